"""第 1–4、6–8 章（Softmax，第 3 章讲它）：把一串评分压成一组都不小于 0、加起来等于 1 的比例（torch 版）。

Two versions:

- ``naive_softmax``: ``exp(x) / sum(exp(x))`` exactly as written on paper. ``exp(1000)``
  overflows to ``inf`` and the result becomes ``nan``.
- ``softmax``: subtract each row's maximum first. The result is mathematically identical
  (the factor ``exp(-max)`` cancels) but no exponent exceeds ``exp(0) = 1``.

Conventions of the stable version (the whole library follows them):

- ``-inf`` entries get proportion exactly 0 (that is how masks work);
- a row whose every entry is ``-inf`` (a query that may see no key) returns all zeros, not
  ``nan``; the attention output of such a row is then the zero vector, the same as
  ``torch.nn.functional.scaled_dot_product_attention``;
- ``nan`` or ``+inf`` in the input raises ``ValueError`` (there is no meaningful proportion);
- float16 / bfloat16 inputs are computed in float32 and returned in their own dtype.
"""
from __future__ import annotations

import torch

from ..rules.numerics import work_dtype
from ..checks import check_float_tensor, check_row_max, check_softmax_input


def naive_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """照公式直接算的 softmax：exp(x) / Σexp(x)。输入大时会溢出成 nan（教学用）。

    Args:
        x: float tensor of any shape.
        dim: the axis that becomes proportions.

    Returns:
        Tensor of ``x``'s shape.
    """
    check_float_tensor("x", x, twin="softmax")
    e = torch.exp(x)  # (...) -> (...)
    return e / e.sum(dim, keepdim=True)  # (...) / (..., 1, ...) -> (...)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """数值稳定的 softmax：先减去每行最大值再取指数；全是 -inf 的行返回全 0。

    The subtraction of the row maximum is what ``torch.softmax`` does inside its fused
    kernel, so this function calls it and adds the library's two conventions on top. A row
    that holds ``nan`` or ``+inf``, or only ``-inf``, comes out of that kernel as ``nan`` in
    *every* entry (its sum is ``nan``), so looking at one entry per row finds them all; only
    then is the input examined: ``nan`` / ``+inf`` raise, all ``-inf`` rows become zeros.
    Differentiable (autograd), also through all ``-inf`` rows.

    Args:
        x: float tensor of any shape; ``-inf`` allowed, ``nan`` / ``+inf`` rejected.
        dim: the axis that becomes proportions (default: last).

    Returns:
        Tensor of ``x``'s shape and dtype; along ``dim`` the entries are >= 0 and sum to 1,
        or are all 0 where every input was ``-inf``.
    """
    dim = check_softmax_input(x, dim)
    if x.ndim == 0:  # a single score is a row of length 1: 1, or 0 if it is -inf
        return softmax(x.reshape(1)).reshape(())  # () -> (1,) -> ()
    if x.shape[dim] == 0:
        return x.clone()
    work = work_dtype(x.dtype)  # float16 / bfloat16 -> float32
    out = torch.softmax(x, dim, dtype=work)  # (...,S,...); a bad or all -inf row is nan throughout
    if bool(torch.isnan(out.select(dim, 0)).any()):  # one entry per row: (...,S,...) -> (...,...)
        m = x.amax(dim, keepdim=True)  # (...,S,...) -> (...,1,...); nan / +inf propagate into m
        check_row_max(x, m)
        return softmax_with_max(x, m, dim)
    return out.to(x.dtype)


def softmax_with_max(x: torch.Tensor, m: torch.Tensor, dim: int) -> torch.Tensor:
    """softmax 的无检查内核：m = x 沿 dim 的最大值（有限或 -inf），全 -inf 的行输出 0。

    Args:
        x: float tensor; ``dim`` a normalised (non-negative) axis of a tensor with >= 1 axis.
        m: ``x.amax(dim, keepdim=True)``, already checked (no nan, no +inf).
        dim: the axis.

    Returns:
        Proportions of ``x``'s shape and dtype (float16 / bfloat16 computed in float32).
    """
    work = work_dtype(x.dtype)  # float16 / bfloat16 -> float32
    dead = torch.isneginf(m)  # (...,1,...): rows that may see nothing
    if bool(dead.any()):
        x = x.masked_fill(dead, 0.0)  # a finite row, so that softmax (and its gradient) has no nan
        return torch.softmax(x, dim, dtype=work).masked_fill(dead, 0.0).to(x.dtype)  # dead rows -> 0
    return torch.softmax(x, dim, dtype=work).to(x.dtype)
