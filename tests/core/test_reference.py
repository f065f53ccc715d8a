"""The reference attention (attn_lib.core.reference: attention, attention_core) against independent oracles:
torch's SDPA (masks, scale, enable_gqa), an explicit band mask from flash-attn's rule (tests/attn_paths.visible_band) (windows,
both alignments), the reference itself with K and V repeated by hand, and the overflow rule."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attn_lib
from attn_lib.core.reference import attention_core
from attn_lib.costs.io_model import largest_tensor
from attn_lib.rules.band import Band
from attn_lib.rules.numerics import OVERFLOW_MESSAGE
from attn_lib.rules.settings import AttentionSettings
from attn_lib.tolerances import assert_close

from attn_paths import randn64, visible_band

SHAPES = [(1, 1, 1, 1, 4, 4), (2, 3, 5, 7, 8, 6), (1, 2, 17, 17, 16, 16), (2, 1, 9, 4, 3, 5)]
HEADS = [(6, 2), (8, 1), (4, 4)]  # (H, H_kv): GQA, MQA, plain multi-head
WINDOWS = [(0, 0), (1, 0), (5, 0), (3, 2), (-1, 4), (40, 40), (-1, -1)]  # (40, 40): wider than every sequence here
LENGTHS = [(7, 7), (9, 13), (13, 5)]  # odd, L < S, L > S
# every window without is_causal, and with it those whose right side is 0 or -1 (right > 0 is refused)
WINDOW_CASES = [(w, False) for w in WINDOWS] + [(w, True) for w in WINDOWS if w[1] <= 0]


def _qkv(B, H, L, S, D, Dv, dtype, gen):
    q = torch.randn(B, H, L, D, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(B, H, S, D, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(B, H, S, Dv, generator=gen, dtype=torch.float64).to(dtype)
    return q, k, v


def qkv(B, H, Hkv, L, S, D=12, Dv=10, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, L, D, generator=g, dtype=dtype), torch.randn(B, Hkv, S, D, generator=g, dtype=dtype),
            torch.randn(B, Hkv, S, Dv, generator=g, dtype=dtype))


def sdpa_oracle(q, k, v, visible):
    """torch SDPA with enable_gqa=True and a bool mask; rows that see no key are set to 0 (SDPA gives nan there)."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=k.shape[1] != q.shape[1])
    seen = visible.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2]).any(-1, keepdim=True)  # (B,H,L,1)
    return torch.where(seen, out, torch.zeros_like(out)), seen


def case_ids(value):
    return "x".join(str(x) for x in value) if isinstance(value, tuple) else str(value)


# --- against SDPA: no mask, masks, scale, 16-bit, empty ----------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_torch_sdpa(dtype, shape, is_causal, rng):
    q, k, v = _qkv(*shape, dtype, rng)
    out, scores = attn_lib.attention(q, k, v, is_causal=is_causal)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    assert out.dtype == dtype and out.shape == expected.shape
    assert_close(out, expected, dtype=dtype)
    assert scores.shape == shape[:3] + (shape[3],)
    row_sums = scores.sum(-1)
    assert_close(row_sums, torch.ones_like(row_sums), dtype=dtype, what="rows of the scores sum to 1")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bool_and_additive_masks_match_sdpa(dtype, rng):
    B, H, L, S, D = 2, 2, 6, 5, 8
    q, k, v = _qkv(B, H, L, S, D, D, dtype, rng)
    keep = torch.rand(B, 1, L, S, generator=rng) > 0.4
    keep[..., 0] = True  # every row sees at least one key (torch's fast paths differ otherwise)
    out_b, _ = attn_lib.attention(q, k, v, mask=keep)
    assert_close(out_b, F.scaled_dot_product_attention(q, k, v, attn_mask=keep), dtype=dtype)
    bias = torch.randn(L, S, generator=rng, dtype=dtype)
    out_f, _ = attn_lib.attention(q, k, v, mask=bias)
    assert_close(out_f, F.scaled_dot_product_attention(q, k, v, attn_mask=bias), dtype=dtype)
    additive = torch.zeros(B, 1, L, S, dtype=dtype).masked_fill(~keep, float("-inf"))
    out_a, _ = attn_lib.attention(q, k, v, mask=additive)
    assert_close(out_a, out_b, dtype=dtype, what="additive -inf mask vs bool mask")


