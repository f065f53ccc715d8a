"""第 13 章（生成与解码：一步解码的 FlashDecoding）：把 KV 缓存的键轴切成几段，各段独立算出部分输出和它的 log-sum-exp，再用 log-sum-exp 规则精确合并。

A decode step is a few new queries (L = 1, or a few for a chunked step) against a long cache.
A forward kernel parallelises over queries, so with small B·H most of a GPU idles; the step is
bound by reading the cache, not by arithmetic. FlashDecoding (flash-attn's
``flash_attn_with_kvcache``) cuts the key axis into ``num_splits`` chunks of whole key blocks
that are attended in parallel, each giving a partial output o_p (normalised within the chunk)
and its log-sum-exp lse_p, and merges them exactly with the rule of chapter 08's online
softmax, now across chunks (``merge_partials``)::

    m = max_p lse_p,   w_p = exp(lse_p - m),   out = Σ_p w_p o_p / Σ_p w_p,   lse = m + log Σ_p w_p

Semantics (as flash-attn): q (B, H, L, D), the cache k (B, H_kv, S_max, D), v (B, H_kv, S_max, Dv);
``cache_seqlens`` (B,) says that entry b uses keys 0 .. n_b - 1 (None: n_b = S_max). The L queries
are the last L positions of the n_b keys (bottom-right causal): query i of entry b sees key j iff
``j <= n_b - L + i``. A query that sees no key (n_b = 0, or n_b - L + i < 0) gives zeros.
Query head h uses key/value head h // (H / H_kv) (SDPA's ``enable_gqa``).

The torch path (any device, float64-capable) computes each split in the grouped layout: q is
viewed as (B, H_kv, G·L, D), G = H / H_kv, so one product per split serves a whole group and K
and V are never repeated: one pass over each key/value head, G·L query rows per product. (SDPA's
CPU kernel with ``enable_gqa`` works head by head: each of the H query heads makes its own pass
over its key/value head, one query row per product when L = 1; ``bench/decode.py`` times both,
and the same split path on K, V repeated to H heads.) The scores of one split are a single tile of
B·H·L rows: G·L / D of the size of the cache slice it reads, so no inner loop over key blocks
is needed here (a GPU kernel, with its small on-chip memory, loops over key blocks inside its
split: ``attn_lib.flash.triton.decode``). The merge runs in float32 for float16 / bfloat16 inputs (float64 stays float64).
"""
from __future__ import annotations

import importlib

import torch

from ..rules.numerics import overflow_error, resolve_scale, work_dtype
from ..checks import check_attention_inputs, check_int, check_no_grad_needed, check_triton_inputs
from ..checks.decoding import (check_cache_seqlens, check_decode_queries, check_num_splits, check_partials)
from .autograd import choose_backend

DECODE_BLOCK_N = 128  # keys per block: a split is a run of whole blocks
MIN_BLOCKS_PER_SPLIT = 2  # a split reads at least this many blocks (else its partial costs more than it saves)


def device_workers(device) -> int:
    """这台设备上能同时干活的单元数：CUDA 是 SM 个数，CPU 是 torch 的线程数（choose_num_splits 用）。"""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return int(torch.get_num_threads())


