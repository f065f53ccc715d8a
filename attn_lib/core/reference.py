"""第 1、3–13 章共用（第 5 章讲它）：参考实现，缩放点积注意力，全书其他实现都拿它当标准答案（torch 版，支持 float64）。

    attention(q, k, v) = softmax(q @ kᵀ * scale + mask) @ v,   scale = 1 / sqrt(D)

Same semantics as ``torch.nn.functional.scaled_dot_product_attention`` (tested against it)
with two additions: it also returns the post-softmax attention scores for plotting, and it
accepts ``mask`` together with ``is_causal`` (the two are combined: a key is visible only if
both allow it; SDPA's documentation refuses the combination). Grouped-query attention (``enable_gqa``, SDPA's
meaning) and sliding windows (``window_size``, flash-attn's meaning) are chapter 12's: k and v
may have H_kv heads, and a band of diagonals (``attn_lib.rules.band``) joins the causal rule,
the window and the alignment (``align``: "top-left" as SDPA's ``is_causal``, "bottom-right" as
flash-attn's). K and V are never repeated: q is viewed as (B, H_kv, G·L, D), G = H / H_kv,
so that one product serves a whole group.

``attention`` checks its inputs once (``attn_lib.checks.doors.check_attention_call``) and calls
``attention_core``, which checks nothing; the layers check their own inputs once and reach the
core through ``attn_lib.layers.dispatch``. Scores that overflow in the working dtype raise
``ValueError`` ("attention scores overflowed to +inf ..."), the rule every path follows.
"""
from __future__ import annotations

import torch

from ..checks.doors import check_attention_call
from ..rules.band import Band
from ..rules.names import NO_WINDOW
from ..rules.numerics import autocast_off, overflow_error
from ..rules.settings import AttentionSettings, Options
from .softmax import softmax_with_max


def attention(q, k, v, *, mask=None, is_causal=False, scale=None, check_finite=True, enable_gqa=False,
              window_size=NO_WINDOW, align="top-left"):
    """缩放点积注意力（参考实现）：返回输出和注意力分数，布局 (B, H, L, D)；支持分组查询（GQA）和滑动窗口。

    Args:
        q: queries, shape (B, H, L, D).
        k: keys, shape (B, H_kv, S, D); H_kv = H unless ``enable_gqa``.
        v: values, shape (B, H_kv, S, Dv).
        mask: optional, 2-D (L, S) or 4-D, broadcastable to (B, H, L, S). Bool: True = may
            attend (as in torch). Float: added to the scaled scores (use ``-inf`` to hide a
            key). A 3-D mask is refused (it would broadcast as (H, L, S)): use
            ``mask.unsqueeze(1)`` for one pattern per sequence, ``mask[None]`` for one per head.
        is_causal: hide keys after each query (aligned as ``align`` says).
        scale: multiplies ``q @ kᵀ``; default ``1 / sqrt(D)``; must be a number > 0 (not a
            tensor that requires grad: scale is not differentiable).
        check_finite: scan q, k, v for nan / inf before, and the scores for overflow after
            (default). ``False`` skips both checks and their host syncs on CUDA; bad input then gives nan.
        enable_gqa: SDPA's meaning: k, v have H_kv heads, H % H_kv == 0, and query head h
            uses key/value head ``h // (H // H_kv)`` (MQA: H_kv = 1).
        window_size: None or ``(left, right)``, flash-attn's meaning: query i sees key j iff
            ``i + o - left <= j <= i + o + right`` (o: the alignment's offset below); -1 =
            unbounded on that side; with ``is_causal`` right must be 0 or -1.
        align: ``"top-left"`` (default, SDPA's ``is_causal``: o = 0, query i sees keys up to i)
            or ``"bottom-right"`` (flash-attn's ``causal`` and ``window_size``: o = S - L, the
            queries are the last L positions). The two differ only when L != S.

    Returns:
        ``(output, scores)``: output (B, H, L, Dv) and the post-softmax attention scores
        (B, H, L, S), both in the input dtype. float16/bfloat16 are computed in float32.
        A query row that may see no key gets all-zero scores and a zero output.

    Raises:
        ValueError: "attention scores overflowed to +inf ..." (or "-inf") when ``scale·q·k``
            exceeds the working dtype's range (and ``check_finite`` is on).
    """
    settings = check_attention_call(q, k, v, mask, Options(is_causal=is_causal, scale=scale, window_size=window_size,
                                                           align=align, enable_gqa=enable_gqa,
                                                           check_finite=check_finite))
    with autocast_off(q.device):  # the core keeps its own precision
        return attention_core(q, k, v, mask, settings)


