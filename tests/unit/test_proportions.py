"""attn_lib.core.proportions: why proportions must sum to 1 (chapter 03's measurement)."""
import pytest
import torch

from attn_lib.core.proportions import WEIGHTINGS, mean_output_norm, weights_from_scores
from attn_lib.tolerances import assert_close


def test_only_softmax_weights_sum_to_one():
    scores = torch.randn(5, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    sums = {w: weights_from_scores(scores, w).sum(-1) for w in WEIGHTINGS}
    assert_close(sums["softmax"], torch.ones(5, dtype=torch.float64))
    assert not torch.allclose(sums["exp"], torch.ones(5, dtype=torch.float64))
    assert not torch.allclose(sums["sigmoid"], torch.ones(5, dtype=torch.float64))
    with pytest.raises(ValueError, match="weighting must be one of"):
        weights_from_scores(scores, "relu")


def test_softmax_mix_of_identical_values_is_that_value_at_every_length():
    v = torch.tensor([2.0, 0.0, 4.0, 1.0], dtype=torch.float64)
    for L in (1, 10, 1000):
        scores = torch.linspace(-3, 3, L, dtype=torch.float64)  # (L,)
        values = v.expand(L, 4)  # (L,4)
        assert_close(weights_from_scores(scores, "softmax") @ values, v, what=f"L={L}")
    scores = torch.linspace(-3, 3, 1000, dtype=torch.float64)  # (L,)
    unnormalized = weights_from_scores(scores, "exp") @ v.expand(1000, 4)  # (L,) @ (L,4) -> (4,)
    assert float(unnormalized.norm()) > 100 * float(v.norm())  # the same value, blown up by Σ exp


def test_output_norm_stays_with_softmax_and_drifts_without():
    lengths = (4, 64, 1024)
    norms = {w: [mean_output_norm(L, weighting=w, n_trials=100) for L in lengths] for w in WEIGHTINGS}
    soft = norms["softmax"]
    assert max(soft) / min(soft) < 1.5
    for w in ("exp", "sigmoid"):
        grow = norms[w][-1] / norms[w][0]
        assert grow > 100, (w, norms[w])  # roughly proportional to L: 1024 / 4 = 256


def test_mean_output_norm_checks_its_input():
    with pytest.raises(ValueError, match="L must be a positive int"):
        mean_output_norm(0)
    with pytest.raises(ValueError, match="weighting must be one of"):
        mean_output_norm(4, weighting="none")
    assert mean_output_norm(8, seed=1) == mean_output_norm(8, seed=1)
