"""第 5、7、10 章的层共用（书中不单独讲）：一套后端名字，一处分派——层检查过输入之后，由这里选一条注意力路径来算。

``BACKENDS`` are the names every layer accepts (``attn_lib.BACKENDS``):

- ``"reference"``: ``attn_lib.core.reference``'s core; the only path that returns the scores;
- ``"sdpa"``: torch's fused ``scaled_dot_product_attention`` with the library's conventions
  (mask and ``is_causal`` combined, a row that sees no key gives zeros, overflow raises);
- ``"torch"`` / ``"triton"``: the tiled FlashAttention paths (``attn_lib.flash.autograd``), key
  padding masks only;
- ``"auto"`` (the layers' default): ``"reference"`` when the scores are asked for, else ``"sdpa"``.

Nothing here checks its input: the layers checked it once, in ``attn_lib.checks.layers``.
Which keys a query sees is one band of diagonals (``attn_lib.rules.band``): with ``is_causal`` query
i sees key j iff ``j <= i + causal_offset`` (0 is torch's top-left ``is_causal``, ``S - L`` the
bottom-right alignment of KV-cache decoding), and ``window_size=(left, right)`` (flash-attn's
meaning, -1 unbounded) adds ``i + causal_offset - left <= j <= i + causal_offset + right``.
k and v may have H_kv heads, H_kv dividing H (grouped-query attention, GQA; MQA is H_kv = 1):
query head h uses key/value head h // (H / H_kv), as SDPA's ``enable_gqa``; no path here
repeats K or V.

KV-cache decode steps (``attend(..., decode=True)``, what ``MultiHeadAttention`` passes with a
``kv_cache``) go through chapter 13's ``attn_lib.flash.decoding`` (FlashDecoding) whenever it computes
exactly what was asked (``decode_backend`` says when): a few queries (at most
``MAX_DECODE_QUERIES``), no mask, no scores, the queries the last L of the keys (causal, or one
query), and a window only for one query whose band holds every key (a rolling cache keeps only
the last ``left`` positions, so after a decode step's append every stored key is in the window).
The layer's ``"auto"`` / ``"sdpa"`` / ``"torch"`` take its tiled torch path on a CPU; on a CUDA
device ``"torch"`` takes it, ``"auto"`` the Triton decode kernels and ``"sdpa"`` keeps torch's fused
kernel; ``"triton"`` takes the Triton decode kernels; ``"reference"`` stays the reference.
"""
from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

from ..flash import decoding as _decoding
from ..flash import autograd as _flash
from ..rules.band import NO_WINDOW, band, band_mask
from ..rules.numerics import overflow_error, work_dtype
from ..core.reference import _attention_core

BACKENDS = ("auto", "reference", "sdpa", "torch", "triton")
MAX_DECODE_QUERIES = 16  # more new queries than this are a prefill: the forward paths parallelise over queries


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


def _triton_decode_ready() -> bool:
    """Triton is installed and the decode kernels (attn_lib.flash.triton.decode) exist (only looked up, not imported)."""
    return _flash.triton_available() and importlib.util.find_spec("attn_lib.flash.triton.decode") is not None


def decode_backend(q, k, mask, *, is_causal: bool, causal_offset: int, window_size, need_weights: bool,
                   backend: str):
    """这一步能否交给 flash_decoding（结果与层要算的完全相同）：能就返回 "torch" 或 "triton"，不能返回 None。

    flash_decoding's rule is: query i sees key j iff ``j <= S - L + i``. That is the layer's band
    when the L queries are the last L positions (``causal_offset == S - L``) and either the layer
    is causal, or L == 1 (one query sees every key); a window changes nothing only for L == 1 with
    ``lo <= 0`` and ``hi >= S - 1`` (every stored key inside it). flash_decoding is forward only:
    a step that autograd must follow (grad mode on, q or k requiring grad) keeps the layer's path.
    """
    L, S = q.shape[2], k.shape[2]
    if need_weights or mask is not None or backend == "reference" or q.numel() == 0:
        return None
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):  # forward only: autograd keeps its path
        return None
    if not 1 <= L <= MAX_DECODE_QUERIES or causal_offset != S - L or not (is_causal or L == 1):
        return None
    if tuple(window_size) != NO_WINDOW:
        lo, hi = band(is_causal, window_size, causal_offset)
        if L != 1 or (lo is not None and lo > 0) or (hi is not None and hi < S - 1):
            return None
    if backend == "triton":
        return "triton" if _triton_decode_ready() else None  # until the kernels exist: the layer's forward kernel
    if q.is_cuda and backend != "torch":  # on a GPU "sdpa" keeps torch's fused kernel; "auto" takes the Triton ones
        fits = q.dtype != torch.float64 and max(q.shape[-1], k.shape[-1]) <= 256
        return "triton" if backend == "auto" and fits and _triton_decode_ready() else None
    return "torch"  # a CPU (any device but CUDA): "auto", "sdpa" and "torch" take the tiled torch decode path


