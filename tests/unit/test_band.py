"""The diagonal band every path uses (attn_lib.rules.band), against a loop over (i, j) written from its definition."""
import itertools

import pytest
import torch

from attn_lib.rules.band import band, band_mask, key_range, query_range


def visible(i, j, is_causal, window, offset):
    left, right = window
    if left >= 0 and j < i + offset - left:
        return False
    if is_causal and j > i + offset:
        return False
    if not is_causal and right >= 0 and j > i + offset + right:
        return False
    return True


CASES = [(c, w, o) for c in (False, True) for w in [(-1, -1), (0, 0), (1, 0), (5, 0), (3, 2), (-1, 4), (2, -1), (20, 20)]
         for o in (0, 3, -2)]


@pytest.mark.parametrize("is_causal,window,offset", CASES)
def test_band_mask_matches_the_definition(is_causal, window, offset):
    L, S = 5, 8
    lo, hi = band(is_causal, window, offset)
    got = band_mask(L, S, lo, hi)
    want = torch.tensor([[visible(i, j, is_causal, window, offset) for j in range(S)] for i in range(L)])
    assert torch.equal(got, want)


@pytest.mark.parametrize("is_causal,window,offset", CASES)
def test_block_ranges_cover_exactly_the_visible_keys(is_causal, window, offset):
    L, S = 7, 9
    lo, hi = band(is_causal, window, offset)
    vis = [[visible(i, j, is_causal, window, offset) for j in range(S)] for i in range(L)]
    for m0, m1 in itertools.combinations(range(L + 1), 2):
        seen = [j for j in range(S) if any(vis[i][j] for i in range(m0, m1))]
        n_start, n_end = key_range(m0, m1, S, lo, hi)
        assert (seen == [] and n_start == n_end) or (seen[0] == n_start and seen[-1] == n_end - 1), (m0, m1)
    for n0, n1 in itertools.combinations(range(S + 1), 2):
        seen = [i for i in range(L) if any(vis[i][j] for j in range(n0, n1))]
        m_start, m_end = query_range(n0, n1, L, lo, hi)
        assert (seen == [] and m_start == m_end) or (seen[0] == m_start and seen[-1] == m_end - 1), (n0, n1)
