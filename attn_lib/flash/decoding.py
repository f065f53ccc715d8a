"""第 13 章（生成与解码：一步解码的 FlashDecoding）：把 KV 缓存的键轴切成几段，各段独立算出部分输出和它的 log-sum-exp，再用 log-sum-exp 规则精确合并。

A decode step is a few new queries (L = 1, or a few for a chunked step) against a long cache.
A forward kernel parallelises over queries, so with small B·H most of a GPU idles; the step is
bound by reading the cache, not by arithmetic. FlashDecoding (flash-attn's
``flash_attn_with_kvcache``) cuts the key axis into ``num_splits`` chunks of whole key blocks
that are attended in parallel, each giving a partial output o_p (normalised within the chunk)
and its log-sum-exp lse_p, and merges them exactly with the rule of chapter 08's online
softmax, now across chunks (``attn_lib.flash.splits.merge_partials``).

Semantics (as flash-attn's ``flash_attn_with_kvcache``, in the (B, H, L, D) layout): q
(B, H, L, D), the cache ``k_cache`` (B, H_kv, S_max, D), ``v_cache`` (B, H_kv, S_max, Dv);
``cache_seqlens`` (B,) says that entry b holds keys 0 .. n_b - 1 (None: n_b = S_max). New keys
and values ``k``, ``v`` (B, H_kv, S_new, ·), when given, are written into the cache in place at
positions n_b .. n_b + S_new - 1 and attended too (``cache_seqlens`` itself is not advanced: add
S_new to it for the next step, as with flash-attn). The L queries are the last L positions of
the keys attended (bottom-right): with ``is_causal`` query i of entry b sees key j iff
``j <= n_b' - L + i`` (n_b' = n_b + S_new); without it every query sees all n_b' keys. A query
that sees no key gives zeros. Query head h uses key/value head h // (H / H_kv) (SDPA's
``enable_gqa``).

The torch path (any device, float64-capable) computes each split in the grouped layout: q is
viewed as (B, H_kv, G·L, D), G = H / H_kv, so one product per split serves a whole group and K
and V are never repeated: one pass over each key/value head, G·L query rows per product. (SDPA's
CPU kernel with ``enable_gqa`` appears to work head by head, each of the H query heads making its
own pass over its key/value head, one query row per product when L = 1: an inference from the
timings of chapter 13, not read from its C++ source; ``bench/decode.py`` times both.)
The scores of one split are a single tile of B·H·L rows, so no inner loop over key blocks is
needed here (a GPU kernel, with its small on-chip memory, loops over key blocks inside its
split: ``attn_lib/flash/triton/decode.py``). Keys and values after an entry's length are never
used: a nan there changes nothing. The merge runs in float32 for float16 / bfloat16 inputs.
"""
from __future__ import annotations

import dataclasses

import torch

from ..checks.decoding import check_decode_call
from ..device import triton_interprets
from ..rules.numerics import autocast_off, overflow_error
from ..rules.settings import DecodeSettings, Options
from .splits import bounds_of, device_workers, merge, num_splits_for
from .triton.entry import load_kernels


def flash_decoding(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens=None, is_causal: bool = False, scale=None,
                   enable_gqa: bool = False, num_splits=None, backend: str = "auto"):
    """一步解码（FlashDecoding）：几个新查询对整个 KV 缓存，键轴切段并行、再精确合并；可以先把新的键值写进缓存；只有前向。

    Args:
        q: (B, H, L, D) the new queries, small L (1 for one token; a few for a chunked step):
            the last L positions of the keys attended, bottom-right aligned.
        k_cache, v_cache: the cache, (B, H_kv, S_max, D) and (B, H_kv, S_max, Dv); L <= S_max;
            H_kv != H needs ``enable_gqa=True`` (H_kv divides H; read in place, never repeated).
            Only the positions a step reads are scanned for nan / inf (keys 0 .. n_b - 1).
        k, v: None, or new keys and values (B, H_kv, S_new, D) / (B, H_kv, S_new, Dv), written
            into ``k_cache`` / ``v_cache`` in place at positions ``cache_seqlens[b] ..`` (which
            must then be given) and attended too; ``cache_seqlens`` is not advanced (add S_new
            yourself, as with flash-attn). A call that raises after the write puts the old
            contents of those slots back.
        cache_seqlens: None (every entry uses all S_max keys) or an integer tensor (B,) on q's
            device (an int is refused): entry b holds keys 0 .. cache_seqlens[b] - 1 (0 with no
            new k, v gives zeros).
        is_causal: False (default, as flash-attn's ``causal``): each of the L queries sees every
            key attended; True: query i sees keys up to cache_seqlens[b] + S_new - L + i (the same
            for L = 1).
        scale: multiplies q·k; default 1 / sqrt(D). enable_gqa: as SDPA's.
        num_splits: None or 0 (``choose_num_splits`` for B·H_kv, S_max and q's device; 0 is
            flash-attn's spelling), or an int >= 1; more splits than key blocks (of
            ``attn_lib.flash.splits.DECODE_BLOCK_N`` = 128 keys) are cut to one per block.
        backend: ``"auto"`` (Triton on CUDA when Triton is importable and takes the dtype and head
            dims, else torch), ``"torch"``
            (the tiled split path, any device, float64 too) or ``"triton"`` (the split and merge
            kernels of ``attn_lib/flash/triton/decode.py``; on CPU tensors under Triton's interpreter).

    Returns:
        out (B, H, L, Dv) in q's dtype (a row that sees no key: zeros).

    Raises:
        ValueError: q, k_cache, v_cache, k or v requires grad (forward only); a score overflows; bad input.
        TypeError: a wrong type (see ``attn_lib.checks.decoding``).
    """
    options = Options(is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, backend=backend,
                      cache_seqlens=cache_seqlens, num_splits=num_splits)
    settings = check_decode_call(q, (k_cache, v_cache), (k, v), options, triton_interprets)
    written = None if k is None else _append(k_cache, v_cache, (k, v), settings.seqlens - k.shape[2])
    try:
        with autocast_off(q.device):
            return decode_core(q, k_cache, v_cache, settings)
    except BaseException:
        if written is not None:  # a step that raised (an overflow, say) leaves the caches as they were
            _append(k_cache, v_cache, written, settings.seqlens - k.shape[2])
        raise