def attend(q, k, v, mask, *, is_causal: bool, scale: float, need_weights: bool, backend: str, check_finite: bool,
           causal_offset: int = 0, window_size=NO_WINDOW, decode: bool = False):
    """层内部用的注意力（输入已检查过）：返回（输出 (B, H, L, Dv)，分数 (B, H, L, S) 或 None）。

    Args:
        q, k, v: (B, H, L, D), (B, H_kv, S, D), (B, H_kv, S, Dv), checked; H_kv divides H.
        mask: None or a 4-D bool / additive float mask broadcastable to (B, H, L, S)
            (``layer_mask``); a bool (B or 1, 1, 1, S) key padding mask for "torch" / "triton".
        is_causal, causal_offset, window_size: the band of visible keys (module docstring).
        scale: the score scale (a float).
        need_weights: also return the scores (only "reference" and "auto" have them).
        backend: a name from ``BACKENDS``.
        check_finite: raise the overflow error when a score overflows (the inputs were
            scanned for nan / inf at the door).
        decode: a KV-cache step (k, v: the cached keys and the new ones): use
            ``attn_lib.flash.decoding`` where ``decode_backend`` allows it.
    """
    window_size = tuple(window_size)
    if decode:
        which = decode_backend(q, k, mask, is_causal=is_causal, causal_offset=causal_offset, window_size=window_size,
                               need_weights=need_weights, backend=backend)
        if which is not None:
            out = _decoding._decode_unchecked(q, k, v, seqlens=None, num_splits=None, scale=scale, backend=which,
                                              check_overflow=check_finite)  # (B,H,L,Dv)
            return out, None
    if backend == "auto":
        backend = "reference" if need_weights else "sdpa"
    if backend == "reference" or q.numel() == 0 or k.shape[2] == 0:
        return _reference(q, k, v, mask, is_causal, causal_offset, window_size, scale, check_finite, need_weights)
    if backend == "sdpa":
        return _sdpa(q, k, v, mask, is_causal, causal_offset, window_size, scale, check_finite), None
    B, S = q.shape[0], k.shape[2]
    padding = None if mask is None else mask[:, 0, 0, :].expand(B, S)  # (B or 1,1,1,S) -> (B,S)
    out = _flash._flash_unchecked(q, k, v, is_causal=is_causal, scale=scale, key_padding_mask=padding, backend=backend,
                                  check_overflow=check_finite, causal_offset=causal_offset,
                                  window_size=window_size)  # (B,H,L,Dv)
    return out, None


def _reference(q, k, v, mask, is_causal, causal_offset, window_size, scale, check_finite, need_weights):
    B, H, L, _ = q.shape
    S, Dv = k.shape[2], v.shape[3]
    if B * H * L == 0:  # no query at all: nothing to compute (and nothing to reduce over)
        out = q.new_zeros(B, H, L, Dv)  # (B,H,L,Dv)
        return out, (q.new_zeros(B, H, L, S) if need_weights else None)  # (B,H,L,S)
    out, scores = _attention_core(q, k, v, mask, is_causal, scale, check_overflow=check_finite,
                                  window_size=window_size, offset=causal_offset)  # (B,H,L,Dv), (B,H,L,S)
    return out, (scores if need_weights else None)


def _may_overflow(q, k, scale: float) -> bool:
    """Whether q·k or scale·q·k could leave the working dtype's range: |q·k| <= D·max|q|·max|k|.

    The reference multiplies by the scale after the product, so with scale < 1 the product itself may
    overflow; SDPA's kernels may fold the scale in first and not overflow. Either way the reference decides.
    """
    q_max, k_max = torch.stack([q.abs().amax(), k.abs().amax()]).double().tolist()  # one host sync
    return max(scale, 1.0) * q.shape[-1] * q_max * k_max >= torch.finfo(work_dtype(q.dtype)).max


def _sdpa(q, k, v, mask, is_causal, causal_offset, window_size, scale, check_finite):
    """torch's fused attention with the reference's conventions; the reference core where it could overflow.

    GQA through SDPA's own ``enable_gqa``; a window (SDPA has none) and a shifted or masked
    causal rule (torch refuses mask + is_causal) as one explicit band mask combined with ``mask``.
    """
    L, S = q.shape[2], k.shape[2]
    if check_finite and _may_overflow(q, k, scale):  # the reference core raises exactly as `attention` does
        return _reference(q, k, v, mask, is_causal, causal_offset, window_size, scale, True, False)[0]
    if window_size != NO_WINDOW or (is_causal and (mask is not None or causal_offset)):
        lo, hi = band(is_causal, window_size, causal_offset)
        mask = _with_band(mask, band_mask(L, S, lo, hi, q.device))  # -> broadcasts to (B,H,L,S)
        is_causal = False
    dtype = q.dtype
    if mask is not None and mask.is_floating_point() and work_dtype(dtype) != dtype:
        # a float mask is added in the working dtype, as in the reference (in fp16 -1e9 would become -inf)
        q, k, v, mask = q.to(work_dtype(dtype)), k.to(work_dtype(dtype)), v.to(work_dtype(dtype)), mask.float()
    elif mask is not None and mask.is_floating_point():
        mask = mask.to(dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, is_causal=is_causal,
                                         enable_gqa=k.shape[1] != q.shape[1])  # (B,H,L,Dv)
    if mask is not None:  # rows that see no key: zeros (torch leaves nan there)
        dead = ~mask.any(-1, keepdim=True) if mask.dtype == torch.bool else \
            torch.isneginf(mask).all(-1, keepdim=True)  # (..,L or 1,1)
        if bool(dead.any()):
            out = out.masked_fill(dead, 0.0)  # (B,H,L,Dv)
    # An overflowing score makes its whole softmax row nan, and so every entry of that output
    # row: one entry per row tells (a strided read, not a scan of the output).
    if check_finite and out.numel() and bool(torch.isnan(out[..., 0]).any()):
        raise overflow_error(work_dtype(dtype))
    return out.to(dtype)  # (B,H,L,Dv)
