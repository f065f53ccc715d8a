"""第 13 章（FlashDecoding 的 Triton 核函数）：切分核函数把 KV 缓存的键轴切成几段并行地算，合并核函数按 log-sum-exp 规则把各段精确地合起来。

Imported only through ``attn_lib.flash.triton.entry.load_kernels("decode")`` (it imports Triton at
module level), after ``attn_lib.device.triton_interprets()`` has fixed the process's Triton mode.
Inputs are already checked by the door (``attn_lib.checks.decoding``); nothing is checked here.
Kernels, grids and launchers are in this one file, read top to bottom.

A decode step: q (B, H, L, D) with small L, the cache k (B, H_kv, S_max, D), v (B, H_kv, S_max, Dv),
``seqlens`` (B,) int32: entry b uses keys 0 .. n_b - 1. The L queries are the last L positions
(bottom-right): query i of entry b sees key j iff ``j < n_b`` and, when ``is_causal``,
``j <= n_b - L + i``.

- ``decode_split``: grid = (P splits, B·H_kv key/value heads, row blocks) (``grid_split``). The G = H / H_kv
  query heads that share one key/value head are loaded together as the G·L rows of one query
  block (row r = g·L + i), so each K/V block is read once per group, never repeated per query
  head. Split p walks the whole key blocks ``p·keys_per_split .. (p+1)·keys_per_split`` (up to
  n_b) with chapter 8's online softmax (``forward.attn_fwd_inner``): first the blocks every row
  sees in full (no masking), then the ragged end (with the causal rule as the band
  ``j - i <= n_b - L`` when ``IS_CAUSAL``). It writes the partial output, normalised within the split (fp32),
  and its log-sum-exp; ``-inf`` and zeros for a split with no visible key; NaN for a row whose
  visible scores all overflowed (a +inf score gives NaN anyway), for the door's overflow check.
  More than ``DECODE_MAX_ROWS`` (128) rows per group are cut into row blocks, each of which reads
  the split's K/V (the only case in which a block is read more than once).
- ``decode_merge``: one program per query row (``grid_merge``). With m = max_p lse_p and w_p = exp(lse_p - m):
  out = sum_p w_p o_p / sum_p w_p (zeros where every split is empty), in q's dtype.
- One split (``num_splits=1``) skips the merge: the split kernel writes the output itself.

Tile sizes: ``configs.decode_configs`` (pure Python). Conventions of ``forward.py``: masked
pointer arithmetic (no ``tl.make_block_ptr``),
a fixed list of configurations tried in order (no autotune), fp32 accumulation, ``DOT_FP32`` and
``input_precision="ieee"`` from ``attn_lib.rules.numerics`` (the interpreter's bf16 ``tl.dot`` is wrong;
fp32 dots are TF32 on a GPU by default), B·H_kv launched in chunks of at most 65535 programs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...rules.names import MAX_HEAD_DIM
from ...rules.numerics import LN2, base2_factor
from ...rules.settings import DecodeSettings
from .configs import INT32_LIMIT, decode_configs, grid_chunks, next_pow2, scale_args
from .entry import launch_target
from .forward import _stage_bounds, attn_fwd_inner, run_first_fitting

_LN2 = tl.constexpr(LN2)
MERGE_BLOCK_P = 16  # splits the merge kernel reads at once


@triton.jit
def decode_split(Q, K, V, Seqlens, OPart, LsePart,  #
                 stride_qb, stride_qh, stride_qm, stride_qd,  #
                 stride_kb, stride_kh, stride_kn, stride_kd,  #
                 stride_vb, stride_vh, stride_vn, stride_vd,  #
                 stride_ob, stride_oh, stride_om, stride_op, stride_od,  #
                 stride_lb, stride_lh, stride_lm, stride_lp,  #
                 H_kv, G, L, keys_per_split, qk_scale, HZ_START,  #
                 D: tl.constexpr, DV: tl.constexpr, DOT_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr,  #
                 INT64: tl.constexpr, SPLIT_SCALE: tl.constexpr, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,  #
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    split = tl.program_id(0)
    off_hz = (tl.program_id(1) + HZ_START).to(tl.int64)  # one key/value head of one batch entry
    off_b = off_hz // H_kv
    off_hkv = off_hz % H_kv
    n_b = tl.load(Seqlens + off_b)  # keys 0 .. n_b - 1 of this entry are in the cache
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) row r = g * L + i
    offs_g = rows // L  # query head off_hkv * G + g
    offs_i = rows % L  # query index i
    row_ok = rows < G * L
    offs_n = tl.arange(0, BLOCK_N)
    if INT64:  # an offset inside one head may reach 2**31
        offs_g, offs_i, offs_n = offs_g.to(tl.int64), offs_i.to(tl.int64), offs_n.to(tl.int64)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    q_rows = Q + off_b * stride_qb + off_hkv * G * stride_qh + offs_g * stride_qh + offs_i * stride_qm  # (BLOCK_M,)
    q = tl.load(q_rows[:, None] + offs_d[None, :] * stride_qd, mask=row_ok[:, None] & (offs_d[None, :] < D),
                other=0.0)  # (BLOCK_M, BLOCK_D): the G heads' L queries, loaded once
    if DOT_FP32:
        q = q.to(tl.float32)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    # Keys [lo, hi) of this split, none >= n_b: [lo, full) every query sees; [full, hi) masked (causal: j - i <= n_b - L).
    lo = split * keys_per_split
    hi = tl.maximum(tl.minimum(lo + keys_per_split, n_b), lo)
    seen_by_all = tl.maximum(n_b - L + 1, 0) if IS_CAUSAL else n_b  # keys < this are seen by every query row
    full = tl.minimum(tl.maximum((seen_by_all // BLOCK_N) * BLOCK_N, lo), hi)
    k_base, v_base = K + off_b * stride_kb + off_hkv * stride_kh, V + off_b * stride_vb + off_hkv * stride_vh
    for stage in tl.static_range(2):  # whole blocks every row sees (no masking), then the masked rest
        start, stop = _stage_bounds(stage + 1, lo, lo, full, hi)
        acc, l_i, m_i = attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, Seqlens,  #
                                       stride_kn, stride_kd, stride_vn, stride_vd, 0,  #
                                       offs_i, offs_n, offs_d, offs_dv, start, stop, n_b, qk_scale, 0, n_b - L,  #
                                       D, DV, stage == 1, False, IS_CAUSAL, False, DOT_FP32, INPUT_PRECISION,
                                       SPLIT_SCALE, BLOCK_N)
    # Normalise within the split. l_i == 0: no visible key (lse -inf, output 0), or every visible score
    # overflowed to -inf (lse and output NaN, as a +inf score gives, so the door's check sees it).
    empty = l_i == 0.0
    sees_to = tl.minimum(hi, n_b - L + 1 + offs_i) if IS_CAUSAL else hi  # the row sees keys [lo, sees_to)
    overflowed = empty & (sees_to > lo)  # the row sees a key of this split
    l_safe = tl.where(empty, 1.0, l_i)
    lse = tl.where(empty, tl.where(overflowed, float("nan"), float("-inf")), (m_i + tl.math.log2(l_safe)) * _LN2)
    o = tl.where(overflowed[:, None], float("nan"), acc / l_safe[:, None])  # (BLOCK_M, BLOCK_DV)
    head_rows = off_hkv * G + offs_g  # (BLOCK_M,) query head of each row
    o_rows = OPart + off_b * stride_ob + head_rows * stride_oh + offs_i * stride_om + split * stride_op
    tl.store(o_rows[:, None] + offs_dv[None, :] * stride_od, o.to(OPart.dtype.element_ty),
             mask=row_ok[:, None] & (offs_dv[None, :] < DV))
    tl.store(LsePart + off_b * stride_lb + head_rows * stride_lh + offs_i * stride_lm + split * stride_lp, lse,
             mask=row_ok)


@triton.jit
def decode_merge(OPart, LsePart, Out, stride_or, stride_op, stride_od, stride_lr, stride_lp, stride_outr,  #
                 stride_outd, P, DV: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_DV: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # one query row (b, h, i)
    offs_p = tl.arange(0, BLOCK_P)
    offs_dv = tl.arange(0, BLOCK_DV)
    m = tl.max(tl.zeros([BLOCK_P], dtype=tl.float32) - float("inf"), 0)
    for p0 in range(0, P, BLOCK_P):  # m = max_p lse_p
        lse = tl.load(LsePart + row * stride_lr + (p0 + offs_p) * stride_lp, mask=p0 + offs_p < P,
                      other=float("-inf"))
        m = tl.maximum(m, tl.max(lse, 0))
    m_shift = tl.where(m == float("-inf"), 0.0, m)  # every split empty: every weight is exp(-inf) = 0
    total = tl.sum(tl.zeros([BLOCK_P], dtype=tl.float32), 0)
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for p0 in range(0, P, BLOCK_P):  # w_p = exp(lse_p - m); acc = sum_p w_p o_p
        ok = p0 + offs_p < P
        w = tl.exp(tl.load(LsePart + row * stride_lr + (p0 + offs_p) * stride_lp, mask=ok, other=float("-inf"))
                   - m_shift)  # (BLOCK_P,)
        o = tl.load(OPart + row * stride_or + (p0 + offs_p)[:, None] * stride_op + offs_dv[None, :] * stride_od,
                    mask=ok[:, None] & (offs_dv[None, :] < DV), other=0.0)  # (BLOCK_P, BLOCK_DV)
        total += tl.sum(w, 0)
        acc += tl.sum(w[:, None] * o, 0)
    out = acc / tl.where(total == 0.0, 1.0, total)  # zeros for a row that sees no key
    tl.store(Out + row * stride_outr + offs_dv * stride_outd, out.to(Out.dtype.element_ty), mask=offs_dv < DV)


def _needs_int64(*extents) -> bool:
    """An offset inside one program's head, sum of (index + block) · |stride| over its dims, may reach 2**31."""
    return any(sum((n + MAX_HEAD_DIM) * abs(s) for n, s in dims) >= INT32_LIMIT for dims in extents)