def test_custom_scale_matches_sdpa(rng):
    q, k, v = _qkv(1, 2, 4, 6, 8, 8, torch.float64, rng)
    out, _ = attn_lib.attention(q, k, v, scale=0.3)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.3), dtype=torch.float64)


def test_fully_masked_row_is_zero_like_torch(rng):
    q, k, v = _qkv(1, 1, 3, 4, 4, 4, torch.float64, rng)
    keep = torch.ones(3, 4, dtype=torch.bool)
    keep[1] = False
    out, scores = attn_lib.attention(q, k, v, mask=keep)
    assert torch.equal(out[0, 0, 1], torch.zeros(4, dtype=torch.float64))
    assert torch.equal(scores[0, 0, 1], torch.zeros(4, dtype=torch.float64))
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=keep), dtype=torch.float64)
    assert not torch.isnan(out).any()


def test_mask_and_causal_combine(rng):
    q, k, v = _qkv(1, 1, 4, 4, 4, 4, torch.float64, rng)
    pad = torch.tensor([True, True, False, True])
    out, scores = attn_lib.attention(q, k, v, mask=pad, is_causal=True)
    both = torch.ones(4, 4, dtype=torch.bool).tril() & pad
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=both), dtype=torch.float64)
    assert torch.equal(scores[0, 0] > 0, both)


def test_half_precision_computed_in_float32(rng):
    q, k, v = _qkv(1, 2, 8, 8, 16, 16, torch.float16, rng)
    out, scores = attn_lib.attention(q, k, v)
    assert out.dtype == torch.float16 and scores.dtype == torch.float16
    ref, _ = attn_lib.attention(q.double(), k.double(), v.double())
    assert_close(out, ref, dtype=torch.float16)


def test_empty_sequences():
    q = torch.zeros(1, 1, 0, 4)
    k = torch.zeros(1, 1, 3, 4)
    v = torch.zeros(1, 1, 3, 5)
    out, scores = attn_lib.attention(q, k, v)
    assert out.shape == (1, 1, 0, 5) and scores.shape == (1, 1, 0, 3)
    out, scores = attn_lib.attention(torch.ones(1, 1, 2, 4), torch.zeros(1, 1, 0, 4), torch.zeros(1, 1, 0, 5))
    assert out.shape == (1, 1, 2, 5) and torch.equal(out, torch.zeros(1, 1, 2, 5))


def test_empty_float_mask_and_no_keys():
    q, k, v = randn64(1, 1, 2, 4), randn64(1, 1, 0, 4), randn64(1, 1, 0, 3)
    out, scores = attn_lib.attention(q, k, v, mask=torch.zeros(2, 0, dtype=torch.float64))
    assert out.shape == (1, 1, 2, 3) and (out == 0).all() and scores.shape == (1, 1, 2, 0)


# --- arguments: check_finite, additive masks in the working dtype, device, scale, GQA flag ----
QQ = randn64(1, 1, 3, 4)


def test_check_finite_false_skips_the_mask_scan_too():
    nan_mask = torch.zeros(3, 3, dtype=torch.float64)
    nan_mask[1, 1] = float("nan")
    with pytest.raises(ValueError, match="additive float mask"):
        attn_lib.attention(QQ, QQ, QQ, mask=nan_mask)
    out, _ = attn_lib.attention(QQ, QQ, QQ, mask=nan_mask, check_finite=False)
    assert torch.isnan(out[0, 0, 1]).all() and not torch.isnan(out[0, 0, 0]).any()


def test_an_additive_mask_is_added_in_the_working_dtype():
    # a float64 mask on float32 inputs: -1e300 is -inf in float32, so the first row sees no key (zeros)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 4, generator=g) for n in (2, 3, 3))
    mask = torch.zeros(2, 3, dtype=torch.float64)
    mask[0] = -1e300
    out, scores = attn_lib.attention(q, k, v, mask=mask)
    assert out.dtype == torch.float32 and (out[0, 0, 0] == 0).all() and (scores[0, 0, 0] == 0).all()
    assert torch.equal(out, attn_lib.attention(q, k, v, mask=mask.float())[0])


def test_the_causal_mask_is_built_on_the_input_device():
    # Under a "meta" default device a tensor made without an explicit device lands on meta.
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, 4, generator=g, dtype=torch.float64) for n in (3, 5, 5))
    want = attn_lib.attention(q, k, v, is_causal=True, mask=torch.ones(3, 5, dtype=torch.bool))
    with torch.device("meta"):
        got = attn_lib.attention(q, k, v, is_causal=True, mask=torch.ones(3, 5, dtype=torch.bool, device="cpu"))
    for a, b in zip(got, want):
        assert a.device == b.device
        assert torch.equal(a, b)


