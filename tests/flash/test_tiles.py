"""The tiles the tiled forward and backward share (``attn_lib.flash.tiles``), against loops written here:
the grouped row layout (``group_rows`` / ``ungroup_rows``), the ``j - i`` grid, which positions of a
tile lie outside a band (``band_hidden``, against a brute-force mask), and the absent keys."""
import itertools

import pytest
import torch

from attn_lib.flash.tiles import absent_keys, band_hidden, col_minus_row, group_rows, ungroup_rows
from attn_lib.rules.band import Band


def numbered(B, H, L, X):
    """x[b, h, l, c] = a distinct number per position, so that a layout can be read off."""
    return torch.arange(B * H * L * X, dtype=torch.float64).view(B, H, L, X)


@pytest.mark.parametrize("B,H,Hkv,L,X", [(2, 6, 2, 5, 3), (1, 8, 1, 4, 2), (3, 4, 4, 7, 1), (2, 6, 3, 0, 2)])
def test_group_rows_interleaves_a_groups_heads_query_by_query(B, H, Hkv, L, X):
    x = numbered(B, H, L, X)
    G = H // Hkv
    y = group_rows(x, Hkv)
    assert y.shape == (B * Hkv, L * G, X)
    for b, h, l in itertools.product(range(B), range(H), range(L)):
        hk, g = divmod(h, G)  # query head h uses key/value head h // G
        assert torch.equal(y[b * Hkv + hk, l * G + g], x[b, h, l])


@pytest.mark.parametrize("B,H,Hkv,L,X", [(2, 6, 2, 5, 3), (1, 8, 1, 4, 2), (3, 4, 4, 7, 1), (2, 6, 3, 0, 2)])
def test_ungroup_rows_undoes_group_rows_with_and_without_the_last_axis(B, H, Hkv, L, X):
    x = numbered(B, H, L, X)
    G = H // Hkv
    assert torch.equal(ungroup_rows(group_rows(x, Hkv), B, Hkv, G, L), x)
    rows = x[..., 0]  # (B,H,L): e.g. a log-sum-exp per query row
    grouped = group_rows(rows[..., None], Hkv)[..., 0]  # (B*H_kv, L*G)
    back = ungroup_rows(grouped, B, Hkv, G, L)
    assert back.shape == (B, H, L) and torch.equal(back, rows)


def test_col_minus_row_is_j_minus_i():
    grid = col_minus_row(3, 5, "cpu")
    assert grid.shape == (3, 5)
    assert grid.tolist() == [[c - r for c in range(5)] for r in range(3)]


def brute_hidden(i0, rows, n0, bn, band):
    """(rows, bn) bool: True where key n0 + c lies outside the band of query i0 + r."""
    out = torch.zeros(rows, bn, dtype=torch.bool)
    for r in range(rows):
        for c in range(bn):
            d = (n0 + c) - (i0 + r)
            out[r, c] = (band.lo is not None and d < band.lo) or (band.hi is not None and d > band.hi)
    return out


BANDS = [Band.resolve(L, S, is_causal=causal, window_size=window, offset=offset)
         for L, S in ((12, 12), (7, 15), (15, 7))
         for causal, window in ((True, (-1, -1)), (False, (2, 1)), (True, (3, 0)), (False, (-1, 4)), (False, (0, 0)))
         for offset in (0, S - L)]


@pytest.mark.parametrize("band", BANDS, ids=lambda b: f"lo{b.lo}_hi{b.hi}")
def test_band_hidden_matches_a_brute_force_mask_on_every_tile(band):
    bm, bn = 4, 3
    grid = col_minus_row(bm, bn, "cpu")
    inside, cut = 0, 0
    for i0, n0 in itertools.product(range(0, 15, bm), range(0, 15, bn)):
        for rows, cols in ((bm, bn), (2, bn), (bm, 1)):  # whole tiles and the short last ones
            want = brute_hidden(i0, rows, n0, cols, band)
            got = band_hidden(grid, i0, rows, n0, cols, band)
            if got is None:  # None: the whole tile is inside the band
                assert not bool(want.any())
                inside += 1
            else:
                assert got.shape == (rows, cols) and torch.equal(got, want)
                cut += 1
    assert cut > 0 and (inside > 0 or band.lo is not None and band.hi is not None)


def test_band_hidden_of_no_band_is_none():
    assert band_hidden(col_minus_row(4, 4, "cpu"), 0, 4, 0, 4, Band(None, None)) is None


def test_absent_keys_flips_the_mask_and_repeats_it_per_kv_head():
    key_mask = torch.tensor([[True, False, True], [False, False, True]])  # (B,S), True = present
    absent = absent_keys(key_mask, 2)
    assert absent.shape == (4, 1, 3)
    for b, h in itertools.product(range(2), range(2)):
        assert torch.equal(absent[b * 2 + h, 0], ~key_mask[b])
    assert absent_keys(None, 2) is None
