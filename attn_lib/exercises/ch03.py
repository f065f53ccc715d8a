"""第 03 章（Softmax）的练习。参考答案全部由代码算出。"""
from __future__ import annotations

import torch

from .. import worked_example as we
from ..softmax import softmax
from . import Exercise, register

register(Exercise(
    id="03-1",
    question="softmax([2, 1, 0]) 是哪三个比例？（一个长度为 3 的列表，精确到 0.001）",
    answer=softmax(torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64)).tolist(),
    hint="先算 e²、e¹、e⁰，再各自除以三者之和；或者直接调用 attn_lib.softmax。",
    atol=1e-3,
    wrong_example=[2 / 3, 1 / 3, 0.0],
))

register(Exercise(
    id="03-2",
    question="softmax([0, 0, -inf, 0]) 是哪四个比例？",
    answer=softmax(torch.tensor([0.0, 0.0, float("-inf"), 0.0], dtype=torch.float64)).tolist(),
    hint="-inf 那一位的比例是 0，剩下三位分数相等，平分全部比例。",
    atol=1e-3,
    wrong_example=[0.25, 0.25, 0.25, 0.25],
))

_scaled = torch.tensor(we.SOURCE_PRINTED["scaled"], dtype=torch.float64)  # (S=3,)
_book_hidden = _scaled.clone()
_book_hidden[1] = float("-inf")

register(Exercise(
    id="03-3",
    question="主走查第 3 步里，把「书」的分数 0.6 换成 -inf（另外两个不变），「水」分到的比例是多少？（精确到 0.001）",
    answer=float(softmax(_book_hidden)[0]),
    hint="-inf 的比例是 0，剩下的 e^3.0 和 e^2.4 平分全部比例：水 = e^3.0 ÷ (e^3.0 + e^2.4)。",
    atol=1e-3,
    wrong_example=0.61,
))