@pytest.mark.parametrize("scale", [torch.tensor(2), torch.tensor([0.5]), np.float32(0.5)],
                         ids=["int tensor", "1-element", "numpy"])
def test_a_scale_given_as_a_tensor_or_numpy_number_is_a_number(scale):
    q, k, v = (randn64(1, 1, n, 4, seed=s) for n, s in ((3, 0), (5, 1), (5, 2)))
    assert torch.equal(attn_lib.attention(q, k, v, scale=scale)[0], attn_lib.attention(q, k, v, scale=float(scale))[0])


def test_finite_inputs_whose_sum_overflows_are_finite():
    # the door's nan/inf scan sums first (one reduction); 3e38 + 3e38 overflows float32 but each value is finite
    q, k = torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4)
    v = torch.full((1, 1, 2, 4), 3e38)
    out, _ = attn_lib.attention(q, k, v)
    assert torch.equal(out, v)


def test_enable_gqa_must_be_a_bool():
    q = randn64(1, 2, 3, 4)
    with pytest.raises(TypeError, match="enable_gqa must be True or False, got None"):
        attn_lib.attention(q, q, q, enable_gqa=None)


def test_window_size_none_is_no_window(rng):
    q, k, v = _qkv(2, 2, 5, 7, 4, 3, torch.float64, rng)
    for is_causal in (False, True):
        out, scores = attn_lib.attention(q, k, v, is_causal=is_causal, window_size=None)
        assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=is_causal), dtype=torch.float64)
        assert torch.equal(scores, attn_lib.attention(q, k, v, is_causal=is_causal)[1])


# --- overflow: the direction, and only in a row that sees a key --------------------------------
def test_scores_that_overflow_to_plus_inf_are_reported_as_plus_inf():
    q, k = torch.full((1, 1, 1, 4), 1e19), torch.full((1, 1, 3, 4), 1e19)  # q·k = 4e38: +inf in float32
    with pytest.raises(ValueError, match=f"^{OVERFLOW_MESSAGE} to \\+inf .*float32"):
        attn_lib.attention(q, k, k)
    out, _ = attn_lib.attention(q.double(), k.double(), k.double())  # float64 holds it: equal scores, the mean of v
    assert_close(out, k.double()[:, :, :1], dtype=torch.float64)


def test_scores_that_all_overflow_to_minus_inf_are_reported_as_minus_inf():
    q, k, v = torch.full((1, 1, 2, 4), 1e19), torch.full((1, 1, 3, 4), -1e19), randn64(1, 1, 3, 4).float()
    with pytest.raises(ValueError, match=f"^{OVERFLOW_MESSAGE} to -inf .*float32"):
        attn_lib.attention(q, k, v)
    bias = torch.zeros(2, 3)  # the same through an additive mask that leaves the keys visible
    with pytest.raises(ValueError, match=f"^{OVERFLOW_MESSAGE} to -inf "):
        attn_lib.attention(q, k, v, mask=bias)
    keep = torch.tensor([[False] * 3, [True] * 3])  # one row sees no key, the other overflowed
    with pytest.raises(ValueError, match=f"^{OVERFLOW_MESSAGE} to -inf "):
        attn_lib.attention(q, k, v, mask=keep)
    out, _ = attn_lib.attention(q, k, v, mask=torch.zeros(2, 3, dtype=torch.bool))  # no row sees a key: zeros
    assert torch.equal(out, torch.zeros(1, 1, 2, 4))
    out, _ = attn_lib.attention(q, k, v, check_finite=False)  # the check off: no error (and no promise)
    assert out.shape == (1, 1, 2, 4)


def test_a_score_that_overflows_to_minus_inf_beside_finite_ones_is_harmless():
    # q.k0 = -1.6e39 is -inf in float32; its true weight, exp(-1.6e39 - max), is 0 as well: no error
    q = torch.full((1, 1, 1, 4), 2e19)
    k = torch.stack([torch.full((4,), -2e19), torch.ones(4)])[None, None]  # (1,1,2,4)
    v = torch.eye(2, 4)[None, None]
    out, scores = attn_lib.attention(q, k, v, scale=0.5)
    assert torch.equal(scores, torch.tensor([[[[0.0, 1.0]]]])) and torch.equal(out, v[:, :, 1:])


