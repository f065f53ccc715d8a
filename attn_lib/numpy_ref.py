"""第 3、5 章（numpy 版）：softmax 与注意力：不想装 torch 的读者用它，语义与 torch 版完全相同。

Same names, arguments, conventions and error messages as ``attn_lib.softmax`` and
``attn_lib.attention`` (see ``attn_lib.softmax`` for the -inf / all-masked-row rules).
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ._validate import check_bool, check_int, check_mask_shape, check_qkv_shapes, check_same_dtype, check_scale, overflow_error


def _check_float_array(name: str, x) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(x).__name__}; wrap it with np.asarray")
    if x.dtype.kind != "f":
        raise TypeError(f"{name} must be a floating-point array, got {x.dtype}; convert with {name}.astype(np.float64)")
    return x


def _normalize_dim(x: np.ndarray, dim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"dim must be an int, got {dim!r}")
    n = max(x.ndim, 1)  # a 0-D array takes dim 0 or -1, as in the torch version
    if not -n <= dim < n:
        raise ValueError(f"dim={dim} is out of range for a {x.ndim}-D array")
    return dim % n


def naive_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """照公式直接算的 softmax:exp(x) / Σexp(x)。输入大时会溢出（教学用）。

    Args:
        x: float array of any shape.
        axis: the axis that becomes proportions.

    Returns:
        Array of ``x``'s shape (``nan`` where ``exp`` overflowed).
    """
    _check_float_array("x", x)
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
    _check_float_array("x", x)
    dim = _normalize_dim(x, dim)
    if x.size and (np.isnan(x).any() or np.isposinf(x).any()):
        raise ValueError(
            f"x contains {int(np.isnan(x).sum())} nan and {int(np.isposinf(x).sum())} +inf entries; "
            "softmax of such a row is undefined. Only -inf is allowed (it means 'masked')."
        )
    if x.ndim == 0:  # a single score is a row of length 1: 1, or 0 if it is -inf
        return softmax(x.reshape(1)).reshape(())  # () -> (1,) -> ()
    if x.shape[dim] == 0:
        return x.copy()
    work = x.astype(np.float32) if x.dtype == np.float16 else x
    m = work.max(axis=dim, keepdims=True)  # (...,S) -> (...,1)
    m = np.where(np.isfinite(m), m, 0)  # all -inf rows: shift by 0
    e = np.exp(work - m)  # -inf -> 0
    s = e.sum(axis=dim, keepdims=True)  # (...,S) -> (...,1)
    return (e / np.where(s > 0, s, 1)).astype(x.dtype)  # all -inf rows: 0 / 1 = 0


def causal_mask(L: int, S: int | None = None) -> np.ndarray:
    """因果掩码（numpy）：布尔 (L, S),True = 可以看；左上角对齐，同 attn_lib.causal_mask。

    Args:
        L: number of queries.
        S: number of keys (default: ``L``).

    Returns:
        Bool array of shape (L, S).
    """
    L = check_int("L", L, 0)
    S = L if S is None else check_int("S", S, 0)
    return np.tril(np.ones((L, S), dtype=bool))  # (L,S)


def attention(q, k, v, *, mask=None, is_causal=False, scale=None):
    """缩放点积注意力（numpy 版）：返回（输出，注意力分数），布局 (B, H, L, D)。

    Args:
        q: (B, H, L, D); k: (B, H, S, D); v: (B, H, S, Dv) float arrays of one dtype.
        mask: optional bool (True = may attend) or float (additive) array, broadcastable
            to (B, H, L, S).
        is_causal: hide the keys after each query (top-left aligned).
        scale: multiplies ``q @ kᵀ``; default ``1 / sqrt(D)``; must be > 0.

    Returns:
        ``(output (B, H, L, Dv), scores (B, H, L, S))`` in the input dtype.

    Raises:
        ValueError: "attention scores overflowed to +inf ..." when ``scale·q·k`` exceeds the
            working dtype's range, as on every torch path.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_float_array(name, t)
    check_same_dtype(("q", "k", "v"), (q.dtype, k.dtype, v.dtype))
    B, H, L, S, D, Dv = check_qkv_shapes(q, k, v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.size and not np.isfinite(t).all():
            raise ValueError(f"{name} contains nan or inf; attention would turn it into nan.")
    check_bool("is_causal", is_causal)
    scale = check_scale(scale)
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    work = np.float32 if q.dtype == np.float16 else q.dtype
    qw, kw, vw = q.astype(work), k.astype(work), v.astype(work)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is detected below, once
        raw = logits = (qw @ np.swapaxes(kw, -2, -1)) * scale  # (B,H,L,D) @ (B,H,D,S) -> (B,H,L,S)
    if mask is not None:
        mask = np.asarray(mask)
        check_mask_shape(mask, (B, H, L, S))
        if mask.dtype == bool:
            logits = np.where(mask, logits, -np.inf)  # (B,H,L,S), hidden -> -inf
        elif mask.dtype.kind == "f":
            if np.isnan(mask).any() or np.isposinf(mask).any():
                raise ValueError("an additive float mask may contain -inf (hidden) but not nan or +inf")
            logits = logits + mask.astype(work)  # (B,H,L,S) + broadcast(mask) -> (B,H,L,S)
        else:
            raise TypeError(
                f"mask must be bool (True = may attend) or float (added to the scores), got {mask.dtype}; "
                "for a 0/1 mask use mask.astype(bool)"
            )
    if is_causal:
        logits = np.where(causal_mask(L, S), logits, -np.inf)  # (B,H,L,S)
    if logits.size:
        with np.errstate(invalid="ignore"):
            m = logits.max(axis=-1)  # (B,H,L); nan propagates, -inf: the row sees no key
        if np.isnan(m).any() or np.isposinf(m).any():
            raise overflow_error(logits.dtype)
        if np.isneginf(m).any() and np.isinf(raw).any():  # no visible key (fine), or overflow to -inf
            visible = np.ones(logits.shape, dtype=bool)  # (B,H,L,S): what the mask and causal rule let through
            if mask is not None:
                visible &= np.broadcast_to(mask if mask.dtype == bool else np.isfinite(mask), logits.shape)
            if is_causal:
                visible &= causal_mask(L, S)
            if (np.isinf(raw) & visible).any():
                raise overflow_error(logits.dtype)
    scores = softmax(logits, dim=-1)  # (B,H,L,S)
    out = scores @ vw  # (B,H,L,S) @ (B,H,S,Dv) -> (B,H,L,Dv)
    return out.astype(q.dtype), scores.astype(q.dtype)
