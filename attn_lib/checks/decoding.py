"""第 13 章（书中不单独讲）：解码一步（FlashDecoding）多出来的检查——缓存长度 cache_seqlens、切分数 num_splits、查询数、合并的输入。

Worded as every other check ("<argument> must be <expected>, got <found>; <remedy>"; TypeError
for a wrong type, ValueError for a wrong value):

- ``check_decode_queries``: the L new queries are the last L positions of the cache, so L <= S_max;
- ``check_cache_seqlens``: None, or an integer tensor (B,) on q's device with every length in 0 .. S_max;
- ``check_num_splits``: None (choose), or an int >= 1;
- ``check_partials``: the per-split outputs (..., P, Dv) and log-sum-exps (..., P) of ``merge_partials``.
"""
from __future__ import annotations

import torch

from .tensors import check_all_finite, check_float_tensor, check_on_q_device, check_tensor
from .values import check_positive_int

INT_DTYPES = (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)


def check_decode_queries(L: int, S: int) -> None:
    """解码一步的查询是缓存里最后 L 个位置：L 不能多于缓存的长度 S_max。"""
    if L > S:
        raise ValueError(
            f"q must have at most S_max={S} queries (the L new queries are the last L positions of the cache "
            f"k, v), got L={L}; append the new keys and values to the cache before the step"
        )


def check_cache_seqlens(cache_seqlens, B: int, S: int, device):
    """cache_seqlens：None（每条都用满 S_max 个键），或整数张量 (B,)，与 q 同设备，每个长度在 0 .. S_max 之间；返回它。

    One reduction and one host sync (the smallest and the largest length).
    """
    if cache_seqlens is None:
        return None
    check_tensor("cache_seqlens", cache_seqlens, none_ok=True)
    if cache_seqlens.dtype not in INT_DTYPES:
        raise TypeError(
            f"cache_seqlens must be an integer tensor (int32 or int64: the number of keys of each sequence), "
            f"got {cache_seqlens.dtype}; convert with cache_seqlens.to(torch.int32)"
        )
    if tuple(cache_seqlens.shape) != (B,):
        raise ValueError(
            f"cache_seqlens must have shape (B,) = {(B,)} (one length per sequence), got "
            f"{tuple(cache_seqlens.shape)}; pass one integer per batch entry, e.g. cache_seqlens.reshape(-1)"
        )
    check_on_q_device("cache_seqlens", cache_seqlens, device)
    if B:
        low, high = (int(x) for x in torch.stack([cache_seqlens.min(), cache_seqlens.max()]).tolist())
        if low < 0 or high > S:
            raise ValueError(
                f"cache_seqlens must hold lengths in 0 .. S_max = {S} (entry b uses keys 0 .. cache_seqlens[b] - 1 "
                f"of the cache), got lengths from {low} to {high}; clamp them with cache_seqlens.clamp(0, {S}) "
                "or pass a longer cache"
            )
    return cache_seqlens


def check_num_splits(num_splits):
    """num_splits：None（按 B·H_kv 和 S 自动选），或 >= 1 的整数；返回 int 或 None。"""
    if num_splits is None:
        return None
    return check_positive_int("num_splits", num_splits)


def check_partials(outs, lses) -> None:
    """merge_partials 的输入：outs (..., P, Dv) 与 lses (..., P) 是浮点张量，同设备，形状相合，P >= 1；outs 有限，lses 只许 -inf。"""
    check_float_tensor("outs", outs)
    check_float_tensor("lses", lses)
    if outs.ndim < 2 or tuple(outs.shape[:-1]) != tuple(lses.shape):
        raise ValueError(
            f"outs must have shape (..., P, Dv) with lses of shape (..., P), got outs {tuple(outs.shape)} and "
            f"lses {tuple(lses.shape)}; pass one output row and one log-sum-exp per split (the split axis last "
            "in lses, second to last in outs)"
        )
    if outs.shape[-2] == 0:
        raise ValueError(f"outs must hold at least one split (P >= 1), got P=0 in outs of shape "
                         f"{tuple(outs.shape)}; there is nothing to merge")
    if str(outs.device) != str(lses.device):
        raise ValueError(f"lses must be on outs' device {outs.device}, got {lses.device}; "
                         "move it with lses.to(outs.device)")
    check_all_finite("outs", outs)
    if lses.numel() and bool((torch.isnan(lses) | torch.isposinf(lses)).any()):
        raise ValueError(
            "lses must be finite or -inf (-inf: a split that sees no key), got nan or +inf; "
            "the scores of that split overflowed: compute it in float64 or with a smaller scale"
        )


__all__ = ["check_decode_queries", "check_cache_seqlens", "check_num_splits", "check_partials", "INT_DTYPES"]
