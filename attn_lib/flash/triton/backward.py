"""第 9 章（FlashAttention 反向的 Triton 核函数，FlashAttention-2）：由保存的 lse 一块块重算 P，求 dq、dk、dv，从不存 L×S 矩阵；三个核函数、网格和启动器都在这一个文件里。

Conventions shared with the forward: chapter 8's ``forward.py`` beside this file. Algorithm 2
of FlashAttention-2 and the tutorial's ``_attn_bwd_*``, from the saved ``lse`` (natural log):

- ``attn_bwd_preprocess``: ``D_i = rowsum(dO_i ∘ O_i)``, (B, H, L) float32.
- ``attn_bwd_dkdv``: one program per key block K_j, V_j (kept on chip); query blocks
  stream past (``attn_bwd_dkdv_inner``): ``P_ij = exp(S_ij − lse_i)``, ``dV_j += P_ijᵀ dO_i``,
  ``dP_ij = dO_i V_jᵀ``, ``dS_ij = P_ij ∘ (dP_ij − D_i)``, ``dK_j += dS_ijᵀ Q_i · scale``. The
  band (causal, sliding window, alignment): query blocks that see none of the key block are
  skipped (``_query_range``, as ``attn_lib.rules.band.query_range``). GQA: the program of one
  key/value head loops over the G query heads that share it and sums their dK_j, dV_j on chip
  (no atomics, no (B, H, S, D) buffer summed afterwards).
- ``attn_bwd_dq``: one program per query block of one query head; key blocks of the shared
  key/value head stream past (``attn_bwd_dq_inner``): ``dQ_i += dS_ij K_j · scale``. Key
  blocks no query of the block sees are skipped (``_key_range`` of the forward).
- ``launch``: preprocess, then dK/dV, then dQ, each on its grid (``grid_preprocess``,
  ``grid_dkdv``, ``grid_dq``), each trying its configurations until one fits.

A row that sees no key (lse = -inf) has P = 0, hence zero gradients, never NaN.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...rules.numerics import LOG2E
from ...rules.settings import AttentionSettings
from .configs import (INTERPRET_BLOCK, band_args, block_args, candidate_configs, grid_chunks, key_mask_args,
                      needs_int64, next_pow2, scale_args, spans)
from .entry import launch_target
from .forward import _base2_scores, _in_band, _key_range, _stage_bounds, run_first_fitting

_LOG2E = tl.constexpr(LOG2E)


@triton.jit
def attn_bwd_preprocess(O, DO, Delta,  #
                        stride_ob, stride_oh, stride_om, stride_od,  #
                        stride_dob, stride_doh, stride_dom, stride_dod,  #
                        H, L, HZ_START,  #
                        DV: tl.constexpr, INT64: tl.constexpr,  #
                        BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):
    # D_i = rowsum(dO_i ∘ O_i): the one number per query that replaces the row of P in dS.
    start_m = tl.program_id(0)
    off_hz = (tl.program_id(1) + HZ_START).to(tl.int64)
    off_b = off_hz // H
    off_h = off_hz % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if INT64:
        offs_m = offs_m.to(tl.int64)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask = (offs_m[:, None] < L) & (offs_dv[None, :] < DV)
    o = tl.load(O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od,
                mask=mask, other=0.0)  # (BLOCK_M, BLOCK_DV)
    do = tl.load(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom
                 + offs_dv[None, :] * stride_dod, mask=mask, other=0.0)  # (BLOCK_M, BLOCK_DV)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)  # (BLOCK_M,)
    tl.store(Delta + off_hz * L + offs_m, delta, mask=offs_m < L)


@triton.jit
def _round_for_dot(x, dtype: tl.constexpr, DOT_FP32: tl.constexpr):
    # Round to the inputs' dtype as the GPU's low-precision dot would; DOT_FP32: then dot in fp32.
    x = x.to(dtype)
    if DOT_FP32:
        x = x.to(tl.float32)
    return x


@triton.jit
def attn_bwd_dkdv_inner(dk, dv, k, v, key_ok,  #
                        q_base, do_base, lse_base, delta_base,  #
                        stride_qm, stride_qd, stride_dom, stride_dod,  #
                        offs_n, offs_m0, offs_d, offs_dv,  #
                        lo, hi, L, qk_scale, band_lo, band_hi,  #
                        D: tl.constexpr, DV: tl.constexpr, MASKED: tl.constexpr,  #
                        HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, HAS_KPM: tl.constexpr,  #
                        DOT_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr, SPLIT_SCALE: tl.constexpr,  #
                        BLOCK_M: tl.constexpr):
    # Query blocks lo .. hi stream past one key block. MASKED: the band's edges and the
    # ragged end of L; otherwise every query of every block sees every key of the block.
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + offs_m0  # (BLOCK_M,) query indices
        # -- load Q_i transposed (BLOCK_D, BLOCK_M) and dO_i (BLOCK_M, BLOCK_DV); padding reads 0 --
        qT_ptrs = q_base + offs_m[None, :] * stride_qm + offs_d[:, None] * stride_qd
        do_ptrs = do_base + offs_m[:, None] * stride_dom + offs_dv[None, :] * stride_dod
        if MASKED:  # rows past L: lse = +inf below gives P = 0
            qT = tl.load(qT_ptrs, mask=(offs_m[None, :] < L) & (offs_d[:, None] < D), other=0.0)
            do = tl.load(do_ptrs, mask=(offs_m[:, None] < L) & (offs_dv[None, :] < DV), other=0.0)
            lse = tl.load(lse_base + offs_m, mask=offs_m < L, other=float("inf"))
            delta = tl.load(delta_base + offs_m, mask=offs_m < L, other=0.0)
        else:
            qT = tl.load(qT_ptrs, mask=offs_d[:, None] < D, other=0.0)
            do = tl.load(do_ptrs, mask=offs_dv[None, :] < DV, other=0.0)
            lse = tl.load(lse_base + offs_m)
            delta = tl.load(delta_base + offs_m)
        # lse in base 2; a row that sees no key (lse = -inf) gets +inf, so its P is 0
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse * _LOG2E)
        if DOT_FP32:
            qT = qT.to(tl.float32)
            do = do.to(tl.float32)
        # -- P_ijᵀ = exp(S_ijᵀ − lse_i), recomputed from K_j Q_iᵀ --  (BLOCK_N, BLOCK_M)
        qkT = _base2_scores(tl.dot(k, qT, input_precision=INPUT_PRECISION), qk_scale, SPLIT_SCALE)
        pT = tl.math.exp2(qkT - lse2[None, :])
        if HAS_KPM:
            pT = tl.where(key_ok[:, None], pT, 0.0)
        if MASKED:  # outside the band (lo <= j - i <= hi): P = 0
            pT = tl.where(_in_band(offs_m[None, :] < L, offs_n[:, None] - offs_m[None, :], band_lo, band_hi,
                                   HAS_LO, HAS_HI), pT, 0.0)
        # -- dV_j += P_ijᵀ dO_i --  (BLOCK_N, BLOCK_M) @ (BLOCK_M, BLOCK_DV)
        ppT = _round_for_dot(pT, do_base.dtype.element_ty, DOT_FP32)  # as the GPU's low-precision dot would
        dv = tl.dot(ppT, do, dv, input_precision=INPUT_PRECISION)
        # -- dP_ijᵀ = V_j dO_iᵀ, dS_ijᵀ = P_ijᵀ ∘ (dP_ijᵀ − D_i) --  (BLOCK_N, BLOCK_M)
        dpT = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)
        dsT = _round_for_dot(pT * (dpT - delta[None, :]), q_base.dtype.element_ty, DOT_FP32)
        # -- dK_j += dS_ijᵀ Q_i (times scale at the end) --  (BLOCK_N, BLOCK_M) @ (BLOCK_M, BLOCK_D)
        dk = tl.dot(dsT, tl.trans(qT), dk, input_precision=INPUT_PRECISION)
    return dk, dv


@triton.jit
def _keys_present(kpm_base, offs_n, S, stride_kpm_n, HAS_KPM: tl.constexpr):
    # (BLOCK_N,) keys that exist and are present (padding: P = 0, zero dK, dV)
    key_ok = offs_n < S
    if HAS_KPM:
        key_ok = key_ok & (tl.load(kpm_base + offs_n * stride_kpm_n, mask=offs_n < S, other=0) != 0)
    return key_ok


@triton.jit
def attn_bwd_dq_inner(dq, q, do, lse2, delta,  #
                      k_base, v_base, kpm_base,  #
                      stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                      offs_m, offs_n0, offs_d, offs_dv,  #
                      lo, hi, S, qk_scale, band_lo, band_hi,  #
                      D: tl.constexpr, DV: tl.constexpr, MASKED: tl.constexpr,  #
                      HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, HAS_KPM: tl.constexpr,  #
                      DOT_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr, SPLIT_SCALE: tl.constexpr,  #
                      BLOCK_N: tl.constexpr):
    # Key blocks lo .. hi stream past one query block. MASKED: the band's edges and the
    # ragged end of S. (Rows past L need no mask: their lse is +inf, so P = 0.)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0  # (BLOCK_N,) key indices
        # -- load K_j and V_j transposed, (BLOCK_D, BLOCK_N) and (BLOCK_DV, BLOCK_N) --
        kT_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
        vT_ptrs = v_base + offs_n[None, :] * stride_vn + offs_dv[:, None] * stride_vd
        if MASKED:
            kT = tl.load(kT_ptrs, mask=(offs_n[None, :] < S) & (offs_d[:, None] < D), other=0.0)
            vT = tl.load(vT_ptrs, mask=(offs_n[None, :] < S) & (offs_dv[:, None] < DV), other=0.0)
        else:
            kT = tl.load(kT_ptrs, mask=offs_d[:, None] < D, other=0.0)
            vT = tl.load(vT_ptrs, mask=offs_dv[:, None] < DV, other=0.0)
        if DOT_FP32:
            kT = kT.to(tl.float32)
            vT = vT.to(tl.float32)
        # -- P_ij = exp(S_ij − lse_i) --  (BLOCK_M, BLOCK_N)
        qk = _base2_scores(tl.dot(q, kT, input_precision=INPUT_PRECISION), qk_scale, SPLIT_SCALE)
        p = tl.math.exp2(qk - lse2[:, None])
        if MASKED:  # keys past S and outside the band: P = 0
            p = tl.where(_in_band(offs_n[None, :] < S, offs_n[None, :] - offs_m[:, None], band_lo, band_hi,
                                  HAS_LO, HAS_HI), p, 0.0)
        if HAS_KPM:
            present = tl.load(kpm_base + offs_n * stride_kpm_n, mask=offs_n < S, other=0)
            p = tl.where(present[None, :] != 0, p, 0.0)
        # -- dP_ij = dO_i V_jᵀ, dS_ij = P_ij ∘ (dP_ij − D_i) --
        dp = tl.dot(do, vT, input_precision=INPUT_PRECISION)
        ds = _round_for_dot(p * (dp - delta[:, None]), k_base.dtype.element_ty, DOT_FP32)
        # -- dQ_i += dS_ij K_j (times scale at the end) --  (BLOCK_M, BLOCK_N) @ (BLOCK_N, BLOCK_D)
        dq = tl.dot(ds, tl.trans(kT), dq, input_precision=INPUT_PRECISION)
    return dq


@triton.jit
def _query_range(start_n, L, S, band_lo, band_hi, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr,  #
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Queries of key block start_n (keys n0 .. n1-1), as attn_lib.rules.band.query_range, cut into
    # [first, full) masked (the band's right edge), [full, last) whole blocks that see every key
    # of the block, [last, end) masked (the band's left edge and the ragged end of L). Query blocks
    # outside [first, end) see none of the key block: they are skipped.
    n0 = start_n * BLOCK_N
    n1 = tl.minimum(n0 + BLOCK_N, S)
    first = n0 * 0
    full = first
    last = first + (L // BLOCK_M) * BLOCK_M
    end = first + L
    if HAS_HI:  # key j is seen by no query i < j - band_hi; every key of the block by i >= n1 - 1 - band_hi
        first = (tl.maximum(n0 - band_hi, 0) // BLOCK_M) * BLOCK_M
        full = tl.cdiv(tl.maximum(n1 - 1 - band_hi, 0), BLOCK_M) * BLOCK_M
    if HAS_LO:  # key j is seen by no query i > j - band_lo; every key of the block by i <= n0 - band_lo
        end = tl.minimum(tl.maximum(n1 - band_lo, 0), L)
        last = (tl.minimum(tl.maximum(n0 - band_lo + 1, 0), L) // BLOCK_M) * BLOCK_M
    end = tl.maximum(end, first)
    full = tl.minimum(tl.maximum(full, first), end)
    last = tl.maximum(tl.minimum(last, end), full)
    return first, full, last, end


@triton.jit
def attn_bwd_dkdv(Q, K, V, KPM, DO, LSE, Delta, DK, DVal,  #
                  stride_qb, stride_qh, stride_qm, stride_qd,  #
                  stride_kb, stride_kh, stride_kn, stride_kd,  #
                  stride_vb, stride_vh, stride_vn, stride_vd,  #
                  stride_dob, stride_doh, stride_dom, stride_dod,  #
                  stride_dkb, stride_dkh, stride_dkn, stride_dkd,  #
                  stride_dvb, stride_dvh, stride_dvn, stride_dvd,  #
                  stride_kpm_b, stride_kpm_n,  #
                  H, G, L, S, qk_scale, sm_scale, band_lo, band_hi, HZ_START,  #
                  D: tl.constexpr, DV: tl.constexpr,  #
                  HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, HAS_KPM: tl.constexpr,  #
                  DOT_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr, INT64: tl.constexpr,  #
                  SPLIT_SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,  #
                  BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    # One program per key block of one key/value head (grid axis 1: B * H_kv): K_j, V_j, dK_j, dV_j
    # stay on chip; the query blocks of the G query heads sharing this head stream past.
    start_n = tl.program_id(0)
    off_hz = (tl.program_id(1) + HZ_START).to(tl.int64)
    off_b = off_hz // (H // G)
    off_hkv = off_hz % (H // G)
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    if INT64:
        offs_n = offs_n.to(tl.int64)
        offs_m0 = offs_m0.to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    # Keys past S read 0; their rows of dK, dV are never stored, so they need no masking later.
    k = tl.load(K + off_b * stride_kb + off_hkv * stride_kh + offs_n[:, None] * stride_kn
                + offs_d[None, :] * stride_kd, mask=(offs_n[:, None] < S) & (offs_d[None, :] < D),
                other=0.0)  # (BLOCK_N, BLOCK_D)
    v = tl.load(V + off_b * stride_vb + off_hkv * stride_vh + offs_n[:, None] * stride_vn
                + offs_dv[None, :] * stride_vd, mask=(offs_n[:, None] < S) & (offs_dv[None, :] < DV),
                other=0.0)  # (BLOCK_N, BLOCK_DV)
    if DOT_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    key_ok = _keys_present(KPM + off_b * stride_kpm_b, offs_n, S, stride_kpm_n, HAS_KPM)  # (BLOCK_N,)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    first, full, last, end = _query_range(start_n, L, S, band_lo, band_hi, HAS_LO, HAS_HI, BLOCK_M, BLOCK_N)
    for g in range(0, G):  # GQA: sum over the query heads of the group, on chip
        off_h = off_hkv * G + g
        off_row = (off_b * H + off_h) * L  # this query head's rows of lse and Delta, (B, H, L)
        for stage in tl.static_range(3):  # the band's right edge (masked), whole blocks, the left edge (masked)
            lo, hi = _stage_bounds(stage, first, full, last, end)
            dk, dv = attn_bwd_dkdv_inner(dk, dv, k, v, key_ok, Q + off_b * stride_qb + off_h * stride_qh,  #
                                         DO + off_b * stride_dob + off_h * stride_doh, LSE + off_row,  #
                                         Delta + off_row, stride_qm, stride_qd, stride_dom, stride_dod,  #
                                         offs_n, offs_m0, offs_d, offs_dv, lo, hi, L, qk_scale, band_lo, band_hi,  #
                                         D, DV, stage != 1, HAS_LO, HAS_HI, HAS_KPM, DOT_FP32, INPUT_PRECISION,
                                         SPLIT_SCALE, BLOCK_M)
    dk = dk * sm_scale
    tl.store(DK + off_b * stride_dkb + off_hkv * stride_dkh + offs_n[:, None] * stride_dkn
             + offs_d[None, :] * stride_dkd, dk.to(DK.dtype.element_ty),
             mask=(offs_n[:, None] < S) & (offs_d[None, :] < D))
    tl.store(DVal + off_b * stride_dvb + off_hkv * stride_dvh + offs_n[:, None] * stride_dvn
             + offs_dv[None, :] * stride_dvd, dv.to(DVal.dtype.element_ty),
             mask=(offs_n[:, None] < S) & (offs_dv[None, :] < DV))


@triton.jit
def attn_bwd_dq(Q, K, V, KPM, DO, LSE, Delta, DQ,  #
                stride_qb, stride_qh, stride_qm, stride_qd,  #
                stride_kb, stride_kh, stride_kn, stride_kd,  #
                stride_vb, stride_vh, stride_vn, stride_vd,  #
                stride_dob, stride_doh, stride_dom, stride_dod,  #
                stride_dqb, stride_dqh, stride_dqm, stride_dqd,  #
                stride_kpm_b, stride_kpm_n,  #
                H, G, L, S, qk_scale, sm_scale, band_lo, band_hi, HZ_START,  #
                D: tl.constexpr, DV: tl.constexpr,  #
                HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, HAS_KPM: tl.constexpr,  #
                DOT_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr, INT64: tl.constexpr,  #
                SPLIT_SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,  #
                BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    # One program per query block of one query head: Q_i, dO_i, dQ_i stay on chip; key blocks stream past.
    start_m = tl.program_id(0)
    off_hz = (tl.program_id(1) + HZ_START).to(tl.int64)
    off_b = off_hz // H
    off_h = off_hz % H
    off_hkv = off_h // G  # GQA: the shared key/value head, read in place
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    if INT64:
        offs_m = offs_m.to(tl.int64)
        offs_n0 = offs_n0.to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < L
    q = tl.load(Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)  # (BLOCK_M, BLOCK_D)
    do = tl.load(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom
                 + offs_dv[None, :] * stride_dod,
                 mask=row_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)  # (BLOCK_M, BLOCK_DV)
    if DOT_FP32:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse = tl.load(LSE + off_hz * L + offs_m, mask=row_ok, other=float("inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * _LOG2E)  # no visible key: P = 0
    delta = tl.load(Delta + off_hz * L + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # Key range as in the forward (forward.py).
    first, full, last, end = _key_range(start_m, L, S, band_lo, band_hi, HAS_LO, HAS_HI, BLOCK_M, BLOCK_N)
    for stage in tl.static_range(3):  # the band's left edge (masked), whole blocks, the right edge (masked)
        lo, hi = _stage_bounds(stage, first, full, last, end)
        dq = attn_bwd_dq_inner(dq, q, do, lse2, delta, K + off_b * stride_kb + off_hkv * stride_kh,  #
                               V + off_b * stride_vb + off_hkv * stride_vh, KPM + off_b * stride_kpm_b,  #
                               stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                               offs_m, offs_n0, offs_d, offs_dv, lo, hi, S, qk_scale, band_lo, band_hi,  #
                               D, DV, stage != 1, HAS_LO, HAS_HI, HAS_KPM, DOT_FP32, INPUT_PRECISION, SPLIT_SCALE,
                               BLOCK_N)
    dq = dq * sm_scale
    tl.store(DQ + off_b * stride_dqb + off_h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
             dq.to(DQ.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < D))


def grid_preprocess(L: int, count: int, block: int) -> tuple:
    """The preprocess grid: one program per ``block`` queries (axis 0) of each of ``count`` heads (axis 1)."""
    return (triton.cdiv(L, block), count)


def grid_dkdv(S: int, count: int, cfg: dict) -> tuple:
    """The dK/dV grid: one program per block of BLOCK_N keys (axis 0) of each of ``count`` key/value heads (axis 1)."""
    return (triton.cdiv(S, cfg["BLOCK_N"]), count)


def grid_dq(L: int, count: int, cfg: dict) -> tuple:
    """The dQ grid: one program per block of BLOCK_M queries (axis 0) of each of ``count`` query heads (axis 1)."""
    return (triton.cdiv(L, cfg["BLOCK_M"]), count)


def _preprocess(out, dout, interpret: bool):
    """D_i = rowsum(dO_i ∘ O_i): a light pass, one program per 64 queries (32 interpreted). Returns (B,H,L) float32."""
    B, H, L, Dv = out.shape
    delta = torch.empty(B, H, L, dtype=torch.float32, device=out.device)  # (B,H,L)
    block = INTERPRET_BLOCK if interpret else 64
    int64 = needs_int64(spans(out, dout))
    for start, count in grid_chunks(B * H):
        attn_bwd_preprocess[grid_preprocess(L, count, block)](
            out, dout, delta, *out.stride(), *dout.stride(), H, L, start,  #
            DV=Dv, INT64=int64, BLOCK_M=block, BLOCK_DV=max(16, next_pow2(Dv)))
    return delta


def launch(q, k, v, saved, settings: AttentionSettings, *, target=None):
    """启动三个反向核函数（输入已检查过）。saved = (out, lse, dout)；返回 (dq, dk, dv)，形状和精度同 q, k, v（dk、dv 是 H_kv 个头）。

    Args:
        saved: what the forward ``launch`` returned for these inputs, and dLoss/dout (B, H, L, Dv).
        settings, target: as in ``forward.launch`` (block_m: query blocks, block_n: key blocks,
            in both backward kernels). GQA: one dK/dV program per key block of a key/value head
            sums over its query heads.
    """
    out, lse, dout = saved
    (B, H, L, D), (H_kv, S), Dv = q.shape, k.shape[1:3], v.shape[3]
    if B * H == 0 or L == 0 or S == 0:  # no query or no key: every gradient is 0
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    tgt = launch_target(q, target)
    dq = torch.empty(B, H, L, D, dtype=q.dtype, device=q.device)  # (B,H,L,D), every row written
    dk = torch.empty(B, H_kv, S, D, dtype=k.dtype, device=q.device)  # (B,H_kv,S,D), every key written
    dv = torch.empty(B, H_kv, S, Dv, dtype=v.dtype, device=q.device)  # (B,H_kv,S,Dv)
    lse = lse.contiguous()  # (B,H,L), indexed as off_hz * L + m
    delta = _preprocess(out, dout, tgt["interpret"])  # (B,H,L)
    kpm, kpm_strides = key_mask_args(settings.key_mask, q)
    sc, bands = scale_args(settings.qk_scale), band_args(settings.band, L, S)
    common = dict(D=D, DV=Dv, HAS_LO=bands["HAS_LO"], HAS_HI=bands["HAS_HI"], HAS_KPM=settings.key_mask is not None,
                  DOT_FP32=tgt["dot_fp32"], INPUT_PRECISION=tgt["input_precision"], SPLIT_SCALE=sc["SPLIT_SCALE"],
                  INT64=needs_int64(spans(q, k, v, out, dout, dq, dk, dv) + [(S, kpm_strides[1], 1, 0)]))
    args = (H, H // H_kv, L, S, sc["qk_scale"], settings.scale, bands["band_lo"], bands["band_hi"])

    def run_dkdv(cfg):
        for start, count in grid_chunks(B * H_kv):  # one program per key block of each key/value head
            attn_bwd_dkdv[grid_dkdv(S, count, cfg)](
                q, k, v, kpm, dout, lse, delta, dk, dv,  #
                *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dk.stride(), *dv.stride(), *kpm_strides,  #
                *args, start, **common, **block_args(cfg))

    def run_dq(cfg):
        for start, count in grid_chunks(B * H):
            attn_bwd_dq[grid_dq(L, count, cfg)](
                q, k, v, kpm, dout, lse, delta, dq,  #
                *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dq.stride(), *kpm_strides,  #
                *args, start, **common, **block_args(cfg))

    blocks = dict(block_m=settings.block_m, block_n=settings.block_n, capability=tgt["capability"])
    run_first_fitting(candidate_configs(D, Dv, q.dtype, tgt["interpret"], kind="dkdv", **blocks), run_dkdv)
    run_first_fitting(candidate_configs(D, Dv, q.dtype, tgt["interpret"], kind="dq", **blocks), run_dq)
    return dq, dk, dv


__all__ = ["attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dkdv_inner", "attn_bwd_dq", "attn_bwd_dq_inner",
           "grid_preprocess", "grid_dkdv", "grid_dq", "launch"]