def masked_scores(logits, mask, band: Band):
    """盖住掩码和带之外的评分：布尔掩码处填 -inf，浮点掩码加上去；返回 (B, H, L, S)。"""
    L, S = logits.shape[-2], logits.shape[-1]
    if mask is not None:
        if mask.dtype == torch.bool:
            logits = logits.masked_fill(~mask, float("-inf"))  # (B,H,L,S), hidden -> -inf
        else:
            add = mask.to(logits.dtype)
            # -inf hides a key whatever its score, as a bool mask does (+inf + -inf would be nan)
            logits = (logits + add).masked_fill(torch.isneginf(add), float("-inf"))  # (B,H,L,S)
    if not band.full:
        logits = logits.masked_fill(~band.mask(L, S, device=logits.device), float("-inf"))  # (B,H,L,S)
    return logits


def _check_overflow(raw, logits, m, mask, band: Band, work) -> None:
    """A row max of +inf or nan overflowed upwards; a row max of -inf overflowed downwards if the row sees a key."""
    if not bool(torch.isfinite(m).logical_or(torch.isneginf(m)).all()):
        raise overflow_error(work, "+inf")  # +inf (or inf - inf = nan) in a row that sees a key
    dead = torch.isneginf(m)  # (B,H,L,1): the row sees no key, or its visible scores overflowed to -inf
    if bool(dead.any()) and bool(torch.isinf(raw).any()):
        visible = torch.isfinite(masked_scores(torch.zeros_like(raw), mask, band))  # (B,H,L,S)
        if bool((torch.isinf(raw) & visible & dead).any()):  # only in such a row: elsewhere -inf weighs 0
            raise overflow_error(work, "-inf")


def attention_core(q, k, v, mask, settings: AttentionSettings):
    """attention 的无检查内核：输入已检查过，settings 已解析。返回（输出 (B,H,L,Dv)，注意力分数 (B,H,L,S)）。

    k, v may have H_kv heads (H_kv divides H): q is viewed as (B, H_kv, G·L, D), so K and V
    are never repeated. ``settings.band`` holds the causal rule, the window and the alignment.
    """
    (B, H, L, D), (Hkv, S), Dv = q.shape, k.shape[1:3], v.shape[-1]
    if B * H * L == 0:  # no query at all: nothing to compute (and nothing to reduce over)
        return q.new_zeros(B, H, L, Dv), q.new_zeros(B, H, L, S)  # (B,H,L,Dv), (B,H,L,S)
    GL = (H // Hkv) * L  # queries per key/value head: the group's G heads of L queries
    work = settings.work_dtype
    qw, kw, vw = q.to(work), k.to(work), v.to(work)
    qg = qw.reshape(B, Hkv, GL, D)  # (B,H,L,D) -> (B,H_kv,G*L,D), a view of the groups
    raw = (qg @ kw.transpose(-2, -1)).view(B, H, L, S) * settings.scale  # (B,H_kv,G*L,D) @ (B,H_kv,D,S) -> (B,H,L,S)
    logits = masked_scores(raw, mask, settings.band)  # (B,H,L,S), hidden -> -inf
    if S:
        m = logits.amax(-1, keepdim=True)  # (B,H,L,S) -> (B,H,L,1); -inf: the row sees no key
    else:  # no keys at all: every row sees nothing
        m = logits.new_full((*logits.shape[:-1], 1), float("-inf"))  # (B,H,L,1)
    if settings.check_overflow:
        _check_overflow(raw, logits, m, mask, settings.band, work)
    scores = softmax_with_max(logits, m, logits.ndim - 1)  # (B,H,L,S), rows sum to 1 (or 0 if fully hidden)
    out = scores.reshape(B, Hkv, GL, S) @ vw  # (B,H_kv,G*L,S) @ (B,H_kv,S,Dv) -> (B,H_kv,G*L,Dv)
    return out.view(B, H, L, Dv).to(q.dtype), scores.to(q.dtype)  # (B,H_kv,G*L,Dv) -> (B,H,L,Dv)


__all__ = ["attention", "attention_core", "masked_scores"]
