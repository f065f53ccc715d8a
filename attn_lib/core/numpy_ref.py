"""第 3、5 章的 numpy 对照版（章节里不调用）：softmax 与注意力：不想装 torch 的读者用它，语义与 torch 版完全相同。

Same names, arguments, conventions and error messages as ``attn_lib.softmax`` and
``attn_lib.attention`` (see ``attn_lib.softmax`` for the -inf / all-masked-row rules).
"""
from __future__ import annotations

import numpy as np

from ..rules.numerics import overflow_error, resolve_scale, work_dtype
from ..checks import check_attention_arrays, check_float_array, check_int, check_softmax_array


def naive_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """照公式直接算的 softmax：exp(x) / Σexp(x)。输入大时会溢出（教学用）。

    Args:
        x: float array of any shape.
        axis: the axis that becomes proportions.

    Returns:
        Array of ``x``'s shape (``nan`` where ``exp`` overflowed).
    """
    check_float_array("x", x)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(x)  # (...) -> (...)
        return e / e.sum(axis=axis, keepdims=True)  # (...) / (...,1) -> (...)


def softmax(x: np.ndarray, dim: int = -1) -> np.ndarray:
    """数值稳定的 softmax(numpy)：先减每行最大值；全是 -inf 的行返回全 0。

    Args:
        x: float array; ``-inf`` allowed, ``nan`` / ``+inf`` rejected.
        dim: the axis that becomes proportions.

    Returns:
        Array of ``x``'s shape and dtype (float16 is computed in float32).
    """
    return _softmax(x, check_softmax_array(x, dim))


def _softmax(x: np.ndarray, dim: int) -> np.ndarray:
    """softmax without checks (dim a normalised axis)."""
    if x.ndim == 0:  # a single score is a row of length 1: 1, or 0 if it is -inf
        return _softmax(x.reshape(1), 0).reshape(())  # () -> (1,) -> ()
    if x.shape[dim] == 0:
        return x.copy()
    work = x.astype(work_dtype(x.dtype))  # float16 -> float32
    m = work.max(axis=dim, keepdims=True)  # (...,S) -> (...,1)
    m = np.where(np.isfinite(m), m, 0)  # all -inf rows: shift by 0
    e = np.exp(work - m)  # -inf -> 0
    s = e.sum(axis=dim, keepdims=True)  # (...,S) -> (...,1)
    return (e / np.where(s > 0, s, 1)).astype(x.dtype)  # all -inf rows: 0 / 1 = 0


def causal_mask(L: int, S: int | None = None) -> np.ndarray:
    """因果掩码（numpy）：布尔 (L, S)，True = 可以看；左上角对齐，同 attn_lib.causal_mask。

    Args:
        L: number of queries.
        S: number of keys (default: ``L``).

    Returns:
        Bool array of shape (L, S).
    """
    L = check_int("L", L, 0)
    return _causal(L, L if S is None else check_int("S", S, 0))


def _causal(L: int, S: int) -> np.ndarray:
    return np.tril(np.ones((L, S), dtype=bool))  # (L,S) lower triangle incl. the diagonal


def attention(q, k, v, *, mask=None, is_causal=False, scale=None):
    """缩放点积注意力（numpy 版）：返回（输出，注意力分数），布局 (B, H, L, D)。

    Args:
        q: (B, H, L, D); k: (B, H, S, D); v: (B, H, S, Dv) float arrays of one dtype.
        mask: optional bool (True = may attend) or float (additive) array, 2-D (L, S) or
            4-D, broadcastable to (B, H, L, S) (a 3-D mask is refused, as in the torch version).
        is_causal: hide the keys after each query (top-left aligned).
        scale: multiplies ``q @ kᵀ``; default ``1 / sqrt(D)``; must be > 0.

    Returns:
        ``(output (B, H, L, Dv), scores (B, H, L, S))`` in the input dtype.

    Raises:
        ValueError: "attention scores overflowed to +inf ..." (or "-inf": every visible score of a
            row fell to -inf) when ``scale·q·k`` exceeds the working dtype's range, as on every torch path.
    """
    (B, H, L, S, D, Dv), scale, mask = check_attention_arrays(q, k, v, mask, scale, is_causal)
    work = work_dtype(q.dtype)  # float16 -> float32
    qw, kw, vw = q.astype(work), k.astype(work), v.astype(work)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is detected below, once
        raw = (qw @ np.swapaxes(kw, -2, -1)) * resolve_scale(scale, D)  # (B,H,L,D) @ (B,H,D,S) -> (B,H,L,S)
    visible = np.ones((L, S), dtype=bool) if mask is None or mask.dtype != bool else mask  # broadcastable
    logits = raw if mask is None or mask.dtype == bool else raw + mask.astype(work)  # (B,H,L,S)
    if mask is not None and mask.dtype != bool:
        visible = np.isfinite(mask)  # an additive -inf hides the key
    if is_causal:
        visible = visible & _causal(L, S)  # (...,L,S)
    logits = np.where(visible, logits, -np.inf)  # (B,H,L,S), hidden -> -inf
    to = _overflowed(raw, logits, visible) if logits.size else None
    if to is not None:
        raise overflow_error(logits.dtype, to)
    scores = _softmax(logits, logits.ndim - 1)  # (B,H,L,S)
    out = scores @ vw  # (B,H,L,S) @ (B,H,S,Dv) -> (B,H,L,Dv)
    return out.astype(q.dtype), scores.astype(q.dtype)


def _overflowed(raw, logits, visible):
    """溢出规则（同 torch 各路径）：行最大值是 nan / +inf 返回 "+inf"；看得见键的行评分全溢出成 -inf 返回 "-inf"；否则 None。"""
    with np.errstate(invalid="ignore"):
        m = logits.max(axis=-1, keepdims=True)  # (B,H,L,1); nan propagates, -inf: the row sees no key
    if np.isnan(m).any() or np.isposinf(m).any():
        return "+inf"
    dead = np.isneginf(m)  # (B,H,L,1): the row sees no key, or its visible scores overflowed to -inf
    return "-inf" if (dead & np.isinf(raw) & visible).any() else None  # (B,H,L,1) & (B,H,L,S) & broadcast
