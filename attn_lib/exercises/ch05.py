"""第 05 章（自注意力）的练习。答案都由代码算出。"""
from __future__ import annotations

import torch

from ..self_attention import SelfAttention
from . import Exercise, register


def _count_05_1() -> int:
    return sum(p.numel() for p in SelfAttention(8, 4, 4).parameters())


def _scores_05_2() -> list[float]:
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]], dtype=torch.float64)  # (1,3,2)
    eye = torch.eye(2, dtype=torch.float64)
    with torch.no_grad():
        _, scores = SelfAttention.from_matrices(eye, eye, eye)(x, need_weights=True)  # (1,3,3)
    return [round(float(s), 4) for s in scores[0, 2]]


register(Exercise(
    id="05-1",
    question="SelfAttention(d_model=8, d_k=4, d_v=4)（不带偏置）一共有多少个参数？",
    answer=_count_05_1(),
    hint="三个矩阵 W_q、W_k、W_v，每个的形状都是 (C, 4),C = 8。",
    wrong_example=8 * 4,
))

register(Exercise(
    id="05-2",
    question=(
        "三个字的输入 x = [[1, 0], [0, 1], [1, 1]],W_q = W_k = W_v = 单位矩阵（也就是 attention(x, x, x)）。"
        "第 3 个字分给三个字的注意力分数是多少？写成长度为 3 的列表，保留 4 位小数。"
    ),
    answer=_scores_05_2(),
    hint="先算第 3 个字和每个字的点积 [1, 1, 2]，除以 √2，再做 Softmax。",
    atol=1e-3,
    wrong_example=[0.25, 0.25, 0.5],
))