def grid_split(num_splits: int, count: int, rows: int, cfg: dict) -> tuple:
    """The split kernel's grid: (splits, ``count`` key/value heads, blocks of BLOCK_M of the G·L query rows)."""
    return (num_splits, count, triton.cdiv(rows, cfg["BLOCK_M"]))


def grid_merge(rows: int) -> tuple:
    """The merge kernel's grid: one program per query row."""
    return (rows,)


def _split_into(q, k, v, settings: DecodeSettings, parts, launch_opts) -> dict:
    """Launch decode_split writing into parts = (o_part (B, H, L, P, Dv), lse_part (B, H, L, P)), any strides.

    ``launch_opts = (target, block_m, block_n)``; ``settings.num_splits`` is P, ``settings.seqlens`` int32 (B,).
    """
    (B, H, L, D), (H_kv, S), Dv = q.shape, k.shape[1:3], v.shape[3]
    (o_part, lse_part), (target, block_m, block_n), G = parts, launch_opts, H // H_kv
    tgt = launch_target(q, target)
    configs = decode_configs(G * L, D, Dv, q.dtype, tgt["interpret"], capability=tgt["capability"], block_m=block_m,
                             block_n=block_n)
    so, sl = o_part.stride(), lse_part.stride()
    int64 = _needs_int64([(G, q.stride(1)), (L, q.stride(2)), (D, q.stride(3))],
                         [(S, k.stride(2)), (D, k.stride(3))], [(S, v.stride(2)), (Dv, v.stride(3))],
                         [(G, so[1]), (L, so[2]), (settings.num_splits, so[3]), (Dv, so[4])],
                         [(G, sl[1]), (L, sl[2]), (settings.num_splits, sl[3])])
    sc = scale_args(base2_factor(settings.scale, settings.work_dtype))

    def run(cfg):
        keys_per_split = triton.cdiv(triton.cdiv(S, cfg["BLOCK_N"]), settings.num_splits) * cfg["BLOCK_N"]  # whole blocks
        for start, count in grid_chunks(B * H_kv):
            decode_split[grid_split(settings.num_splits, count, G * L, cfg)](
                q, k, v, settings.seqlens, o_part, lse_part,  #
                *q.stride(), *k.stride(), *v.stride(), *so, *sl,  #
                H_kv, G, L, keys_per_split, sc["qk_scale"], start,  #
                D=D, DV=Dv, DOT_FP32=tgt["dot_fp32"], INPUT_PRECISION=tgt["input_precision"], INT64=int64,
                SPLIT_SCALE=sc["SPLIT_SCALE"], IS_CAUSAL=settings.is_causal, **cfg)

    return run_first_fitting(configs, run)


