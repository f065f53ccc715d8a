"""第 13 章（拆分 KV 的规则）：键轴切成几段、切几段由什么决定，以及把各段的部分结果按 log-sum-exp 规则精确合并。

- ``choose_num_splits`` / ``device_workers``: how many splits fill the device (the rule is in the
  docstring);
- ``split_bounds``: the splits as runs of whole key blocks;
- ``merge_partials``: the log-sum-exp rule of chapter 08's online softmax, now across splits::

    m = max_p lse_p,   w_p = exp(lse_p - m),   out = Σ_p w_p o_p / Σ_p w_p,   lse = m + log Σ_p w_p

``attn_lib.flash.decoding`` (``flash_decoding``) uses all three; each public function here checks
its own arguments once (``attn_lib.checks.decoding``).
"""
from __future__ import annotations

import torch

from ..checks.decoding import check_partials, check_split_bounds, check_split_rule
from ..rules.numerics import work_dtype

DECODE_BLOCK_N = 128  # keys per block: a split is a run of whole blocks
MIN_BLOCKS_PER_SPLIT = 2  # a split reads at least this many blocks (else its partial costs more than it saves)


def device_workers(device) -> int:
    """这台设备上能同时干活的单元数：CUDA 是 SM 个数；CPU 没有 SM，只是类比地取 torch 的线程数（choose_num_splits 用）。"""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return int(torch.get_num_threads())


def choose_num_splits(batch_heads: int, S: int, *, workers: int | None = None, block_n: int = DECODE_BLOCK_N,
                      min_blocks: int = MIN_BLOCKS_PER_SPLIT) -> int:
    """自动选段数：让 B·H_kv·splits 个工作项填满设备，每段至少读几块键，段数不超过键块数。

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
    work for nothing. A CPU has no SMs: there ``workers`` is the thread count only by analogy
    with the GPU rule, not for a reason of its own. The torch path runs the splits one after
    another and each product already uses every thread, so on a CPU a split adds no parallelism,
    only the partial-and-merge work: B·H_kv >= threads gives one split, one pass over the cache;
    fewer pairs than threads still split (B·H_kv = 1, e.g. MQA with B = 1, on 2 threads: 2
    splits), at that cost.

    Args:
        batch_heads: B·H_kv, the (batch entry, key/value head) pairs (a GQA group is one pair).
        S: S_max, the cache length.
        workers: parallel units of the device; default ``torch.get_num_threads()``
            (``device_workers(q.device)`` is what ``flash_decoding`` passes).
        block_n: keys per block; min_blocks: fewest blocks per split.

    Returns:
        The number of splits, 1 .. max(n_blocks, 1).
    """
    return num_splits_for(*check_split_rule(batch_heads, S, workers, block_n, min_blocks))


def num_splits_for(batch_heads: int, S: int, workers: int, block_n: int = DECODE_BLOCK_N,
                   min_blocks: int = MIN_BLOCKS_PER_SPLIT) -> int:
    """choose_num_splits without checks (the rule is in its docstring)."""
    n_blocks = -(-S // block_n)
    if n_blocks <= 1 or batch_heads == 0:
        return 1
    want = -(-workers // batch_heads)
    return max(1, min(want, n_blocks // min_blocks, n_blocks))


def split_bounds(S: int, num_splits: int, block_n: int = DECODE_BLOCK_N) -> list[tuple[int, int]]:
    """键轴 0 .. S-1 切成的段：[(s0, s1), ...]，每段是连续的整块，块数尽量均分；段数不超过块数。"""
    return bounds_of(*check_split_bounds(S, num_splits, block_n))


def bounds_of(S: int, num_splits: int, block_n: int = DECODE_BLOCK_N) -> list[tuple[int, int]]:
    """split_bounds without checks."""
    n_blocks = max(-(-S // block_n), 1)
    P = min(num_splits, n_blocks)
    edges = [min(n_blocks * p // P * block_n, S) for p in range(P + 1)]
    return list(zip(edges[:-1], edges[1:]))


def merge_partials(outs, lses):
    """合并各段的部分结果：outs (..., P, Dv) 和 lses (..., P) → (out (..., Dv), lse (...))，与一次算完全部键相同。

    The log-sum-exp rule: ``m = max_p lse_p``, ``w_p = exp(lse_p - m)``,
    ``out = Σ_p w_p o_p / Σ_p w_p``, ``lse = m + log Σ_p w_p``. A split that saw no key has
    ``lse_p = -inf`` (merge coefficient w_p = 0); where every split saw none, out is 0 and lse is -inf.
    Computed in float32 for float16 / bfloat16 (float64 stays float64); differentiable.

    Args:
        outs: (..., P, Dv) each split's output, normalised within the split.
        lses: (..., P) each split's natural-log log-sum-exp of its scaled scores (-inf allowed).

    Returns:
        ``(out, lse)``: out (..., Dv) in outs' dtype, lse (...) in lses' dtype.
    """
    check_partials(outs, lses)
    return merge(outs, lses)


def merge(outs, lses):
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


__all__ = ["choose_num_splits", "num_splits_for", "split_bounds", "bounds_of", "merge_partials", "merge",
           "device_workers", "DECODE_BLOCK_N", "MIN_BLOCKS_PER_SPLIT"]
