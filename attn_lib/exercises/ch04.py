"""第 04 章（缩放与完整走查）的练习。参考答案是写死的数或用标准库 math 独立算出，不调用 attn_lib。"""
from __future__ import annotations

import math

from ..core import worked_example as we
from . import Exercise, register


def _softmax(xs: list[float]) -> list[float]:
    """独立于 attn_lib 的 Softmax（标准库 math）。"""
    top = max(xs)
    exps = [math.exp(x - top) for x in xs]
    return [e / sum(exps) for e in exps]


def _output_for_query(query: list[float]) -> list[float]:
    """主走查的键和值（原章的数，抄在这里），一个新查询：点积 → 除以 √4 → Softmax → 加权求和。"""
    keys = [[3.0, 1.0, 3.0, 2.0], [0.6, 2.0, 0.6, 1.0], [2.0, 0.0, 2.8, 1.0]]  # 水、书、打翻
    values = [[2.0, 0.0, 4.0, 1.0], [0.0, 3.0, 0.6, 0.0], [1.0, 1.0, 0.0, 3.0]]
    dots = [sum(q * k for q, k in zip(query, key)) for key in keys]
    p = _softmax([x / math.sqrt(4) for x in dots])
    return [sum(p[j] * values[j][i] for j in range(3)) for i in range(4)]


register(Exercise(
    id="04-1",
    question="向量还是主走查那几个，但假装 d = 16（除以 √16 = 4 而不是 2）：「水」分到的比例是多少？（精确到 0.001）",
    answer=_softmax([6.0 / 4, 1.2 / 4, 4.8 / 4])[0],  # ≈ 0.490
    hint="三个点积 6.0、1.2、4.8 各除以 4，再做 Softmax，取第一个。除数越大，比例越平均。",
    atol=1e-3,
    wrong_example=0.61,
))

register(Exercise(
    id="04-2",
    question="4 个评分完全相等时，Softmax 的雅可比矩阵 diag(p) − ppᵀ 的 Frobenius 范数是多少？（精确到 0.001）",
    answer=math.sqrt(4 * 0.1875**2 + 12 * 0.0625**2),  # = √0.1875 ≈ 0.433
    hint="p = [0.25, 0.25, 0.25, 0.25]；对角线上是 0.25 − 0.0625，其余是 −0.0625；平方、求和、开根。"
         "也可以调用 attn_lib.core.scaling.softmax_grad_norm。",
    atol=1e-3,
    wrong_example=0.0,
))


register(Exercise(
    id="04-3",
    question="把「它」的查询换成 [0, 1, 0, 1]，完整走一遍缩放点积注意力，「它」的新表示是什么？（长度为 4 的列表，精确到 0.001）",
    answer=_output_for_query([0.0, 1.0, 0.0, 1.0]),  # ≈ [1.000, 1.422, 1.943, 0.888]
    hint="点积是 3、3、1，除以 2，做 Softmax，再按比例混合三个值向量；或者调用 attn_lib.attention。",
    atol=1e-3,
    wrong_example=list(we.SOURCE_PRINTED["output"]),
))
