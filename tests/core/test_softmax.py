"""softmax and naive_softmax (attn_lib.core.softmax) against torch.softmax: stable, -inf means masked, a row of
only -inf gives zeros, nan / +inf refused, 16-bit input worked in float32."""
import importlib
import math

import pytest
import torch

import attn_lib
from attn_lib.tolerances import assert_close

from attn_paths import randn64


def test_softmax_matches_torch_and_sums_to_one():
    x = torch.randn(4, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p = attn_lib.softmax(x)
    assert_close(p, torch.softmax(x, -1), dtype=torch.float64)
    assert_close(p.sum(-1), torch.ones(4, dtype=torch.float64), dtype=torch.float64, what="row sums")
    assert_close(attn_lib.softmax(x, dim=0), torch.softmax(x, 0), dtype=torch.float64, what="dim=0")


def test_naive_overflows_stable_does_not():
    x = torch.tensor([1000.0, 999.0, 998.0])
    assert torch.isnan(attn_lib.naive_softmax(x)).any()
    p = attn_lib.softmax(x)
    assert_close(p, torch.softmax(x - 1000, -1), dtype=torch.float32)
    assert bool(torch.isfinite(p).all())


def test_minus_inf_gets_zero_and_all_minus_inf_row_is_zeros():
    x = torch.tensor([[0.0, -math.inf, 1.0], [-math.inf, -math.inf, -math.inf]])
    p = attn_lib.softmax(x)
    assert p[0, 1] == 0
    assert_close(p[0], torch.softmax(x[0].double(), -1), dtype=torch.float32)
    assert torch.equal(p[1], torch.zeros(3))
    assert bool(torch.isnan(torch.softmax(x, -1)[1]).all())  # what torch itself gives there


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_plus_inf_is_refused(bad):
    x = torch.tensor([[0.0, 1.0], [bad, 0.0]])
    with pytest.raises(ValueError, match="Only -inf is allowed"):
        attn_lib.softmax(x)


def test_softmax_gradient_through_a_dead_row_is_zero_not_nan():
    x = torch.tensor([[0.5, 1.0, -math.inf], [-math.inf, -math.inf, -math.inf]], dtype=torch.float64,
                     requires_grad=True)
    w = torch.tensor([[1.0, -2.0, 3.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    (attn_lib.softmax(x) * w).sum().backward()
    live = x[0, :2].detach().requires_grad_()
    (torch.softmax(live, -1) * w[0, :2]).sum().backward()
    assert_close(x.grad[0, :2], live.grad, dtype=torch.float64, kind="gradient")
    assert torch.equal(x.grad[1], torch.zeros(3, dtype=torch.float64)) and x.grad[0, 2] == 0


# --- naive_softmax along any axis; a single score; empty rows; 16-bit input worked in float32 --
@pytest.mark.parametrize("shape,dim", [((3, 3), 0), ((3, 3), -1), ((3, 3), 1), ((2, 5), 0), ((2, 5), -1),
                                       ((4, 1, 3), 0), ((4, 1, 3), 1), ((4, 1, 3), -1)])
def test_naive_softmax_normalises_along_dim(shape, dim):
    x = randn64(*shape)
    assert_close(attn_lib.naive_softmax(x, dim), torch.softmax(x, dim), dtype="float64", what="naive_softmax")
    assert_close(attn_lib.naive_softmax(x), torch.softmax(x, -1), dtype="float64", what="naive_softmax default dim")


@pytest.mark.parametrize("shape,dim", [((3, 3), 0), ((4, 1, 3), 1), ((2, 5), -2)])
def test_softmax_normalises_along_dim(shape, dim):
    x = randn64(*shape, seed=3)
    assert_close(attn_lib.softmax(x, dim), torch.softmax(x, dim), dtype="float64")


def test_softmax_of_a_single_score():
    one = attn_lib.softmax(torch.tensor(2.5))
    assert one.shape == () and one.item() == 1.0
    assert attn_lib.softmax(torch.tensor(float("-inf"))).item() == 0.0


def test_softmax_of_an_empty_row_is_empty():
    x = torch.zeros(3, 0)
    assert attn_lib.softmax(x).shape == (3, 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_softmax_is_computed_in_float32(dtype):
    x = (randn64(4, 300) * 4).to(dtype)
    expected = torch.softmax(x.float(), -1).to(dtype)
    assert attn_lib.softmax(x).dtype == dtype and torch.equal(attn_lib.softmax(x), expected)


def test_16_bit_softmax_with_a_dead_row_keeps_its_dtype():
    x = torch.tensor([[0.5, 1.0], [float("-inf"), float("-inf")]], dtype=torch.float16)
    p = attn_lib.softmax(x)
    assert p.dtype == torch.float16 and (p[1] == 0).all()
    assert_close(p[0], torch.softmax(x[0].double(), -1), dtype="float16")


def test_softmax_with_max_keeps_the_dtype_and_the_row_check_does_not_scan(monkeypatch):
    sm = importlib.import_module("attn_lib.core.softmax")  # the module (attn_lib.softmax is the function)
    x = torch.tensor([[0.5, 1.0], [float("-inf"), float("-inf")]], dtype=torch.float16)
    live = x[:1]
    assert sm.softmax_with_max(live, live.amax(-1, keepdim=True), 1).dtype == torch.float16
    assert sm.softmax_with_max(x, x.amax(-1, keepdim=True), 1).dtype == torch.float16

    def no_scan(*a, **k):
        raise AssertionError("finite row maxima: check_row_max must not scan the scores")

    checks = importlib.import_module("attn_lib.checks.tensors")  # where check_row_max lives
    monkeypatch.setattr(checks, "check_scores_finite", no_scan)
    checks.check_row_max(x, x.amax(-1, keepdim=True))  # one -inf row max: allowed, no scan
    assert (attn_lib.softmax(x)[1] == 0).all()


def test_softmax_with_max_equals_torch_softmax_on_live_rows():
    sm = importlib.import_module("attn_lib.core.softmax")
    x = randn64(3, 5, seed=7)
    x[1] = float("-inf")
    got = sm.softmax_with_max(x, x.amax(-1, keepdim=True), 1)
    assert_close(got[[0, 2]], torch.softmax(x[[0, 2]], -1), dtype=torch.float64)
    assert torch.equal(got[1], torch.zeros(5, dtype=torch.float64))
