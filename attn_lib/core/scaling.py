"""第 4、9、11 章（缩放）：为什么要除以 √d——点积的离散程度、Softmax 的饱和，以及穿过 Softmax 的梯度。

Three measurements behind chapter 04, on random vectors whose entries are independent with
mean 0 and variance 1 (float64, CPU, a seeded ``torch.Generator``: the same numbers on
every machine):

- ``score_std``: the standard deviation of q·k grows like √d;
- ``softmax_jacobian`` / ``softmax_grad_norm``: the derivative of softmax with respect to
  its inputs, ``diag(p) - p pᵀ``, which goes to 0 when p becomes one-hot;
- ``softmax_saturation``: for one query against S keys, the largest proportion and the
  Jacobian's norm, averaged over trials, with and without the 1/√d scaling.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..checks import check_positive_int
from .softmax import softmax


def _generator(generator: torch.Generator | None, seed: int) -> torch.Generator:
    return generator if generator is not None else torch.Generator().manual_seed(seed)


def random_unit_variance(shape, *, generator: torch.Generator | None = None, seed: int = 0) -> torch.Tensor:
    """造一组随机向量：每个分量独立，均值 0、方差 1（float64，CPU）。

    Args:
        shape: the tensor shape, e.g. (N, d).
        generator: a seeded ``torch.Generator`` (default: a new one seeded with ``seed``).
        seed: used only when ``generator`` is None.

    Returns:
        float64 tensor of ``shape``.
    """
    return torch.randn(*shape, generator=_generator(generator, seed), dtype=torch.float64)


def score_std(d: int, *, n_samples: int = 4000, generator: torch.Generator | None = None, seed: int = 0) -> float:
    """测量：随机 q、k（分量方差为 1）的点积 q·k 的标准差；理论值是 √d。

    Args:
        d: the length of q and k.
        n_samples: how many independent (q, k) pairs to draw.
        generator: a seeded ``torch.Generator`` (default: seeded with ``seed``).
        seed: used only when ``generator`` is None.

    Returns:
        The sample standard deviation of the ``n_samples`` dot products (a float).
    """
    check_positive_int("d", d)
    check_positive_int("n_samples", n_samples)
    if n_samples < 2:
        raise ValueError(f"n_samples must be >= 2 to measure a spread, got {n_samples}")
    gen = _generator(generator, seed)
    q = random_unit_variance((n_samples, d), generator=gen)  # (N,d)
    k = random_unit_variance((n_samples, d), generator=gen)  # (N,d)
    scores = (q * k).sum(-1)  # (N,d) * (N,d) -> (N,)
    return float(scores.std())


def softmax_jacobian(p: torch.Tensor) -> torch.Tensor:
    """Softmax 对输入的雅可比矩阵：J = diag(p) − p pᵀ，J[i, j] = ∂p_i / ∂x_j。

    Args:
        p: proportions (the softmax output), shape (..., S).

    Returns:
        Tensor of shape (..., S, S).
    """
    if not isinstance(p, torch.Tensor) or not p.is_floating_point():
        raise TypeError(f"p must be a floating-point torch.Tensor, got {type(p).__name__}")
    if p.ndim < 1:
        raise ValueError("p must have at least one axis (..., S)")
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)  # (...,S,S) - (...,S,1)*(...,1,S) -> (...,S,S)


def softmax_grad_norm(logits: torch.Tensor) -> torch.Tensor:
    """穿过 Softmax 的梯度有多大：雅可比矩阵 diag(p) − p pᵀ 的 Frobenius 范数，p = softmax(logits)。

    It is 0 exactly when p is one-hot (softmax saturated: the output no longer moves when
    the inputs move); for S equal proportions it is √(S−1)/S.

    Args:
        logits: the inputs of softmax, shape (..., S).

    Returns:
        Tensor of shape (...).
    """
    p = softmax(logits, dim=-1)  # (...,S)
    return torch.linalg.matrix_norm(softmax_jacobian(p))  # (...,S,S) -> (...)


class Saturation(NamedTuple):
    """softmax_saturation 的结果：最大比例的平均值，梯度范数的平均值与中位数。"""

    max_proportion: float
    grad_norm_mean: float
    grad_norm_median: float


def softmax_saturation(
    d: int,
    *,
    num_keys: int = 16,
    n_trials: int = 200,
    scaled: bool = True,
    generator: torch.Generator | None = None,
    seed: int = 0,
) -> Saturation:
    """测量：一个随机查询对 num_keys 个随机键做 Softmax，最大比例和梯度范数有多大。

    Args:
        d: the length of the query and key vectors.
        num_keys: S, the number of keys.
        n_trials: how many independent queries (each with its own keys) to average over.
        scaled: divide the dot products by √d first (as attention does).
        generator: a seeded ``torch.Generator`` (default: seeded with ``seed``). With the
            same seed, ``scaled=True`` and ``scaled=False`` see the very same vectors.
        seed: used only when ``generator`` is None.

    Returns:
        ``Saturation(max_proportion, grad_norm_mean, grad_norm_median)``: over the trials,
        the average largest softmax proportion, and the average and the median of
        ``softmax_grad_norm`` (the median shows the typical query; the mean is pulled up by
        the few queries whose two best keys happen to tie).
    """
    check_positive_int("d", d)
    check_positive_int("num_keys", num_keys)
    check_positive_int("n_trials", n_trials)
    gen = _generator(generator, seed)
    q = random_unit_variance((n_trials, 1, d), generator=gen)  # (T,1,d)
    k = random_unit_variance((n_trials, num_keys, d), generator=gen)  # (T,S,d)
    logits = (q @ k.transpose(-2, -1)).squeeze(-2)  # (T,1,d) @ (T,d,S) -> (T,1,S) -> (T,S)
    if scaled:
        logits = logits / math.sqrt(d)  # (T,S)
    p = softmax(logits, dim=-1)  # (T,S)
    max_prop = p.amax(-1)  # (T,S) -> (T,)
    grad = softmax_grad_norm(logits)  # (T,S) -> (T,)
    return Saturation(float(max_prop.mean()), float(grad.mean()), float(grad.median()))
