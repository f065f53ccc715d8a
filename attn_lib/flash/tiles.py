"""第 8、9 章（书中不单独讲）：分块前向和分块反向共用的「块」：GQA 时一组查询头的行怎么排，一块评分里哪些位置在带外、哪些键缺席。

- ``group_rows`` / ``ungroup_rows``: (B, H, L, X) <-> (B·H_kv, L·G, X), the G query heads that
  share a key/value head interleaved, so that a block of queries against its key/value head is
  one batch of contiguous rows;
- ``band_hidden``: the positions of one (rows, bn) tile outside the band (None when the whole
  tile is inside it), computed from one precomputed ``j - i`` grid;
- ``absent_keys``: the key mask as (B·H_kv, 1, S), True = absent.
"""
from __future__ import annotations

import torch

from ..rules.band import Band


def group_rows(x, Hkv: int):
    """(B, H, L, X) -> (B·H_kv, L·G, X)：同一组 G 个查询头的同一个查询挨在一起，一块查询对一个键值头是连续的行。"""
    B, H, L, X = x.shape
    G = H // Hkv if Hkv else 1
    if G == 1:
        return x.reshape(B * H, L, X)  # (B,H,L,X) -> (BH,L,X)
    return x.reshape(B, Hkv, G, L, X).transpose(2, 3).reshape(B * Hkv, L * G, X)  # (B,H,L,X) -> (B*H_kv,L*G,X)


def ungroup_rows(x, B: int, Hkv: int, G: int, L: int):
    """group_rows 的逆：(B·H_kv, L·G, X) -> (B, H, L, X)（X 可省略：(B·H_kv, L·G) -> (B, H, L)）。"""
    squeeze = x.ndim == 2
    x = x.unsqueeze(-1) if squeeze else x  # (B*H_kv,L*G) -> (B*H_kv,L*G,1)
    X = x.shape[2]
    y = x.view(B, Hkv, L, G, X).transpose(2, 3).reshape(B, Hkv * G, L, X)  # (B*H_kv,L*G,X) -> (B,H,L,X)
    return y.squeeze(-1) if squeeze else y  # (B,H,L,1) -> (B,H,L)


def col_minus_row(bm: int, bn: int, device):
    """j - i for every position (row r, column c) of a tile: c - r, shifted per tile. (bm, bn) int64."""
    return torch.arange(bn, device=device)[None, :] - torch.arange(bm, device=device)[:, None]  # (bm,bn)


def band_hidden(grid, i0: int, rows: int, n0: int, bn: int, band: Band):
    """一块 (rows, bn) 评分（首行是查询 i0，首列是键 n0）里带外的位置（True = 看不见）；整块都在带内时返回 None。"""
    lo, hi = band.lo, band.hi
    cut_lo = lo is not None and n0 - (i0 + rows - 1) < lo  # some key of the tile lies left of the band
    cut_hi = hi is not None and (n0 + bn - 1) - i0 > hi  # some key of the tile lies right of the band
    if not (cut_lo or cut_hi):
        return None
    d = grid[:rows, :bn] + (n0 - i0)  # (rows,bn): j - i
    if cut_lo and cut_hi:
        return (d < lo) | (d > hi)  # (rows,bn)
    return (d < lo) if cut_lo else (d > hi)  # (rows,bn)


def absent_keys(key_mask, Hkv: int):
    """键掩码 (B, S)（True = 在）→ (B·H_kv, 1, S)，True = 这个键缺席；None 原样返回。"""
    if key_mask is None:
        return None
    return (~key_mask).repeat_interleave(Hkv, dim=0)[:, None, :]  # (B,S) -> (B*H_kv,1,S)


__all__ = ["group_rows", "ungroup_rows", "col_minus_row", "band_hidden", "absent_keys"]