def launch_split(q, k, v, settings: DecodeSettings, *, target=None, block_m=None, block_n=None):
    """切分核函数：每段键给出段内归一化的部分输出和它的 log-sum-exp（没有可见键的段给 0 和 -inf）。

    Args:
        q, k, v: (B, H, L, D), (B, H_kv, S_max, D), (B, H_kv, S_max, Dv); fp16, bf16 or fp32.
        settings: ``seqlens`` (B,) int32 on q's device (0 <= n_b <= S_max), ``num_splits`` P >= 1
            contiguous chunks of whole key blocks (more than there are blocks: the extra splits are
            empty), ``scale``, ``is_causal``.
        target: ``(interpret, capability)`` to launch for (``bench/gpu.py --compile-only``).
        block_m, block_n: override BLOCK_M (rows per query block) / BLOCK_N (keys per block).

    Returns:
        ``(o_part, lse_part)``: (B, H, L, P, Dv) and (B, H, L, P), float32.
    """
    (B, H, L, _), Dv, P = q.shape, v.shape[3], settings.num_splits
    o_part = torch.empty(B, H, L, P, Dv, dtype=torch.float32, device=q.device)  # (B,H,L,P,Dv)
    lse_part = torch.empty(B, H, L, P, dtype=torch.float32, device=q.device)  # (B,H,L,P)
    if B * H * L * Dv and k.shape[2]:  # the kernel writes every element
        _split_into(q, k, v, settings, (o_part, lse_part), (target, block_m, block_n))
    else:  # no key at all: every split is empty
        o_part.zero_()
        lse_part.fill_(float("-inf"))
    return o_part, lse_part