@torch.no_grad()
def _append(k_cache, v_cache, new, starts):
    """Write the new keys and values (B, H_kv, S_new, ·) into the caches at positions starts[b] .. (in place);
    return what those slots held before."""
    old = []
    for cache, x in zip((k_cache, v_cache), new):
        B, Hkv, S_new, X = x.shape
        pos = starts.to(device=x.device, dtype=torch.long)[:, None] + torch.arange(S_new, device=x.device)  # (B,S_new)
        index = pos[:, None, :, None].expand(B, Hkv, S_new, X)  # (B,H_kv,S_new,X)
        old.append(cache.gather(2, index))  # (B,H_kv,S_new,X)
        cache.scatter_(2, index, x)  # (B,H_kv,S_max,X)
    return tuple(old)


def decode_core(q, k, v, settings: DecodeSettings):
    """一步解码的无检查内核（调用方已检查全部输入）：返回 out (B, H, L, Dv)，q 的精度。

    Args:
        q, k, v: (B, H, L, D), (B, H_kv, S_max, D), (B, H_kv, S_max, Dv), checked, L <= S_max.
        settings: scale, seqlens (None, or (B,) keys each entry attends), is_causal, num_splits
            (None: ``choose_num_splits`` for the device), backend ("torch" or "triton"), and
            check_overflow (raise where a row that sees a key got a non-finite result: one
            reduction, one host sync).
    """
    (B, H, L, _), (Hkv, S), Dv = q.shape, k.shape[1:3], v.shape[3]
    splits = settings.num_splits or num_splits_for(B * Hkv, S, device_workers(q.device))
    if q.numel() == 0 or S == 0 or Dv == 0:
        return q.new_zeros(B, H, L, Dv)  # (B,H,L,Dv): no query, or no key to see
    bounds = bounds_of(S, splits)
    if settings.backend == "triton":
        lens = (torch.full((B,), S, dtype=torch.int32, device=q.device) if settings.seqlens is None
                else settings.seqlens.to(device=q.device, dtype=torch.int32))  # (B,)
        launch = dataclasses.replace(settings, seqlens=lens, num_splits=len(bounds))
        out = load_kernels("decode").launch(q, k, v, launch)  # (B,H,L,Dv)
        if settings.check_overflow and bool(torch.isnan(out[..., 0]).any()):  # an overflowed row is nan
            raise overflow_error(settings.work_dtype, "±inf")
        return out
    out, lse = _merge_splits(*_split_partials(q, k, v, bounds, settings))  # (BK,G*L,Dv), (BK,G*L)
    if settings.check_overflow:
        _raise_if_overflowed(lse.reshape(B, H, L), settings, L, S)
    return out.reshape(B, H, L, Dv).to(q.dtype)  # (B*H_kv,G*L,Dv) -> (B,H,L,Dv)


def _last_seen(settings: DecodeSettings, L: int, S: int, Hkv: int, device):
    """The last key each query row sees, (BK|1, 1, L, 1), or None when every row sees all S keys; and (n_min, n_max)."""
    i = torch.arange(L, device=device)
    shift = i - (L - 1) if settings.is_causal else torch.zeros_like(i)  # (L,): causal rows see up to n - L + i
    if settings.seqlens is None:
        last = None if not settings.is_causal or L == 1 else (S - 1 + shift).view(1, 1, L, 1)  # (1,1,L,1)
        return last, (S, S)
    n = settings.seqlens.to(device=device, dtype=torch.long)  # (B,)
    n_min, n_max = (int(x) for x in torch.stack([n.min(), n.max()]).tolist())  # one host sync
    last = (n[:, None] - 1 + shift).repeat_interleave(Hkv, 0).view(-1, 1, L, 1)  # (BK,1,L,1)
    return last, (n_min, n_max)


