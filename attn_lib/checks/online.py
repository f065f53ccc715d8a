"""第 8 章（书中不单独讲）：在线 Softmax 各函数的门——一行评分、切法、值、一步更新的参数，与其他入口同一套措辞。"""
from __future__ import annotations

import numbers

import torch

from .tensors import check_float_tensor, check_score_row, check_scores_finite
from .values import check_positive_int


def check_splits(n: int, splits) -> list[int]:
    """切法：一个块大小（正整数，最后一段可以短些）或各段长度的列表（正整数，加起来等于 n）；返回各段长度。"""
    if isinstance(splits, (numbers.Number, str, bytes)) or not hasattr(splits, "__iter__"):
        size = check_positive_int("splits", splits)  # an int (numpy ints too); anything else: TypeError
        return [min(size, n - s) for s in range(0, n, size)]
    lengths = [check_positive_int(f"splits[{i}]", p) for i, p in enumerate(splits)]
    if sum(lengths) != n:
        raise ValueError(f"piece lengths {list(lengths)} sum to {sum(lengths)}, but the row has {n} entries")
    return lengths


def check_online_row(x, splits) -> list[int]:
    """online_max_and_sum / online_softmax / online_logsumexp 的门：x 是一行（或一批行）评分，splits 是切法；返回各段长度。"""
    check_score_row(x)
    return check_splits(x.shape[-1], splits)


def check_online_values(x, v, splits) -> list[int]:
    """online_weighted_sum 的门：x (..., S) 评分，v (..., S, Dv) 有限的值（前面的轴与 x 的能广播），splits 是切法；返回各段长度。"""
    check_score_row(x)
    check_float_tensor("v", v)
    if v.ndim < 2 or v.shape[-2] != x.shape[-1]:
        raise ValueError(f"v must have shape (..., S, Dv) with S = {x.shape[-1]} (x's last axis), got {tuple(v.shape)}")
    try:
        torch.broadcast_shapes(x.shape[:-1], v.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"v's leading axes {tuple(v.shape[:-2])} do not broadcast with x's {tuple(x.shape[:-1])} "
            f"(x {tuple(x.shape)} is (..., S), v {tuple(v.shape)} is (..., S, Dv))"
        ) from None
    if v.numel() and not torch.isfinite(v).all():
        raise ValueError("v contains nan or inf; the weighted sum would be nan. Check what produced it.")
    return check_splits(x.shape[-1], splits)


def check_online_update(m, l, piece) -> None:
    """online_softmax_update 的门：m、l 形状相同的浮点张量，piece (..., P) 的前面几轴等于 m 的形状、只许 -inf。"""
    for name, t in (("m", m), ("l", l), ("piece", piece)):
        check_float_tensor(name, t)
    if m.shape != l.shape or piece.ndim == 0 or tuple(piece.shape[:-1]) != tuple(m.shape):
        raise ValueError(
            f"piece must have shape (..., P) with ... = m's shape; got piece {tuple(piece.shape)}, "
            f"m {tuple(m.shape)}, l {tuple(l.shape)} (m and l must have the same shape)"
        )
    check_scores_finite(piece, "piece")


__all__ = ["check_splits", "check_online_row", "check_online_values", "check_online_update"]
