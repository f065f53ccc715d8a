"""第 12 章（分组查询注意力与滑动窗口）的练习。参考答案是字面值或独立的算式。"""
from __future__ import annotations

import math

from . import Exercise, register

register(Exercise(
    id="12-1",
    question="40 层、40 个查询头、8 个键值头、头的维度 128，bf16（每个数 2 字节），缓存 8192 个位置：KV 缓存一共多少 GiB？",
    answer=2 * 40 * 8 * 128 * 8192 * 2 / 2**30,  # K and V, layers, kv heads, head dim, tokens, bytes
    hint="字节数 = 2（K 和 V）× 层数 × 键值头数 × 头的维度 × 位置数 × 每个数的字节数；1 GiB = 2³⁰ 字节。",
    atol=1e-3,
    wrong_example=2 * 40 * 40 * 128 * 8192 * 2 / 2**30,  # counted one key/value head per query head
))

register(Exercise(
    id="12-2",
    question="每层都用 window_size=(4, 0) 的因果滑动窗口，叠 3 层。第 3 层输出里位置 20 的向量，最早能用到输入里第几个位置的信息？",
    answer=20 - 3 * 4,  # every layer reaches 4 positions further back
    hint="一层里位置 i 看得到 i − 4 .. i；下一层再往前看 4 个位置时，看到的向量本身已经带着更早的信息。",
    atol=0.0,
    wrong_example=20 - 4,  # one layer only
))

register(Exercise(
    id="12-3",
    question="一层用 window_size=(255, 0) 的滑动窗口和滚动缓存，逐字生成了 1000 个字。为了生成下一个字，缓存里至少要留着前面几个位置的键和值？",
    answer=255,  # the next token sees itself (computed in its own step) and the 255 before it
    hint="下一个字看它自己和前面 255 个位置；它自己的键和值在这一步现算，更早的位置再也用不上。",
    atol=0.0,
    wrong_example=1000,  # the cache of a layer without a window
))


# ---------------------------------------------------------------- 12-4: write the code yourself
# The key is written with torch: query head h uses key/value head h // (H // H_kv), the rule
# of torch SDPA's enable_gqa=True; softmax(q k^T / sqrt(D)) v, no mask.

import torch  # noqa: E402  (code exercises: the answer key is torch itself)

from .code import CodeExercise, Mistake, Probe, register_code  # noqa: E402


def _gqa(q, k, v, *, tile=False, scale="D"):
    group = q.shape[1] // k.shape[1]
    if tile:  # head h gets kv head h % H_kv: the wrong order
        kr, vr = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)  # (B,H,S,D), (B,H,S,Dv)
    else:
        kr, vr = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B,H,S,D), (B,H,S,Dv)
    dots = q @ kr.transpose(-2, -1)  # (B,H,L,D) @ (B,H,D,S) -> (B,H,L,S)
    if scale:  # "D": the head dim of q and k (right); "Dv": the value's length (a mistake)
        dots = dots / math.sqrt(q.shape[-1] if scale == "D" else v.shape[-1])
    return torch.softmax(dots, dim=-1) @ vr  # (B,H,L,S) @ (B,H,S,Dv) -> (B,H,L,Dv)


def _first_kv_only(q, k, v):
    return _gqa(q, k[:, :1], v[:, :1])  # every query head uses kv head 0


def _gqa_inputs(g, B, H, H_kv, L, S, D, Dv):
    q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)  # (B,H,L,D)
    k = torch.randn(B, H_kv, S, D, generator=g, dtype=torch.float64)  # (B,H_kv,S,D)
    v = torch.randn(B, H_kv, S, Dv, generator=g, dtype=torch.float64)  # (B,H_kv,S,Dv)
    return q, k, v


register_code(CodeExercise(
    id="12-4",
    name="my_gqa",
    reference=_gqa,
    probes=(
        Probe("随机输入 q (2, 6, 5, 4)、k 和 v 各 2 个头（每 3 个查询头共用一个）",
              lambda g: _gqa_inputs(g, 2, 6, 2, 5, 7, 4, 3)),
        Probe("随机输入 q (1, 8, 3, 4)、k 和 v 各 4 个头（每 2 个查询头共用一个）",
              lambda g: _gqa_inputs(g, 1, 8, 4, 3, 6, 4, 4)),
    ),
    mistakes=(
        Mistake("tile", lambda q, k, v: _gqa(q, k, v, tile=True),
                "查询头和键值头配错了：第 h 个查询头用第 h // (H // H_kv) 个键值头，相邻的查询头一组"
                "（repeat_interleave）；k.repeat(...) 把键值头整体重复，第 h 个头拿到的是第 h % H_kv 个。"),
        Mistake("no_scale", lambda q, k, v: _gqa(q, k, v, scale=""), "点积没有除以 √D（D 是头的维度）。"),
        Mistake("scale_dv", lambda q, k, v: _gqa(q, k, v, scale="Dv"),
                "缩放因子不对：除的是 √D，D 是查询、键的维度，不是值的维度 Dv。"),
        Mistake("first_kv_only", _first_kv_only, "所有查询头都用了第 0 个键值头：每一组查询头有自己的键值头。"),
    ),
    wrong_solutions=((lambda q, k, v: _gqa(q, k, v, tile=True), "tile"),
                     (lambda q, k, v: _gqa(q, k, v, scale=""), "no_scale"),
                     (lambda q, k, v: _gqa(q, k, v, scale="Dv"), "scale_dv")),
    forbidden=("attn_lib.attention", "F.scaled_dot_product_attention"),
))
