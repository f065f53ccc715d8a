"""参考实现：缩放点积注意力，全书其他实现都拿它当标准答案（torch 版，支持 float64）。

    attention(q, k, v) = softmax(q @ kᵀ * scale + mask) @ v,   scale = 1 / sqrt(D)

Same semantics as ``torch.nn.functional.scaled_dot_product_attention`` (tested against it)
with two additions: it also returns the post-softmax attention scores for plotting, and it
accepts ``mask`` together with ``is_causal`` (the two are combined: a key is visible only if
both allow it; torch refuses the combination).
"""
from __future__ import annotations

import math

import torch

from ._validate import all_finite, check_bool, check_mask_shape, check_qkv_shapes, check_same_dtype, check_scale
from .masks import causal_mask
from .softmax import softmax

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_attention_inputs(q, k, v, mask=None, scale=None):
    """检查 attention 的全部输入，返回 (B, H, L, S, D, Dv) 和规范化后的 scale。

    Args:
        q, k, v: (B, H, L, D), (B, H, S, D), (B, H, S, Dv) float tensors of one dtype and device.
        mask: None, or a bool / float tensor broadcastable to (B, H, L, S).
        scale: None or a positive finite number.

    Returns:
        ``((B, H, L, S, D, Dv), scale)`` with ``scale`` a float or None.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"{name} must be a torch.Tensor, got {type(t).__name__}; "
                "for numpy arrays use attn_lib.numpy_ref.attention"
            )
        if t.dtype not in _FLOATS:
            raise TypeError(
                f"{name} must be a floating-point tensor (float16/bfloat16/float32/float64), "
                f"got {t.dtype}; convert with {name}.float()"
            )
    check_same_dtype(("q", "k", "v"), (q.dtype, k.dtype, v.dtype))
    devices = {str(q.device), str(k.device), str(v.device)}
    if len(devices) > 1:
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    dims = check_qkv_shapes(q, k, v)
    B, H, L, S, _, _ = dims
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.numel() and not all_finite(t):
            raise ValueError(
                f"{name} contains nan or inf; attention would turn it into nan. "
                "Check the layer that produced it (masks belong in `mask`, not in q/k/v)."
            )
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"mask must be a torch.Tensor or None, got {type(mask).__name__}")
        if mask.dtype != torch.bool and not mask.is_floating_point():
            raise TypeError(
                f"mask must be bool (True = may attend) or float (added to the scores), got {mask.dtype}; "
                "for a 0/1 mask use mask.bool()"
            )
        if str(mask.device) != str(q.device):
            raise ValueError(f"mask is on {mask.device} but q is on {q.device}")
        check_mask_shape(mask, (B, H, L, S))
        if mask.is_floating_point() and mask.numel() and (torch.isnan(mask).any() or torch.isposinf(mask).any()):
            raise ValueError("an additive float mask may contain -inf (hidden) but not nan or +inf")
    return dims, check_scale(scale)


def attention(q, k, v, *, mask=None, is_causal=False, scale=None):
    """缩放点积注意力（参考实现）：返回输出和注意力分数，布局 (B, H, L, D)。

    Args:
        q: queries, shape (B, H, L, D).
        k: keys, shape (B, H, S, D).
        v: values, shape (B, H, S, Dv).
        mask: optional, broadcastable to (B, H, L, S). Bool: True = may attend (as in torch).
            Float: added to the scaled scores (use ``-inf`` to hide a key).
        is_causal: hide keys after each query (top-left aligned, see ``causal_mask``).
        scale: multiplies ``q @ kᵀ``; default ``1 / sqrt(D)``; must be > 0.

    Returns:
        ``(output, scores)``: output (B, H, L, Dv) and the post-softmax attention scores
        (B, H, L, S), both in the input dtype. float16/bfloat16 are computed in float32.
        A query row that may see no key gets all-zero scores and a zero output.
    """
    (B, H, L, S, D, Dv), scale = check_attention_inputs(q, k, v, mask, scale)
    check_bool("is_causal", is_causal)
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    work = q.dtype if q.dtype in (torch.float32, torch.float64) else torch.float32
    qw, kw, vw = q.to(work), k.to(work), v.to(work)
    logits = (qw @ kw.transpose(-2, -1)) * scale  # (B,H,L,D) @ (B,H,D,S) -> (B,H,L,S)
    if mask is not None:
        if mask.dtype == torch.bool:
            logits = logits.masked_fill(~mask, float("-inf"))  # (B,H,L,S), hidden -> -inf
        else:
            logits = logits + mask.to(work)  # (B,H,L,S) + broadcast(mask) -> (B,H,L,S)
    if is_causal:
        logits = logits.masked_fill(~causal_mask(L, S, device=q.device), float("-inf"))  # (B,H,L,S)
    scores = softmax(logits, dim=-1)  # (B,H,L,S), rows sum to 1 (or 0 if fully hidden)
    out = scores @ vw  # (B,H,L,S) @ (B,H,S,Dv) -> (B,H,L,Dv)
    return out.to(q.dtype), scores.to(q.dtype)
