"""第 8、9 章（对照组：朴素注意力）：整张 (B, H, L, S) 评分矩阵在输入精度下算出、存下，softmax 得到的整张比例再乘 V——基准测试和误差规则拿它作对照。

Written the way a model does it without a fused kernel (and the way flash-attn's tests build
their low-precision baseline): ``q @ kᵀ`` in the input dtype, softmax in float32, the
proportions rounded back to the input dtype, then ``@ v``. The full score matrix and the
proportions both live in memory, which is what makes it quadratic.
"""
from __future__ import annotations

import torch

from ..checks.doors import check_naive_call
from ..rules.numerics import overflow_error
from ..rules.settings import AttentionSettings, Options, rows_with_keys


def naive_attention(q, k, v, *, is_causal: bool = False, scale: float | None = None, key_mask=None,
                    align: str = "top-left"):
    """朴素注意力：整张 (B, H, L, S) 评分矩阵在输入精度下算出、存下，softmax 得到的整张比例再乘 V（基准测试和误差规则的对照）。

    Args:
        q, k, v: (B, H, L, D), (B, H, S, D), (B, H, S, Dv).
        is_causal, scale, key_mask, align: as in ``attn_lib.flash_attention``.

    Returns:
        Output (B, H, L, Dv) in q's dtype; rows that see no key are zeros. Differentiable
        (plain autograd through the full matrix; a row that sees no key gets zero gradients).

    Raises:
        ValueError: a score overflows to +inf in q's dtype, or every score a row sees falls to -inf.
        TypeError: ``scale`` is a tensor that requires grad (not differentiable).
    """
    settings = check_naive_call(q, k, v, Options(is_causal=is_causal, scale=scale, key_mask=key_mask, align=align))
    return naive_core(q, k, v, settings)


def naive_core(q, k, v, settings: AttentionSettings):
    """naive_attention 的无检查内核（输入已检查过）；settings.check_overflow=False 时不做归约、不同步。"""
    L, S = q.shape[2], k.shape[2]
    scores = (q * settings.scale) @ k.transpose(-2, -1)  # (B,H,L,D) @ (B,H,D,S) -> (B,H,L,S)
    if not settings.band.full:
        scores.masked_fill_(~settings.band.mask(L, S, device=q.device), float("-inf"))  # (B,H,L,S)
    if settings.key_mask is not None:
        scores.masked_fill_(~settings.key_mask[:, None, None, :], float("-inf"))  # (B,H,L,S)
    if settings.check_overflow and S:
        row_max = scores.detach().amax(-1)  # (B,H,L,S) -> (B,H,L); -inf for a row that sees no key
        up = torch.isposinf(row_max) | torch.isnan(row_max)  # (B,H,L)
        down = torch.isneginf(row_max) & rows_with_keys(L, S, settings, q.device)  # (B,H,L): every visible score -inf
        if bool((up | down).any()):
            raise overflow_error(q.dtype, "+inf" if bool(up.any()) else "-inf")
    probs = torch.softmax(scores, dim=-1, dtype=settings.work_dtype)  # (B,H,L,S) proportions
    if settings.key_mask is not None or not settings.band.full:
        # A query that sees no key: zeros, as attn_lib.softmax. Out of place, so that softmax's
        # backward still finds the output it saved.
        probs = probs.nan_to_num(0.0)  # (B,H,L,S)
    return probs.to(q.dtype) @ v  # (B,H,L,S) @ (B,H,S,Dv) -> (B,H,L,Dv)


__all__ = ["naive_attention", "naive_core"]
