"""The naive baseline (``attn_lib.flash.naive``: ``naive_attention`` and ``naive_core``) against the float64
reference ``attn_lib.attention`` and torch's own softmax: key masks, causal top-left and bottom-right,
rows that see no key (zeros, zero gradients), overflow, the low-precision recipe (scores in the input
dtype, softmax in float32, proportions rounded back), gradients, and the full score matrix it builds.
"""
import pytest
import torch

import attn_lib
from attn_lib import naive_attention
from attn_lib.checks.doors import check_naive_call
from attn_lib.costs.io_model import largest_tensor
from attn_lib.flash.naive import naive_core
from attn_lib.rules.settings import Options
from attn_lib.tolerances import assert_close

from attn_paths import flash_inputs, flash_reference, reference_grads

OVERFLOW_UP = r"attention scores overflowed to \+inf"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("padding", [False, True], ids=["nopad", "pad"])
def test_float64_matches_the_reference(causal, padding):
    q, k, v, key_mask = flash_inputs(2, 2, 17, 23, 8, 5, padding=padding)
    ref, _ = flash_reference(q, k, v, key_mask, causal)
    assert_close(naive_attention(q, k, v, is_causal=causal, key_mask=key_mask), ref)


@pytest.mark.parametrize("L,S", [(5, 11), (11, 5), (7, 7)])
def test_bottom_right_is_the_tril_with_offset_s_minus_l(L, S):
    q, k, v, key_mask = flash_inputs(2, 2, L, S, 8, 6, seed=L + S, padding=True)
    visible = torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L) & key_mask[:, None, None, :]  # (B,1,L,S)
    ref, _ = attn_lib.attention(q, k, v, mask=visible)
    assert_close(naive_attention(q, k, v, is_causal=True, align="bottom-right", key_mask=key_mask), ref)
    assert_close(naive_attention(q, k, v, align="bottom-right", key_mask=key_mask),
                 flash_reference(q, k, v, key_mask, False)[0])  # without is_causal the alignment changes nothing


def test_rows_that_see_no_key_are_zeros_with_zero_gradients():
    q, k, v, _ = flash_inputs(2, 2, 9, 6, 4)
    key_mask = torch.ones(2, 6, dtype=torch.bool)
    key_mask[1] = False  # sequence 1: every key absent
    key_mask[0, 0] = False  # causal: query 0 of sequence 0 sees only key 0, which is absent
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = naive_attention(qg, kg, vg, is_causal=True, key_mask=key_mask)
    assert not bool(out[1].any()) and not bool(out[0, :, 0].any()) and bool(out[0, :, 1:].abs().sum(-1).gt(0).all())
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=out.dtype))
    assert all(bool(torch.isfinite(g).all()) for g in (qg.grad, kg.grad, vg.grad))
    assert not bool(qg.grad[1].any()) and not bool(qg.grad[0, :, 0].any())
    # causal bottom-right with L > S: queries 0 .. L - S - 1 see no key at all
    out = naive_attention(q, k, v, is_causal=True, align="bottom-right")
    assert not bool(out[:, :, :3].any()) and bool(out[:, :, 3:].abs().sum(-1).gt(0).all())


def test_a_fully_masked_batch_is_not_an_overflow():
    q, k, v, _ = flash_inputs(1, 2, 5, 6, 4)
    out = naive_attention(q.float(), k.float(), v.float(), key_mask=torch.zeros(1, 6, dtype=torch.bool))
    assert torch.equal(out, torch.zeros_like(out))


def test_overflowing_scores_raise_and_float64_holds_them():
    q, k, v, _ = flash_inputs(1, 2, 5, 6, 4)
    q32, k32, v32 = q.float() * 0 + 1e20, k.float() * 0 + 1e20, v.float()  # scale·q·k = 2e40 > 3.4e38
    with pytest.raises(ValueError, match=OVERFLOW_UP + r" \(\|scale·q·k\| exceeds the range of float32\)"):
        naive_attention(q32, k32, v32)
    q64, k64, v64 = (t.double() for t in (q32, k32, v32))
    assert_close(naive_attention(q64, k64, v64), attn_lib.attention(q64, k64, v64)[0])


