"""第 8、9 章和滑动窗口那一章共用（书中不单独讲）：因果规则和滑动窗口合成一条「对角线带」。

Every attention path describes which keys a query sees by one band of diagonals:

    query i sees key j  iff  lo <= j - i <= hi          (None: unbounded on that side)

- ``is_causal`` alone, aligned top-left (SDPA's rule): ``(None, 0)``;
- KV-cache decoding (L new queries after S - L cached keys, bottom-right): ``offset = S - L``;
- ``window_size=(left, right)`` (flash-attn's meaning, -1 = unbounded): query i sees key j iff
  ``i + offset - left <= j <= i + offset + right``; with ``is_causal`` the right side is 0.

The public entry points check ``window_size`` (``attn_lib.checks``); nothing here checks.
"""
from __future__ import annotations

import torch

NO_WINDOW = (-1, -1)


def band(is_causal: bool, window_size=NO_WINDOW, offset: int = 0):
    """(lo, hi) with query i seeing key j iff lo <= j - i <= hi; None means unbounded."""
    left, right = window_size
    if is_causal:
        right = 0
    lo = None if left < 0 else offset - left
    hi = None if right < 0 else offset + right
    return lo, hi


def band_mask(L: int, S: int, lo, hi, device=None) -> torch.Tensor:
    """The band as a bool (L, S) mask, True = visible (what ``attention``'s ``mask`` means)."""
    d = torch.arange(S, device=device)[None, :] - torch.arange(L, device=device)[:, None]  # (L,S): j - i
    keep = torch.ones(L, S, dtype=torch.bool, device=device)  # (L,S)
    if lo is not None:
        keep &= d >= lo
    if hi is not None:
        keep &= d <= hi
    return keep  # (L,S)


def key_range(m0: int, m1: int, S: int, lo, hi):
    """Keys [n_start, n_end) that queries m0..m1-1 may see: the key blocks a tiled path visits."""
    n_start = 0 if lo is None else max(m0 + lo, 0)
    n_end = S if hi is None else max(min(S, m1 - 1 + hi + 1), 0)
    return n_start, max(n_end, n_start)


def query_range(n0: int, n1: int, L: int, lo, hi):
    """Queries [m_start, m_end) that may see keys n0..n1-1 (the backward pass's dK/dV loop)."""
    m_start = 0 if hi is None else max(n0 - hi, 0)
    m_end = L if lo is None else max(min(L, n1 - 1 - lo + 1), 0)
    return m_start, max(m_end, m_start)
