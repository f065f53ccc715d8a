"""第 8、9、12 章（FlashAttention 的可求导入口：第 8 章前向、第 9 章反向、第 12 章的窗口）：按设备在纯 torch 分块实现和 Triton 核函数之间选一个，结果与 attn_lib.attention 相同。

``flash_attention(q, k, v, is_causal=..., scale=..., key_mask=..., backend=..., enable_gqa=...,
window_size=..., align=...)``: grouped-query attention and sliding windows (chapter 12) on both
paths, forward and backward.

- ``backend="auto"``: the Triton kernels when q is on a CUDA device, Triton is importable
  and the kernels take the inputs (not float64, head dims up to 256), otherwise the tiled
  torch path (``attn_lib.flash.tiled_forward``).
- ``backend="torch"``: the tiled torch path on any device (forward ``attn_lib.flash.tiled_forward``,
  backward ``attn_lib.flash.tiled_backward``).
- ``backend="triton"``: the Triton kernels (``attn_lib/flash/triton/forward.py`` forward,
  ``attn_lib/flash/triton/backward.py`` backward); on CPU tensors without a GPU they run
  under Triton's interpreter (``attn_lib.device``).

``flash_attention`` checks its inputs once, at the door (``attn_lib.checks.doors.check_flash_call``),
and calls ``flash_core(q, k, v, settings)``, the core that the layers reach too: no check below
it. The autograd Function takes ``(q, k, v, settings)``, saves q, k, v, the output and the
log-sum-exp (never the L×S matrix) and recomputes the proportions block by block in its backward
(FlashAttention-2). Gradients of gradients are refused.
"""
from __future__ import annotations

import torch

from ..checks.doors import check_flash_call
from ..device import triton_interprets
from ..rules.names import FLASH_BACKENDS, NO_WINDOW
from ..rules.numerics import autocast_off
from ..rules.settings import AttentionSettings, Options, raise_if_overflowed
from . import tiled_backward, tiled_forward
from .triton.entry import triton_backward, triton_forward

SECOND_ORDER_MESSAGE = (
    "flash_attention has no second-order gradients (its backward is not differentiable), but "
    "torch.autograd.grad(..., create_graph=True) or a double backward asked for them; "
    "use attn_lib.attention (plain autograd, any order) for gradient penalties and Hessians"
)


def forward_any(q, k, v, settings: AttentionSettings):
    """无检查的前向，settings.backend 选路径（"torch" 或 "triton"）：返回 (out (B,H,L,Dv), lse (B,H,L))，不查溢出。"""
    if settings.backend == "triton":
        return triton_forward(q, k, v, settings)
    return tiled_forward.forward_core(q, k, v, settings)


def backward_any(q, k, v, saved, settings: AttentionSettings):
    """无检查的反向：saved = (out, lse, dout)；返回 (dq, dk, dv)，dk、dv 有 k、v 的 H_kv 个头（对组内的查询头求和）。"""
    if settings.backend == "triton":
        return triton_backward(q, k, v, saved, settings)
    return tiled_backward.backward_core(q, k, v, saved, settings)


def checked_forward(q, k, v, settings: AttentionSettings):
    """forward_any, then the overflow rule when ``settings.check_overflow``: returns (out, lse)."""
    out, lse = forward_any(q, k, v, settings)  # (B,H,L,Dv), (B,H,L)
    if settings.check_overflow:
        raise_if_overflowed(lse, q.shape[2], k.shape[2], settings)
    return out, lse


