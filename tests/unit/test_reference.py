"""The reference attention (torch) and its numpy twin against torch's own SDPA."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attn_lib
from attn_lib.core import numpy_ref
from attn_lib.tolerances import assert_close

from attn_paths import randn64

SHAPES = [(1, 1, 1, 1, 4, 4), (2, 3, 5, 7, 8, 6), (1, 2, 17, 17, 16, 16), (2, 1, 9, 4, 3, 5)]


def _qkv(B, H, L, S, D, Dv, dtype, gen):
    q = torch.randn(B, H, L, D, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(B, H, S, D, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(B, H, S, Dv, generator=gen, dtype=torch.float64).to(dtype)
    return q, k, v


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


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_numpy_twin_matches_torch(dtype, is_causal):
    gen = np.random.default_rng(1)
    q = gen.standard_normal((2, 2, 5, 6)).astype(dtype)
    k = gen.standard_normal((2, 2, 7, 6)).astype(dtype)
    v = gen.standard_normal((2, 2, 7, 3)).astype(dtype)
    mask = gen.random((2, 1, 5, 7)) > 0.3
    out_np, sc_np = numpy_ref.attention(q, k, v, mask=mask, is_causal=is_causal)
    out_t, sc_t = attn_lib.attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                                     mask=torch.from_numpy(mask), is_causal=is_causal)
    assert out_np.dtype == np.dtype(dtype)
    assert_close(out_np, out_t, dtype=dtype)
    assert_close(sc_np, sc_t, dtype=dtype)


def test_numpy_additive_mask_and_scale():
    gen = np.random.default_rng(2)
    q, k, v = (gen.standard_normal((1, 1, 3, 4)) for _ in range(3))
    bias = np.array([0.0, -np.inf, 0.5])
    out_np, _ = numpy_ref.attention(q, k, v, mask=bias, scale=0.7)
    out_t, _ = attn_lib.attention(*(torch.from_numpy(x) for x in (q, k, v)), mask=torch.from_numpy(bias), scale=0.7)
    assert_close(out_np, out_t, dtype="float64")


def test_worked_example_numbers():
    from attn_lib.core import worked_example as we

    q, k, v = we.as_tensors()
    out, scores = attn_lib.attention(q, k, v)
    dots = (q @ k.transpose(-2, -1)).flatten().tolist()
    assert dots == pytest.approx([6.0, 1.2, 4.8])
    expected_w = torch.softmax(torch.tensor([3.0, 0.6, 2.4], dtype=torch.float64), 0)
    assert torch.allclose(scores.flatten(), expected_w)
    assert [round(x, 2) for x in scores.flatten().tolist()] == list(we.SOURCE_PRINTED["weights"])
    assert torch.allclose(out.flatten(), expected_w @ v[0, 0])
    qa, ka, va = we.as_arrays()
    assert np.allclose(numpy_ref.attention(qa, ka, va)[0], out.numpy())


# --- check_finite=False turns off the mask scan too; an empty float mask with no keys -----------
QQ = randn64(1, 1, 3, 4)


def test_check_finite_false_skips_the_mask_scan_too():
    nan_mask = torch.zeros(3, 3, dtype=torch.float64)
    nan_mask[1, 1] = float("nan")
    with pytest.raises(ValueError, match="additive float mask"):
        attn_lib.attention(QQ, QQ, QQ, mask=nan_mask)
    out, _ = attn_lib.attention(QQ, QQ, QQ, mask=nan_mask, check_finite=False)
    assert torch.isnan(out[0, 0, 1]).all() and not torch.isnan(out[0, 0, 0]).any()


def test_empty_float_mask_and_no_keys():
    q, k, v = randn64(1, 1, 2, 4), randn64(1, 1, 0, 4), randn64(1, 1, 0, 3)
    out, scores = attn_lib.attention(q, k, v, mask=torch.zeros(2, 0, dtype=torch.float64))
    assert out.shape == (1, 1, 2, 3) and (out == 0).all() and scores.shape == (1, 1, 2, 0)


def test_a_score_that_overflows_to_minus_inf_beside_finite_ones_is_harmless():
    # q.k0 = -1.6e39 is -inf in float32; its true weight, exp(-1.6e39 - max), is 0 as well: no error
    q = torch.full((1, 1, 1, 4), 2e19)
    k = torch.stack([torch.full((4,), -2e19), torch.ones(4)])[None, None]  # (1,1,2,4)
    v = torch.eye(2, 4)[None, None]
    out, scores = attn_lib.attention(q, k, v, scale=0.5)
    assert torch.equal(scores, torch.tensor([[[[0.0, 1.0]]]])) and torch.equal(out, v[:, :, 1:])


def test_an_additive_mask_is_added_in_the_working_dtype():
    # a float64 mask on float32 inputs: -1e300 is -inf in float32, so the first row sees no key (zeros)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 4, generator=g) for n in (2, 3, 3))
    mask = torch.zeros(2, 3, dtype=torch.float64)
    mask[0] = -1e300
    out, scores = attn_lib.attention(q, k, v, mask=mask)
    assert out.dtype == torch.float32 and (out[0, 0, 0] == 0).all() and (scores[0, 0, 0] == 0).all()
    torch.testing.assert_close(out, attn_lib.attention(q, k, v, mask=mask.float())[0], rtol=0, atol=0)


def test_the_causal_mask_is_built_on_the_input_device():
    # Under a "meta" default device a tensor made without an explicit device lands on meta.
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, 4, generator=g, dtype=torch.float64) for n in (3, 5, 5))
    want = attn_lib.attention(q, k, v, is_causal=True, mask=torch.ones(3, 5, dtype=torch.bool))
    with torch.device("meta"):
        got = attn_lib.attention(q, k, v, is_causal=True, mask=torch.ones(3, 5, dtype=torch.bool, device="cpu"))
    for a, b in zip(got, want):
        assert a.device == b.device
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("scale", [torch.tensor(2), torch.tensor([0.5]), np.float32(0.5)], ids=["int tensor", "1-element", "numpy"])
def test_a_scale_given_as_a_tensor_or_numpy_number_is_a_number(scale):
    q, k, v = (randn64(1, 1, n, 4, seed=s) for n, s in ((3, 0), (5, 1), (5, 2)))
    torch.testing.assert_close(attn_lib.attention(q, k, v, scale=scale)[0], attn_lib.attention(q, k, v, scale=float(scale))[0],
                               rtol=0, atol=0)


def test_finite_inputs_whose_sum_overflows_are_finite():
    # the door's nan/inf scan sums first (one reduction); 3e38 + 3e38 overflows float32 but each value is finite
    q, k = torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4)
    v = torch.full((1, 1, 2, 4), 3e38)
    out, _ = attn_lib.attention(q, k, v)
    assert torch.equal(out, v)
