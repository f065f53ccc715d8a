"""第 5 章起全书共用（第 5–8、11 章）：参考实现，缩放点积注意力，全书其他实现都拿它当标准答案（torch 版，支持 float64）。

    attention(q, k, v) = softmax(q @ kᵀ * scale + mask) @ v,   scale = 1 / sqrt(D)

Same semantics as ``torch.nn.functional.scaled_dot_product_attention`` (tested against it)
with two additions: it also returns the post-softmax attention scores for plotting, and it
accepts ``mask`` together with ``is_causal`` (the two are combined: a key is visible only if
both allow it; torch refuses the combination).

``attention`` checks its inputs once and calls ``_attention_core``, which checks nothing;
the layers (``SelfAttention``, ``MultiHeadAttention``) check their own inputs once and call
the core directly. Scores that overflow to +inf in the working dtype raise ``ValueError``
("attention scores overflowed to +inf ..."), the rule every path follows.
"""
from __future__ import annotations

import torch

from ._numerics import overflow_error, resolve_scale, work_dtype
from ._validate import check_attention_inputs, check_bool, check_mask  # noqa: F401  (check_mask: the layers)
from .masks import causal_mask
from .stable_softmax import softmax_with_max


def attention(q, k, v, *, mask=None, is_causal=False, scale=None, check_finite=True):
    """缩放点积注意力（参考实现）：返回输出和注意力分数，布局 (B, H, L, D)。

    Args:
        q: queries, shape (B, H, L, D).
        k: keys, shape (B, H, S, D).
        v: values, shape (B, H, S, Dv).
        mask: optional, 2-D (L, S) or 4-D, broadcastable to (B, H, L, S). Bool: True = may
            attend (as in torch). Float: added to the scaled scores (use ``-inf`` to hide a
            key). A 3-D mask is refused (it would broadcast as (H, L, S)): use
            ``mask.unsqueeze(1)`` for one pattern per sequence, ``mask[None]`` for one per head.
        is_causal: hide keys after each query (top-left aligned, see ``causal_mask``).
        scale: multiplies ``q @ kᵀ``; default ``1 / sqrt(D)``; must be a number > 0 (not a
            tensor that requires grad: scale is not differentiable).
        check_finite: scan q, k, v for nan / inf before, and the scores for overflow after
            (default). ``False`` skips both (no host sync on CUDA); bad input then gives nan.

    Returns:
        ``(output, scores)``: output (B, H, L, Dv) and the post-softmax attention scores
        (B, H, L, S), both in the input dtype. float16/bfloat16 are computed in float32.
        A query row that may see no key gets all-zero scores and a zero output.

    Raises:
        ValueError: "attention scores overflowed to +inf ..." when ``scale·q·k`` exceeds the
            working dtype's range (and ``check_finite`` is on).
    """
    (B, H, L, S, D, Dv), scale = check_attention_inputs(q, k, v, mask, scale, check_finite=check_finite,
                                                        refuse_3d_mask=True)
    check_bool("is_causal", is_causal)
    return _attention_core(q, k, v, mask, is_causal, resolve_scale(scale, D), check_overflow=check_finite)


def _masked(logits, mask, is_causal: bool):
    """Hide what the mask and the causal rule hide: -inf there (bool mask) or + the additive mask."""
    L, S = logits.shape[-2], logits.shape[-1]
    if mask is not None:
        if mask.dtype == torch.bool:
            logits = logits.masked_fill(~mask, float("-inf"))  # (B,H,L,S), hidden -> -inf
        else:
            logits = logits + mask.to(logits.dtype)  # (B,H,L,S) + broadcast(mask) -> (B,H,L,S)
    if is_causal:
        logits = logits.masked_fill(~causal_mask(L, S, device=logits.device), float("-inf"))  # (B,H,L,S)
    return logits


def _attention_core(q, k, v, mask, is_causal: bool, scale: float, *, check_overflow: bool):
    """attention 的无检查内核：输入已检查过（形状、精度、掩码），scale 已是 float。返回（输出，分数）。"""
    S = k.shape[-2]
    work = work_dtype(q.dtype)
    qw, kw, vw = q.to(work), k.to(work), v.to(work)
    raw = (qw @ kw.transpose(-2, -1)) * scale  # (B,H,L,D) @ (B,H,D,S) -> (B,H,L,S)
    logits = _masked(raw, mask, is_causal)  # (B,H,L,S), hidden -> -inf
    if S:
        m = logits.amax(-1, keepdim=True)  # (B,H,L,S) -> (B,H,L,1); -inf: the row sees no key
    else:  # no keys at all: every row sees nothing
        m = logits.new_full((*logits.shape[:-1], 1), float("-inf"))  # (B,H,L,1)
    if check_overflow and m.numel():
        if not bool(torch.isfinite(m).logical_or(torch.isneginf(m)).all()):
            raise overflow_error(work)  # +inf (or inf - inf = nan) in a row that sees a key
        if bool(torch.isneginf(m).any()) and bool(torch.isinf(raw).any()):
            # a row max of -inf: the row sees no key (fine) or its visible scores overflowed to -inf
            visible = torch.isfinite(_masked(torch.zeros_like(raw), mask, is_causal))  # (B,H,L,S)
            if bool((torch.isinf(raw) & visible).any()):
                raise overflow_error(work)
    scores = softmax_with_max(logits, m, logits.ndim - 1)  # (B,H,L,S), rows sum to 1 (or 0 if fully hidden)
    out = scores @ vw  # (B,H,L,S) @ (B,H,S,Dv) -> (B,H,L,Dv)
    return out.to(q.dtype), scores.to(q.dtype)