def launch_merge(o_part, lse_part, dtype):
    """合并核函数：m = max lse_p，w_p = exp(lse_p − m)，out = Σ w_p o_p / Σ w_p；一个键也看不见的行给 0。

    Args:
        o_part: (..., P, Dv) float32, each partial normalised within its split.
        lse_part: (..., P) float32, ``-inf`` for an empty split.
        dtype: the output's dtype.

    Returns:
        out (..., Dv) in ``dtype``.
    """
    *lead, P, Dv = o_part.shape
    out = torch.empty(*lead, Dv, dtype=dtype, device=o_part.device)  # (...,Dv)
    rows = out.numel() // Dv if Dv else 0
    if rows == 0:
        return out
    o3 = o_part.reshape(rows, P, Dv)  # (...,P,Dv) -> (R,P,Dv)
    l2 = lse_part.reshape(rows, P)  # (...,P) -> (R,P)
    o2 = out.view(rows, Dv)  # (...,Dv) -> (R,Dv)
    decode_merge[grid_merge(rows)](o3, l2, o2, *o3.stride(), *l2.stride(), *o2.stride(), P, DV=Dv,
                                   BLOCK_P=min(MERGE_BLOCK_P, max(2, next_pow2(P))), BLOCK_DV=max(16, next_pow2(Dv)))
    return out


def launch(q, k, v, settings: DecodeSettings, *, target=None, block_m=None, block_n=None):
    """FlashDecoding 的一步（输入已检查过）：切分核函数加合并核函数；返回 out (B, H, L, Dv)，精度同 q。

    Query head h reads key/value head h // (H // H_kv) in place (K and V are never repeated).
    One split (``settings.num_splits == 1``) runs the split kernel alone, writing the output in q's dtype.

    Args:
        q, k, v, settings, target, block_m, block_n: as in ``launch_split``.
    """
    (B, H, L, _), Dv = q.shape, v.shape[3]
    if settings.num_splits > 1:
        o_part, lse_part = launch_split(q, k, v, settings, target=target, block_m=block_m, block_n=block_n)
        return launch_merge(o_part, lse_part, q.dtype)
    if not (B * H * L * Dv and k.shape[2]):
        return torch.zeros(B, H, L, Dv, dtype=q.dtype, device=q.device)  # (B,H,L,Dv): no key, zeros
    out = torch.empty(B, H, L, Dv, dtype=q.dtype, device=q.device)  # (B,H,L,Dv), every row written
    lse = torch.empty(B, H, L, 1, dtype=torch.float32, device=q.device)  # (B,H,L,1), not returned
    _split_into(q, k, v, settings, (out.unsqueeze(3), lse), (target, block_m, block_n))  # out as (B,H,L,1,Dv)
    return out


__all__ = ["decode_split", "decode_merge", "grid_split", "grid_merge", "launch", "launch_split", "launch_merge"]