def test_a_harmless_minus_inf_score_stays_harmless_beside_a_row_that_sees_no_key():
    # row 0: one score -inf in float32 beside a finite one; row 1: no key visible. Neither overflowed.
    q = torch.stack([torch.full((4,), 2e19), torch.ones(4)])[None, None]  # (1,1,2,4)
    k = torch.stack([torch.full((4,), -2e19), torch.ones(4)])[None, None]  # (1,1,2,4)
    v = torch.eye(2, 4)[None, None]
    keep = torch.tensor([[True, True], [False, False]])
    out, scores = attn_lib.attention(q, k, v, mask=keep, scale=0.5)
    assert torch.equal(scores, torch.tensor([[[[0.0, 1.0], [0.0, 0.0]]]]))
    assert torch.equal(out, torch.stack([v[0, 0, 1], torch.zeros(4)])[None, None])


# --- grouped-query attention and sliding windows -----------------------------------------------
@pytest.mark.parametrize("heads", HEADS, ids=case_ids)
@pytest.mark.parametrize("lengths", LENGTHS, ids=case_ids)
@pytest.mark.parametrize("window,causal", WINDOW_CASES, ids=lambda c: case_ids(c) if isinstance(c, tuple) else
                         ("causal" if c else "full"))
def test_reference_matches_sdpa_with_gqa_and_a_written_out_band(heads, lengths, window, causal):
    (H, Hkv), (L, S) = heads, lengths
    q, k, v = qkv(2, H, Hkv, L, S)
    kpm = torch.ones(2, S, dtype=torch.bool)
    kpm[1, S // 2:] = False  # the second sequence's last keys are padding
    out, scores = attn_lib.attention(q, k, v, mask=kpm[:, None, None, :], is_causal=causal, enable_gqa=True,
                                     window_size=window)
    visible = visible_band(L, S, causal, window)[None, None] & kpm[:, None, None, :]  # (B,1,L,S)
    want, seen = sdpa_oracle(q, k, v, visible)
    assert_close(out, want, dtype=torch.float64)
    assert scores.shape == (2, H, L, S)
    assert bool((scores[~visible.expand_as(scores)] == 0).all())  # nothing outside the band and the padding
    assert_close(scores.sum(-1), seen.squeeze(-1).to(scores.dtype).expand(2, H, L), dtype=torch.float64)


BOTTOM_RIGHT_LENGTHS = [(3, 8), (8, 3), (1, 6), (6, 1), (5, 9), (9, 5)]
BOTTOM_RIGHT_CASES = [((-1, -1), True), ((2, 0), True), ((0, 0), True), ((-1, 0), False), ((1, 1), False),
                      ((3, 2), False), ((0, -1), False), ((2**64, 0), False)]


@pytest.mark.parametrize("lengths", BOTTOM_RIGHT_LENGTHS, ids=case_ids)
@pytest.mark.parametrize("window,causal", BOTTOM_RIGHT_CASES, ids=lambda c: case_ids(c) if isinstance(c, tuple)
                         else ("causal" if c else "window"))
def test_bottom_right_follows_flash_attn_rule(lengths, window, causal):
    # flash-attn: query i sees key j iff i + S - L - left <= j <= i + S - L + right (causal: right = 0);
    # a row that sees nothing gives zeros
    L, S = lengths
    q, k, v = qkv(2, 4, 2, L, S, D=6, Dv=5, seed=L * 10 + S)
    visible = visible_band(L, S, causal, window, S - L)[None, None]  # (1,1,L,S)
    want, seen = sdpa_oracle(q, k, v, visible)
    out, scores = attn_lib.attention(q, k, v, is_causal=causal, window_size=window, align="bottom-right",
                                     enable_gqa=True)
    assert_close(out, want, dtype=torch.float64)
    assert bool((out[~seen.expand_as(out)] == 0).all()) and bool((scores[~visible.expand_as(scores)] == 0).all())
    if not causal and window == (-1, 0):  # the same band asked for as is_causal
        same, _ = attn_lib.attention(q, k, v, is_causal=True, align="bottom-right", enable_gqa=True)
        assert torch.equal(same, out)


@pytest.mark.parametrize("lengths", BOTTOM_RIGHT_LENGTHS, ids=case_ids)
def test_bottom_right_causal_equals_torch_lower_right_and_top_left_equals_is_causal(lengths):
    L, S = lengths
    q, k, v = qkv(1, 2, 2, L, S, D=6, Dv=5)
    visible = torch.ones(L, S, dtype=torch.bool).tril(S - L)  # torch's causal_lower_right, written out
    want, _ = sdpa_oracle(q, k, v, visible[None, None])
    assert_close(attn_lib.attention(q, k, v, is_causal=True, align="bottom-right")[0], want, dtype=torch.float64)
    assert_close(attn_lib.attention(q, k, v, is_causal=True, align="top-left")[0],
                 F.scaled_dot_product_attention(q, k, v, is_causal=True), dtype=torch.float64)


@pytest.mark.parametrize("heads", HEADS, ids=case_ids)
def test_gqa_equals_attention_with_k_v_repeated_by_hand(heads):
    H, Hkv = heads
    q, k, v = qkv(1, H, Hkv, 9, 11)
    G = H // Hkv
    out, scores = attn_lib.attention(q, k, v, enable_gqa=True, window_size=(3, 2))
    rep_out, rep_scores = attn_lib.attention(q, k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1),
                                             window_size=(3, 2))
    assert_close(out, rep_out, dtype=torch.float64)
    assert_close(scores, rep_scores, dtype=torch.float64)
    # query head h uses key/value head h // G: moving kv head 0 changes query heads 0..G-1 only
    k2 = k.clone()
    k2[:, 0] += 1.0
    out2, _ = attn_lib.attention(q, k2, v, enable_gqa=True, window_size=(3, 2))
    changed = (out2 - out).abs().amax(dim=(0, 2, 3)) > 0  # (H,)
    assert changed.tolist() == [h < G for h in range(H)]