def choose_num_splits(batch_heads: int, S: int, *, workers: int | None = None, block_n: int = DECODE_BLOCK_N,
                      min_blocks: int = MIN_BLOCKS_PER_SPLIT) -> int:
    """自动选切分数：让 B·H_kv·splits 个工作项填满设备，每段至少读几块键，段数不超过键块数。

    How: with n_blocks = ceil(S / block_n) key blocks,
    ``splits = min(ceil(workers / batch_heads), n_blocks // min_blocks, n_blocks)``, at least 1.

    Why: the split kernel runs one program per (b, h_kv, split), reading one slice of the cache.
    With fewer programs than the device has workers (SMs on a GPU) the idle ones read nothing,
    and a decode step is bound by reading the cache, so ``ceil(workers / batch_heads)`` splits
    give every worker a slice (B·H_kv = 8 on a 132-SM GPU: 17 splits; B·H_kv = 256: 1). Each
    split also costs a fixed amount: its partial output and log-sum-exp (Dv + 1 numbers per
    query row) are written and read again by the merge, and the split's program starts and
    reduces on its own; so a split should read at least ``min_blocks`` key blocks, whose bytes
    dwarf that. Never more splits than key blocks: a split is whole blocks, an empty one is
    work for nothing. On a CPU the torch path runs the splits one after another and each
    product uses every thread, so ``workers`` is the thread count: B·H_kv >= threads gives one
    split, one pass over the cache.

    Args:
        batch_heads: B·H_kv, the (batch entry, key/value head) pairs (a GQA group is one pair).
        S: S_max, the cache length.
        workers: parallel units of the device; default ``torch.get_num_threads()``
            (``device_workers(q.device)`` is what ``flash_decoding`` passes).
        block_n: keys per block; min_blocks: fewest blocks per split.

    Returns:
        The number of splits, 1 .. max(n_blocks, 1).
    """
    batch_heads, S = check_int("batch_heads", batch_heads, 0), check_int("S", S, 0)
    workers = torch.get_num_threads() if workers is None else check_int("workers", workers)
    return _num_splits(batch_heads, S, workers, check_int("block_n", block_n), check_int("min_blocks", min_blocks))


