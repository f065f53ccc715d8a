"""The numpy twin (attn_lib.core.numpy_ref): softmax, naive_softmax, causal_mask and attention against torch
(torch.softmax, torch's SDPA, the torch reference in float64) and the overflow rule of every torch path."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attn_lib
from attn_lib.core import numpy_ref
from attn_lib.rules.numerics import OVERFLOW_MESSAGE
from attn_lib.tolerances import assert_close


def arrays(*shapes, dtype="float64", seed=1):
    gen = np.random.default_rng(seed)
    return [gen.standard_normal(shape).astype(dtype) for shape in shapes]


# --- softmax ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("shape,dim", [((4, 7), -1), ((4, 7), 0), ((2, 3, 5), 1)])
def test_softmax_equals_torch_softmax(dtype, shape, dim):
    (x,) = arrays(shape, dtype=dtype)
    p = numpy_ref.softmax(x, dim)
    assert p.dtype == np.dtype(dtype)
    assert_close(p, torch.softmax(torch.from_numpy(x).double(), dim), dtype=dtype)


def test_stable_softmax_does_not_overflow_and_naive_does():
    x = np.array([1000.0, 999.0, 998.0])
    with np.errstate(all="ignore"):
        assert np.isnan(numpy_ref.naive_softmax(x)).any()
    assert_close(numpy_ref.softmax(x), torch.softmax(torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64), -1),
                 dtype="float64")


def test_minus_inf_gets_zero_and_all_minus_inf_row_is_zeros():
    x = np.array([[0.0, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf]], dtype=np.float32)
    p = numpy_ref.softmax(x)
    assert p[0, 1] == 0 and np.array_equal(p[1], np.zeros(3, dtype=np.float32))
    assert_close(p[0], torch.softmax(torch.tensor([0.0, float("-inf"), 1.0], dtype=torch.float64), -1),
                 dtype="float32")


def test_float16_softmax_is_computed_in_float32():
    (x,) = arrays((3, 200), seed=4)
    x16 = (x * 4).astype(np.float16)
    p = numpy_ref.softmax(x16)
    assert p.dtype == np.float16
    assert np.array_equal(p, torch.softmax(torch.from_numpy(x16).float(), -1).numpy().astype(np.float16))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_softmax_refuses_nan_and_plus_inf(bad):
    with pytest.raises(ValueError, match="Only -inf is allowed"):
        numpy_ref.softmax(np.array([0.0, bad]))


def test_softmax_of_a_single_score_and_of_an_empty_row():
    assert numpy_ref.softmax(np.array(2.5)) == 1.0 and numpy_ref.softmax(np.array(-np.inf)) == 0.0
    assert numpy_ref.softmax(np.zeros((3, 0))).shape == (3, 0)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_naive_softmax_normalises_along_axis(axis):
    (x,) = arrays((3, 4), seed=2)
    assert_close(numpy_ref.naive_softmax(x, axis), torch.softmax(torch.from_numpy(x), axis), dtype="float64")


# --- causal_mask -----------------------------------------------------------------------------
@pytest.mark.parametrize("L,S", [(1, 1), (3, 3), (2, 5), (5, 2), (0, 3)])
def test_causal_mask_equals_the_torch_one(L, S):
    got = numpy_ref.causal_mask(L, S)
    assert got.dtype == bool and got.shape == (L, S)
    assert np.array_equal(got, attn_lib.causal_mask(L, S).numpy())
    assert np.array_equal(numpy_ref.causal_mask(L), np.tril(np.ones((L, L), dtype=bool)))


# --- attention -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_attention_matches_the_torch_reference(dtype, is_causal):
    q, k, v = arrays((2, 2, 5, 6), (2, 2, 7, 6), (2, 2, 7, 3), dtype=dtype)
    mask = np.random.default_rng(1).random((2, 1, 5, 7)) > 0.3
    out_np, sc_np = numpy_ref.attention(q, k, v, mask=mask, is_causal=is_causal)
    out_t, sc_t = attn_lib.attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                                     mask=torch.from_numpy(mask), is_causal=is_causal)
    assert out_np.dtype == np.dtype(dtype) and sc_np.dtype == np.dtype(dtype)
    assert_close(out_np, out_t, dtype=dtype)
    assert_close(sc_np, sc_t, dtype=dtype)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
def test_float64_attention_matches_sdpa(is_causal, mask_kind):
    q, k, v = arrays((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 2), seed=3)
    keep = np.random.default_rng(3).random((4, 6)) > 0.3
    keep[:, 0] = True  # every row sees a key (SDPA gives nan otherwise)
    mask = {"none": None, "bool": keep, "additive": np.where(keep, 0.5, -np.inf)}[mask_kind]
    out, scores = numpy_ref.attention(q, k, v, mask=mask, is_causal=is_causal)
    visible = torch.from_numpy(keep if mask is not None else np.ones((4, 6), dtype=bool))
    if is_causal:
        visible = visible & torch.ones(4, 6, dtype=torch.bool).tril()
    bias = torch.zeros(4, 6, dtype=torch.float64).masked_fill(~visible, float("-inf"))
    if mask_kind == "additive":
        bias = bias + 0.5
    want = F.scaled_dot_product_attention(*(torch.from_numpy(x) for x in (q, k, v)), attn_mask=bias)
    assert_close(out, want, dtype="float64")
    assert_close(scores.sum(-1), np.ones((2, 3, 4)), dtype="float64", what="rows of the scores sum to 1")


def test_additive_mask_and_scale():
    q, k, v = arrays((1, 1, 3, 4), (1, 1, 3, 4), (1, 1, 3, 4), seed=2)
    bias = np.array([0.0, -np.inf, 0.5])
    out_np, _ = numpy_ref.attention(q, k, v, mask=bias, scale=0.7)
    want = F.scaled_dot_product_attention(*(torch.from_numpy(x) for x in (q, k, v)), attn_mask=torch.from_numpy(bias)[None],
                                          scale=0.7)
    assert_close(out_np, want, dtype="float64")


def test_a_row_that_sees_no_key_is_zeros():
    q, k, v = arrays((1, 1, 3, 4), (1, 1, 4, 4), (1, 1, 4, 2), seed=5)
    keep = np.ones((3, 4), dtype=bool)
    keep[1] = False
    out, scores = numpy_ref.attention(q, k, v, mask=keep)
    assert np.array_equal(out[0, 0, 1], np.zeros(2)) and np.array_equal(scores[0, 0, 1], np.zeros(4))
    assert not np.isnan(out).any()


def test_a_3d_mask_is_refused_as_in_torch():
    q = arrays((2, 2, 3, 4))[0]
    with pytest.raises(ValueError, match="3-D"):
        numpy_ref.attention(q, q, q, mask=np.ones((2, 3, 3), dtype=bool))


# --- overflow: the direction, per row, as on every torch path ----------------------------------
def test_scores_that_overflow_to_plus_inf_are_reported_as_plus_inf():
    q, k = np.full((1, 1, 1, 4), 1e19, dtype=np.float32), np.full((1, 1, 3, 4), 1e19, dtype=np.float32)
    with pytest.raises(ValueError, match=f"^{OVERFLOW_MESSAGE} to \\+inf .*float32"):
        numpy_ref.attention(q, k, k)


def test_scores_that_all_overflow_to_minus_inf_are_reported_as_minus_inf():
    q, k = np.full((1, 1, 2, 4), 1e19, dtype=np.float32), np.full((1, 1, 3, 4), -1e19, dtype=np.float32)
    v = arrays((1, 1, 3, 4), dtype="float32")[0]
    with pytest.raises(ValueError, match=f"^{OVERFLOW_MESSAGE} to -inf .*float32"):
        numpy_ref.attention(q, k, v)
    keep = np.array([[False] * 3, [True] * 3])  # one row sees no key, the other overflowed
    with pytest.raises(ValueError, match=f"^{OVERFLOW_MESSAGE} to -inf "):
        numpy_ref.attention(q, k, v, mask=keep)
    out, _ = numpy_ref.attention(q, k, v, mask=np.zeros((2, 3), dtype=bool))  # no row sees a key: zeros
    assert np.array_equal(out, np.zeros((1, 1, 2, 4), dtype=np.float32))


def test_a_harmless_minus_inf_score_stays_harmless_beside_a_row_that_sees_no_key():
    # row 0: one score -inf in float32 beside a finite one; row 1: no key visible. Neither overflowed.
    q = np.stack([np.full(4, 2e19), np.ones(4)]).astype(np.float32)[None, None]  # (1,1,2,4)
    k = np.stack([np.full(4, -2e19), np.ones(4)]).astype(np.float32)[None, None]  # (1,1,2,4)
    v = np.eye(2, 4, dtype=np.float32)[None, None]
    keep = np.array([[True, True], [False, False]])
    out, scores = numpy_ref.attention(q, k, v, mask=keep, scale=0.5)
    assert np.array_equal(scores, np.array([[[[0.0, 1.0], [0.0, 0.0]]]], dtype=np.float32))
    assert np.array_equal(out[0, 0], np.stack([v[0, 0, 1], np.zeros(4, dtype=np.float32)]))


def test_the_same_overflow_gives_the_same_message_as_the_torch_reference():
    q, k = np.full((1, 1, 2, 4), 1e19, dtype=np.float32), np.full((1, 1, 3, 4), -1e19, dtype=np.float32)
    for kk in (k, -k):  # -inf, then +inf
        with pytest.raises(ValueError) as theirs:
            attn_lib.attention(torch.from_numpy(q), torch.from_numpy(kk), torch.from_numpy(kk))
        with pytest.raises(ValueError) as ours:
            numpy_ref.attention(q, kk, kk)
        assert str(ours.value) == str(theirs.value)


def test_the_worked_example_gives_the_torch_reference_numbers():
    from attn_lib.core import worked_example as we

    out, scores = numpy_ref.attention(*we.as_arrays())
    ref_out, ref_scores = attn_lib.attention(*we.as_tensors())
    assert_close(out, ref_out, dtype="float64")
    assert_close(scores, ref_scores, dtype="float64")
