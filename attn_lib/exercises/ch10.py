"""第 10 章（位置、训练好的小模型、KV 缓存）的练习。参考答案是字面值或独立的算式；写代码的练习拿 PyTorch 核对（见 code.py）。"""
from __future__ import annotations

import math

from . import Exercise, register

register(Exercise(
    id="10-1",
    question="D = 2(θ₀ = 1)，q = (1, 0) 在位置 5，k = (1, 0) 在位置 3，都用 RoPE 转过以后，点积是多少？（精确到 0.001）",
    answer=math.cos(5 - 3),  # two unit vectors at angle 5 - 3 radians
    hint="q 转了 5 弧度，k 转了 3 弧度；两个单位向量的点积是夹角的余弦。",
    atol=1e-3,
    wrong_example=math.cos(5) * math.cos(3),  # multiplied the two cosines instead of taking the angle difference
))

register(Exercise(
    id="10-2",
    question="正余弦位置编码表 sinusoidal_positions(L, 4) 的第 0 行是哪 4 个数？",
    answer=[0.0, 1.0, 0.0, 1.0],  # sin 0, cos 0, sin 0, cos 0
    hint="位置 0 上所有角度都是 0；偶数列是正弦，奇数列是余弦。",
    atol=1e-6,
    wrong_example=[0.0, 0.0, 0.0, 0.0],
))

register(Exercise(
    id="10-3",
    question="H = 12 个头，KV 缓存里已有 1000 个位置，再生成 1 个字：这一步这一层一共做多少次查询和键的点积？",
    answer=12 * 1001,  # the new key joins the cache first: 1001 keys per head
    hint="新字的键先接进缓存，它的查询要和缓存里所有的键比较，包括它自己。",
    atol=0.0,
    wrong_example=12 * 1000,
))


# ---------------------------------------------------------------- 10-4: write the code yourself
# The key is written with torch from the chapter's formula: pairs (x_2i, x_2i+1), position m
# turns pair i by m * theta_i, theta_i = 10000^(-2i/D).

import torch  # noqa: E402  (code exercises: the answer key is torch itself)

from .code import CodeExercise, Mistake, Probe, register_code  # noqa: E402


def _rotate(x, positions, *, base=10000.0, sign=1.0, pair_exponent=2.0):
    D = x.shape[-1]
    i = torch.arange(D // 2, dtype=torch.float64)  # (D/2,) pair index
    theta = base ** (-pair_exponent * i / D)  # (D/2,)
    angle = sign * torch.as_tensor(positions, dtype=torch.float64)[:, None] * theta  # (L,1) * (D/2,) -> (L,D/2)
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)  # (L,D/2)
    x0, x1 = x[..., 0::2], x[..., 1::2]  # (B,H,L,D/2) each
    out0 = x0 * cos - x1 * sin  # (B,H,L,D/2)
    out1 = x0 * sin + x1 * cos  # (B,H,L,D/2)
    return torch.stack([out0, out1], dim=-1).flatten(-2)  # (B,H,L,D/2,2) -> (B,H,L,D)


def _rotate_half(x, positions):
    D = x.shape[-1]
    theta = 10000.0 ** (-2.0 * torch.arange(D // 2, dtype=torch.float64) / D)  # (D/2,)
    angle = torch.as_tensor(positions, dtype=torch.float64)[:, None] * theta  # (L,D/2)
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)  # (L,D/2)
    x0, x1 = x[..., : D // 2], x[..., D // 2:]  # pairs (x_i, x_{i+D/2}): another convention
    return torch.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)  # (B,H,L,D)


def _rope_inputs(g, B, H, L, D, positions=None):
    x = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)  # (B,H,L,D)
    pos = torch.arange(L) if positions is None else torch.tensor(positions)  # (L,)
    return x, pos


register_code(CodeExercise(
    id="10-4",
    name="my_rotary",
    reference=_rotate,
    probes=(
        Probe("随机输入 x (2, 3, 6, 8)、位置 0..5", lambda g: _rope_inputs(g, 2, 3, 6, 8)),
        Probe("随机输入 x (1, 2, 5, 4)、位置 [3, 7, 0, 1, 12]", lambda g: _rope_inputs(g, 1, 2, 5, 4, [3, 7, 0, 1, 12])),
    ),
    mistakes=(
        Mistake("direction", lambda x, p: _rotate(x, p, sign=-1.0),
                "转的方向反了：x′₂ᵢ = x₂ᵢ·cos mθᵢ − x₂ᵢ₊₁·sin mθᵢ，x′₂ᵢ₊₁ = x₂ᵢ·sin mθᵢ + x₂ᵢ₊₁·cos mθᵢ。"),
        Mistake("pairing", _rotate_half,
                "配对方式不对：本章把相邻的两个数 (x₂ᵢ, x₂ᵢ₊₁) 配成一对；把前一半和后一半配对"
                "（GPT-NeoX 和 Hugging Face transformers 代码里的 rotate_half）是另一种写法，和本章的公式不同。"),
        Mistake("frequency", lambda x, p: _rotate(x, p, pair_exponent=1.0),
                "角速度不对：第 i 对的 θᵢ = 10000^(−2i/D)，i 从 0 数到 D/2 − 1。"),
        Mistake("no_rotation", lambda x, p: x.clone(), "输出和输入一模一样：每一对都要按位置 m 转 mθᵢ 角。"),
    ),
    wrong_solutions=((lambda x, p: _rotate(x, p, sign=-1.0), "direction"), (_rotate_half, "pairing"),
                     (lambda x, p: _rotate(x, p, pair_exponent=1.0), "frequency")),
    forbidden=("attn_lib.apply_rotary",),
))