def test_a_row_whose_visible_scores_all_fall_to_minus_infinity_is_an_overflow():
    """Every score a row sees is -1e40 (-inf in float32) while a row that sees no key is just zeros."""
    q = torch.full((1, 1, 2, 1), 1e20)
    k = torch.full((1, 1, 3, 1), -1e20)
    v = torch.ones(1, 1, 3, 1)
    with pytest.raises(ValueError, match=r"attention scores overflowed to -inf"):
        naive_attention(q, k, v, scale=1.0)
    with pytest.raises(ValueError, match=r"attention scores overflowed to -inf"):  # a key mask hides the nan no more
        naive_attention(q, k, v, scale=1.0, key_mask=torch.tensor([[True, False, True]]))
    out = naive_attention(q, k, v, scale=1.0, key_mask=torch.zeros(1, 3, dtype=torch.bool))  # no key seen: zeros
    assert torch.equal(out, torch.zeros_like(out))
    assert_close(naive_attention(q.double(), k.double(), v.double(), scale=1.0),
                 attn_lib.attention(q.double(), k.double(), v.double(), scale=1.0)[0])


def test_the_core_without_the_overflow_check_returns_what_softmax_makes_of_it():
    q, k, v, _ = flash_inputs(1, 1, 3, 4, 2)
    q32, k32, v32 = q.float() * 0 + 1e20, k.float() * 0 + 1e20, v.float()
    settings = check_naive_call(q32, k32, v32, Options(check_finite=False))
    assert not settings.check_overflow
    out = naive_core(q32, k32, v32, settings)  # every score is +inf: softmax gives nan, nothing raised
    assert bool(torch.isnan(out).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_follows_the_naive_recipe(dtype):
    """Scores in the input dtype, softmax in float32, proportions rounded back, then @ v: the same steps
    written with torch here."""
    q, k, v, key_mask = flash_inputs(2, 2, 13, 17, 8, padding=True, seed=4)
    ql, kl, vl = (t.to(dtype) for t in (q, k, v))
    scores = (ql * 8 ** -0.5) @ kl.transpose(-2, -1)  # (B,H,L,S) in the low precision
    scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    want = torch.softmax(scores, dim=-1, dtype=torch.float32).nan_to_num(0.0).to(dtype) @ vl  # (B,H,L,Dv)
    out = naive_attention(ql, kl, vl, key_mask=key_mask)
    assert out.dtype == dtype and torch.equal(out, want)


def test_gradients_match_the_reference_and_gradcheck():
    q, k, v, key_mask = flash_inputs(2, 2, 11, 13, 4, 3, padding=True, seed=9)
    inputs = tuple(t.requires_grad_() for t in (q, k, v))
    fn = lambda q, k, v: naive_attention(q, k, v, is_causal=True, key_mask=key_mask)  # noqa: E731
    assert torch.autograd.gradcheck(fn, inputs, fast_mode=True)
    out = fn(*inputs)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=out.dtype)
    for g, e in zip(torch.autograd.grad(out, inputs, dout), reference_grads(q, k, v, dout, key_mask, True)):
        assert bool(torch.isfinite(g).all())
        assert_close(g, e, kind="gradient")


def test_it_builds_the_full_score_matrix():
    B, H, L, S, D = 1, 2, 128, 160, 8
    q, k, v, key_mask = flash_inputs(B, H, L, S, D, padding=True, seed=8)
    for causal in (False, True):
        _, largest = largest_tensor(naive_attention, q.float(), k.float(), v.float(), is_causal=causal,
                                    key_mask=key_mask)
        assert largest >= B * H * L * S
