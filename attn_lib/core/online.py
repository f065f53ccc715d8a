"""第 8 章（FlashAttention 之一，在线 Softmax）：一段一段地读一行评分，只记「目前最大值」和「目前的指数和」两个数，读完就得到整行的 softmax。

Standard softmax needs the whole row twice: once for its maximum ``m``, once for
``l = Σ exp(x - m)``. Online softmax (Milakov & Gimelshein 2018; the heart of FlashAttention)
reads the row in pieces and keeps a running pair ``(m, l)``. When a new piece raises the
maximum from ``m`` to ``m_new``, every term already in ``l`` was computed against the old
maximum, so ``l`` is rescaled by ``exp(m - m_new)``::

    m_new = max(m, max(piece))
    l_new = l * exp(m - m_new) + Σ exp(piece - m_new)

After the last piece ``(m, l)`` are exactly the maximum and the shifted sum of the whole row,
whatever the split. ``online_weighted_sum`` does the same for ``softmax(x) @ v``: the running
weighted sum ``acc`` is rescaled by the same factor, so one pass over (score, value) pieces
gives attention's output. The names ``m``, ``l``, ``acc`` follow the FlashAttention papers.

Conventions are those of ``attn_lib.softmax``: ``-inf`` means masked, a row with no finite
entry gives zeros (and log-sum-exp ``-inf``); ``nan`` / ``+inf`` are rejected.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..rules.numerics import work_dtype
from ..checks.online import check_online_row, check_online_update, check_online_values, check_splits


def split_row(n: int, splits: int | Sequence[int]) -> list[tuple[int, int]]:
    """把长度 n 切成若干段，返回每段的（起点，终点）。

    Args:
        n: row length S.
        splits: a block size (int, the last piece may be shorter) or the list of piece lengths
            (positive ints summing to ``n``).

    Returns:
        List of ``(start, stop)`` pairs covering ``0..n`` in order.
    """
    return _bounds(check_splits(n, splits))


def _bounds(lengths) -> list[tuple[int, int]]:
    bounds, start = [], 0
    for p in lengths:
        bounds.append((start, start + p))
        start += p
    return bounds


def _safe(m: torch.Tensor) -> torch.Tensor:
    """Rows that have seen only -inf keep m = -inf; shift them by 0 instead (exp(-inf - 0) = 0)."""
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def online_softmax_update(m: torch.Tensor, l: torch.Tensor, piece: torch.Tensor):
    """在线 softmax 的一步：读入新的一段评分，更新「目前最大值」m 和「目前指数和」l。

    Args:
        m: running maximum, shape (...,); start with ``-inf``.
        l: running sum ``Σ exp(x - m)``, shape (...,); start with 0.
        piece: the next scores, shape (..., P).

    Returns:
        ``(m_new, l_new)``, each of shape (...,).
    """
    check_online_update(m, l, piece)
    return _update(m, l, piece)


def _update(m: torch.Tensor, l: torch.Tensor, piece: torch.Tensor):
    """online_softmax_update without the checks (the caller has checked the whole row)."""
    m_new = torch.maximum(m, piece.amax(-1))  # (...,P) -> (...,)
    shift = _safe(m_new)  # (...,)
    alpha = torch.exp(m - shift)  # (...,) rescales what l already holds
    l_new = l * alpha + torch.exp(piece - shift[..., None]).sum(-1)  # (...,P) -> (...,)
    return m_new, l_new


def _start(x: torch.Tensor):
    work = x.to(work_dtype(x.dtype))  # float16 / bfloat16 -> float32
    m = torch.full(work.shape[:-1], float("-inf"), dtype=work.dtype, device=work.device)  # (...,)
    l = torch.zeros(work.shape[:-1], dtype=work.dtype, device=work.device)  # (...,)
    return work, m, l


def online_max_and_sum(x: torch.Tensor, splits: int | Sequence[int]):
    """一段一段读完一行，返回整行的最大值 m 和指数和 l = Σexp(x - m)（与切法无关）。

    Args:
        x: scores, shape (..., S); the last axis is the row.
        splits: block size or list of piece lengths (see ``split_row``).

    Returns:
        ``(m, l)``, each of shape (...,), in float32 for float16/bfloat16 input.
    """
    return _max_and_sum(x, _bounds(check_online_row(x, splits)))


def _max_and_sum(x: torch.Tensor, bounds):
    work, m, l = _start(x)
    for a, b in bounds:
        m, l = _update(m, l, work[..., a:b])  # (...,b-a) -> (...,)
    return m, l


def online_softmax(x: torch.Tensor, splits: int | Sequence[int]) -> torch.Tensor:
    """在线 softmax：分段求出 (m, l)，再用它们把整行归一化；结果与 attn_lib.softmax 相同。

    Args:
        x: scores, shape (..., S).
        splits: block size or list of piece lengths.

    Returns:
        Proportions of ``x``'s shape and dtype (rows with no finite entry are all 0).
    """
    m, l = _max_and_sum(x, _bounds(check_online_row(x, splits)))  # (...,), (...,)
    work = x.to(work_dtype(x.dtype))  # float16 / bfloat16 -> float32
    p = torch.exp(work - _safe(m)[..., None])  # (...,S)
    return (p / torch.where(l > 0, l, torch.ones_like(l))[..., None]).to(x.dtype)  # (...,S)


def online_logsumexp(x: torch.Tensor, splits: int | Sequence[int]) -> torch.Tensor:
    """分段求 log Σ exp(x) = m + log(l)；全是 -inf 的行得 -inf。

    Args:
        x: scores, shape (..., S).
        splits: block size or list of piece lengths.

    Returns:
        Shape (...,).
    """
    m, l = _max_and_sum(x, _bounds(check_online_row(x, splits)))
    return m + torch.log(l)  # (...,); l = 0 -> -inf


def online_weighted_sum(x: torch.Tensor, v: torch.Tensor, splits: int | Sequence[int]) -> torch.Tensor:
    """一遍读完（评分，值）的各段，直接得到 softmax(x) @ v：注意力输出的在线算法。

    Keeps ``m``, ``l`` and ``acc`` (the unnormalised weighted sum of values); each new piece
    rescales ``l`` and ``acc`` by ``exp(m - m_new)``; at the end ``acc / l`` is the output.

    Args:
        x: scores, shape (..., S).
        v: values, shape (..., S, Dv) (leading axes broadcast with ``x``'s).
        splits: block size or list of piece lengths.

    Returns:
        Shape (..., Dv): ``softmax(x) @ v`` (zeros for rows with no finite score).
    """
    bounds = _bounds(check_online_values(x, v, splits))
    work, m, l = _start(x)
    vw = v.to(work.dtype)
    acc = torch.zeros(*work.shape[:-1], v.shape[-1], dtype=work.dtype, device=x.device)  # (...,Dv)
    for a, b in bounds:
        piece = work[..., a:b]  # (...,P)
        m_new = torch.maximum(m, piece.amax(-1))  # (...,)
        shift = _safe(m_new)  # (...,)
        p = torch.exp(piece - shift[..., None])  # (...,P)
        alpha = torch.exp(m - shift)  # (...,)
        l = l * alpha + p.sum(-1)  # (...,)
        pv = (p.unsqueeze(-2) @ vw[..., a:b, :]).squeeze(-2)  # (...,1,P) @ (...,P,Dv) -> (...,Dv)
        acc = acc * alpha[..., None] + pv  # (...,Dv)
        m = m_new
    out = acc / torch.where(l > 0, l, torch.ones_like(l))[..., None]  # (...,Dv)
    return out.to(x.dtype)


__all__ = [
    "split_row",
    "online_softmax_update",
    "online_max_and_sum",
    "online_softmax",
    "online_logsumexp",
    "online_weighted_sum",
]
