"""第 02 章（点积）的练习。参考答案全部由代码算出。"""
from __future__ import annotations

import torch

from .. import worked_example as we
from ..similarity import dot, dot_query_keys
from . import Exercise, register

_K = torch.tensor(we.key_matrix(), dtype=torch.float64)  # (S=3, D=4)
_q = torch.tensor(we.QUERY, dtype=torch.float64)  # (D,)

register(Exercise(
    id="02-1",
    question="[1, 2, 3] 和 [4, -5, 6] 的点积是多少？",
    answer=float(dot(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, -5.0, 6.0]))),
    hint="对应位置相乘：1×4、2×(-5)、3×6，再把三个乘积加起来；别丢了负号。",
    wrong_example=32.0,
))

register(Exercise(
    id="02-2",
    question="把「它」的查询换成 [0, 1, 0, 1]，它和 水、书、打翻 三个键的点积依次是多少？（一个长度为 3 的列表）",
    answer=dot_query_keys(torch.tensor([0.0, 1.0, 0.0, 1.0], dtype=torch.float64), _K).tolist(),
    hint="用 attn_lib.dot_query_keys(q, K),K 是 worked_example.key_matrix() 堆成的 (3, 4) 矩阵。",
    wrong_example=list(we.SOURCE_PRINTED["dots"]),
))

register(Exercise(
    id="02-3",
    question="用 ‖q−k‖² = ‖q‖² − 2q·k + ‖k‖²，算「它」的查询到「水」的键的欧氏距离的平方。",
    answer=float(dot(_q, _q) - 2 * dot(_q, _K[0]) + dot(_K[0], _K[0])),
    hint="‖q‖² = q·q = 2,q·k = 6,‖k‖² = k·k；中间那一项要乘 2。",
    wrong_example=19.0,
))
