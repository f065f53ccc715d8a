"""第 5–7、10–13 章的层共用：一套后端名字，一处分派——层的门检查过输入、解析好设置之后，由这里选一条注意力路径来算。

``attn_lib.BACKENDS`` are the names every layer accepts:

- ``"reference"``: ``attn_lib.core.reference``'s core; the only path that returns the scores;
- ``"sdpa"``: torch's fused ``scaled_dot_product_attention`` with the library's conventions
  (mask and ``is_causal`` combined, a row that sees no key gives zeros, overflow raises);
- ``"torch"`` / ``"triton"``: the tiled FlashAttention paths (``attn_lib.flash.autograd``), key
  padding masks only;
- ``"auto"`` (the layers' default): ``"reference"`` when the scores are asked for, else ``"sdpa"``.

Nothing here checks its input: the layer's door did (``attn_lib.checks.layers``) and handed over
the call's ``AttentionSettings``, whose band says which keys a query sees (the causal rule, the
window and the alignment; bottom-right when the layer decodes with a KV cache). k and v may
have H_kv heads, H_kv dividing H (grouped-query attention, GQA; MQA is H_kv = 1): query head h
uses key/value head h // (H / H_kv), as SDPA's ``enable_gqa``; no path here repeats K or V.

KV-cache decode steps (``attend(..., decode=True)``) go through chapter 13's
``attn_lib.flash.decoding`` (FlashDecoding) whenever it computes exactly what was asked
(``decode_backend`` says when): a few queries (at most ``MAX_DECODE_QUERIES``), no mask, no
scores, no autograd, and a band that is flash_decoding's own (every key, or the bottom-right
causal rule). The layer's ``"auto"`` / ``"sdpa"`` / ``"torch"`` take its tiled torch path on a
CPU; on a CUDA device ``"torch"`` takes it, ``"auto"`` the Triton decode kernels and ``"sdpa"``
keeps torch's fused kernel; ``"triton"`` takes the Triton decode kernels; ``"reference"`` stays
the reference.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.reference import attention_core
from ..flash.autograd import flash_core
from ..flash.decoding import decode_core
from ..rules.band import Band
from ..rules.names import MAX_DECODE_QUERIES, MAX_HEAD_DIM, triton_available
from ..rules.numerics import autocast_off, overflow_error
from ..rules.settings import AttentionSettings, DecodeSettings


def layer_mask(mask):
    """A checked layer mask as a 4-D tensor that broadcasts to (B, H, L, S); 3-D means (B, L, S)."""
    if mask is None:
        return None
    if mask.ndim == 3:
        return mask.unsqueeze(1)  # (B,L,S) -> (B,1,L,S): the same for every head
    return mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))  # (S,) or (L,S) -> (1,1,L,S) etc.


def _with_band(mask, keep):
    """mask combined with the band ``keep`` (bool (L, S), True = visible)."""
    if mask is None:
        return keep
    if mask.dtype == torch.bool:
        return mask & keep  # broadcast(mask) & (L,S)
    return mask.masked_fill(~keep, float("-inf"))  # broadcast(mask) -> (..,L,S), hidden -> -inf


def decode_backend(q, k, mask, settings: AttentionSettings, need_weights: bool):
    """这一步能否交给 flash_decoding（结果与层要算的完全相同）：能就返回 (backend, is_causal)，backend 是 "torch" 或 "triton"，不能返回 None。

    flash_decoding's rule is: with ``is_causal`` query i sees key j iff ``j <= S - L + i``, without
    it every key. That is the layer's step when its band is one of these two (a window changes
    nothing once a rolling cache holds only the keys inside it). flash_decoding is forward only:
    a step that autograd must follow (grad mode on, q or k requiring grad) keeps the layer's path.
    """
    (L, S), backend = (q.shape[2], k.shape[2]), settings.backend
    if need_weights or mask is not None or backend == "reference" or q.numel() == 0:
        return None
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):  # forward only: autograd keeps its path
        return None
    causal = Band.resolve(L, S, is_causal=True, offset=S - L)
    if not 1 <= L <= MAX_DECODE_QUERIES or settings.band not in (causal, Band()):
        return None
    is_causal = settings.band == causal and not causal.full
    if backend == "triton":
        return ("triton", is_causal) if triton_available() else None
    if q.is_cuda and backend != "torch":  # on a GPU "sdpa" keeps torch's fused kernel; "auto" takes the Triton ones
        fits = q.dtype != torch.float64 and max(q.shape[-1], k.shape[-1]) <= MAX_HEAD_DIM
        return ("triton", is_causal) if backend == "auto" and fits and triton_available() else None
    return "torch", is_causal  # a CPU (any device but CUDA): "auto", "sdpa" and "torch" take the tiled torch decode path


def attend(q, k, v, mask, settings: AttentionSettings, *, need_weights: bool = False, decode: bool = False):
    """层内部用的注意力（输入已检查过）：返回（输出 (B, H, L, Dv)，注意力分数 (B, H, L, S) 或 None）。

    Args:
        q, k, v: (B, H, L, D), (B, H_kv, S, D), (B, H_kv, S, Dv), checked; H_kv divides H.
        mask: None or a 4-D bool / additive float mask broadcastable to (B, H, L, S)
            (``layer_mask``); a bool (B or 1, 1, 1, S) key padding mask for "torch" / "triton".
        settings: the call's settings from the layer's door (band, scale, working dtype,
            overflow check, the layer's backend).
        need_weights: also return the scores (only "reference" and "auto" have them).
        decode: a KV-cache step (k, v: the cached keys and the new ones): use
            ``attn_lib.flash.decoding`` where ``decode_backend`` allows it.
    """
    with autocast_off(q.device):  # every path keeps its own precision (the projections ran under autocast)
        if decode:
            which = decode_backend(q, k, mask, settings, need_weights)
            if which is not None:
                step = DecodeSettings(scale=settings.scale, work_dtype=settings.work_dtype, is_causal=which[1],
                                      check_overflow=settings.check_overflow, backend=which[0])
                return decode_core(q, k, v, step), None  # (B,H,L,Dv)
        backend = settings.backend
        if backend == "auto":
            backend = "reference" if need_weights else "sdpa"
        if backend == "reference" or q.numel() == 0 or k.shape[2] == 0:
            out, scores = attention_core(q, k, v, mask, settings)  # (B,H,L,Dv), (B,H,L,S)
            return out, (scores if need_weights else None)
        if backend == "sdpa":
            return _sdpa(q, k, v, mask, settings), None
        B, S = q.shape[0], k.shape[2]
        padding = None if mask is None else mask[:, 0, 0, :].expand(B, S)  # (B or 1,1,1,S) -> (B,S)
        return flash_core(q, k, v, settings.replace(key_mask=padding, backend=backend)), None  # (B,H,L,Dv)


def _may_overflow(q, k, scale: float, work) -> bool:
    """Whether q·k or scale·q·k could leave the working dtype's range: |q·k| <= D·max|q|·max|k|.

    The reference multiplies by the scale after the product, so with scale < 1 the product itself may
    overflow; SDPA's kernels may fold the scale in first and not overflow. Either way the reference decides.
    """
    q_max, k_max = torch.stack([q.abs().amax(), k.abs().amax()]).double().tolist()  # one host sync
    return max(scale, 1.0) * q.shape[-1] * q_max * k_max >= torch.finfo(work).max


def _sdpa(q, k, v, mask, settings: AttentionSettings):
    """torch's fused attention with the reference's conventions; the reference core where it could overflow.

    GQA through SDPA's own ``enable_gqa``; a window, a bottom-right alignment or a masked causal
    rule (SDPA has no window, and documents mask + is_causal as an error: its math backend raises)
    as one explicit band mask combined with ``mask``; a plain top-left causal band as SDPA's ``is_causal``.
    """
    (L, S), band, work = (q.shape[2], k.shape[2]), settings.band, settings.work_dtype
    if settings.check_overflow and _may_overflow(q, k, settings.scale, work):  # the reference raises exactly
        return attention_core(q, k, v, mask, settings)[0]
    is_causal = mask is None and band == Band(None, 0)  # top-left causal: SDPA's own is_causal
    if not band.full and not is_causal:
        mask = _with_band(mask, band.mask(L, S, q.device))  # -> broadcasts to (B,H,L,S)
    dtype = q.dtype
    if mask is not None and mask.is_floating_point() and work != dtype:
        # a float mask is added in the working dtype, as in the reference (in fp16 -1e9 would become -inf)
        q, k, v, mask = q.to(work), k.to(work), v.to(work), mask.float()
    elif mask is not None and mask.is_floating_point():
        mask = mask.to(dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=settings.scale, is_causal=is_causal,
                                         enable_gqa=k.shape[1] != q.shape[1])  # (B,H,L,Dv)
    if mask is not None:  # rows that see no key: zeros (torch before 2.5 gave nan there)
        dead = ~mask.any(-1, keepdim=True) if mask.dtype == torch.bool else \
            torch.isneginf(mask).all(-1, keepdim=True)  # (..,L or 1,1)
        if bool(dead.any()):
            out = out.masked_fill(dead, 0.0)  # (B,H,L,Dv)
    # An overflowing score makes its whole softmax row nan, and so every entry of that output
    # row: one entry per row tells (a strided read, not a scan of the output).
    if settings.check_overflow and out.numel() and bool(torch.isnan(out[..., 0]).any()):
        raise overflow_error(work, "±inf")
    return out.to(dtype)  # (B,H,L,Dv)


__all__ = ["attend", "decode_backend", "layer_mask"]
