"""第 9 章（FlashAttention 反向的 Triton 核函数，FlashAttention-2）：由保存的 lse 一块块重算 P，求 dq、dk、dv，从不存 L×S 矩阵。

Conventions shared with the forward: chapter 8's ``attn_lib/flash/triton/forward.py``. Algorithm 2 of
FlashAttention-2 and the tutorial's ``_attn_bwd_*``, from the saved ``lse`` (natural log):

- ``_attn_bwd_preprocess``: ``D_i = rowsum(dO_i ∘ O_i)``, (B, H, L) float32.
- ``_attn_bwd_dkdv``: one program per key block K_j, V_j (kept on chip); query blocks
  stream past: ``P_ij = exp(S_ij − lse_i)``, ``dV_j += P_ijᵀ dO_i``, ``dP_ij = dO_i V_jᵀ``,
  ``dS_ij = P_ij ∘ (dP_ij − D_i)``, ``dK_j += dS_ijᵀ Q_i · scale``. The band (causal, sliding
  window; see ``attn_lib/flash/triton/forward.py``): query blocks that see none of the key block are
  skipped (``_query_range``, as ``attn_lib.rules.band.query_range``). GQA: the program of one
  key/value head loops over the G query heads that share it and sums their dK_j, dV_j on chip
  (no atomics, no (B, H, S, D) buffer summed afterwards).
- ``_attn_bwd_dq`` (in ``attn_lib/flash/triton/backward_dq.py``): one program per query block of one query
  head; key blocks of the shared key/value head stream past: ``dQ_i += dS_ij K_j · scale``.
  Key blocks no query of the block sees are skipped (``_key_range`` of the forward).

A row that sees no key (lse = -inf) has P = 0, hence zero gradients, never NaN.
"""
from __future__ import annotations

import triton
import triton.language as tl

from attn_lib.rules.numerics import LOG2E
from attn_lib.flash.triton.forward import _base2_scores, _in_band

_LOG2E = tl.constexpr(LOG2E)


@triton.jit
def _attn_bwd_preprocess(O, DO, Delta,  #
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
def _attn_bwd_dkdv_inner(dk, dv, k, v, key_ok,  #
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
def _attn_bwd_dq_inner(dq, q, do, lse2, delta,  #
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
def _attn_bwd_dkdv_band(dk, dv, k, v, key_ok, q_base, do_base, lse_base, delta_base,  #
                        stride_qm, stride_qd, stride_dom, stride_dod,  #
                        offs_n, offs_m0, offs_d, offs_dv, first, full, last, end, L, qk_scale, band_lo, band_hi,  #
                        D: tl.constexpr, DV: tl.constexpr, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr,  #
                        HAS_KPM: tl.constexpr, DOT_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr,  #
                        SPLIT_SCALE: tl.constexpr, BLOCK_M: tl.constexpr):
    # The three stages of _query_range for one query head: masked, unmasked, masked.
    dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, key_ok, q_base, do_base, lse_base, delta_base,  #
                                  stride_qm, stride_qd, stride_dom, stride_dod,  #
                                  offs_n, offs_m0, offs_d, offs_dv, first, full, L, qk_scale, band_lo, band_hi,  #
                                  D, DV, True, HAS_LO, HAS_HI, HAS_KPM, DOT_FP32, INPUT_PRECISION, SPLIT_SCALE,
                                  BLOCK_M)
    dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, key_ok, q_base, do_base, lse_base, delta_base,  #
                                  stride_qm, stride_qd, stride_dom, stride_dod,  #
                                  offs_n, offs_m0, offs_d, offs_dv, full, last, L, qk_scale, band_lo, band_hi,  #
                                  D, DV, False, HAS_LO, HAS_HI, HAS_KPM, DOT_FP32, INPUT_PRECISION, SPLIT_SCALE,
                                  BLOCK_M)
    dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, key_ok, q_base, do_base, lse_base, delta_base,  #
                                  stride_qm, stride_qd, stride_dom, stride_dod,  #
                                  offs_n, offs_m0, offs_d, offs_dv, last, end, L, qk_scale, band_lo, band_hi,  #
                                  D, DV, True, HAS_LO, HAS_HI, HAS_KPM, DOT_FP32, INPUT_PRECISION, SPLIT_SCALE,
                                  BLOCK_M)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv(Q, K, V, KPM, DO, LSE, Delta, DK, DVal,  #
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
        dk, dv = _attn_bwd_dkdv_band(dk, dv, k, v, key_ok, Q + off_b * stride_qb + off_h * stride_qh,  #
                                     DO + off_b * stride_dob + off_h * stride_doh, LSE + off_row,  #
                                     Delta + off_row, stride_qm, stride_qd, stride_dom, stride_dod,  #
                                     offs_n, offs_m0, offs_d, offs_dv, first, full, last, end, L, qk_scale,  #
                                     band_lo, band_hi, D, DV, HAS_LO, HAS_HI, HAS_KPM, DOT_FP32, INPUT_PRECISION,
                                     SPLIT_SCALE, BLOCK_M)
    dk = dk * sm_scale
    tl.store(DK + off_b * stride_dkb + off_hkv * stride_dkh + offs_n[:, None] * stride_dkn
             + offs_d[None, :] * stride_dkd, dk.to(DK.dtype.element_ty),
             mask=(offs_n[:, None] < S) & (offs_d[None, :] < D))
    tl.store(DVal + off_b * stride_dvb + off_hkv * stride_dvh + offs_n[:, None] * stride_dvn
             + offs_dv[None, :] * stride_dvd, dv.to(DVal.dtype.element_ty),
             mask=(offs_n[:, None] < S) & (offs_dv[None, :] < DV))
