"""第 05 章（自注意力）的练习。参考答案是写死的数或用标准库 math 独立算出，不调用 attn_lib。"""
from __future__ import annotations

import math

from . import Exercise, register


def _scores_05_2() -> list[float]:
    # Independent of attn_lib: the third row [1, 1] against [1, 0], [0, 1], [1, 1] -> dots 1, 1, 2.
    scaled = [x / math.sqrt(2) for x in (1.0, 1.0, 2.0)]
    exps = [math.exp(x) for x in scaled]
    return [round(e / sum(exps), 4) for e in exps]


register(Exercise(
    id="05-1",
    question="SelfAttention(d_model=8, d_k=4, d_v=4)（不带偏置）一共有多少个参数？",
    answer=3 * 8 * 4,  # W_q、W_k、W_v 各是 (C=8) × 4，没有偏置
    hint="三个矩阵 W_q、W_k、W_v，每个的形状都是 (C, 4)，C = 8。",
    wrong_example=8 * 4,
))

register(Exercise(
    id="05-2",
    question=(
        "三个字的输入 x = [[1, 0], [0, 1], [1, 1]]，W_q = W_k = W_v = 单位矩阵（也就是 attention(x, x, x)）。"
        "第 3 个字分给三个字的注意力分数是多少？写成长度为 3 的列表，保留 4 位小数。"
    ),
    answer=_scores_05_2(),
    hint="先算第 3 个字和每个字的点积 [1, 1, 2]，除以 √2，再做 Softmax。",
    atol=1e-3,
    wrong_example=[0.25, 0.25, 0.5],
))
