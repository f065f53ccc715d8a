"""第 9 章（FlashAttention 反向的 Triton 核函数之二）：求 dq 的核函数，一个程序实例算一个查询头的一块查询。

The rest of chapter 9's backward is ``attn_lib/flash/triton/backward.py`` (its docstring has
the formulas); the inner loop ``_attn_bwd_dq_inner`` lives there too, beside the dK/dV loop.
Here: the kernel ``_attn_bwd_dq`` and its three stages. One program per query block of one
query head; the key blocks of the key/value head it shares (GQA: ``h // G``) stream past; key
blocks no query of the block sees (outside the band, ``_key_range`` of the forward) are skipped.
"""
from __future__ import annotations

import triton
import triton.language as tl

from attn_lib.rules.numerics import LOG2E
from attn_lib.flash.triton.forward import _key_range
from attn_lib.flash.triton.backward import _attn_bwd_dq_inner

_LOG2E = tl.constexpr(LOG2E)


@triton.jit
def _attn_bwd_dq_band(dq, q, do, lse2, delta, k_base, v_base, kpm_base,  #
                      stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                      offs_m, offs_n0, offs_d, offs_dv, first, full, last, end, S, qk_scale, band_lo, band_hi,  #
                      D: tl.constexpr, DV: tl.constexpr, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr,  #
                      HAS_KPM: tl.constexpr, DOT_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr,  #
                      SPLIT_SCALE: tl.constexpr, BLOCK_N: tl.constexpr):
    # The three stages of _key_range: masked, unmasked, masked.
    dq = _attn_bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base, kpm_base,  #
                            stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                            offs_m, offs_n0, offs_d, offs_dv, first, full, S, qk_scale, band_lo, band_hi,  #
                            D, DV, True, HAS_LO, HAS_HI, HAS_KPM, DOT_FP32, INPUT_PRECISION, SPLIT_SCALE, BLOCK_N)
    dq = _attn_bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base, kpm_base,  #
                            stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                            offs_m, offs_n0, offs_d, offs_dv, full, last, S, qk_scale, band_lo, band_hi,  #
                            D, DV, False, HAS_LO, HAS_HI, HAS_KPM, DOT_FP32, INPUT_PRECISION, SPLIT_SCALE, BLOCK_N)
    dq = _attn_bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base, kpm_base,  #
                            stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                            offs_m, offs_n0, offs_d, offs_dv, last, end, S, qk_scale, band_lo, band_hi,  #
                            D, DV, True, HAS_LO, HAS_HI, HAS_KPM, DOT_FP32, INPUT_PRECISION, SPLIT_SCALE, BLOCK_N)
    return dq


@triton.jit
def _attn_bwd_dq(Q, K, V, KPM, DO, LSE, Delta, DQ,  #
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
    # Key range as in the forward (attn_lib/flash/triton/forward.py).
    first, full, last, end = _key_range(start_m, L, S, band_lo, band_hi, HAS_LO, HAS_HI, BLOCK_M, BLOCK_N)
    dq = _attn_bwd_dq_band(dq, q, do, lse2, delta, K + off_b * stride_kb + off_hkv * stride_kh,  #
                           V + off_b * stride_vb + off_hkv * stride_vh, KPM + off_b * stride_kpm_b,  #
                           stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                           offs_m, offs_n0, offs_d, offs_dv, first, full, last, end, S, qk_scale,  #
                           band_lo, band_hi, D, DV, HAS_LO, HAS_HI, HAS_KPM, DOT_FP32, INPUT_PRECISION,
                           SPLIT_SCALE, BLOCK_N)
    dq = dq * sm_scale
    tl.store(DQ + off_b * stride_dqb + off_h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
             dq.to(DQ.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < D))