def test_gqa_gradients_match_sdpa():
    q, k, v = (t.requires_grad_() for t in qkv(2, 6, 2, 7, 9))
    out, _ = attn_lib.attention(q, k, v, enable_gqa=True, is_causal=True)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    dout = torch.randn_like(out)
    mine = torch.autograd.grad(out, (q, k, v), dout)
    theirs = torch.autograd.grad(ref, (q, k, v), dout)
    for a, b, name in zip(mine, theirs, "qkv"):
        assert a.shape == b.shape
        assert_close(a, b, dtype=torch.float64, what=f"d{name}", kind="gradient")


def test_window_and_an_additive_mask_combine():
    q, k, v = qkv(1, 4, 2, 8, 8)
    bias = torch.randn(8, 8, dtype=torch.float64)
    out, _ = attn_lib.attention(q, k, v, mask=bias, enable_gqa=True, window_size=(2, 1))
    visible = visible_band(8, 8, False, (2, 1))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.masked_fill(~visible, float("-inf")),
                                          enable_gqa=True)
    assert_close(out, want, dtype=torch.float64)


@pytest.mark.parametrize("offset", [0, 4, -3])
def test_core_band_offset_aligns_the_window(offset):
    q, k, v = qkv(1, 6, 3, 5, 9)
    settings = AttentionSettings(band=Band.resolve(5, 9, is_causal=True, window_size=(2, 0), offset=offset),
                                 scale=12 ** -0.5, work_dtype=torch.float64)
    out, scores = attention_core(q, k, v, None, settings)
    visible = visible_band(5, 9, True, (2, 0), offset)
    want, _ = sdpa_oracle(q, k, v, visible)
    assert_close(out, want, dtype=torch.float64)
    assert bool((scores[..., ~visible] == 0).all())


def test_core_computes_in_the_settings_work_dtype_with_its_scale():
    # q·k0 = 1e8 + 1 - 1e8: 1 in float64, 0 in float32 (1e8 + 1 rounds to 1e8); q·k1 = 0
    q = torch.tensor([1.0, 1.0, 1.0]).reshape(1, 1, 1, 3)
    k = torch.tensor([[1e8, 1.0, -1e8], [0.0, 0.0, 0.0]]).reshape(1, 1, 2, 3)
    v = torch.tensor([[1.0], [0.0]]).reshape(1, 1, 2, 1)
    for work, scale, weight in ((torch.float64, 1.0, 1 / (1 + math.exp(-1))), (torch.float64, 2.0, 1 / (1 + math.exp(-2))),
                                (torch.float32, 1.0, 0.5)):
        out, scores = attention_core(q, k, v, None, AttentionSettings(band=Band(), scale=scale, work_dtype=work))
        assert out.dtype == scores.dtype == torch.float32
        assert_close(out, torch.full((1, 1, 1, 1), weight, dtype=torch.float64), dtype=torch.float32,
                     what=f"work {work}, scale {scale}")


