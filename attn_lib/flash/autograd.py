"""第 8、9 章（FlashAttention 的唯一入口：第 08 章前向、第 09 章反向）：按设备在纯 torch 分块实现和 Triton 核函数之间选一个，结果与 attn_lib.attention 相同。

``flash_attention(q, k, v, is_causal=..., scale=..., key_padding_mask=..., backend=...,
enable_gqa=..., window_size=...)``: grouped-query attention and sliding windows (the
sliding-window chapter) on both paths, forward and backward.

- ``backend="auto"``: the Triton kernels when q is on a CUDA device and Triton is
  importable, otherwise the tiled torch path (``attn_lib.flash.tiled_forward``).
- ``backend="torch"``: the tiled torch path on any device (forward ``attn_lib.flash.tiled_forward``,
  backward ``attn_lib.flash.tiled_backward``).
- ``backend="triton"``: the Triton kernels (``attn_lib/flash/triton/forward.py`` forward,
  ``attn_lib/flash/triton/backward.py`` backward); on CPU tensors without a GPU they run
  under Triton's interpreter (see ``attn_lib.flash.triton.entry``).

``flash_attention`` checks its inputs once, at the door, and calls ``_flash_unchecked``, the
core that the layers call too: no check below it. The autograd Function saves q, k, v, the
output and the log-sum-exp (never the L×S matrix) and recomputes the proportions block by
block in its backward (FlashAttention-2). Gradients of gradients are refused.
"""
from __future__ import annotations

import torch

from . import tiled_forward as _fwd
from . import tiled_backward as _bwd
from ..rules.numerics import OVERFLOW_MESSAGE, raise_if_overflowed, resolve_scale
from ..rules.band import NO_WINDOW
from .triton.entry import (flash_attention_triton, flash_attention_triton_backward, kernel_flags,  # noqa: F401
                            load_kernel, triton_available, triton_backward_core, triton_forward_core,
                            triton_mode_for)
from ..checks import (check_attention_inputs, check_bool, check_choice, check_key_padding_mask, check_triton_inputs,
                        check_window_size)

FLASH_BACKENDS = ("auto", "torch", "triton")  # what flash_attention's backend takes (attn_lib.BACKENDS: the layers')
SECOND_ORDER_MESSAGE = (
    "flash_attention has no second-order gradients (its backward is not differentiable), but "
    "torch.autograd.grad(..., create_graph=True) or a double backward asked for them; "
    "use attn_lib.attention (plain autograd, any order) for gradient penalties and Hessians"
)


def choose_backend(q, backend: str = "auto") -> str:
    """按 backend 参数和 q 所在设备决定用哪条路径：'torch' 或 'triton'。"""
    check_choice("backend", backend, FLASH_BACKENDS)
    if backend == "auto":
        on_cuda = isinstance(q, torch.Tensor) and q.is_cuda
        return "triton" if on_cuda and triton_available() else "torch"
    return backend


def _forward_core(backend: str, q, k, v, is_causal, scale, key_padding_mask, causal_offset, window_size=NO_WINDOW):
    """无检查的前向：返回 (out (B,H,L,Dv), lse (B,H,L))，不检查溢出；k、v 可以只有 H_kv 个头。"""
    if backend == "triton":
        return triton_forward_core(q, k, v, is_causal=is_causal, scale=scale, key_padding_mask=key_padding_mask,
                                   causal_offset=causal_offset, window_size=window_size)
    return _fwd._forward_tiles(q, k, v, key_padding_mask, causal=is_causal, scale=scale,
                               block_m=_fwd.default_block_m(q.shape[1], k.shape[1]), block_n=_fwd.DEFAULT_BLOCK_N,
                               counter=None, causal_offset=causal_offset, window_size=window_size)


