"""第 05 章（自注意力）的练习。参考答案是写死的数或用标准库 math 独立算出，不调用 attn_lib；写代码的练习拿 PyTorch 核对（见 code.py）。"""
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


# ---------------------------------------------------------------- 05-3: write the code yourself
# The key is torch's scaled_dot_product_attention; L != S and D != Dv, so a transposed or
# mixed-up tensor shows in the shape.

import torch  # noqa: E402  (code exercises: the answer key is torch itself)
import torch.nn.functional as F  # noqa: E402

from .code import CodeExercise, Mistake, Probe, register_code  # noqa: E402


def _qkv(g, B, H, L, S, D, Dv, spread=1.0):
    q = spread * torch.randn(B, H, L, D, generator=g, dtype=torch.float64)  # (B,H,L,D)
    k = spread * torch.randn(B, H, S, D, generator=g, dtype=torch.float64)  # (B,H,S,D)
    v = torch.randn(B, H, S, Dv, generator=g, dtype=torch.float64)  # (B,H,S,Dv)
    return q, k, v


def _attend(q, k, v, scale, dim=-1):
    w = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=dim)  # (B,H,L,D) @ (B,H,D,S) -> (B,H,L,S)
    return w @ v  # (B,H,L,S) @ (B,H,S,Dv) -> (B,H,L,Dv)


def _unscaled(q, k, v):
    w = torch.softmax(q @ k.transpose(-2, -1), dim=-1)  # (B,H,L,S), the scale forgotten
    return w @ v  # (B,H,L,Dv)


def _softmax_over_queries(q, k, v):
    w = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-2)  # (B,H,L,S), wrong axis
    return w @ v  # (B,H,L,Dv)


register_code(CodeExercise(
    id="05-3",
    name="my_attention",
    reference=lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
    probes=(
        Probe("随机输入（q (2, 3, 4, 8)、k (2, 3, 6, 8)、v (2, 3, 6, 5)）", lambda g: _qkv(g, 2, 3, 4, 6, 8, 5)),
        Probe("元素较大的输入（q、k 乘 30）", lambda g: _qkv(g, 1, 2, 5, 7, 16, 3, spread=30.0)),
    ),
    mistakes=(
        Mistake("scale", lambda q, k, v: _attend(q, k, v, 1.0), "评分没有缩放：点积要先除以 √d（d 是查询、键的维度）。"),
        Mistake("scale", lambda q, k, v: _attend(q, k, v, 1 / q.shape[-1]), "缩放因子不对：应除以 √d，不是 d。"),
        Mistake("scale", lambda q, k, v: _attend(q, k, v, v.shape[-1] ** -0.5),
                "缩放用了值向量的维度：√d 里的 d 是查询、键的维度。"),
        Mistake("axis", lambda q, k, v: _attend(q, k, v, q.shape[-1] ** -0.5, dim=-2),
                "Softmax 做在了查询的轴上：应沿键的轴（最后一个轴），让每个查询的比例加起来等于 1。"),
    ),
    wrong_solutions=((_unscaled, "scale"), (_softmax_over_queries, "axis")),
    forbidden=("F.scaled_dot_product_attention", "attn_lib.attention"),
    extra={"nan_hint": "Softmax 要先减去每行的最大值（可以直接用 torch.softmax）。"},
))
