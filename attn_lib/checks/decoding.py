"""第 13 章（书中不单独讲）：一步解码（flash_decoding）的门和它多出来的检查——新的键值、缓存长度 cache_seqlens、段数 num_splits、查询数、合并的输入。

Worded as every other check ("<argument> must be <expected>, got <found>; <remedy>"; TypeError
for a wrong type, ValueError for a wrong value):

- ``check_decode_call``: the door of ``attn_lib.flash_decoding`` (one entry per call); returns
  its ``DecodeSettings``;
- ``check_decode_queries``: the L new queries are the last L positions of the cache, so L <= S_max;
- ``check_cache_seqlens``: None, or an integer tensor (B,) on q's device with every length in
  0 .. S_max - S_new (room for the S_new new keys appended after them);
- ``check_num_splits``: None or 0 (choose, flash-attn's 0), or an int >= 1;
- ``check_partials``: the per-split outputs (..., P, Dv) and log-sum-exps (..., P) of ``merge_partials``;
- ``check_split_bounds``: ``split_bounds``' sizes.
"""
from __future__ import annotations

import dataclasses

import torch

from ..rules.names import FLASH_BACKENDS
from ..rules.numerics import resolve_scale, work_dtype
from ..rules.settings import DecodeSettings, Options
from .flash import auto_backend, check_no_grad_needed, check_triton
from .shapes import check_rank, check_same_device, check_same_dtype
from .tensors import all_finite, check_all_finite, check_attention_inputs, check_float_tensor, check_on_q_device
from .tensors import check_tensor
from .values import check_bool, check_choice, check_int, check_positive_int

INT_DTYPES = (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)


def check_decode_queries(L: int, S: int) -> None:
    """解码一步的查询是缓存里最后 L 个位置：L 不能多于缓存的长度 S_max。"""
    if L > S:
        raise ValueError(
            f"q must have at most S_max={S} queries (the L new queries are the last L positions of k_cache, "
            f"v_cache), got L={L}; use a cache with at least L positions, or split the queries into smaller steps"
        )


