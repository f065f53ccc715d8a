"""第 10 章（位置编码）：正余弦位置表和旋转位置编码（RoPE）。

Attention without positions is permutation-equivariant: shuffle the tokens and the outputs
are shuffled the same way (chapter 11's 我喜欢你 / 你喜欢我). Two standard remedies:

- ``sinusoidal_positions(L, d_model)``: the original Transformer's table, *added* to the
  token embeddings. Column ``2i`` is ``sin(pos / base^(2i/d))`` and column ``2i+1`` is
  ``cos(pos / base^(2i/d))``.
- ``apply_rotary(x, positions)``: rotary position embedding (RoPE, Su et al. 2021), applied
  to queries and keys *inside* attention. Each pair of channels ``(2i, 2i+1)`` of the vector
  at position m is rotated by the angle ``m * theta_i`` with ``theta_i = base^(-2i/D)``.
  Rotations preserve lengths, and ``rot(m) q · rot(n) k = q · rot(n - m) k``: the score
  depends on the positions only through the offset m − n.
"""
from __future__ import annotations

import torch

from ..rules.numerics import work_dtype
from ..checks.sequences import check_rotary_args, check_sinusoidal_args


def _inverse_frequencies(D: int, base: float, device=None) -> torch.Tensor:
    """theta_i = base^(-2i/D) for i = 0 .. ceil(D/2) - 1, in float64."""
    i2 = torch.arange(0, D, 2, dtype=torch.float64, device=device)  # (ceil(D/2),) = 0, 2, 4, ...
    return base ** (-i2 / D)  # (ceil(D/2),)


def sinusoidal_positions(L: int, d_model: int, *, base: float = 10000.0, dtype: torch.dtype = torch.float32,
                         device=None) -> torch.Tensor:
    """正余弦位置编码表（原始 Transformer）：偶数列是正弦，奇数列是余弦，返回 (L, d_model)。

    ``PE[pos, 2i] = sin(pos / base^(2i/d_model))`` and ``PE[pos, 2i+1] = cos(pos / base^(2i/d_model))``.
    Computed in float64, then cast to ``dtype``. An odd ``d_model`` ends with a sine column.

    Args:
        L: number of positions (int >= 0).
        d_model: width of each position vector (int >= 1), the model's hidden size C.
        base: the wavelength scale (10000 in the original paper).
        dtype: floating dtype of the result.
        device: torch device of the result.

    Returns:
        (L, d_model) tensor; add it to the (B, L, C) token embeddings.
    """
    L, d_model, base = check_sinusoidal_args(L, d_model, base, dtype)
    pos = torch.arange(L, dtype=torch.float64, device=device)[:, None]  # (L,1)
    angle = pos * _inverse_frequencies(d_model, base, device)[None, :]  # (L,1) * (1,ceil(d/2)) -> (L,ceil(d/2))
    pe = torch.empty(L, d_model, dtype=torch.float64, device=device)  # (L,d_model)
    pe[:, 0::2] = torch.sin(angle)  # (L,ceil(d/2)) even columns
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])  # (L,floor(d/2)) odd columns
    return pe.to(dtype)


def apply_rotary(x: torch.Tensor, positions=None, *, base: float = 10000.0) -> torch.Tensor:
    """旋转位置编码（RoPE）：把位置 m 上向量的每一对通道 (2i, 2i+1) 旋转 m·θ_i 角，返回同形状张量。

    ``theta_i = base^(-2i/D)``. For the pair ``(a, b) = (x[..., 2i], x[..., 2i+1])``::

        a' = a cos(m θ_i) − b sin(m θ_i)
        b' = a sin(m θ_i) + b cos(m θ_i)

    Apply it to the queries and the keys (not the values) before the dot products; then a
    score depends on the two positions only through their offset. The angles are computed
    in float64 and the result has ``x``'s dtype.

    Args:
        x: (B, H, L, D) floating tensor, D even.
        positions: position of each of the L tokens: None (0 .. L-1), a sequence or int
            tensor of shape (L,), or an int tensor (B, L) (one row per sequence, e.g. when
            decoding with a KV cache the new tokens sit at ``cache_length + 0 .. L-1``).
        base: the wavelength scale (10000 in the paper).

    Returns:
        (B, H, L, D) tensor: ``x`` rotated pair by pair.
    """
    pos, base = check_rotary_args(x, positions, base)
    return rotate(x, pos, base)


def rotate(x: torch.Tensor, pos: torch.Tensor | None, base: float) -> torch.Tensor:
    """apply_rotary without checks: x (B, H, L, D), pos None or int (L,) / (B, L) on x's device."""
    B, H, L, D = x.shape
    pos = torch.arange(L, device=x.device) if pos is None else pos  # (L,) or (B,L)
    angle = pos.to(torch.float64)[..., None] * _inverse_frequencies(D, base, x.device)  # (L,1)*(D/2,) -> (L,D/2) or (B,L,D/2)
    if angle.ndim == 3:
        angle = angle[:, None]  # (B,L,D/2) -> (B,1,L,D/2), broadcasts over heads
    work = work_dtype(x.dtype)
    cos, sin = torch.cos(angle).to(work), torch.sin(angle).to(work)  # (L,D/2) or (B,1,L,D/2)
    pairs = x.to(work).reshape(B, H, L, D // 2, 2)  # (B,H,L,D) -> (B,H,L,D/2,2)
    a, b = pairs[..., 0], pairs[..., 1]  # (B,H,L,D/2) each
    rotated = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)  # (B,H,L,D/2,2)
    return rotated.reshape(B, H, L, D).to(x.dtype)  # (B,H,L,D/2,2) -> (B,H,L,D)


__all__ = ["sinusoidal_positions", "apply_rotary", "rotate"]
