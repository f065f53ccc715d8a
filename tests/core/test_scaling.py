"""attn_lib.core.scaling: the measurements behind chapter 04 (spread of q·k, softmax saturation, gradients),
against torch (autograd's Jacobian, seeded torch.randn), closed forms, and the sampling error of each measurement.

The measurements are random (seeded): a measured value is compared with its theoretical value within
SIGMAS standard errors of the estimate (the standard error is computed from the sample size below), a
statistical bound, not a numeric tolerance. The saturation claims compare regimes with the thresholds
named below (what "saturated" and "still in the same regime" mean for chapter 04's plots)."""
import math

import pytest
import torch

from attn_lib import softmax
from attn_lib.core.scaling import (
    Saturation,
    random_unit_variance,
    score_std,
    softmax_grad_norm,
    softmax_jacobian,
    softmax_saturation,
)
from attn_lib.tolerances import assert_close

SIGMAS = 4  # standard errors a seeded estimate may stray from its expectation
SATURATED = 0.9  # a largest proportion above this: the softmax is nearly one-hot
STALLED = 1e-3  # a typical gradient norm below this: the softmax no longer passes gradients
ALIVE = 0.1  # a typical gradient norm above this: gradients flow
SAME_REGIME = 0.05  # scaled measurements at d = 4 and d = 1024 differ by less than this


@pytest.mark.parametrize("d", [4, 64, 1024])
def test_score_std_grows_like_sqrt_d(d):
    n = 4000
    measured = score_std(d, n_samples=n)
    # q·k is a sum of d products of unit normals: variance d, kurtosis 3 + 6/d, so the sample std has
    # relative standard error sqrt((2 + 6/d) / n) / 2
    rel_se = math.sqrt((2 + 6 / d) / n) / 2
    assert abs(measured / math.sqrt(d) - 1) < SIGMAS * rel_se


def test_score_std_is_the_std_of_seeded_dot_products():
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(500, 16, generator=g, dtype=torch.float64) for _ in range(2))
    want = (q * k).sum(-1).std()
    assert_close(torch.tensor(score_std(16, n_samples=500, seed=3), dtype=torch.float64), want, dtype="float64")


def test_score_std_is_reproducible_and_checks_its_input():
    assert score_std(16, seed=3) == score_std(16, seed=3)
    assert score_std(16, seed=3) != score_std(16, seed=4)
    with pytest.raises(ValueError, match="d must be a positive int"):
        score_std(0)
    with pytest.raises(ValueError, match="n_samples must be >= 2"):
        score_std(4, n_samples=1)


def test_random_unit_variance_has_mean_0_and_variance_1():
    n = 200_000
    x = random_unit_variance((n,), seed=1)
    assert x.dtype == torch.float64
    assert torch.equal(x, torch.randn(n, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    assert abs(float(x.mean())) < SIGMAS / math.sqrt(n)  # standard error of a mean: 1 / sqrt(n)
    assert abs(float(x.var()) - 1) < SIGMAS * math.sqrt(2 / n)  # of a normal sample's variance: sqrt(2 / n)


def test_jacobian_matches_autograd():
    logits = torch.tensor([[3.0, 0.6, 2.4], [1.0, -2.0, 0.5]], dtype=torch.float64)  # (2,3)
    p = softmax(logits)
    for row in range(2):
        auto = torch.autograd.functional.jacobian(lambda x: torch.softmax(x, -1), logits[row])  # (3,3)
        assert_close(softmax_jacobian(p)[row], auto, what=f"row {row}")


def test_jacobian_vanishes_for_one_hot_and_is_largest_for_ties():
    one_hot = torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    assert torch.count_nonzero(softmax_jacobian(one_hot)) == 0
    S = 4
    uniform = softmax_grad_norm(torch.zeros(S, dtype=torch.float64))
    assert_close(uniform, torch.tensor(math.sqrt(S - 1) / S, dtype=torch.float64), dtype="float64",
                 what="gradient norm of S equal proportions")
    peaked = softmax_grad_norm(torch.tensor([40.0, 0.0, 0.0, 0.0], dtype=torch.float64))
    assert_close(peaked, torch.zeros((), dtype=torch.float64), dtype="float64", what="gradient norm of a one-hot softmax")
    with pytest.raises(TypeError):
        softmax_jacobian(torch.tensor([1, 0]))


def test_grad_norm_is_the_frobenius_norm_of_autograd_jacobian():
    logits = torch.tensor([0.3, -1.0, 2.0, 0.0, 0.5], dtype=torch.float64)
    auto = torch.autograd.functional.jacobian(lambda x: torch.softmax(x, -1), logits)
    assert_close(softmax_grad_norm(logits), torch.linalg.matrix_norm(auto), dtype="float64")


def test_saturation_without_scaling_collapses_with_scaling_stays():
    sat = {(d, s): softmax_saturation(d, scaled=s) for d in (4, 1024) for s in (True, False)}
    assert isinstance(sat[4, True], Saturation)
    # without 1/sqrt(d): the largest proportion heads for 1, the typical gradient for 0
    assert sat[1024, False].max_proportion > SATURATED > sat[4, False].max_proportion
    assert sat[1024, False].grad_norm_median < STALLED < ALIVE < sat[4, False].grad_norm_median
    # with it: both stay where they were at d = 4
    assert abs(sat[1024, True].max_proportion - sat[4, True].max_proportion) < SAME_REGIME
    assert abs(sat[1024, True].grad_norm_median - sat[4, True].grad_norm_median) < SAME_REGIME


def test_saturation_sees_the_same_vectors_with_and_without_scaling():
    # d = 1: dividing by sqrt(1) changes nothing, so both calls must agree exactly
    assert softmax_saturation(1, scaled=True) == softmax_saturation(1, scaled=False)