class FlashAttentionFunction(torch.autograd.Function):
    """可求导的 FlashAttention：前向存 q、k、v、输出和 lse（从不存 L×S 矩阵），反向按 FlashAttention-2 分块重算。

    ``FlashAttentionFunction.apply(q, k, v, settings)`` with ``settings`` an
    ``AttentionSettings`` whose ``backend`` is ``"torch"`` or ``"triton"``; nothing is checked
    here. k, v may have H_kv heads (their gradients too). Gradients flow to q, k and v only;
    asking for second-order gradients raises ``RuntimeError``.
    """

    @staticmethod
    def forward(ctx, q, k, v, settings):
        out, lse = checked_forward(q, k, v, settings)  # (B,H,L,Dv), (B,H,L)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.settings = settings
        return out

    @staticmethod
    def backward(ctx, dout):
        if torch.is_grad_enabled():  # create_graph=True: the caller wants to differentiate the gradient
            raise RuntimeError(SECOND_ORDER_MESSAGE)
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = backward_any(q, k, v, (out, lse, dout), ctx.settings)
        return dq, dk, dv, None


def flash_core(q, k, v, settings: AttentionSettings):
    """FlashAttention 的无检查内核（调用方已检查全部输入）：返回 out (B, H, L, Dv)，需要时可求导。

    Args:
        q, k, v: (B, H, L, D), (B, H_kv, S, D), (B, H_kv, S, Dv), already checked (H_kv
            divides H: grouped-query attention by shape, K and V never repeated).
        settings: the resolved ``AttentionSettings`` (``backend`` "torch" or "triton"; the band
            holds the causal rule, the window and the alignment; ``check_overflow`` costs one
            reduction and host sync).

    Returns:
        out (B, H, L, Dv) in q's dtype; differentiable through ``FlashAttentionFunction``
        when grad mode is on and q, k or v requires grad.
    """
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return FlashAttentionFunction.apply(q, k, v, settings)
    return checked_forward(q, k, v, settings)[0]


def flash_attention(q, k, v, *, is_causal: bool = False, scale: float | None = None, key_mask=None,
                    backend: str = "auto", check_finite: bool = True, enable_gqa: bool = False,
                    window_size=NO_WINDOW, align: str = "top-left"):
    """FlashAttention：与 attn_lib.attention 结果相同，但不存整张评分矩阵；可以求导（对 q、k、v）。

    Args:
        q, k, v: queries (B, H, L, D), keys (B, H_kv, S, D), values (B, H_kv, S, Dv).
        is_causal, scale, enable_gqa, window_size, align: as in ``attn_lib.attention``
            (``align="bottom-right"`` is flash-attn's rule for ``causal`` and ``window_size``);
            key blocks outside the band are skipped, forward and backward: a window of w keys
            costs O(L·w), not O(L·S).
        key_mask: optional bool (B, S), True = key present (the same as
            ``attention(..., mask=key_mask[:, None, None, :])``; the opposite polarity of
            ``torch.nn.MultiheadAttention``'s ``key_padding_mask``, which marks padding).
        backend: ``"auto"`` (Triton on CUDA when Triton is installed and its kernels take the dtype
            and head dims, else torch), ``"torch"`` or
            ``"triton"`` (on CPU tensors: Triton's interpreter, slow, for checking).
        check_finite: scan q, k, v for nan / inf before and the log-sum-exp for overflow
            after (default). ``False`` skips both checks and their host syncs; bad input then gives nan.

    Returns:
        Output of shape (B, H, L, Dv) in q's dtype; a query that sees no key gets zeros.
        When grad mode is on and q, k or v requires grad, the output has a ``grad_fn``
        (``FlashAttentionFunction``); a query that sees no key gets zero gradients.

    Raises:
        TypeError: ``scale`` is a tensor that requires grad (not differentiable).
        ValueError: ``key_mask`` requires grad, or a score overflows.
        RuntimeError: second-order gradients are asked for (use ``attn_lib.attention``).
    """
    options = Options(is_causal=is_causal, scale=scale, window_size=window_size, align=align, enable_gqa=enable_gqa,
                      check_finite=check_finite, key_mask=key_mask, backend=backend)
    settings = check_flash_call(q, k, v, options, triton_interprets)
    with autocast_off(q.device):
        return flash_core(q, k, v, settings)


__all__ = ["flash_attention", "flash_core", "FlashAttentionFunction", "forward_any", "backward_any",
           "checked_forward", "FLASH_BACKENDS", "SECOND_ORDER_MESSAGE"]
