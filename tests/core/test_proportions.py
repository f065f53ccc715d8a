"""attn_lib.core.proportions: why proportions must sum to 1 (chapter 03's measurement), against torch's
softmax / exp / sigmoid and the output norms it explains.

The growth claims use the thresholds named below (what "stays" and "drifts" mean for chapter 03's plot)."""
import pytest
import torch

from attn_lib.core.proportions import WEIGHTINGS, mean_output_norm, weights_from_scores
from attn_lib.tolerances import assert_close

from attn_paths import DISTINGUISHABLE

STAYS = 1.5  # softmax: the output norm at L = 1024 and L = 4 differ by less than this factor
DRIFTS = 100  # exp / sigmoid: it grows by more than this factor (about L: 1024 / 4 = 256)


def test_weights_are_torch_softmax_exp_and_sigmoid():
    scores = torch.randn(5, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    want = {"softmax": torch.softmax(scores, -1), "exp": torch.exp(scores), "sigmoid": torch.sigmoid(scores)}
    for w in WEIGHTINGS:
        assert_close(weights_from_scores(scores, w), want[w], dtype="float64", what=w)


def test_only_softmax_weights_sum_to_one():
    scores = torch.randn(5, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    sums = {w: weights_from_scores(scores, w).sum(-1) for w in WEIGHTINGS}
    assert_close(sums["softmax"], torch.ones(5, dtype=torch.float64))
    assert float((sums["exp"] - 1).abs().max()) > DISTINGUISHABLE
    assert float((sums["sigmoid"] - 1).abs().max()) > DISTINGUISHABLE
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
    assert_close(unnormalized, torch.exp(scores).sum() * v, dtype="float64")  # the same value, blown up by Σ exp
    assert float(unnormalized.norm()) > DRIFTS * float(v.norm())


def test_output_norm_stays_with_softmax_and_drifts_without():
    lengths = (4, 64, 1024)
    norms = {w: [mean_output_norm(L, weighting=w, n_trials=100) for L in lengths] for w in WEIGHTINGS}
    soft = norms["softmax"]
    assert max(soft) / min(soft) < STAYS
    for w in ("exp", "sigmoid"):
        grow = norms[w][-1] / norms[w][0]
        assert grow > DRIFTS, (w, norms[w])


def test_mean_output_norm_is_the_norm_of_a_seeded_weighted_sum():
    g = torch.Generator().manual_seed(5)
    T, L, d = 7, 9, 16
    q = torch.randn(T, 1, d, generator=g, dtype=torch.float64)
    k = torch.randn(T, L, d, generator=g, dtype=torch.float64)
    v = 1.0 + torch.randn(T, L, d, generator=g, dtype=torch.float64)
    w = torch.softmax(q @ k.transpose(-2, -1) / d ** 0.5, -1)  # (T,1,L)
    want = torch.linalg.vector_norm((w @ v).squeeze(1), dim=-1).mean()
    got = mean_output_norm(L, weighting="softmax", d=d, n_trials=T, seed=5)
    assert_close(torch.tensor(got, dtype=torch.float64), want, dtype="float64")


def test_mean_output_norm_checks_its_input():
    with pytest.raises(ValueError, match="L must be a positive int"):
        mean_output_norm(0)
    with pytest.raises(ValueError, match="weighting must be one of"):
        mean_output_norm(4, weighting="none")
    assert mean_output_norm(8, seed=1) == mean_output_norm(8, seed=1)