def test_fully_hidden_rows_give_zeros_and_zero_gradients():
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, 2, 9, 4))
    out, scores = attn_lib.attention(q, k, v, enable_gqa=True, window_size=(0, 0))  # queries 4..8 see no key
    assert bool((out[:, :, 4:] == 0).all()) and bool((scores[:, :, 4:] == 0).all())
    assert bool(out[:, :, :4].abs().sum(-1).gt(0).all())
    (out * torch.randn_like(out)).sum().backward()
    assert bool((q.grad[:, :, 4:] == 0).all())  # (window (0, 0): one key per row, so dq = 0 everywhere)
    assert bool(v.grad.abs().sum(-1).gt(0).all())  # each of the 4 keys is seen by its own query


def test_reference_never_repeats_k_and_v():
    """What it measures: the largest tensor any aten op returns during the call (attn_lib.costs.io_model.largest_tensor).
    Here L is small and D large, so K, V repeated to H heads (B·H·S·D) would be the largest tensor by far; the
    call stays at the (B, H, L, S) scores or the inputs."""
    B, H, Hkv, L, S, D = 1, 8, 1, 2, 16, 32
    q, k, v = qkv(B, H, Hkv, L, S, D=D, Dv=D)
    _, largest = largest_tensor(attn_lib.attention, q, k, v, enable_gqa=True, window_size=(4, 0))
    assert largest <= max(B * H * L * S, k.numel(), q.numel())
    assert largest < B * H * S * D // 2  # 8x below repeated K


def test_window_as_mask_equals_window_size():
    q, k, v = qkv(2, 6, 2, 9, 9)
    a, sa = attn_lib.attention(q, k, v, enable_gqa=True, window_size=(3, 1))
    b, sb = attn_lib.attention(q, k, v, enable_gqa=True, mask=attn_lib.sliding_window_mask(9, window_size=(3, 1)))
    assert torch.equal(a, b) and torch.equal(sa, sb)


def test_a_window_wider_than_any_sequence_limits_nothing():
    q, k, v = qkv(1, 2, 2, 5, 7)
    out, _ = attn_lib.attention(q, k, v, window_size=(2**64, 2**64))
    assert_close(out, F.scaled_dot_product_attention(q, k, v), dtype=torch.float64)
    causal, _ = attn_lib.attention(q, k, v, is_causal=True, window_size=(2**64, 0))
    assert_close(causal, F.scaled_dot_product_attention(q, k, v, is_causal=True), dtype=torch.float64)


def test_float32_gqa_window_matches_float64_reference():
    q, k, v = qkv(1, 8, 2, 11, 13, dtype=torch.float32)
    out, _ = attn_lib.attention(q, k, v, enable_gqa=True, window_size=(4, 0), is_causal=True)
    visible = visible_band(11, 13, True, (4, 0))[None, None]
    ref, _ = sdpa_oracle(q.double(), k.double(), v.double(), visible)
    assert out.dtype == torch.float32
    assert_close(out, ref, dtype=torch.float32)


def test_default_scale_is_one_over_sqrt_d():
    q, k, v = qkv(1, 1, 1, 3, 4, D=7, Dv=2)
    assert_close(attn_lib.attention(q, k, v)[0], attn_lib.attention(q, k, v, scale=1 / math.sqrt(7))[0],
                 dtype=torch.float64)
    assert_close(attn_lib.attention(q, k, v)[0], F.scaled_dot_product_attention(q, k, v), dtype=torch.float64)


def test_an_additive_minus_inf_hides_a_key_whose_score_overflows_as_a_bool_mask_does():
    """+inf + -inf would be nan: a key an additive -inf hides must not take part, however large its score."""
    q = torch.full((1, 1, 1, 4), 1e19)  # (B,H,L,D): q·k of the first key overflows float32
    k = torch.tensor([[[[1e19] * 4, [1.0] * 4]]])  # (B,H,S,D)
    v = torch.tensor([[[[5.0] * 4, [2.0] * 4]]])  # (B,H,S,D)
    additive, _ = attn_lib.attention(q, k, v, mask=torch.tensor([[float("-inf"), 0.0]]))
    boolean, _ = attn_lib.attention(q, k, v, mask=torch.tensor([[False, True]]))
    assert torch.equal(additive, boolean) and torch.equal(boolean, v[:, :, 1:])
