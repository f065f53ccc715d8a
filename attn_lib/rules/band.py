"""第 6、8、9、12、13 章共用（书中不单独讲）：因果规则和滑动窗口合成一条「对角线带」。

Every attention path describes which keys a query sees by one band of diagonals:

    query i sees key j  iff  lo <= j - i <= hi          (None: unbounded on that side)

- ``is_causal`` alone, aligned top-left (SDPA's rule): ``(None, 0)``;
- aligned bottom-right (flash-attn's rule, and KV-cache decoding: L new queries after S - L
  earlier keys): the same band moved by ``offset = S - L``;
- ``window_size=(left, right)`` (flash-attn's meaning, -1 = unbounded): query i sees key j iff
  ``i + offset - left <= j <= i + offset + right``; with ``is_causal`` the right side is 0.

``Band.resolve`` builds the band for L queries and S keys and normalises it: a side that every
(i, j) of the L × S matrix satisfies becomes unbounded, a side that hides everything is clamped
to S or -L, so the numbers stay small whatever window the caller asked for. The public entry
points check their arguments (``attn_lib.checks``); nothing here checks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .names import NO_WINDOW


def band(is_causal: bool, window_size=NO_WINDOW, offset: int = 0):
    """(lo, hi) with query i seeing key j iff lo <= j - i <= hi; None means unbounded (not normalised)."""
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


@dataclass(frozen=True)
class Band:
    """一条对角线带：查询 i 看得见键 j 当且仅当 lo <= j - i <= hi（None：这一侧不设界），已按 L、S 规范化。"""

    lo: int | None = None
    hi: int | None = None

    @classmethod
    def resolve(cls, L: int, S: int, *, is_causal: bool = False, window_size=NO_WINDOW, offset: int = 0) -> "Band":
        """L 个查询、S 个键的带：因果、窗口和对齐（offset：0 左上角，S - L 右下角）合成一条，并规范化。"""
        lo, hi = band(is_causal, window_size, offset)
        if lo is not None and lo <= -(L - 1):  # j - i >= -(L - 1) holds for every (i, j)
            lo = None
        if hi is not None and hi >= S - 1:  # j - i <= S - 1 holds for every (i, j)
            hi = None
        return cls(None if lo is None else min(lo, S), None if hi is None else max(hi, -L))

    @property
    def full(self) -> bool:
        """Every query sees every key (no side bounded)."""
        return self.lo is None and self.hi is None

    def mask(self, L: int, S: int, device=None) -> torch.Tensor:
        """The band as a bool (L, S) mask, True = visible."""
        return band_mask(L, S, self.lo, self.hi, device)

    def key_range(self, m0: int, m1: int, S: int):
        """Keys [n_start, n_end) that queries m0..m1-1 may see."""
        return key_range(m0, m1, S, self.lo, self.hi)

    def query_range(self, n0: int, n1: int, L: int):
        """Queries [m_start, m_end) that may see keys n0..n1-1."""
        return query_range(n0, n1, L, self.lo, self.hi)


__all__ = ["Band", "band", "band_mask", "key_range", "query_range"]
