"""第 02 章（点积）的练习。参考答案是写死的数（注释里是手算过程），不调用 attn_lib。"""
from __future__ import annotations

from ..core import worked_example as we
from . import Exercise, register

register(Exercise(
    id="02-1",
    question="[1, 2, 3] 和 [4, -5, 6] 的点积是多少？",
    answer=12.0,  # 1×4 + 2×(-5) + 3×6 = 4 - 10 + 18
    hint="对应位置相乘：1×4、2×(-5)、3×6，再把三个乘积加起来；别丢了负号。",
    wrong_example=32.0,
))

register(Exercise(
    id="02-2",
    question="把「它」的查询换成 [0, 1, 0, 1]，它和「水」「书」「打翻」三个键的点积依次是多少？（一个长度为 3 的列表）",
    answer=[3.0, 3.0, 1.0],  # 水 1 + 2、书 2 + 1、打翻 0 + 1（只有第 2、4 位起作用）
    hint="用 attn_lib.dot_query_keys(q, K)，K 是 worked_example.key_matrix() 堆成的 (3, 4) 矩阵。",
    wrong_example=list(we.SOURCE_PRINTED["dots"]),
))

register(Exercise(
    id="02-3",
    question="用 ‖q−k‖² = ‖q‖² − 2q·k + ‖k‖²，算「它」的查询到「水」的键的欧氏距离的平方。",
    answer=13.0,  # ‖q‖² = 2，q·k = 6，‖k‖² = 9 + 1 + 9 + 4 = 23：2 − 12 + 23
    hint="‖q‖² = q·q = 2，q·k = 6，‖k‖² = k·k；中间那一项要乘 2。",
    wrong_example=19.0,
))
