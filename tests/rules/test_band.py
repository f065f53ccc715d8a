"""The diagonal band every path uses (attn_lib.rules.band): band, band_mask, key_range, query_range and
Band.resolve, against a loop over (i, j) written from flash-attn's definition."""
import dataclasses
import itertools

import pytest
import torch

from attn_lib.rules.band import Band, band, band_mask, key_range, query_range

HUGE = 2**64  # wider than any sequence: a side this wide limits nothing


def visible(i, j, is_causal, window, offset):
    """Query i sees key j iff i + offset - left <= j <= i + offset + right (-1: unbounded); causal: right = 0."""
    left, right = window
    if left >= 0 and j < i + offset - left:
        return False
    if is_causal and j > i + offset:
        return False
    if not is_causal and right >= 0 and j > i + offset + right:
        return False
    return True


def loop_mask(L, S, is_causal, window, offset):
    return torch.tensor([[visible(i, j, is_causal, window, offset) for j in range(S)] for i in range(L)],
                        dtype=torch.bool).reshape(L, S)


WINDOWS = [(-1, -1), (0, 0), (1, 0), (5, 0), (3, 2), (-1, 4), (2, -1), (20, 20)]
CASES = [(c, w, o) for c in (False, True) for w in WINDOWS for o in (0, 3, -2)]
# windows whose sides are far wider than the sequence, and offsets that push the band off the matrix
WIDE_CASES = [(c, w, o) for c in (False, True) for w in [(HUGE, 0), (0, HUGE), (HUGE, HUGE), (HUGE, -1), (-1, HUGE)]
              for o in (0, 3, -2, 40, -40)] + [(c, (1, 1), o) for c in (False, True) for o in (40, -40, HUGE, -HUGE)]
LENGTHS = [(5, 8), (8, 5), (1, 1), (6, 6), (0, 3), (3, 0)]


@pytest.mark.parametrize("is_causal,window,offset", CASES)
def test_band_mask_matches_the_definition(is_causal, window, offset):
    L, S = 5, 8
    lo, hi = band(is_causal, window, offset)
    assert torch.equal(band_mask(L, S, lo, hi), loop_mask(L, S, is_causal, window, offset))


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


@pytest.mark.parametrize("L,S", LENGTHS)
@pytest.mark.parametrize("is_causal,window,offset", CASES + WIDE_CASES)
def test_resolved_band_keeps_the_visible_keys_and_small_numbers(L, S, is_causal, window, offset):
    got = Band.resolve(L, S, is_causal=is_causal, window_size=window, offset=offset)
    assert torch.equal(got.mask(L, S), loop_mask(L, S, is_causal, window, offset))
    # normalised: a bounded side lies where it can still cut the L x S matrix, or just past it
    assert got.lo is None or -(L - 1) < got.lo <= S
    assert got.hi is None or -L <= got.hi < S - 1


@pytest.mark.parametrize("L,S", [(7, 9), (9, 7)])
@pytest.mark.parametrize("is_causal,window,offset", CASES + WIDE_CASES)
def test_resolved_band_ranges_cover_exactly_the_visible_keys(L, S, is_causal, window, offset):
    got = Band.resolve(L, S, is_causal=is_causal, window_size=window, offset=offset)
    vis = loop_mask(L, S, is_causal, window, offset)
    for m0, m1 in itertools.combinations(range(L + 1), 2):
        seen = vis[m0:m1].any(0).nonzero().flatten().tolist()
        n_start, n_end = got.key_range(m0, m1, S)
        assert (seen == [] and n_start == n_end) or (seen[0] == n_start and seen[-1] == n_end - 1), (m0, m1)
    for n0, n1 in itertools.combinations(range(S + 1), 2):
        seen = vis[:, n0:n1].any(1).nonzero().flatten().tolist()
        m_start, m_end = got.query_range(n0, n1, L)
        assert (seen == [] and m_start == m_end) or (seen[0] == m_start and seen[-1] == m_end - 1), (n0, n1)


def test_a_huge_window_side_becomes_unbounded():
    assert Band.resolve(5, 8, window_size=(HUGE, 0)) == Band(None, 0) == Band.resolve(5, 8, is_causal=True)
    assert Band.resolve(5, 8, window_size=(0, HUGE)) == Band(0, None)
    assert Band.resolve(5, 8, window_size=(HUGE, HUGE)) == Band() == Band.resolve(5, 8)
    assert Band.resolve(5, 8, window_size=(HUGE, HUGE)).full
    assert Band.resolve(5, 8, is_causal=True, window_size=(HUGE, HUGE)) == Band(None, 0)


def test_a_side_that_every_pair_satisfies_becomes_unbounded_exactly_at_the_edge():
    L, S = 4, 6  # j - i runs from -(L - 1) = -3 to S - 1 = 5
    assert Band.resolve(L, S, window_size=(3, 5)) == Band(None, None)
    assert Band.resolve(L, S, window_size=(2, 4)) == Band(-2, 4)  # one short on each side: both still cut
    assert Band.resolve(L, S, is_causal=True, offset=S - L, window_size=(5, 0)) == Band(None, 2)
    assert Band.resolve(L, S, is_causal=True, offset=S - L, window_size=(4, 0)) == Band(-2, 2)


def test_a_side_that_hides_everything_is_clamped():
    L, S = 3, 4
    ahead = Band.resolve(L, S, window_size=(0, 0), offset=HUGE)  # every key is behind the band
    assert ahead == Band(S, None) and not ahead.mask(L, S).any()
    behind = Band.resolve(L, S, window_size=(0, 0), offset=-HUGE)  # every key is ahead of the band
    assert behind == Band(None, -L) and not behind.mask(L, S).any()
    assert Band.resolve(L, S, is_causal=True, offset=-40) == Band(None, -L)
    assert Band.resolve(L, S, is_causal=True, offset=-L) == Band(None, -L)  # just past the edge: already -L
    assert Band.resolve(L, S, is_causal=True, offset=-(L - 1)).mask(L, S).any()  # query L-1 still sees key 0


def test_bands_compare_by_value_and_are_frozen():
    a, b = Band.resolve(5, 8, is_causal=True, offset=3), Band(None, 3)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert Band(None, 0) != Band(None, 1) and Band(0, None) != Band(None, 0) and Band(-2, 1) != Band(-2, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.lo = 0


def test_full_means_no_side_bounded():
    assert Band().full and Band(None, None).full
    assert not Band(None, 0).full and not Band(0, None).full and not Band(-1, 1).full
    assert bool(Band().mask(3, 5).all())


def test_band_mask_is_built_on_the_requested_device():
    meta = torch.device("meta")  # a device other than the CPU that every machine has
    assert Band(-1, 0).mask(3, 4, device=meta).device == meta
    assert band_mask(3, 4, None, None, device=meta).device == meta
