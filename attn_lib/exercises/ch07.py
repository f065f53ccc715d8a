"""第 07 章（多头注意力）的练习。参考答案是写死的数或用标准库 math 独立算出，不调用 attn_lib。"""
from __future__ import annotations

import math

from .. import worked_example as we
from . import Exercise, register


def _head2_weight_on_overturn() -> float:
    # Independent of attn_lib: head 2 sees the last two numbers of each vector (the source's values).
    q = (1.0, 0.0)  # 它
    keys = [(3.0, 2.0), (0.6, 1.0), (2.8, 1.0)]  # 水、书、打翻
    scaled = [(q[0] * k[0] + q[1] * k[1]) / math.sqrt(2) for k in keys]
    exps = [math.exp(x) for x in scaled]
    return round(exps[2] / sum(exps), 4)


register(Exercise(
    id="07-1",
    question="隐藏层维度 512、8 个头，每个头的维度是多少？",
    answer=64,  # 512 ÷ 8
    hint="每个头的维度 = 隐藏层维度 ÷ 头数。",
    wrong_example=8,
))

register(Exercise(
    id="07-2",
    question="MultiHeadAttention(512, 8)（带偏置）一共有多少个参数？",
    answer=4 * 512 * 512 + 4 * 512,  # 4C² + 4C = 1050624
    hint="一个 (C, 3C) 的 QKV 矩阵和一个 (C, C) 的输出矩阵，再加上两者的偏置 3C 和 C；和头数无关。",
    wrong_example=3 * 512 * 512,
))

register(Exercise(
    id="07-3",
    question="主走查的第 2 个头（只看后两位）里，「它」分给「打翻」的注意力分数精确到 4 位小数是多少？",
    answer=_head2_weight_on_overturn(),
    hint="第 2 个头的点积是 3.0 / 0.6 / 2.8，除以 √2（不是 1.41，也不是 2），再做 Softmax。",
    atol=5e-4,
    wrong_example=we.SOURCE_PRINTED["head_weights"][1][2],
))
