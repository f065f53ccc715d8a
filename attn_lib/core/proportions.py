"""第 3 章（Softmax，测量用）：比例为什么必须加起来等于 1：不归一化时，输出的大小会随序列长度漂移（测量用）。

Chapter 03 compares three ways of turning scores into weights before the weighted sum:

- ``"softmax"``: proportions, >= 0 and summing to 1 (what attention uses);
- ``"exp"``: ``exp(score)`` without dividing by the sum (softmax minus its normalisation);
- ``"sigmoid"``: ``sigmoid(score)``, each weight in (0, 1) on its own, no common sum.

``mean_output_norm`` measures the average length of the weighted sum of L random value
vectors for each of them (float64, CPU, seeded: the same numbers on every machine).
"""
from __future__ import annotations

import math

import torch

from ..checks import check_positive_int
from .softmax import softmax

WEIGHTINGS = ("softmax", "exp", "sigmoid")


def weights_from_scores(scores: torch.Tensor, weighting: str = "softmax") -> torch.Tensor:
    """把评分变成加权求和用的权重：softmax（归一化）、exp 或 sigmoid（都不归一化）。

    Args:
        scores: float tensor (..., S).
        weighting: one of ``"softmax"``, ``"exp"``, ``"sigmoid"``.

    Returns:
        Tensor of shape (..., S); only ``"softmax"`` rows sum to 1.
    """
    if weighting == "softmax":
        return softmax(scores, dim=-1)  # (...,S), rows sum to 1
    if weighting == "exp":
        return torch.exp(scores)  # (...,S), rows sum to anything
    if weighting == "sigmoid":
        return torch.sigmoid(scores)  # (...,S), each in (0,1)
    raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")


def mean_output_norm(
    L: int,
    *,
    weighting: str = "softmax",
    d: int = 16,
    n_trials: int = 200,
    value_mean: float = 1.0,
    generator: torch.Generator | None = None,
    seed: int = 0,
) -> float:
    """测量：一个随机查询对 L 个随机键、值做加权求和，输出向量长度（范数）的平均值。

    Queries and keys have independent N(0, 1) entries, the scores are q·k/√d; the values
    have entries ``value_mean + N(0, 1)`` (a shared non-zero part: a setting of this
    experiment, not a claim about real features).
    With the same ``seed`` every weighting sees the very same vectors.

    Args:
        L: the sequence length (number of keys and values).
        weighting: ``"softmax"``, ``"exp"`` or ``"sigmoid"`` (see ``weights_from_scores``).
        d: the length of every vector.
        n_trials: how many independent queries (each with its own keys and values) to average.
        value_mean: the mean of every value entry.
        generator: a seeded ``torch.Generator`` (default: seeded with ``seed``).
        seed: used only when ``generator`` is None.

    Returns:
        The average over trials of ‖Σ_j w_j v_j‖ (a float).
    """
    check_positive_int("L", L)
    check_positive_int("d", d)
    check_positive_int("n_trials", n_trials)
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    gen = generator if generator is not None else torch.Generator().manual_seed(seed)
    q = torch.randn(n_trials, 1, d, generator=gen, dtype=torch.float64)  # (T,1,d)
    k = torch.randn(n_trials, L, d, generator=gen, dtype=torch.float64)  # (T,L,d)
    v = value_mean + torch.randn(n_trials, L, d, generator=gen, dtype=torch.float64)  # (T,L,d)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(d)  # (T,1,d) @ (T,d,L) -> (T,1,L)
    w = weights_from_scores(scores, weighting)  # (T,1,L)
    out = (w @ v).squeeze(-2)  # (T,1,L) @ (T,L,d) -> (T,1,d) -> (T,d)
    return float(torch.linalg.vector_norm(out, dim=-1).mean())  # (T,d) -> (T,) -> ()
