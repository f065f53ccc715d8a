"""第 07 章（多头注意力）的练习。参考答案是写死的数或用标准库 math 独立算出，不调用 attn_lib；写代码的练习拿 PyTorch 核对（见 code.py）。"""
from __future__ import annotations

import math

from ..core import worked_example as we
from . import Exercise, register


def _head2_weight_on_overturn(divisor: float = math.sqrt(2)) -> float:
    # Independent of attn_lib: head 2 sees the last two numbers of each vector (the source's values).
    q = (1.0, 0.0)  # 它
    keys = [(3.0, 2.0), (0.6, 1.0), (2.8, 1.0)]  # 水、书、打翻
    scaled = [(q[0] * k[0] + q[1] * k[1]) / divisor for k in keys]
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
    hint="第 2 个头的点积是 3.0 / 0.6 / 2.8，除以 √2（不是 1.41，也不是 2），再做 Softmax，保留 4 位小数。",
    atol=5e-5,  # the 4th decimal counts: ÷1.41 gives 0.4233
    wrong_example=we.SOURCE_PRINTED["head_weights"][1][2],
    more_wrong=(_head2_weight_on_overturn(1.41), _head2_weight_on_overturn(2.0), 0.4236),
))


# ------------------------------------------------------- 07-4, 07-5: write the code yourself
# The key is torch's view/transpose; L != H != D in every probe, so a missing transpose or an
# interleaved split shows either in the shape or in the values.

import torch  # noqa: E402  (code exercises: the answer key is torch itself)

from .code import CodeExercise, Mistake, Probe, register_code  # noqa: E402


def _x(g, B, L, C):
    return torch.randn(B, L, C, generator=g, dtype=torch.float64)  # (B,L,C)


def _split(x, num_heads):
    B, L, C = x.shape
    return x.view(B, L, num_heads, C // num_heads).transpose(1, 2)  # (B,L,C) -> (B,L,H,D) -> (B,H,L,D)


def _split_no_transpose(x, num_heads):
    B, L, C = x.shape
    return x.reshape(B, num_heads, L, C // num_heads)  # (B,L,C) -> (B,H,L,D) without moving the axes


def _split_interleaved(x, num_heads):
    B, L, C = x.shape
    return x.view(B, L, C // num_heads, num_heads).permute(0, 3, 1, 2)  # head h gets every H-th number


def _merge(x):
    B, H, L, D = x.shape
    return x.transpose(1, 2).reshape(B, L, H * D)  # (B,H,L,D) -> (B,L,H,D) -> (B,L,C)


def _merge_no_transpose(x):
    B, H, L, D = x.shape
    return x.reshape(B, L, H * D)  # (B,H,L,D) -> (B,L,C) without moving the axes back


def _merge_interleaved(x):
    B, H, L, D = x.shape
    return x.permute(0, 2, 3, 1).reshape(B, L, D * H)  # (B,H,L,D) -> (B,L,D,H) -> (B,L,C)


_SPLIT_PROBES = (
    Probe("随机输入 x (2, 5, 12)、3 个头", lambda g: (_x(g, 2, 5, 12), 3)),
    Probe("随机输入 x (1, 7, 8)、2 个头", lambda g: (_x(g, 1, 7, 8), 2)),
)

register_code(CodeExercise(
    id="07-4",
    name="my_split_heads",
    reference=_split,
    probes=_SPLIT_PROBES,
    mistakes=(
        Mistake("no_transpose", _split_no_transpose,
                "形状对了，数却放错了地方：直接 reshape 成 (B, H, L, D) 会把不同位置的数混进同一个头。"
                "先 view 成 (B, L, H, D)，再交换 L 和 H 两个轴（transpose(1, 2)）。"),
        Mistake("interleaved", _split_interleaved,
                "每个头应拿连续的 D 个数（第 h 个头拿第 hD 到第 (h+1)D−1 个），不是每隔 H 个取一个。"),
    ),
    wrong_solutions=((_split_no_transpose, "no_transpose"), (_split_interleaved, "interleaved"),
                     (lambda x, num_heads: x.view(x.shape[0], x.shape[1], num_heads, -1), "shape")),
    forbidden=("attn_lib.split_heads",),
))

_MERGE_PROBES = (
    Probe("随机输入 x (2, 3, 5, 4)", lambda g: (torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64),)),
    Probe("随机输入 x (1, 2, 7, 4)", lambda g: (torch.randn(1, 2, 7, 4, generator=g, dtype=torch.float64),)),
)

register_code(CodeExercise(
    id="07-5",
    name="my_merge_heads",
    reference=_merge,
    probes=_MERGE_PROBES,
    mistakes=(
        Mistake("no_transpose", _merge_no_transpose,
                "形状对了，数却放错了地方：先把 H 和 L 两个轴换回来（transpose(1, 2)），再把 H 和 D 合成 C。"),
        Mistake("interleaved", _merge_interleaved,
                "拼接的顺序不对：应是第 1 个头的 D 个数在前，接着第 2 个头的 D 个数……，不是各个头的数交错排。"),
    ),
    wrong_solutions=((_merge_no_transpose, "no_transpose"), (_merge_interleaved, "interleaved"),
                     (lambda x: x.transpose(1, 2), "shape")),
    forbidden=("attn_lib.merge_heads",),
))