def _backward_core(backend: str, q, k, v, out, lse, dout, is_causal, scale, key_padding_mask, causal_offset,
                   window_size=NO_WINDOW):
    """无检查的反向：返回 (dq, dk, dv)，dk、dv 有 k、v 的 H_kv 个头（对组内的查询头求和）。"""
    if backend == "triton":
        return triton_backward_core(q, k, v, out, lse, dout, is_causal=is_causal, scale=scale,
                                    key_padding_mask=key_padding_mask, causal_offset=causal_offset,
                                    window_size=window_size)
    return _bwd._backward_tiles(q, k, v, out, lse, dout, key_padding_mask, causal=is_causal, scale=scale,
                                block_m=_bwd.DEFAULT_BWD_BLOCK_M, block_n=_bwd.DEFAULT_BWD_BLOCK_N,
                                causal_offset=causal_offset, window_size=window_size)


def _checked_forward(backend, q, k, v, is_causal, scale, key_padding_mask, check_overflow, causal_offset, window_size):
    out, lse = _forward_core(backend, q, k, v, is_causal, scale, key_padding_mask, causal_offset, window_size)
    if check_overflow:
        raise_if_overflowed(lse, q.shape[2], k.shape[2], key_padding_mask, is_causal, causal_offset, q.dtype,
                            window_size=window_size)
    return out, lse