def check_cache_seqlens(cache_seqlens, B: int, S: int, device):
    """cache_seqlens：None（每条都用满 S 个键），或整数张量 (B,)，与 q 同设备，每个长度在 0 .. S 之间；返回它。

    S is S_max minus the new keys appended after the lengths. One reduction and one host sync
    (the smallest and the largest length).
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
                f"cache_seqlens must hold lengths in 0 .. {S} (entry b uses keys 0 .. cache_seqlens[b] - 1 "
                f"of the cache, and new keys go after them), got lengths from {low} to {high}; clamp them with "
                f"cache_seqlens.clamp(0, {S}) or pass a longer cache"
            )
    return cache_seqlens


def check_num_splits(num_splits):
    """num_splits：None 或 0（按 B·H_kv 和 S 自动选，0 是 flash-attn 的写法），或 >= 1 的整数；返回 int 或 None。"""
    if num_splits is None:
        return None
    num_splits = check_int("num_splits", num_splits, 0)
    return num_splits or None


def check_split_rule(batch_heads, S, workers, block_n, min_blocks) -> tuple:
    """choose_num_splits 的参数：batch_heads、S >= 0，workers（None：torch 的线程数）、block_n、min_blocks >= 1；返回这五个 int。"""
    workers = torch.get_num_threads() if workers is None else check_positive_int("workers", workers)
    return (check_int("batch_heads", batch_heads, 0), check_int("S", S, 0), workers,
            check_positive_int("block_n", block_n), check_positive_int("min_blocks", min_blocks))


def check_split_bounds(S, num_splits, block_n) -> tuple[int, int, int]:
    """split_bounds 的参数：S >= 0，num_splits >= 1，block_n >= 1；返回这三个 int。"""
    return check_int("S", S, 0), check_positive_int("num_splits", num_splits), check_positive_int("block_n", block_n)


def _check_new_keys(k, v, caches, seqlens) -> int:
    """k, v appended at cache_seqlens: both or neither, (B, H_kv, S_new, D) / (.., Dv) like the cache; returns S_new."""
    if k is None and v is None:
        return 0
    if k is None or v is None:
        raise ValueError("k and v must be given together (the new keys and their values), got only "
                         f"{'k' if v is None else 'v'}; pass both, or neither to attend over the cache as it is")
    if seqlens is None:
        raise ValueError("cache_seqlens must be given with new k and v (they are written at positions "
                         "cache_seqlens[b] .. cache_seqlens[b] + S_new - 1), got None; e.g. "
                         "cache_seqlens=torch.zeros(B, dtype=torch.int32) for empty caches")
    for name, t, cache in (("k", k, caches[0]), ("v", v, caches[1])):
        check_float_tensor(name, t)
        check_rank(name, t, 4, "(B, H_kv, S_new, D)")
        want = (cache.shape[0], cache.shape[1], k.shape[2], cache.shape[3])
        if tuple(t.shape) != want:
            raise ValueError(f"{name} must have shape (B, H_kv, S_new, D) = {want} like {name}_cache's "
                             f"{tuple(cache.shape)}, got {tuple(t.shape)}")
    check_same_dtype(("k_cache", "k", "v"), (caches[0].dtype, k.dtype, v.dtype))
    check_same_device(("k_cache", "k", "v"), (caches[0], k, v))
    return int(k.shape[2])


def _check_read_finite(caches, seqlens, new) -> None:
    """nan / inf where the step reads: the cache's first cache_seqlens[b] positions, and the new k, v."""
    for name, cache in zip(("k_cache", "v_cache"), caches):
        if seqlens is None:
            check_all_finite(name, cache)
            continue
        used = torch.arange(cache.shape[2], device=cache.device)[None, :] < seqlens[:, None].long()  # (B,S_max)
        read = torch.where(used[:, None, :, None], cache.detach(), 0.0)  # (B,H_kv,S_max,X): the unused tail as 0
        if cache.numel() and not all_finite(read):
            raise ValueError(f"{name} contains nan or inf in the positions the step reads (keys 0 .. "
                             f"cache_seqlens[b] - 1; the tail after them is never read); attention would turn it "
                             "into nan. Check the layer that produced it.")
    for name, t in zip(("k", "v"), new):
        if t is not None:
            check_all_finite(name, t)


def check_decode_call(q, caches, new, options: Options, triton_mode) -> DecodeSettings:
    """flash_decoding 的门（唯一一处）：q、缓存 (k_cache, v_cache)、新的 (k, v)、cache_seqlens、is_causal、scale、enable_gqa、num_splits、backend。

    Args:
        caches: ``(k_cache, v_cache)``; new: ``(k, v)``, each None or the new keys / values.
        triton_mode: ``attn_lib.device.triton_interprets`` (called only for the Triton backend).

    Returns:
        The step's ``DecodeSettings`` (seqlens: the lengths the attention reads, after the append).
    """
    backend = check_choice("backend", options.backend, FLASH_BACKENDS)
    if backend == "auto":
        backend = auto_backend(q, *caches)
    (B, H, L, S, D, Dv), scale = check_attention_inputs(q, *caches, None, dataclasses.replace(options, check_finite=False),
                                                        names=("q", "k_cache", "v_cache"))
    S_new = _check_new_keys(*new, caches, options.cache_seqlens)
    seqlens = check_cache_seqlens(options.cache_seqlens, B, S - S_new, q.device)
    check_decode_queries(L, S)
    num_splits, is_causal = check_num_splits(options.num_splits), check_bool("is_causal", options.is_causal)
    if backend == "triton":
        check_triton(q.dtype, q.device, (D, Dv), triton_mode)
    check_no_grad_needed("flash_decoding", q, *caches, *new)
    check_all_finite("q", q)
    _check_read_finite(caches, seqlens, new)
    read = None if seqlens is None else seqlens + S_new  # (B,): the keys the step attends over, after the append
    return DecodeSettings(scale=resolve_scale(scale, D), work_dtype=work_dtype(q.dtype), seqlens=read,
                          is_causal=is_causal, num_splits=num_splits, backend=backend)


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


__all__ = ["check_decode_call", "check_decode_queries", "check_cache_seqlens", "check_num_splits", "check_partials",
           "check_split_bounds", "check_split_rule", "INT_DTYPES"]
