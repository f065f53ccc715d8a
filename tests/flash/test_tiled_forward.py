"""The tiled torch forward (``attn_lib.flash.tiled_forward``: ``flash_attention_torch`` and its core
``forward_core``) against independent answers: the float64 reference ``attn_lib.attention`` (given a
bool mask built here from the rule written out), torch SDPA with ``enable_gqa`` and a band built by a
loop, and float64 log-sum-exps computed here.

Covered: shapes around the block sizes, causal and not, key masks with rows and sequences that see no
key, grouped-query attention, sliding windows, ``align="bottom-right"`` (and any band offset through
the core's settings), custom scales and strided inputs, low precision within flash-attn's 2x rule,
the "reference 0" regimes of ``_tile_weights`` (each test asserts that its regime occurred), values
too large or too small for that trick in float32, overflow, the IO counter and what is never built.
"""
import pytest
import torch
import torch.nn.functional as F

import attn_lib
import attn_lib.flash.tiled_forward as tiled_forward
from attn_lib import flash_attention, flash_attention_torch, naive_attention
from attn_lib.costs.io_model import IOCounter, largest_tensor
from attn_lib.rules.band import Band
from attn_lib.rules.numerics import LOG2E
from attn_lib.rules.settings import AttentionSettings
from attn_lib.tolerances import assert_close, assert_flash_rule, lse_atol, max_abs_error, tolerance

from attn_paths import DISTINGUISHABLE, flash_inputs, flash_reference, visible_band

OVERFLOW_UP = r"attention scores overflowed to \+inf"


def check_lse(lse, lse_ref, dtype):
    """-inf exactly where the reference has -inf (rows that see no key); elsewhere within lse_atol."""
    assert torch.equal(torch.isneginf(lse), torch.isneginf(lse_ref)), "rows that see no key must have lse = -inf"
    fin = torch.isfinite(lse_ref)
    assert max_abs_error(lse[fin], lse_ref[fin]) <= lse_atol(dtype)