class FlashAttentionFunction(torch.autograd.Function):
    """可求导的 FlashAttention：前向存 q、k、v、输出和 lse（从不存 L×S 矩阵），反向按 FlashAttention-2 分块重算。

    ``FlashAttentionFunction.apply(q, k, v, is_causal, scale, key_padding_mask, backend,
    check_overflow, causal_offset, window_size)`` with ``backend`` ``"torch"`` or ``"triton"``
    (already resolved by ``choose_backend``), ``scale`` a float and ``window_size`` a checked
    pair; nothing is checked here. k, v may have H_kv heads (their gradients too). Gradients
    flow to q, k and v only; asking for second-order gradients raises ``RuntimeError``.
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale, key_padding_mask, backend, check_overflow, causal_offset,
                window_size=NO_WINDOW):
        out, lse = _checked_forward(backend, q, k, v, is_causal, scale, key_padding_mask, check_overflow,
                                    causal_offset, window_size)  # (B,H,L,Dv), (B,H,L)
        ctx.save_for_backward(q, k, v, out, lse, key_padding_mask)
        ctx.args = (is_causal, scale, backend, causal_offset, window_size)
        return out

    @staticmethod
    def backward(ctx, dout):
        if torch.is_grad_enabled():  # create_graph=True: the caller wants to differentiate the gradient
            raise RuntimeError(SECOND_ORDER_MESSAGE)
        q, k, v, out, lse, key_padding_mask = ctx.saved_tensors
        is_causal, scale, backend, causal_offset, window_size = ctx.args
        dq, dk, dv = _backward_core(backend, q, k, v, out, lse, dout, is_causal, scale, key_padding_mask,
                                    causal_offset, window_size)
        return dq, dk, dv, None, None, None, None, None, None, None


def _flash_unchecked(q, k, v, *, is_causal: bool, scale: float, key_padding_mask, backend: str,
                     check_overflow: bool, causal_offset: int = 0, window_size=NO_WINDOW):
    """FlashAttention 的无检查内核（调用方已检查全部输入）：返回 out (B, H, L, Dv)，需要时可求导。

    Args:
        q, k, v: (B, H, L, D), (B, H_kv, S, D), (B, H_kv, S, Dv), already checked (H_kv
            divides H: grouped-query attention by shape, K and V never repeated).
        is_causal: with ``causal_offset``: query i sees key j iff ``j <= i + causal_offset``.
        scale: a float (already resolved, e.g. ``1 / sqrt(D)``).
        key_padding_mask: None or bool (B, S), True = key present.
        backend: ``"torch"`` or ``"triton"`` (already resolved).
        check_overflow: check the log-sum-exp for overflow (one reduction and host sync);
            False skips it (no reduction, no host sync).
        causal_offset: 0 is SDPA's top-left ``is_causal``; ``S - L`` is the bottom-right
            alignment of KV-cache decoding (``attn_lib.causal_mask(L, S, align="bottom-right")``).
            It aligns the window too.
        window_size: a checked ``(left, right)``: query i sees key j iff
            ``i + causal_offset - left <= j <= i + causal_offset + right`` (-1: unbounded).

    Returns:
        out (B, H, L, Dv) in q's dtype; differentiable through ``FlashAttentionFunction``
        when grad mode is on and q, k or v requires grad.
    """
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return FlashAttentionFunction.apply(q, k, v, is_causal, scale, key_padding_mask, backend, check_overflow,
                                            causal_offset, window_size)
    out, _ = _checked_forward(backend, q, k, v, is_causal, scale, key_padding_mask, check_overflow, causal_offset,
                              window_size)
    return out


def flash_attention(q, k, v, *, is_causal: bool = False, scale: float | None = None, key_padding_mask=None,
                    backend: str = "auto", check_finite: bool = True, enable_gqa: bool = False,
                    window_size=NO_WINDOW):
    """FlashAttention：与 attn_lib.attention 结果相同，但不存整张分数矩阵；可以求导（对 q、k、v）。

    Args:
        q, k, v: queries (B, H, L, D), keys (B, H_kv, S, D), values (B, H_kv, S, Dv).
        is_causal: query i sees keys 0..i (top-left aligned, as ``attn_lib.causal_mask``).
        scale: multiplies ``q @ kᵀ``; default ``1 / sqrt(D)``. A number (not differentiable).
        key_padding_mask: optional bool (B, S), True = key present (same as
            ``attention(..., mask=key_padding_mask[:, None, None, :])``).
        backend: ``"auto"`` (Triton on CUDA when available, else torch), ``"torch"`` or
            ``"triton"`` (on CPU tensors: Triton's interpreter, slow, for checking).
        check_finite: scan q, k, v for nan / inf before and the log-sum-exp for overflow
            after (default). ``False`` skips both (no host sync); bad input then gives nan.
        enable_gqa: SDPA's meaning: k, v have H_kv heads (H % H_kv == 0), query head h uses
            key/value head ``h // (H // H_kv)``; no path repeats K or V.
        window_size: ``(left, right)``, flash-attn's meaning: query i sees keys
            ``i - left .. i + right`` (-1: unbounded); aligned top-left like ``is_causal``
            (flash-attn aligns bottom-right when L != S). Key blocks outside the window are
            skipped, forward and backward: the cost is O(L·window), not O(L·S).

    Returns:
        Output of shape (B, H, L, Dv) in q's dtype; a query that sees no key gets zeros.
        When grad mode is on and q, k or v requires grad, the output has a ``grad_fn``
        (``FlashAttentionFunction``); a query that sees no key gets zero gradients.

    Raises:
        TypeError: ``scale`` is a tensor that requires grad (not differentiable).
        ValueError: ``key_padding_mask`` requires grad, or a score overflows.
        RuntimeError: second-order gradients are asked for (use ``attn_lib.attention``).
    """
    which = choose_backend(q, backend)
    check_bool("check_finite", check_finite)
    (B, H, L, S, D, Dv), scale = check_attention_inputs(q, k, v, None, scale, check_finite=check_finite,
                                                        enable_gqa=enable_gqa)
    if which == "triton":
        check_triton_inputs(q, k, v)
    window_size = check_window_size(window_size, check_bool("is_causal", is_causal))
    check_key_padding_mask(key_padding_mask, B, S, q.device)
    if which == "triton":
        triton_mode_for(q)
    return _flash_unchecked(q, k, v, is_causal=is_causal, scale=resolve_scale(scale, D),
                            key_padding_mask=key_padding_mask, backend=which, check_overflow=check_finite,
                            window_size=window_size)


__all__ = ["flash_attention", "FlashAttentionFunction", "flash_attention_triton", "flash_attention_triton_backward",
           "choose_backend", "load_kernel", "kernel_flags", "triton_available", "FLASH_BACKENDS", "OVERFLOW_MESSAGE"]
