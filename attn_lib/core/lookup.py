"""第 1、3 章（字典类比）：普通字典的精确查找（硬查找）vs 注意力的按比例混合（软查找）。"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence


def hard_lookup(query: str, table: Mapping[str, Any]) -> Any:
    """精确匹配：query 必须和某个键完全相等，否则报 KeyError。

    Args:
        query: the key to look up.
        table: a mapping from keys to values.
    """
    if query not in table:
        raise KeyError(
            f"hard lookup needs an exact key: {query!r} is not one of {list(table)}. "
            "A soft lookup (soft_lookup) mixes all values by proportions instead."
        )
    return table[query]


def check_proportions(weights: Sequence[float], *, atol: float = 1e-9) -> None:
    """检查一组比例：每个都不小于 0，加起来等于 1；否则报 ValueError。"""
    ws = [float(w.detach()) if hasattr(w, "detach") else float(w) for w in weights]  # checks only: no graph
    if not all(math.isfinite(w) for w in ws):
        raise ValueError(f"proportions must be finite numbers, got {ws}")
    if any(w < 0 for w in ws):
        raise ValueError(f"proportions must be >= 0, got {ws}")
    if abs(sum(ws) - 1.0) > atol:
        raise ValueError(f"proportions must sum to 1, got sum {sum(ws)!r} for {ws}")


def soft_lookup(weights: Mapping[str, float] | Sequence[float], values: Mapping[str, Any] | Any) -> Any:
    """软查找：按比例给每个值加权再相加，结果 = Σ 比例_i × 值_i。

    Args:
        weights: proportions over the keys, either a mapping key -> proportion (then
            ``values`` is a mapping too) or a sequence of length S.
        values: the values, a mapping key -> value or an array of shape (S,) or (S, Dv)
            (numpy or torch); values may be numbers or vectors.

    Returns:
        The weighted sum: a number, or a vector of shape (Dv,).
    """
    if isinstance(weights, Mapping):
        if not isinstance(values, Mapping):
            raise TypeError("weights is a mapping, so values must be a mapping with the same keys")
        missing = set(weights) ^ set(values)
        if missing:
            raise KeyError(f"weights and values must have the same keys; these differ: {sorted(missing)}")
        keys = list(weights)
        check_proportions([weights[k] for k in keys])
        return sum(weights[k] * values[k] for k in keys)
    ws = list(weights)
    check_proportions(ws)
    if not hasattr(values, "__len__"):
        raise TypeError(f"values must be a sequence or array of {len(ws)} values, got {type(values).__name__}")
    if len(ws) != len(values):
        raise ValueError(f"got {len(ws)} proportions for {len(values)} values")
    total = 0
    for w, val in zip(ws, values):  # S terms of shape () or (Dv,)
        total = total + w * val
    return total
