"""第 03 章（Softmax）的练习。参考答案是写死的数或用标准库 math 独立算出，不调用 attn_lib；写代码的练习拿 PyTorch 核对（见 code.py）。"""
from __future__ import annotations

import math

from . import Exercise, register


def _softmax(xs: list[float]) -> list[float]:
    """独立于 attn_lib 的 Softmax（标准库 math）；-inf 的比例是 0。"""
    top = max(xs)
    exps = [math.exp(x - top) for x in xs]
    return [e / sum(exps) for e in exps]


register(Exercise(
    id="03-1",
    question="softmax([2, 1, 0]) 是哪三个比例？（一个长度为 3 的列表，精确到 0.001）",
    answer=_softmax([2.0, 1.0, 0.0]),  # ≈ [0.665, 0.245, 0.090]
    hint="先算 e²、e¹、e⁰，再各自除以三者之和；或者直接调用 attn_lib.softmax。",
    atol=1e-3,
    wrong_example=[2 / 3, 1 / 3, 0.0],
))

register(Exercise(
    id="03-2",
    question="softmax([0, 0, -inf, 0]) 是哪四个比例？（精确到 0.001，也可以写成 1/3）",
    answer=[1 / 3, 1 / 3, 0.0, 1 / 3],
    hint="-inf 那一位的比例是 0，剩下三位评分相等，平分全部比例；每一位要精确到 0.001（0.33 不够，写 0.333 或 1/3）。",
    atol=1e-3,
    wrong_example=[0.25, 0.25, 0.25, 0.25],
))

register(Exercise(
    id="03-3",
    question="主走查第 3 步里，把「书」的评分 0.6 换成 -inf（另外两个不变），「水」分到的比例是多少？（精确到 0.001）",
    answer=1 / (1 + math.exp(2.4 - 3.0)),  # e^3.0 ÷ (e^3.0 + e^2.4) ≈ 0.646
    hint="-inf 的比例是 0，剩下的 e^3.0 和 e^2.4 按各自的大小分掉全部比例：水 = e^3.0 ÷ (e^3.0 + e^2.4)。",
    atol=1e-3,
    wrong_example=0.61,
))


# ---------------------------------------------------------------- 03-4: write the code yourself
# The key is torch.softmax; the mistakes are what a first attempt often computes.

import torch  # noqa: E402  (code exercises: the answer key is torch itself)

from .code import CodeExercise, Mistake, Probe, register_code  # noqa: E402


def _naive_softmax(x):
    e = torch.exp(x)  # overflows to inf for x > ~709.78 (float64)
    return e / e.sum(dim=-1, keepdim=True)


def _softmax_first_axis(x):
    e = torch.exp(x - x.max(dim=0, keepdim=True).values)
    return e / e.sum(dim=0, keepdim=True)


register_code(CodeExercise(
    id="03-4",
    name="stable_softmax",
    reference=lambda x: torch.softmax(x, dim=-1),
    probes=(
        Probe("随机输入（形状 (2, 3, 4, 5)）", lambda g: (3 * torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64),)),
        Probe("元素大到约 ±1000 的输入", lambda g: (1000 * torch.randn(3, 6, generator=g, dtype=torch.float64),)),
        Probe("每行盖住一部分（-inf）的输入", lambda g: (torch.randn(4, 6, generator=g, dtype=torch.float64)
                                             .masked_fill(torch.ones(4, 6, dtype=torch.bool).triu(1), float("-inf")),)),
    ),
    mistakes=(
        Mistake("axis", lambda x: torch.softmax(x, dim=0), "Softmax 做在了第一个轴上：应沿最后一个轴（dim=-1），让每行加起来等于 1。"),
        Mistake("axis", lambda x: torch.softmax(x, dim=-2), "Softmax 做在了倒数第二个轴上：应沿最后一个轴（dim=-1），让每行加起来等于 1。"),
        Mistake("sum", lambda x: torch.exp(x - x.max(dim=-1, keepdim=True).values),
                "每行没有除以这一行指数的和：比例要加起来等于 1。"),
    ),
    wrong_solutions=((_naive_softmax, "nan"), (_softmax_first_axis, "axis")),
    forbidden=("torch.softmax", "attn_lib.softmax"),
    extra={"nan_hint": "先把每行减去这一行的最大值，再取指数（float64 里 e 的 1000 次方已经是 inf）。"},
))
