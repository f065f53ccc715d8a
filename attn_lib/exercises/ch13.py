"""第 13 章（让模型写字：生成、KV 缓存与拆分 KV 的解码）的练习。参考答案是字面值或独立的算式；写代码的练习拿 PyTorch 核对（见 code.py）。"""
from __future__ import annotations

import math

from . import Exercise, register

register(Exercise(
    id="13-1",
    question="一层注意力有 64 个查询头、8 个键值头，头的维度 128，缓存用 bf16（每个数 2 字节），缓存里有 8192 个位置。"
             "一次解码步（B = 1）这一层要从显存读多少 MiB 的键和值？",
    answer=2 * 8 * 8192 * 128 * 2 / 2**20,  # K and V, kv heads, positions, head dim, bytes -> 32 MiB
    hint="每个键值头存 8192 个键和 8192 个值，各 128 个数；读的是键值头，不是查询头。1 MiB = 2²⁰ 字节。",
    atol=1e-6,
    wrong_example=2 * 64 * 8192 * 128 * 2 / 2**20,  # one cached head per query head
))

register(Exercise(
    id="13-2",
    question="同一层（64 个查询头、8 个键值头、bf16），只算读键和值的字节、不算 q 和输出，"
             "一次解码步每读一个字节做几次浮点运算（算术强度）？",
    # FLOPs 2*H*S*(D+D) = 4*64*S*D; bytes 8*S*(D+D)*2 = 32*S*D; the ratio is 64 / 8 = 8
    answer=(2 * 64 * 2 * 128) / (8 * 2 * 128 * 2),
    hint="浮点运算：每个查询头对每个键做 q·k 和 p·v，各 2·D 次（乘一次、加一次）；字节：每个键值头的键和值各 D 个数、每个 2 字节。",
    atol=1e-9,
    wrong_example=(2 * 64 * 2 * 128) / (64 * 2 * 128 * 2),  # as if every query head read its own copy
))

register(Exercise(
    id="13-3",
    question="缓存切成两段。第 1 段的部分输出是 o₁ = 2（值只有 1 维），lse₁ = ln 1 = 0；第 2 段 o₂ = 5，lse₂ = ln 3。"
             "合并后的输出是多少？",
    answer=(1 * 2 + 3 * 5) / (1 + 3),  # merge coefficients e^lse: 1 and 3
    hint="每段的合并系数是 e^(lse_p − m)，m 是最大的 lse；输出 = Σ 合并系数·o_p ÷ Σ 合并系数。",
    atol=1e-9,
    wrong_example=(2 + 5) / 2,  # the plain mean of the two partial outputs
))

register(Exercise(
    id="13-4",
    question="A100 有 108 个计算单元（SM，第 08 章引的 FlashAttention 论文）。一次解码步 B = 1、8 个键值头，拆分 KV 的每个程序实例"
             "算一个键值头的一段缓存。至少要把缓存切成几段，程序实例才不少于 108 个？",
    answer=math.ceil(108 / 8),  # 8 * 14 = 112 >= 108 > 8 * 13 = 104
    hint="程序实例的个数 = B × 键值头数 × 段数；找最小的段数让它不少于 108。",
    atol=0.0,
    wrong_example=108 // 8,  # 13 splits: 104 instances, 4 units still idle
))


# ---------------------------------------------------------------- 13-5: write the code yourself
# The key is torch itself: the merge coefficients of the partials are softmax(lses) over the split axis
# (the log-sum-exp merge); an empty split has lse = -inf and gets coefficient 0.

import torch  # noqa: E402  (code exercises: the answer key is torch itself)

from .code import CodeExercise, Mistake, Probe, register_code  # noqa: E402


def _merge(outs, lses):
    w = torch.softmax(lses, dim=-1)  # (..., P)
    return (w.unsqueeze(-1) * outs).sum(dim=-2)  # (..., P, Dv) -> (..., Dv)


def _mean(outs, lses):
    return outs.mean(dim=-2)  # (..., P, Dv) -> (..., Dv): the lse ignored


def _no_divide(outs, lses):
    w = torch.exp(lses - lses.max(dim=-1, keepdim=True).values)  # (..., P)
    return (w.unsqueeze(-1) * outs).sum(dim=-2)  # the sum of the coefficients never divided out


def _unshifted(outs, lses):
    w = torch.exp(lses)  # (..., P): overflows for a large lse
    return (w.unsqueeze(-1) * outs).sum(dim=-2) / w.sum(dim=-1, keepdim=True)


def _partials(g, shape, P, Dv, *, offset=0.0, empty=False):
    outs = torch.randn(*shape, P, Dv, generator=g, dtype=torch.float64)  # (..., P, Dv)
    lses = torch.randn(*shape, P, generator=g, dtype=torch.float64) * 3 + offset  # (..., P)
    if empty:  # the last split saw no key: lse = -inf, output 0
        lses[..., -1] = float("-inf")
        outs[..., -1, :] = 0.0
    return outs, lses


register_code(CodeExercise(
    id="13-5",
    name="my_merge",
    reference=_merge,
    probes=(
        Probe("随机的部分结果 outs (2, 4, 3, 5)、lses (2, 4, 3)", lambda g: _partials(g, (2, 4), 3, 5)),
        Probe("有一段没有键（它的 lse 是 -inf、输出是 0）", lambda g: _partials(g, (3,), 4, 2, empty=True)),
        Probe("lse 都在 1000 左右（e^lse 会溢出）", lambda g: _partials(g, (2, 2), 5, 3, offset=1000.0)),
    ),
    mistakes=(
        Mistake("mean", _mean, "直接平均了各段的输出：每段要按它的 e^lse 加权（分到的注意力越多，合并系数越大）。"),
        Mistake("no_divide", _no_divide, "加权和没有除以合并系数之和：各段的输出已在段内归一化，合并时要重新归一化。"),
    ),
    wrong_solutions=((_mean, "mean"), (_no_divide, "no_divide"), (_unshifted, "nan")),
    extra={"nan_hint": "lse 很大时 e^lse 溢出：先减去最大的 lse 再取指数（和第 03 章的稳定 Softmax 一样）。"},
))