def _split_partials(q, k, v, bounds, settings: DecodeSettings):
    """每段的部分结果（无检查）：未归一化的 acc (P,B·H_kv,G·L,Dv)、行最大值 m 与指数和 total（都是 (P,B·H_kv,G·L,1)），工作精度。

    Per split: one product for the scores (the scale applied by ``baddbmm``), the row max, the
    exponentials in place, their sum, one product with the values, written straight into the
    split's slot; the normalisation and the log-sum-exps of all splits are computed after the
    loop, at once (few operations per split: on a CPU each one has a fixed cost). Values after an
    entry's length are zeroed before the product (0 · nan would be nan).
    """
    (B, H, L, D), (Hkv, S), Dv = q.shape, k.shape[1:3], v.shape[3]
    G, P, work, dev, BK = H // Hkv, len(bounds), settings.work_dtype, q.device, B * Hkv
    qg = q.to(work).reshape(BK, G * L, D)  # (B,H,L,D) -> (B*H_kv,G*L,D): a group's queries are rows
    last, (n_min, n_max) = _last_seen(settings, L, S, Hkv, dev)
    lowest_last = n_min - (L if settings.is_causal else 1)  # the smallest last key any row sees
    acc = torch.empty(P, BK, G * L, Dv, dtype=work, device=dev)  # (P,B*H_kv,G*L,Dv) sum_j p_j v_j per split
    m = torch.empty(P, BK, G * L, 1, dtype=work, device=dev)  # (P,BK,G*L,1) row max per split
    total = torch.empty(P, BK, G * L, 1, dtype=work, device=dev)  # (P,BK,G*L,1) sum_j p_j per split
    every_row_sees = True  # no split has a row that sees none of its keys
    for p, (s0, s1) in enumerate(bounds):
        if s0 >= n_max:  # no query of any entry sees a key here (the last one seen is n_max - 1)
            acc[p], m[p], total[p], every_row_sees = 0.0, float("-inf"), 0.0, False
            continue
        kc = k[:, :, s0:s1].to(work).reshape(BK, s1 - s0, D)  # (B,H_kv,n,D) -> (BK,n,D), a view when it can be
        s = torch.baddbmm(qg.new_empty(()), qg, kc.transpose(1, 2), beta=0, alpha=settings.scale)  # (BK,G*L,D) @ (BK,D,n) -> (BK,G*L,n)
        masked = last is not None and s1 - 1 > lowest_last  # some key here lies after the last one some row sees
        every_row_sees &= not masked
        if masked:
            hide = torch.arange(s0, s1, device=dev) > last  # (n,) vs (BK|1,1,L,1) -> (BK|1,1,L,n)
            s.view(BK, G, L, s1 - s0).masked_fill_(hide, float("-inf"))  # (BK,G,L,n)
        torch.amax(s, -1, keepdim=True, out=m[p])  # (BK,G*L,1)
        shift = torch.where(torch.isneginf(m[p]), 0.0, m[p])  # no key seen, or every score fell to -inf: shift by 0
        e = s.sub_(shift).exp_()  # (BK,G*L,n), in place
        torch.sum(e, -1, keepdim=True, out=total[p])  # (BK,G*L,1)
        vc = v[:, :, s0:s1].to(work)  # (B,H_kv,n,Dv)
        if settings.seqlens is not None and s1 > n_min:  # keys past some entry's length: never used, maybe nan
            tail = torch.arange(s0, s1, device=dev)[None, :] >= settings.seqlens.to(dev).long()[:, None]  # (B,n)
            vc = vc.masked_fill(tail[:, None, :, None], 0.0)  # (B,H_kv,n,Dv)
        torch.bmm(e, vc.reshape(BK, s1 - s0, Dv), out=acc[p])  # (BK,G*L,n) @ (BK,n,Dv) -> (BK,G*L,Dv)
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
    return merge(o.permute(1, 2, 0, 3), lse.permute(1, 2, 0))  # (BK,G*L,P,Dv), (BK,G*L,P) -> (BK,G*L,Dv), (BK,G*L)


def _raise_if_overflowed(lse, settings: DecodeSettings, L: int, S: int) -> None:
    """看得见键的行，合并后的 lse 却不是有限数：评分溢出了（+inf 或 nan 向上，-inf 向下）。lse (B, H, L)；一次归约、一次同步。"""
    B = lse.shape[0]
    n = (torch.full((B,), S, device=lse.device) if settings.seqlens is None
         else settings.seqlens.to(lse.device, torch.long))  # (B,)
    back = torch.arange(L, device=lse.device) - (L - 1) if settings.is_causal else torch.zeros(L, device=lse.device)
    sees = (n[:, None] - 1 + back) >= 0  # (B,L): the row's last visible key exists
    bad = ~torch.isfinite(lse) & sees.view(B, 1, L)  # (B,H,L) & (B,1,L)
    if bool(bad.any()):
        raise overflow_error(settings.work_dtype, "+inf" if bool((bad & ~torch.isneginf(lse)).any()) else "-inf")


__all__ = ["flash_decoding", "decode_core"]