def _num_splits(batch_heads: int, S: int, workers: int, block_n: int = DECODE_BLOCK_N,
                min_blocks: int = MIN_BLOCKS_PER_SPLIT) -> int:
    """choose_num_splits without checks (the rule is in its docstring)."""
    n_blocks = -(-S // block_n)
    if n_blocks <= 1 or batch_heads == 0:
        return 1
    want = -(-workers // batch_heads)
    return max(1, min(want, n_blocks // min_blocks, n_blocks))


def split_bounds(S: int, num_splits: int, block_n: int = DECODE_BLOCK_N) -> list[tuple[int, int]]:
    """键轴 0 .. S-1 切成的段：[(s0, s1), ...]，每段是连续的整块，块数尽量均分；段数不超过块数。"""
    n_blocks = max(-(-S // block_n), 1)
    P = min(num_splits, n_blocks)
    edges = [min(n_blocks * p // P * block_n, S) for p in range(P + 1)]
    return list(zip(edges[:-1], edges[1:]))


def merge_partials(outs, lses):
    """合并各段的部分结果：outs (..., P, Dv) 和 lses (..., P) → (out (..., Dv), lse (...))，与一次算完全部键相同。

    The log-sum-exp rule: ``m = max_p lse_p``, ``w_p = exp(lse_p - m)``,
    ``out = Σ_p w_p o_p / Σ_p w_p``, ``lse = m + log Σ_p w_p``. A split that saw no key has
    ``lse_p = -inf`` (weight 0); where every split saw none, out is 0 and lse is -inf.
    Computed in float32 for float16 / bfloat16 (float64 stays float64); differentiable.

    Args:
        outs: (..., P, Dv) each split's output, normalised within the split.
        lses: (..., P) each split's natural-log log-sum-exp of its scaled scores (-inf allowed).

    Returns:
        ``(out, lse)``: out (..., Dv) in outs' dtype, lse (...) in lses' dtype.
    """
    check_partials(outs, lses)
    return _merge(outs, lses)


def _merge(outs, lses):
    """merge_partials without checks."""
    o, lw = outs.to(work_dtype(outs.dtype)), lses.to(work_dtype(lses.dtype))
    m = lw.amax(-1, keepdim=True)  # (...,P) -> (...,1)
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # (...,1): no split saw a key -> shift by 0
    w = torch.exp(lw - m_safe)  # (...,P), -inf -> 0
    total = w.sum(-1, keepdim=True)  # (...,1)
    out = (w.unsqueeze(-1).to(o.dtype) * o).sum(-2)  # (...,P,1) * (...,P,Dv) -> (...,Dv)
    out = out / torch.where(total > 0, total, torch.ones_like(total)).to(o.dtype)  # (...,Dv)
    lse = (m_safe + torch.log(total)).squeeze(-1)  # (...,1) -> (...); total 0 -> -inf
    return out.to(outs.dtype), lse.to(lses.dtype)


def _split_partials(q, k, v, seqlens, bounds, scale: float):
    """每段的部分结果（无检查）：未归一化的 acc (P,B·H_kv,G·L,Dv)、行最大值 m 与指数和 total（都是 (P,B·H_kv,G·L,1)），工作精度。

    Per split: one product for the scores (the scale applied by ``baddbmm``), the row max, the
    exponentials in place, their sum, one product with the values, written straight into the
    split's slot; the normalisation and the log-sum-exps of all splits are computed after the
    loop, at once (few operations per split: on a CPU each one has a fixed cost).
    """
    (B, H, L, D), (Hkv, S), Dv = q.shape, k.shape[1:3], v.shape[3]
    G, P, work, dev, BK = H // Hkv, len(bounds), work_dtype(q.dtype), q.device, B * Hkv
    qg = q.to(work).reshape(BK, G * L, D)  # (B,H,L,D) -> (B*H_kv,G*L,D): a group's queries are rows
    if seqlens is None:
        n_min = n_max = S
        last = None if L == 1 else (S - L + torch.arange(L, device=dev)).view(1, 1, L, 1)  # (1,1,L,1) last key seen
    else:
        n = seqlens.to(device=dev, dtype=torch.long)  # (B,)
        n_min, n_max = (int(x) for x in torch.stack([n.min(), n.max()]).tolist())  # one host sync
        last = (n[:, None] - L + torch.arange(L, device=dev)).repeat_interleave(Hkv, 0).view(BK, 1, L, 1)  # (BK,1,L,1)
    acc = torch.empty(P, BK, G * L, Dv, dtype=work, device=dev)  # (P,B*H_kv,G*L,Dv) sum_j p_j v_j per split
    m = torch.empty(P, BK, G * L, 1, dtype=work, device=dev)  # (P,BK,G*L,1) row max per split
    total = torch.empty(P, BK, G * L, 1, dtype=work, device=dev)  # (P,BK,G*L,1) sum_j p_j per split
    every_row_sees = True  # no split has a row that sees none of its keys
    for p, (s0, s1) in enumerate(bounds):
        if s0 >= n_max:  # no query of any entry sees a key here (the last one seen is n_max - 1)
            acc[p], m[p], total[p], every_row_sees = 0.0, float("-inf"), 0.0, False
            continue
        kc = k[:, :, s0:s1].to(work).reshape(BK, s1 - s0, D)  # (B,H_kv,n,D) -> (BK,n,D), a view when it can be
        s = torch.baddbmm(qg.new_empty(()), qg, kc.transpose(1, 2), beta=0, alpha=scale)  # (BK,G*L,D) @ (BK,D,n) -> (BK,G*L,n)
        masked = s1 - 1 > n_min - L  # some key here lies after the last one some query sees
        every_row_sees &= not masked
        if masked:
            hide = torch.arange(s0, s1, device=dev) > last  # (n,) vs (BK|1,1,L,1) -> (BK|1,1,L,n)
            s.view(BK, G, L, s1 - s0).masked_fill_(hide, float("-inf"))  # (BK,G,L,n)
        torch.amax(s, -1, keepdim=True, out=m[p])  # (BK,G*L,1)
        shift = torch.where(torch.isneginf(m[p]), 0.0, m[p]) if masked else m[p]  # no key seen: shift by 0
        e = s.sub_(shift).exp_()  # (BK,G*L,n), in place
        torch.sum(e, -1, keepdim=True, out=total[p])  # (BK,G*L,1)
        torch.bmm(e, v[:, :, s0:s1].to(work).reshape(BK, s1 - s0, Dv), out=acc[p])  # (BK,G*L,n) @ (BK,n,Dv) -> (BK,G*L,Dv)
    return acc, m, total, every_row_sees  # (P,BK,G*L,Dv), (P,BK,G*L,1), (P,BK,G*L,1), bool


def _merge_splits(acc, m, total, every_row_sees: bool = False):
    """各段未归一化的 (acc, m, total) → 每段的 (o_p, lse_p)，再按 log-sum-exp 规则合并：(out (BK,G·L,Dv), lse (BK,G·L))。

    One split needs no merge (its o_p and lse_p are the answer): computed directly, with fewer
    operations. A row that saw no key in a split has m = -inf and total = 0: o_p = 0, lse_p = -inf.
    """
    # total = 0 where a row saw no key of a split: divide by 1 there (acc is 0 there)
    divisor = total if every_row_sees else torch.where(total > 0, total, torch.ones_like(total))  # (P,BK,G*L,1)
    o = acc / divisor  # (P,BK,G*L,Dv), normalised within the split
    lse = (m + torch.log(total))[..., 0]  # (P,BK,G*L,1) -> (P,BK,G*L); no key seen: -inf + -inf = -inf
    if acc.shape[0] == 1:
        return o[0], lse[0]  # (BK,G*L,Dv), (BK,G*L)
    return _merge(o.permute(1, 2, 0, 3), lse.permute(1, 2, 0))  # (BK,G*L,P,Dv), (BK,G*L,P) -> (BK,G*L,Dv), (BK,G*L)


def _raise_if_overflowed(lse, seqlens, L: int, S: int, dtype) -> None:
    """看得见键的行（n_b - L + i >= 0），合并后的 lse 却不是有限数：分数溢出了。lse (B, H, L)；一次归约、一次同步。"""
    if seqlens is None:  # L <= S_max: every row sees a key
        bad = not bool(torch.isfinite(lse).all())
    else:
        B = lse.shape[0]
        sees = (seqlens.to(lse.device, torch.long)[:, None] - L + torch.arange(L, device=lse.device)) >= 0  # (B,L)
        bad = bool((~torch.isfinite(lse) & sees.view(B, 1, L)).any())  # (B,H,L) & (B,1,L)
    if bad:
        raise overflow_error(work_dtype(dtype))


def _triton_decode():
    """The Triton decode kernels (attn_lib.flash.triton.decode, imported lazily, after the Triton mode is fixed)."""
    from ..device import triton_interprets

    triton_interprets()  # decided once per process, before Triton is imported
    return importlib.import_module("attn_lib.flash.triton.decode")


def _decode_unchecked(q, k, v, *, seqlens, num_splits, scale: float, backend: str, check_overflow: bool = True):
    """一步解码的无检查内核（调用方已检查全部输入）：返回 out (B, H, L, Dv)，q 的精度。

    Args:
        q, k, v: (B, H, L, D), (B, H_kv, S_max, D), (B, H_kv, S_max, Dv), checked, L <= S_max.
        seqlens: None (every entry uses all S_max keys) or an integer tensor (B,) in 0 .. S_max.
        num_splits: None (``choose_num_splits`` for the device) or an int >= 1.
        scale: a float; backend: ``"torch"`` or ``"triton"`` (resolved).
        check_overflow: raise ``overflow_error`` where a row that sees a key got a non-finite
            result (one reduction, one host sync).
    """
    (B, H, L, D), (Hkv, S), Dv = q.shape, k.shape[1:3], v.shape[3]
    if num_splits is None:
        num_splits = _num_splits(B * Hkv, S, device_workers(q.device))
    if q.numel() == 0 or S == 0 or Dv == 0:
        return q.new_zeros(B, H, L, Dv)  # (B,H,L,Dv): no query, or no key to see
    if backend == "triton":
        lens = (torch.full((B,), S, dtype=torch.int32, device=q.device) if seqlens is None
                else seqlens.to(device=q.device, dtype=torch.int32))  # (B,)
        out = _triton_decode().decode_attention(q, k, v, lens, len(split_bounds(S, num_splits)), scale)
        if check_overflow and bool(torch.isnan(out[..., 0]).any()):  # +inf scores make the row nan
            raise overflow_error(work_dtype(q.dtype))
        return out  # (B,H,L,Dv)
    out, lse = _merge_splits(*_split_partials(q, k, v, seqlens, split_bounds(S, num_splits), scale))  # (BK,G*L,Dv), (BK,G*L)
    if check_overflow:
        _raise_if_overflowed(lse.reshape(B, H, L), seqlens, L, S, q.dtype)
    return out.reshape(B, H, L, Dv).to(q.dtype)  # (B*H_kv,G*L,Dv) -> (B,H,L,Dv)


def flash_decoding(q, k, v, *, cache_seqlens=None, num_splits=None, enable_gqa: bool = False, scale=None,
                   backend: str = "auto"):
    """一步解码（FlashDecoding）：几个新查询对整个 KV 缓存，键轴切段并行、再精确合并；只有前向。

    Args:
        q: (B, H, L, D) the new queries, small L (1 for one token; a few for a chunked step):
            the last L positions of each sequence, causal, bottom-right aligned.
        k, v: the cache, (B, H_kv, S_max, D) and (B, H_kv, S_max, Dv); L <= S_max; H_kv != H
            needs ``enable_gqa=True`` (H_kv divides H; K and V are read in place, never repeated).
            Every entry of the cache is scanned for nan / inf: zero-fill the unused tail.
        cache_seqlens: None (every entry uses all S_max keys) or an integer tensor (B,) on q's
            device: entry b uses keys 0 .. cache_seqlens[b] - 1 (0 .. S_max; 0 gives zeros).
        num_splits: None (``choose_num_splits`` for B·H_kv, S_max and q's device) or an int
            >= 1; more splits than key blocks (``DECODE_BLOCK_N`` keys) are cut to one per block.
        enable_gqa: as SDPA's. scale: multiplies q·k; default 1 / sqrt(D).
        backend: ``"auto"`` (Triton on CUDA when Triton is importable, else torch), ``"torch"``
            (the tiled split path, any device, float64 too) or ``"triton"`` (the split and merge
            kernels of ``attn_lib.flash.triton.decode``; on CPU tensors under Triton's interpreter).

    Returns:
        out (B, H, L, Dv) in q's dtype (a row that sees no key: zeros).

    Raises:
        ValueError: q, k or v requires grad (forward only); a score overflows; bad input.
        TypeError: a wrong type (see ``attn_lib.checks.decoding``).
    """
    which = choose_backend(q, backend)
    (B, H, L, S, D, Dv), scale = check_attention_inputs(q, k, v, None, scale, enable_gqa=enable_gqa)
    check_no_grad_needed("flash_decoding", q, k, v)
    check_decode_queries(L, S)
    seqlens = check_cache_seqlens(cache_seqlens, B, S, q.device)
    num_splits = check_num_splits(num_splits)
    if which == "triton":
        from .triton.entry import triton_available, triton_mode_for

        check_triton_inputs(q, k, v)
        if not triton_available():
            raise ImportError("backend='triton' needs the triton package (pip install triton); use backend='torch'")
        triton_mode_for(q)  # fixes the process's Triton mode before the kernels are imported
    return _decode_unchecked(q, k, v, seqlens=seqlens, num_splits=num_splits, scale=resolve_scale(scale, D),
                             backend=which)


__all__ = ["flash_decoding", "merge_partials", "choose_num_splits", "split_bounds", "device_workers",
           "DECODE_BLOCK_N", "MIN_BLOCKS_PER_SPLIT"]