def qkv(B, H, Hkv, L, S, D=12, Dv=10, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = ((B, H, L, D), (B, Hkv, S, D), (B, Hkv, S, Dv))
    return tuple(torch.randn(*s, generator=g, dtype=torch.float64).to(dtype) for s in shapes)


def half_padded(B, S):
    """(B, S) key mask, True = present: the last sequence's second half is absent."""
    key_mask = torch.ones(B, S, dtype=torch.bool)
    key_mask[-1, S // 2:] = False
    return key_mask


def reference_lse(q, k, visible, scale=None):
    """float64 log Σ_j exp(scale·q·k_j) over the visible keys (visible: broadcastable to (B, H, L, S))."""
    G = q.shape[1] // k.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = q.double() @ k.double().repeat_interleave(G, dim=1).transpose(-1, -2) * scale  # (B,H,L,S)
    return s.masked_fill(~visible, float("-inf")).logsumexp(-1)  # (B,H,L)


# --- against the float64 reference ------------------------------------------------------------------------

SHAPES = [  # (B, H, L, S, D, Dv)
    (1, 1, 1, 1, 16, 16),
    (1, 1, 17, 17, 16, 16),
    (2, 3, 17, 97, 32, 32),
    (1, 2, 97, 17, 8, 8),
    (2, 2, 113, 113, 64, 64),
    (1, 1, 113, 1, 16, 16),
    (1, 1, 1, 113, 16, 16),
    (2, 1, 97, 113, 20, 12),
]
BLOCKS = [(None, None), (16, 16), (7, 5), (64, 32)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("padding", [False, True], ids=["nopad", "pad"])
def test_float64_matches_the_reference_for_every_block_size(shape, causal, padding):
    B, H, L, S, D, Dv = shape
    q, k, v, key_mask = flash_inputs(B, H, L, S, D, Dv, padding=padding)
    ref, lse_ref = flash_reference(q, k, v, key_mask, causal)
    for bm, bn in BLOCKS:
        out, lse = flash_attention_torch(q, k, v, is_causal=causal, key_mask=key_mask, block_m=bm, block_n=bn)
        assert out.shape == (B, H, L, Dv) and lse.shape == (B, H, L)
        assert_close(out, ref, what=f"out, blocks {bm}x{bn}")
        check_lse(lse, lse_ref, torch.float64)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_long_float32_sequence_of_1025(causal):
    q, k, v, key_mask = flash_inputs(1, 2, 1025, 1025, 16, padding=True)
    ref, lse_ref = flash_reference(q, k, v, key_mask, causal)
    q32, k32, v32 = q.float(), k.float(), v.float()
    out, lse = flash_attention_torch(q32, k32, v32, is_causal=causal, key_mask=key_mask, block_m=256, block_n=128)
    assert_close(out, ref, dtype=torch.float32, what="float32 out")
    assert_flash_rule(out, naive_attention(q32, k32, v32, is_causal=causal, key_mask=key_mask), ref)
    check_lse(lse, lse_ref, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_low_precision_keeps_the_flash_rule(dtype, causal):
    q, k, v, key_mask = flash_inputs(2, 2, 97, 113, 32, padding=True, seed=3)
    ref, _ = flash_reference(q, k, v, key_mask, causal)
    ql, kl, vl = q.to(dtype), k.to(dtype), v.to(dtype)
    out, lse = flash_attention_torch(ql, kl, vl, is_causal=causal, key_mask=key_mask, block_m=32, block_n=16)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert_flash_rule(out, naive_attention(ql, kl, vl, is_causal=causal, key_mask=key_mask), ref, what=str(dtype))
    if dtype == torch.float32:
        assert_close(out, ref, dtype=torch.float32)


def test_rows_that_see_no_key_give_zeros_and_minus_infinity():
    q, k, v, _ = flash_inputs(2, 2, 9, 6, 8)
    key_mask = torch.ones(2, 6, dtype=torch.bool)
    key_mask[1] = False  # second sequence: every key absent
    key_mask[0, 0] = False  # first sequence: with causal, query 0 sees only key 0, which is absent
    for causal in (False, True):
        out, lse = flash_attention_torch(q, k, v, is_causal=causal, key_mask=key_mask, block_n=4)
        assert torch.equal(out[1], torch.zeros_like(out[1])) and bool(torch.isneginf(lse[1]).all())
        assert bool(torch.isfinite(out).all())
    assert torch.equal(out[0, :, 0], torch.zeros_like(out[0, :, 0])) and bool(torch.isneginf(lse[0, :, 0]).all())
    assert bool(torch.isfinite(lse[0, :, 1:]).all())


def test_a_scale_and_strided_inputs():
    gen = torch.Generator().manual_seed(5)
    # (B, L, H, D) storage viewed as (B, H, L, D): non-contiguous, as a model's projections often are
    q = torch.randn(2, 33, 3, 16, generator=gen, dtype=torch.float64).transpose(1, 2)
    k = torch.randn(2, 40, 3, 16, generator=gen, dtype=torch.float64).transpose(1, 2)
    v = torch.randn(2, 40, 3, 8, generator=gen, dtype=torch.float64).transpose(1, 2)
    assert not q.is_contiguous()
    ref, lse_ref = flash_reference(q, k, v, None, True, scale=0.3)
    out, lse = flash_attention_torch(q, k, v, is_causal=True, scale=0.3, block_m=8, block_n=16)
    assert_close(out, ref)
    check_lse(lse, lse_ref, torch.float64)


def test_no_key_and_no_query():
    q, k, v, _ = flash_inputs(1, 2, 5, 0, 4)
    out, lse = flash_attention_torch(q, k, v)
    assert out.shape == (1, 2, 5, 4) and torch.equal(out, torch.zeros_like(out)) and bool(torch.isneginf(lse).all())
    q, k, v, _ = flash_inputs(1, 2, 0, 5, 4)
    out, lse = flash_attention_torch(q, k, v, is_causal=True)
    assert out.shape == (1, 2, 0, 4) and lse.shape == (1, 2, 0)


@pytest.mark.parametrize("L,S", [(37, 29), (0, 5), (4, 0)])
def test_every_buffer_is_built_on_the_input_device(L, S):
    # Under a "meta" default device any tensor created without an explicit device lands on meta:
    # the result then differs or the call fails. On a GPU the same slip would put a buffer on the CPU.
    q, k, v = qkv(2, 2, 2, L, S, D=6, Dv=6)
    key_mask = torch.ones(2, S, dtype=torch.bool)
    key_mask[1, : S // 2] = False
    kw = dict(is_causal=True, key_mask=key_mask, block_m=16, block_n=8)
    want = flash_attention_torch(q, k, v, **kw)
    with torch.device("meta"):
        got = flash_attention_torch(q, k, v, **kw)
    for g, w in zip(got, want):
        assert g.device == w.device and g.dtype == w.dtype and torch.equal(g, w)


def test_a_scale_beyond_the_range_of_the_base_2_factor():
    # scale·log2(e) does not fit float32: the scores are scaled in two steps
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 2, n, 4, generator=g) * 1e-19 for n in (6, 7))  # q·k ~ 1e-38
    v = torch.randn(1, 2, 7, 4, generator=g)
    scale = 3e38  # scale·q·k ~ 1
    out, _ = flash_attention_torch(q, k, v, scale=scale, is_causal=True, block_m=4, block_n=4)
    want, _ = attn_lib.attention(q.double(), k.double(), v.double(), is_causal=True, scale=scale)
    assert_close(out, want, dtype=torch.float32)


# --- grouped-query attention, windows, alignment ---------------------------------------------------------

HEADS = [(6, 2), (8, 1), (4, 4)]
WINDOWS = [(0, 0), (1, 0), (5, 0), (3, 2), (-1, 4), (50, 50)]  # (50, 50): wider than every sequence here
WINDOW_CASES = [(w, False) for w in WINDOWS] + [(w, True) for w in WINDOWS if w[1] <= 0]


def ids(c):
    if isinstance(c, tuple):
        return "x".join(map(str, c))
    return "causal" if c is True else "full" if c is False else str(c)


@pytest.mark.parametrize("heads", HEADS, ids=ids)
@pytest.mark.parametrize("window,causal", WINDOW_CASES, ids=ids)
@pytest.mark.parametrize("lengths", [(13, 11), (13, 17)], ids=ids)
def test_gqa_and_windows_match_the_reference(heads, window, causal, lengths):
    (H, Hkv), (L, S) = heads, lengths
    q, k, v = qkv(2, H, Hkv, L, S)
    key_mask = half_padded(2, S)
    visible = visible_band(L, S, causal, window) & key_mask[:, None, None, :]  # (B,1,L,S)
    ref, _ = attn_lib.attention(q, k, v, mask=visible, enable_gqa=True)
    for bm, bn in [(4, 3), (5, 7)]:  # do not divide L = 13, S = 11 / 17
        out, lse = flash_attention_torch(q, k, v, is_causal=causal, key_mask=key_mask, block_m=bm, block_n=bn,
                                         enable_gqa=True, window_size=window)
        assert_close(out, ref, dtype=torch.float64, what=f"blocks {bm}x{bn}")
        check_lse(lse, reference_lse(q, k, visible), torch.float64)


@pytest.mark.parametrize("heads", HEADS, ids=ids)
@pytest.mark.parametrize("window", [(0, 0), (3, 2), (-1, 4), (5, 0)], ids=ids)
def test_gqa_and_windows_match_sdpa_with_a_written_out_band(heads, window):
    H, Hkv = heads
    q, k, v = qkv(1, H, Hkv, 15, 9)
    visible = visible_band(15, 9, False, window)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=H != Hkv)
    seen = visible.any(-1)[:, None]  # (L,1): SDPA gives nan for a row that sees no key, we give 0
    want = torch.where(seen, want, torch.zeros_like(want))
    out, _ = flash_attention_torch(q, k, v, block_m=4, block_n=3, enable_gqa=True, window_size=window)
    assert_close(out, want, dtype=torch.float64)


def test_window_size_none_is_no_window():
    q, k, v = qkv(1, 4, 2, 9, 11)
    out, _ = flash_attention_torch(q, k, v, enable_gqa=True, window_size=None, block_m=4, block_n=3)
    ref, _ = attn_lib.attention(q, k, v, enable_gqa=True)
    assert_close(out, ref, dtype=torch.float64)


def test_a_float32_gqa_window_with_padding_matches_the_float64_reference():
    q, k, v = qkv(2, 8, 2, 33, 29, dtype=torch.float32)
    key_mask = half_padded(2, 29)
    out, _ = flash_attention_torch(q, k, v, is_causal=True, key_mask=key_mask, enable_gqa=True, window_size=(7, 0))
    visible = visible_band(33, 29, True, (7, 0)) & key_mask[:, None, None, :]
    ref, _ = attn_lib.attention(q.double(), k.double(), v.double(), mask=visible, enable_gqa=True)
    assert out.dtype == torch.float32
    assert_close(out, ref, dtype=torch.float32)


def offset_mask(L, S, offset):
    """(L, S) bool, True = query i may see key j, i.e. j <= i + offset (written with tril, not the library)."""
    return torch.ones(L, S, dtype=torch.bool).tril(diagonal=offset)


# (L, S): bottom-right for L < S, L > S and L = S, a single query at the end, offsets that hide whole rows
ALIGNED = [(5, 11), (11, 5), (7, 7), (1, 17), (9, 13), (13, 9), (3, 17), (17, 3)]


@pytest.mark.parametrize("padding", [False, True], ids=["nopad", "pad"])
@pytest.mark.parametrize("L,S", ALIGNED, ids=ids)
def test_bottom_right_causal_is_the_tril_with_offset_s_minus_l(L, S, padding):
    q, k, v, key_mask = flash_inputs(2, 2, L, S, 8, 6, seed=L * 31 + S, padding=padding)
    visible = offset_mask(L, S, S - L)[None, None]  # (1,1,L,S)
    if key_mask is not None:
        visible = visible & key_mask[:, None, None, :]  # (B,1,L,S)
    ref, _ = attn_lib.attention(q, k, v, mask=visible)
    for bm, bn in ((2, 3), (4, 2), (16, 16)):
        out, lse = flash_attention_torch(q, k, v, is_causal=True, align="bottom-right", key_mask=key_mask,
                                         block_m=bm, block_n=bn)
        assert_close(out, ref, dtype=torch.float64, what=f"blocks {bm}x{bn}")
        check_lse(lse, reference_lse(q, k, visible), torch.float64)
    if L != S:  # the alignment matters: top-left is another answer
        top_left, _ = flash_attention_torch(q, k, v, is_causal=True, key_mask=key_mask)
        assert max_abs_error(top_left, ref) > DISTINGUISHABLE


@pytest.mark.parametrize("L,S,window,causal", [(7, 13, (3, 0), True), (13, 9, (3, 0), True), (9, 9, (3, 0), True),
                                               (6, 14, (2, 1), False), (14, 6, (1, 2), False)], ids=ids)
def test_bottom_right_moves_the_window_by_s_minus_l(L, S, window, causal):
    q, k, v = qkv(1, 6, 3, L, S)
    visible = visible_band(L, S, causal, window, offset=S - L)
    ref, _ = attn_lib.attention(q, k, v, mask=visible, enable_gqa=True)
    out, lse = flash_attention_torch(q, k, v, is_causal=causal, window_size=window, align="bottom-right",
                                     enable_gqa=True, block_m=4, block_n=3)
    assert_close(out, ref, dtype=torch.float64)
    check_lse(lse, reference_lse(q, k, visible), torch.float64)


def band_settings(L, S, offset, D, key_mask=None, blocks=(None, None)):
    """Settings written by hand: causal with any offset (the public entries offer 0 and S - L only)."""
    return AttentionSettings(band=Band.resolve(L, S, is_causal=True, offset=offset), scale=D ** -0.5,
                             work_dtype=torch.float64, key_mask=key_mask, check_overflow=True, backend="torch",
                             block_m=blocks[0], block_n=blocks[1])


# Offsets that no alignment gives: some inside the matrix, some past either end (every row sees all / none).
OFFSETS = [(9, 13, 3), (13, 9, -2), (6, 9, 20), (9, 6, -20), (5, 11, 0), (11, 5, 1)]


@pytest.mark.parametrize("padding", [False, True], ids=["nopad", "pad"])
@pytest.mark.parametrize("L,S,offset", OFFSETS, ids=ids)
def test_the_core_follows_any_band_offset(L, S, offset, padding):
    q, k, v, key_mask = flash_inputs(2, 2, L, S, 8, 6, seed=L * 31 + S, padding=padding)
    visible = offset_mask(L, S, offset)[None, None]  # (1,1,L,S)
    if key_mask is not None:
        visible = visible & key_mask[:, None, None, :]  # (B,1,L,S)
    ref, _ = attn_lib.attention(q, k, v, mask=visible)
    for blocks in ((2, 3), (4, 2), (16, 16)):
        out, lse = tiled_forward.forward_core(q, k, v, band_settings(L, S, offset, 8, key_mask, blocks))
        assert_close(out, ref, dtype=torch.float64, what=f"blocks {blocks}")
        check_lse(lse, reference_lse(q, k, visible), torch.float64)


# --- overflow -----------------------------------------------------------------------------------------------

def test_overflowing_scores_raise_and_float64_holds_them():
    q, k, v, _ = flash_inputs(1, 2, 5, 6, 4)
    q32, k32, v32 = q.float() * 0 + 1e20, k.float() * 0 + 1e20, v.float()  # scale·q·k = 2e40 > 3.4e38
    with pytest.raises(ValueError, match=OVERFLOW_UP + r" \(\|scale·q·k\| exceeds the range of float32\); "
                                         "compute in float64 or use a smaller scale"):
        flash_attention_torch(q32, k32, v32, block_m=2, block_n=4)
    q64, k64, v64 = (t.double() for t in (q32, k32, v32))
    out, _ = flash_attention_torch(q64, k64, v64, block_m=2, block_n=4)
    assert_close(out, attn_lib.attention(q64, k64, v64)[0])


def test_fully_masked_rows_are_not_an_overflow():
    q, k, v, _ = flash_inputs(1, 2, 5, 6, 4)
    out, lse = flash_attention_torch(q.float(), k.float(), v.float(), key_mask=torch.zeros(1, 6, dtype=torch.bool))
    assert torch.equal(out, torch.zeros_like(out)) and bool(torch.isneginf(lse).all())


def test_a_window_row_that_sees_no_key_is_not_an_overflow_but_a_real_overflow_is():
    q, k, v = qkv(1, 4, 2, 8, 3, dtype=torch.float32)
    out, lse = flash_attention_torch(q, k, v, enable_gqa=True, window_size=(0, 0))  # queries 3..7 see no key
    assert bool(torch.isneginf(lse[..., 3:]).all()) and torch.equal(out[..., 3:, :], torch.zeros_like(out[..., 3:, :]))
    with pytest.raises(ValueError, match=OVERFLOW_UP):
        flash_attention_torch(q * 1e20, k * 1e20, v, enable_gqa=True, window_size=(0, 0), scale=1e10)


@pytest.mark.parametrize("window, causal", [((-1, -1), True), ((1, 0), False), ((0, 1), False)], ids=ids)
def test_a_score_that_overflows_outside_the_band_stays_hidden(window, causal):
    """A hidden pair whose float32 score overflows to +inf changes nothing (as in the reference): the
    tiled path hides band positions by min(score, -inf), which also holds for +inf."""
    q, k, v = qkv(1, 4, 2, 5, 5, D=4, Dv=3, dtype=torch.float32)
    q[:, :, 0], k[:, :, 4] = 1e20, 1e20  # query 0 never sees key 4 in these bands; scale·q·k = inf in float32
    out, _ = flash_attention_torch(q, k, v, is_causal=causal, window_size=window, enable_gqa=True)
    want, _ = attn_lib.attention(q.double(), k.double(), v.double(), is_causal=causal, window_size=window,
                                 enable_gqa=True)
    assert_close(out, want, dtype=torch.float32)


# --- the "reference 0" regimes of _tile_weights --------------------------------------------------------------

@pytest.fixture
def regimes(monkeypatch):
    """Records, per call of _tile_weights, which weights it used: bounded, unshifted or shifted."""
    seen = []
    original = tiled_forward._tile_weights

    def spy(qk, m_old, l_old, state, bounded):
        before = state.zero_ref
        out = original(qk, m_old, l_old, state, bounded)
        seen.append("bounded" if bounded else "unshifted" if before and state.zero_ref else "shifted")
        return out

    monkeypatch.setattr(tiled_forward, "_tile_weights", spy)
    return seen


def regime_inputs(L, S, D, big_from, factor, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, L, D, generator=g)  # (B,H,L,D)
    k = torch.randn(1, 2, S, D, generator=g)  # (B,H_kv,S,D)
    v = torch.randn(1, 2, S, D, generator=g)  # (B,H_kv,S,D)
    k[:, :, big_from:] *= factor  # later keys give scores far outside ±ZERO_REF_RANGE
    return q, k, v


def check_regime_case(q, k, v, *, is_causal, key_mask=None):
    out, lse = flash_attention_torch(q, k, v, is_causal=is_causal, enable_gqa=True, block_m=8, block_n=8,
                                     key_mask=key_mask)
    L, S = q.shape[2], k.shape[2]
    visible = torch.ones(L, S, dtype=torch.bool).tril() if is_causal else torch.ones(L, S, dtype=torch.bool)
    if key_mask is not None:
        visible = visible & key_mask[:, None, None, :]  # (B,1,L,S)
    ref, _ = attn_lib.attention(q.double(), k.double(), v.double(), mask=visible, enable_gqa=True)
    assert_close(out, ref.to(q.dtype), dtype=q.dtype)
    expected = reference_lse(q, k, visible)
    # the table's rtol on top of its lse atol: these scores reach hundreds
    torch.testing.assert_close(lse.double(), expected, atol=lse_atol(q.dtype), rtol=tolerance(q.dtype)["rtol"])
    return out, lse


@pytest.mark.parametrize("is_causal", [False, True])
def test_small_norms_need_neither_a_shift_nor_a_row_maximum(regimes, is_causal):
    q, k, v = regime_inputs(19, 23, 16, big_from=23, factor=1.0)
    check_regime_case(q, k, v, is_causal=is_causal)
    assert regimes and set(regimes) == {"bounded"}


@pytest.mark.parametrize("is_causal", [False, True])
def test_small_scores_of_long_vectors_need_no_shift(regimes, is_causal):
    # q lives in dims 0..7 and k in dims 8..15: long vectors (the Cauchy–Schwarz bound fails),
    # small scores (within ±ZERO_REF_RANGE): the row maximum is taken and nothing is shifted.
    q, k, v = regime_inputs(19, 23, 16, big_from=23, factor=1.0)
    q[..., 8:] = 0.0
    q[..., :8] *= 40.0
    k[..., :8] *= 0.01
    k[..., 8:] *= 40.0
    check_regime_case(q, k, v, is_causal=is_causal)
    assert regimes and set(regimes) == {"unshifted"}


@pytest.mark.parametrize("is_causal", [False, True])
def test_a_block_that_leaves_the_range_midway_switches_to_the_running_maximum(regimes, is_causal):
    q, k, v = regime_inputs(19, 23, 16, big_from=16, factor=30.0)  # keys 16.. (the third key block) are huge
    check_regime_case(q, k, v, is_causal=is_causal)
    assert "unshifted" in regimes and "shifted" in regimes
    first_shift = regimes.index("shifted")
    assert regimes[first_shift - 1] == "unshifted"  # the switch happens inside a query block


def test_rows_without_weight_restart_from_their_own_maximum(regimes):
    # The first 8 keys are absent: no row has weight after the first key block (which passes as
    # "unshifted": it sees no key). Every later score is below -1100 (base 2): measured from a
    # reference of 0 all of them would underflow to 0 even in float64; from the row's own
    # maximum they do not.
    q, k, v = (t.double() for t in regime_inputs(9, 24, 16, big_from=24, factor=1.0))
    q = q.abs() + 0.5
    k[:, :, 8:] = -(k[:, :, 8:].abs() + 0.5) * 300.0
    key_mask = torch.ones(1, 24, dtype=torch.bool)
    key_mask[:, :8] = False
    out, lse = check_regime_case(q, k, v, is_causal=False, key_mask=key_mask)
    assert "shifted" in regimes
    assert bool((lse * LOG2E < -1100).all())  # the scores really are that small
    assert bool((out.abs().sum(-1) > 0).all())  # every row has weight: none underflowed


# q = 1, k = ±41, D = 1: the score is ±41 (±59.2 base 2), inside ±ZERO_REF_RANGE. With the reference 0 the
# weight 2^±59.2 times v leaves float32 (1e21 · 2^59 = 6e38 > 3.4e38; 1e-29 · 2^-59 = 2e-47 < 1.4e-45).
EXTREME_VALUES = [(41.0, 1e21), (-41.0, 1e-29)]


def extreme_inputs(k_value, v_value, L, S):
    q = torch.ones(1, 1, L, 1)  # (B,H,L,D), D = 1
    k = torch.full((1, 1, S, 1), k_value)  # (B,H,S,D)
    v = torch.full((1, 1, S, 1), v_value)  # (B,H,S,Dv)
    return q, k, v


@pytest.mark.parametrize("k_value,v_value", EXTREME_VALUES, ids=["v=1e21", "v=1e-29"])
@pytest.mark.parametrize("L,S", [(1, 1), (2, 3)], ids=ids)
def test_values_the_reference_0_cannot_carry_get_the_float64_answer(regimes, k_value, v_value, L, S):
    q, k, v = extreme_inputs(k_value, v_value, L, S)
    out, _ = flash_attention_torch(q, k, v)
    want, _ = attn_lib.attention(q.double(), k.double(), v.double())  # every output is v_value
    assert bool(torch.isfinite(out).all()) and bool((out != 0).all())
    assert_close(out, want, dtype=torch.float32)
    assert regimes and set(regimes) == {"shifted"}  # the zero reference was skipped from the first tile


@pytest.mark.parametrize("k_value,v_value", EXTREME_VALUES, ids=["v=1e21", "v=1e-29"])
def test_the_zero_reference_is_what_those_values_must_skip(k_value, v_value, monkeypatch):
    """The regime rule says no for these values (and yes for ordinary ones); forced to the reference 0,
    the same call gives inf or 0: the previous test can fail."""
    q, k, v = extreme_inputs(k_value, v_value, 1, 1)
    decisions = []
    rule = tiled_forward._zero_ref_regime
    monkeypatch.setattr(tiled_forward, "_zero_ref_regime", lambda *a: decisions.append(rule(*a)) or decisions[-1])
    flash_attention_torch(q, k, v)
    flash_attention_torch(q, k, torch.ones_like(v))
    # (may the reference be 0, is every score bounded): no for these values; yes, and bounded (59.2 <= 60), for v = 1
    assert decisions == [(False, False), (True, True)]
    monkeypatch.setattr(tiled_forward, "_zero_ref_regime", lambda *a: (True, False))
    forced, _ = flash_attention_torch(q, k, v)
    assert bool(torch.isinf(forced).all()) if v_value > 1 else torch.equal(forced, torch.zeros_like(forced))


# --- blocks, counts, memory -------------------------------------------------------------------------------

def test_the_counter_tallies_every_block_read_and_written():
    """IOCounter: each of the ceil(L / block_m) query blocks reads every key block it needs."""
    B, H, L, S, D, Dv = 1, 2, 5, 7, 3, 4
    q, k, v = qkv(B, H, H, L, S, D=D, Dv=Dv, dtype=torch.float32)
    blocks = 3  # ceil(5 / 2) query blocks of block_m = 2
    counter = IOCounter()
    flash_attention_torch(q, k, v, block_m=2, block_n=4, counter=counter, key_mask=torch.ones(B, S, dtype=torch.bool))
    assert counter.reads["K"] == blocks * B * H * S * D  # 126
    assert counter.reads["V"] == blocks * B * H * S * Dv  # 168
    assert counter.reads["mask"] == blocks * B * H * S  # one bool per key
    assert counter.reads["Q"] == B * H * L * D and counter.writes["O"] == B * H * L * Dv
    assert counter.writes["lse"] == B * H * L
    counter = IOCounter()
    flash_attention_torch(q, k, v, block_m=2, block_n=4, counter=counter)
    assert "mask" not in counter.reads
    counter = IOCounter()
    flash_attention_torch(q, k, v, block_m=2, block_n=4, counter=counter, is_causal=True)
    # causal (top-left for L < S here): query rows 0-1 need keys 0..1, rows 2-3 keys 0..3, row 4 keys 0..4
    assert counter.reads["K"] == (2 + 4 + 5) * B * H * D
    assert counter.reads["V"] == (2 + 4 + 5) * B * H * Dv
    counter = IOCounter()
    flash_attention_torch(q, k, v, block_m=2, block_n=4, counter=counter, is_causal=True, align="bottom-right")
    # bottom-right (offset 2): rows 0-1 need keys 0..3, rows 2-3 keys 0..5, row 4 keys 0..6
    assert counter.reads["K"] == (4 + 6 + 7) * B * H * D


def test_a_counter_without_load_and_store_is_a_type_error():
    q, k, v = qkv(1, 1, 1, 2, 3)
    with pytest.raises(TypeError, match=r"^counter must be None or have methods load\(name, n\) and store"):
        flash_attention_torch(q, k, v, counter="x")


def key_blocks_visited(N, window, block, causal):
    q, k, v = qkv(1, 2, 1, N, N, D=4, Dv=4, dtype=torch.float32)
    counter = IOCounter()
    flash_attention_torch(q, k, v, is_causal=causal, block_m=block, block_n=block, counter=counter, enable_gqa=True,
                          window_size=window)
    return counter.reads["K"] // (block * 4)  # K elements read / (BLOCK_N · D) with one kv head: blocks visited


def test_the_cost_is_linear_in_the_window_not_quadratic():
    """N = 1024, window 64 back, blocks of 64: each query block visits at most 2 key blocks (its own and the
    one before), i.e. 2·N/64 tiles, where full causal visits (N/64)(N/64 + 1)/2."""
    N, b = 1024, 64
    n = N // b
    assert key_blocks_visited(N, (64, 0), b, True) == 2 * n - 1  # the first query block has no block before
    assert key_blocks_visited(N, (-1, -1), b, True) == n * (n + 1) // 2
    assert key_blocks_visited(N, (64, 64), b, False) == 3 * n - 2  # a window on both sides: 3 blocks


# The default query block 512 // G and the ceil(L / block) query blocks it makes for L = 1100, by hand.
DEFAULT_QUERY_BLOCKS = [((8, 8), 512, 3), ((8, 2), 128, 9), ((32, 8), 128, 9), ((6, 1), 85, 13)]


@pytest.mark.parametrize("heads, block_m, blocks", DEFAULT_QUERY_BLOCKS,
                         ids=[f"{h}x{kv}" for (h, kv), _, _ in DEFAULT_QUERY_BLOCKS])
def test_the_default_query_block_keeps_a_tile_of_512_rows_under_gqa(heads, block_m, blocks, monkeypatch):
    """G = H / H_kv query heads share a key/value head: the default block is 512 // G queries, a tile of
    at most 512 rows as without sharing; flash_attention(backend="torch") uses the same default."""
    (H, Hkv), (L, S, D) = heads, (1100, 40, 2)
    q, k, v = qkv(1, H, Hkv, L, S, D=D, Dv=D, dtype=torch.float32)
    counter = IOCounter()
    flash_attention_torch(q, k, v, enable_gqa=True, counter=counter)
    assert counter.reads["K"] == blocks * Hkv * S * D  # every query block reads every key once
    rows = []
    real = tiled_forward._forward_query_block
    monkeypatch.setattr(tiled_forward, "_forward_query_block",
                        lambda Q_i, *a: rows.append(Q_i.shape[1]) or real(Q_i, *a))
    flash_attention(q, k, v, backend="torch", enable_gqa=True)
    G = H // Hkv
    assert len(rows) == blocks and rows[0] == block_m * G and sum(rows) == L * G


def test_never_materialises_the_score_matrix():
    B, H, L, S, D = 1, 2, 1024, 1024, 16
    q, k, v, key_mask = flash_inputs(B, H, L, S, D, padding=True)
    q, k, v = q.float(), k.float(), v.float()
    for causal in (False, True):
        _, largest = largest_tensor(flash_attention_torch, q, k, v, is_causal=causal, key_mask=key_mask,
                                    block_m=128, block_n=64)
        # the biggest thing ever made is the score tile (B*H*128*64) or a copy of an input (B*H*L*D)
        assert largest <= max(B * H * 128 * 64, B * H * L * D) < B * H * L * S
    _, largest = largest_tensor(attn_lib.attention, q, k, v)
    assert largest >= B * H * L * S  # the spy does see a full score matrix when one is made


def test_the_forward_refuses_inputs_that_require_grad():
    q, k, v = qkv(1, 1, 1, 2, 3)
    with pytest.raises(ValueError, match=r"^flash_attention_torch is forward-only"):
        flash_attention_torch(q.requires_grad_(), k, v)
    with torch.no_grad():
        out, _ = flash_attention_torch(q, k, v)
    assert not out.requires_grad
