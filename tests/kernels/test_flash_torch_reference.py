"""The tiled torch forward's per-row reference (``attn_lib.flash.tiled_forward._tile_weights``).

While every score of a query block lies within ``ZERO_REF_RANGE`` (base 2) of 0 the weights are
``exp2(score)`` with nothing subtracted ("unshifted"; "bounded" when Cauchy–Schwarz on the
largest q and k norms already guarantees it, so that no row maximum is taken); a tile that
leaves that range switches the block to FlashAttention's running maximum for the rest of its
keys ("shifted"). Every regime, and the switch in the middle of a query block (rows that
already have weight, rows that have none yet), is checked against the float64 reference
``attn_lib.attention`` with the same mask, and each test asserts that its regime occurred.
"""
import pytest
import torch

import attn_lib
import attn_lib.flash.tiled_forward as ft
from attn_lib.tolerances import assert_close, lse_atol, tolerance


@pytest.fixture
def regimes(monkeypatch):
    """Records, per call of _tile_weights, whether the call used the unshifted weights."""
    seen = []
    original = ft._tile_weights

    def spy(qk, m_old, l_old, state):
        bounded, before = state["bounded"], state["zero_ref"]
        out = original(qk, m_old, l_old, state)
        seen.append("bounded" if bounded else "unshifted" if before and state["zero_ref"] else "shifted")
        return out

    monkeypatch.setattr(ft, "_tile_weights", spy)
    return seen


def _inputs(L, S, D, big_from, factor, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, L, D, generator=g)  # (B,H,L,D)
    k = torch.randn(1, 2, S, D, generator=g)  # (B,H_kv,S,D)
    v = torch.randn(1, 2, S, D, generator=g)  # (B,H_kv,S,D)
    k[:, :, big_from:] *= factor  # later keys give scores far outside ±ZERO_REF_RANGE
    return q, k, v


def _lse_reference(q, k, mask):
    """float64 log Σ_j exp(q·k_j / sqrt(D)) over the visible keys (mask (L, S) or (B, 1, 1, S)), K repeated here."""
    G = q.shape[1] // k.shape[1]
    s = q.double() @ k.double().repeat_interleave(G, dim=1).transpose(-1, -2) / q.shape[-1] ** 0.5  # (B,H,L,S)
    return s.masked_fill(~mask, float("-inf")).logsumexp(-1)  # (B,H,L)


def _check(q, k, v, *, is_causal, key_padding_mask=None):
    out, lse = attn_lib.flash_attention_torch(q, k, v, is_causal=is_causal, enable_gqa=True, block_m=8, block_n=8,
                                              key_padding_mask=key_padding_mask)
    L, S = q.shape[2], k.shape[2]
    mask = torch.ones(L, S, dtype=torch.bool).tril() if is_causal else torch.ones(L, S, dtype=torch.bool)  # (L,S)
    if key_padding_mask is not None:
        mask = mask & key_padding_mask[:, None, None, :]  # (B,1,L,S)
    ref, _ = attn_lib.attention(q.double(), k.double(), v.double(), mask=mask, enable_gqa=True)
    assert_close(out, ref.to(q.dtype), dtype=q.dtype)
    expected = _lse_reference(q, k, mask)
    # the table's rtol on top of its lse atol: these scores reach hundreds
    torch.testing.assert_close(lse.double(), expected, atol=lse_atol(q.dtype), rtol=tolerance(q.dtype)["rtol"])
    return out, lse


@pytest.mark.parametrize("is_causal", [False, True])
def test_small_norms_need_neither_a_shift_nor_a_row_maximum(regimes, is_causal):
    q, k, v = _inputs(19, 23, 16, big_from=23, factor=1.0)
    _check(q, k, v, is_causal=is_causal)
    assert regimes and set(regimes) == {"bounded"}


@pytest.mark.parametrize("is_causal", [False, True])
def test_small_scores_of_long_vectors_need_no_shift(regimes, is_causal):
    # q lives in dims 0..7 and k in dims 8..15: long vectors (the Cauchy–Schwarz bound fails),
    # small scores (within ±ZERO_REF_RANGE): the row maximum is taken and nothing is shifted.
    q, k, v = _inputs(19, 23, 16, big_from=23, factor=1.0)
    q[..., 8:] = 0.0
    q[..., :8] *= 40.0
    k[..., :8] *= 0.01
    k[..., 8:] *= 40.0
    _check(q, k, v, is_causal=is_causal)
    assert regimes and set(regimes) == {"unshifted"}


@pytest.mark.parametrize("is_causal", [False, True])
def test_a_block_that_leaves_the_range_midway_switches_to_the_running_maximum(regimes, is_causal):
    q, k, v = _inputs(19, 23, 16, big_from=16, factor=30.0)  # keys 16.. (the third key block) are huge
    _check(q, k, v, is_causal=is_causal)
    assert "unshifted" in regimes and "shifted" in regimes
    first_shift = regimes.index("shifted")
    assert regimes[first_shift - 1] == "unshifted"  # the switch happens inside a query block


def test_rows_without_weight_restart_from_their_own_maximum(regimes):
    # The first 8 keys are absent: no row has weight after the first key block (which passes as
    # "unshifted": it sees no key). Every later score is below -1100 (base 2): measured from a
    # reference of 0 all of them would underflow to 0 even in float64; from the row's own
    # maximum they do not.
    q, k, v = (t.double() for t in _inputs(9, 24, 16, big_from=24, factor=1.0))
    q = q.abs() + 0.5
    k[:, :, 8:] = -(k[:, :, 8:].abs() + 0.5) * 300.0
    kpm = torch.ones(1, 24, dtype=torch.bool)
    kpm[:, :8] = False
    out, lse = _check(q, k, v, is_causal=False, key_padding_mask=kpm)
    assert "shifted" in regimes
    assert (lse * 1.4426950408889634 < -1100).all()  # the scores really are that small
    assert (out.abs().sum(-1) > 0).all()  # every row has weight: none underflowed
