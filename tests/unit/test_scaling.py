"""attn_lib.core.scaling: the measurements behind chapter 04 (spread of q·k, softmax saturation, gradients)."""
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


@pytest.mark.parametrize("d", [4, 64, 1024])
def test_score_std_grows_like_sqrt_d(d):
    measured = score_std(d, n_samples=4000)
    assert measured == pytest.approx(math.sqrt(d), rel=0.08)


def test_score_std_is_reproducible_and_checks_its_input():
    assert score_std(16, seed=3) == score_std(16, seed=3)
    assert score_std(16, seed=3) != score_std(16, seed=4)
    with pytest.raises(ValueError, match="d must be a positive int"):
        score_std(0)
    with pytest.raises(ValueError, match="n_samples must be >= 2"):
        score_std(4, n_samples=1)


def test_random_unit_variance_has_mean_0_and_variance_1():
    x = random_unit_variance((200_000,), seed=1)
    assert x.dtype == torch.float64
    assert abs(float(x.mean())) < 0.01
    assert float(x.var()) == pytest.approx(1.0, abs=0.01)


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
    assert float(uniform) == pytest.approx(math.sqrt(S - 1) / S)
    peaked = softmax_grad_norm(torch.tensor([40.0, 0.0, 0.0, 0.0], dtype=torch.float64))
    assert_close(peaked, torch.zeros((), dtype=torch.float64), dtype="float64", what="gradient norm of a one-hot softmax")
    with pytest.raises(TypeError):
        softmax_jacobian(torch.tensor([1, 0]))


def test_saturation_without_scaling_collapses_with_scaling_stays():
    sat = {(d, s): softmax_saturation(d, scaled=s) for d in (4, 1024) for s in (True, False)}
    assert isinstance(sat[4, True], Saturation)
    # without 1/sqrt(d): the largest proportion heads for 1, the typical gradient for 0
    assert sat[1024, False].max_proportion > 0.9 > sat[4, False].max_proportion
    assert sat[1024, False].grad_norm_median < 1e-3 < 0.1 < sat[4, False].grad_norm_median
    # with it: both stay where they were at d = 4
    assert sat[1024, True].max_proportion == pytest.approx(sat[4, True].max_proportion, abs=0.05)
    assert sat[1024, True].grad_norm_median == pytest.approx(sat[4, True].grad_norm_median, abs=0.05)


def test_saturation_sees_the_same_vectors_with_and_without_scaling():
    # d = 1: dividing by sqrt(1) changes nothing, so both calls must agree exactly
    assert softmax_saturation(1, scaled=True) == softmax_saturation(1, scaled=False)
