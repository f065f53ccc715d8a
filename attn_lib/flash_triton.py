"""第 8、9 章（FlashAttention 的 Triton 核函数：第 08 章前向、第 09 章反向）：与 attn_lib/flash_torch.py 同一个算法，一个程序实例算一块。

Do not import this module directly: ``attn_lib.flash.load_kernel()`` imports it after
``attn_lib.device.triton_interprets()`` has fixed, once per process, whether Triton runs
compiled GPU kernels or its interpreter (``TRITON_INTERPRET=1`` on a machine without a CUDA
device: the interpreter runs the kernel with numpy on the CPU, so the tests and the book run
it without a GPU).

Structure and names follow the Triton fused-attention tutorial (FlashAttention-2) and the
FlashAttention paper (Dao et al. 2022, arXiv 2205.14135, Algorithm 1):

Forward ``_attn_fwd``:

- grid = (ceil(L / BLOCK_M), B * H): program (start_m, off_hz) owns queries
  ``start_m*BLOCK_M .. +BLOCK_M`` of head ``off_hz``; Q_i stays in registers/SRAM, together
  with the running statistics ``m_i`` (row max, base 2), ``l_i`` (row sum) and ``acc``.
- ``_attn_fwd_inner`` streams K_j, V_j blocks of BLOCK_N keys from HBM: paper lines 6-12.
  Stage 1 covers key blocks every query of the block may fully see (no masking work);
  stage 2 covers the rest (the causal diagonal and the ragged end of S), masked.
- ``exp2`` with ``log2(e)`` folded into ``qk_scale``, as in the tutorial.

Backward (FlashAttention-2, Algorithm 2; the tutorial's ``_attn_bwd_*``), from the saved
``lse`` (natural log) without ever storing the L×S matrix:

- ``_attn_bwd_preprocess``: ``D_i = rowsum(dO_i ∘ O_i)``, (B, H, L) float32.
- ``_attn_bwd_dkdv``: one program per key block K_j, V_j (kept on chip); query blocks
  stream past: ``P_ij = exp(S_ij − lse_i)``, ``dV_j += P_ijᵀ dO_i``, ``dP_ij = dO_i V_jᵀ``,
  ``dS_ij = P_ij ∘ (dP_ij − D_i)``, ``dK_j += dS_ijᵀ Q_i · scale``. Causal: query blocks
  before the key block are skipped.
- ``_attn_bwd_dq``: one program per query block; key blocks stream past:
  ``dQ_i += dS_ij K_j · scale``. Causal: key blocks after the query block are skipped.
- A row that sees no key (lse = -inf) has P = 0, hence zero gradients, never NaN.

Common to every kernel:

- Any L and S and any head dim 1..256: loads are masked, the head dims are padded to
  BLOCK_D / BLOCK_DV = next power of two (at least 16, the smallest ``tl.dot``). The head dims
  are compile-time constants (``D``, ``DV``, as HEAD_DIM in the tutorial), so for D = BLOCK_D
  the head-dim masks are all-true and fold away.
- Plain pointer arithmetic with masks (no ``tl.make_block_ptr``, gone in Triton 3.9), a fixed
  list of configurations tried in order (no autotune: multi-config autotune fails in the
  interpreter).
- fp16 / bf16 / fp32 inputs, fp32 accumulation; fp32 dots use ``input_precision="ieee"``
  (the GPU default would be TF32, 10-bit mantissa). ``DOT_FP32`` makes every dot run in fp32
  after rounding its inputs as the GPU would: in the interpreter (its bf16 ``tl.dot`` is
  wrong) and for bf16 on GPUs before sm_80 (Colab's T4 has no bf16 ``tl.dot``).
- Launch limits: CUDA allows at most 65535 programs on grid axis 1, so the B·H heads are
  launched in chunks (``grid_chunks``; ``HZ_START`` is the chunk's first head). Per-head
  offsets are int64; offsets inside a head are int32 unless ``needs_int64`` finds one that
  could reach 2³¹ (``INT64``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from attn_lib.flash_torch import LN2, LOG2E

MAX_HEAD_DIM = 256
MAX_GRID_Y = 65535  # CUDA's gridDim.y (and .z) limit; gridDim.x may reach 2**31 - 1
INT32_LIMIT = 2**31

_LN2 = tl.constexpr(LN2)
_LOG2E = tl.constexpr(LOG2E)


@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q,  #
                    k_base, v_base, kpm_base,  #
                    stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                    offs_m, offs_n, offs_d, offs_dv,  #
                    lo, hi, S, qk_scale, causal_offset,  #
                    D: tl.constexpr, DV: tl.constexpr,  #
                    MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr,  #
                    DOT_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr,  #
                    BLOCK_N: tl.constexpr):
    # Paper Algorithm 1, lines 6-12, for key blocks lo .. hi of one query block.
    for start_n in range(lo, hi, BLOCK_N):
        offs_kn = start_n + offs_n  # (BLOCK_N,) key indices
        # -- load K_j transposed, (BLOCK_D, BLOCK_N); padding (d >= D, key >= S) reads 0 --
        k_ptrs = k_base + offs_kn[None, :] * stride_kn + offs_d[:, None] * stride_kd
        if MASKED:  # the ragged end of S
            k = tl.load(k_ptrs, mask=(offs_kn[None, :] < S) & (offs_d[:, None] < D), other=0.0)
        else:
            k = tl.load(k_ptrs, mask=offs_d[:, None] < D, other=0.0)
        if DOT_FP32:
            k = k.to(tl.float32)
        # -- S_ij = Q_i K_jᵀ, scaled into base 2 --  (BLOCK_M, BLOCK_N)
        qk = tl.dot(q, k, input_precision=INPUT_PRECISION) * qk_scale
        if MASKED:
            visible = offs_kn[None, :] < S
            if CAUSAL:
                visible = visible & (offs_kn[None, :] <= offs_m[:, None] + causal_offset)
            qk = tl.where(visible, qk, float("-inf"))
        if HAS_KPM:
            present = tl.load(kpm_base + offs_kn * stride_kpm_n, mask=offs_kn < S, other=0)
            qk = tl.where(present[None, :] != 0, qk, float("-inf"))
        # -- m_ij = max(m_i, rowmax(S_ij)); rows that have seen no key yet shift by 0 --
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        m_shift = tl.where(m_ij == float("-inf"), 0.0, m_ij)
        p = tl.math.exp2(qk - m_shift[:, None])  # P~_ij
        # -- rescale what was accumulated against the old maximum --
        alpha = tl.math.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        # -- acc += P~_ij V_j --
        v_ptrs = v_base + offs_kn[:, None] * stride_vn + offs_dv[None, :] * stride_vd
        if MASKED:
            v = tl.load(v_ptrs, mask=(offs_kn[:, None] < S) & (offs_dv[None, :] < DV), other=0.0)
        else:
            v = tl.load(v_ptrs, mask=offs_dv[None, :] < DV, other=0.0)
        if DOT_FP32:
            p = p.to(v.dtype).to(tl.float32)  # round P as the GPU's low-precision dot would
            v = v.to(tl.float32)
        else:
            p = p.to(v.dtype)
        acc = tl.dot(p, v, acc, input_precision=INPUT_PRECISION)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, KPM, Out, LSE,  #
              stride_qb, stride_qh, stride_qm, stride_qd,  #
              stride_kb, stride_kh, stride_kn, stride_kd,  #
              stride_vb, stride_vh, stride_vn, stride_vd,  #
              stride_ob, stride_oh, stride_om, stride_od,  #
              stride_kpm_b, stride_kpm_n,  #
              H, L, S, qk_scale, CAUSAL_OFFSET, HZ_START,  #
              D: tl.constexpr, DV: tl.constexpr,  #
              CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr,  #
              DOT_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr, INT64: tl.constexpr,  #
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,  #
              BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    start_m = tl.program_id(0)
    off_hz = (tl.program_id(1) + HZ_START).to(tl.int64)  # this chunk's heads start at HZ_START
    off_b = off_hz // H
    off_h = off_hz % H
    q_base = Q + off_b * stride_qb + off_h * stride_qh
    k_base = K + off_b * stride_kb + off_h * stride_kh
    v_base = V + off_b * stride_vb + off_h * stride_vh
    o_base = Out + off_b * stride_ob + off_h * stride_oh
    kpm_base = KPM + off_b * stride_kpm_b
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    if INT64:  # an offset inside one head may reach 2**31
        offs_m = offs_m.to(tl.int64)
        offs_n = offs_n.to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    # Paper line 4 / 8: initialise the on-chip statistics of this query block.
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    # Load Q_i once: it stays on chip for the whole inner loop.  (BLOCK_M, BLOCK_D)
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=(offs_m[:, None] < L) & (offs_d[None, :] < D), other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    # Key range: all S keys, or (causal) keys j <= i + CAUSAL_OFFSET for the block's last query i.
    if CAUSAL:
        hi = tl.maximum(tl.minimum(S, (start_m + 1) * BLOCK_M + CAUSAL_OFFSET), 0)
        # Blocks ending at or before the first query (+ offset) of the block are fully visible.
        full = (tl.maximum(tl.minimum(S, start_m * BLOCK_M + 1 + CAUSAL_OFFSET), 0) // BLOCK_N) * BLOCK_N
    else:
        hi = S
        full = (S // BLOCK_N) * BLOCK_N
    # Stage 1: unmasked key blocks.
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, kpm_base,  #
                                    stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                                    offs_m, offs_n, offs_d, offs_dv, 0, full, S, qk_scale, CAUSAL_OFFSET,  #
                                    D, DV, False, CAUSAL, HAS_KPM, DOT_FP32, INPUT_PRECISION, BLOCK_N)
    # Stage 2: the causal diagonal and the ragged end of S, masked.
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, kpm_base,  #
                                    stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                                    offs_m, offs_n, offs_d, offs_dv, full, hi, S, qk_scale, CAUSAL_OFFSET,  #
                                    D, DV, True, CAUSAL, HAS_KPM, DOT_FP32, INPUT_PRECISION, BLOCK_N)
    # Paper line 12 after the last block: O_i = acc / l_i; log-sum-exp in natural log.
    # l_i == 0: the row saw no key (lse = -inf, output 0). An overflowed score (+inf) makes
    # l_i NaN, so lse is NaN and attn_lib.flash reports it after the kernel.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    acc = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * _LN2)
    tl.store(LSE + off_hz * L + offs_m, lse, mask=offs_m < L)
    tl.store(o_base + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od,
             acc.to(Out.dtype.element_ty), mask=(offs_m[:, None] < L) & (offs_dv[None, :] < DV))


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
    o = tl.load(O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om
                + offs_dv[None, :] * stride_od, mask=mask, other=0.0)  # (BLOCK_M, BLOCK_DV)
    do = tl.load(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom
                 + offs_dv[None, :] * stride_dod, mask=mask, other=0.0)  # (BLOCK_M, BLOCK_DV)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)  # (BLOCK_M,)
    tl.store(Delta + off_hz * L + offs_m, delta, mask=offs_m < L)


@triton.jit
def _attn_bwd_dkdv_inner(dk, dv, k, v, key_ok,  #
                         q_base, do_base, lse_base, delta_base,  #
                         stride_qm, stride_qd, stride_dom, stride_dod,  #
                         offs_n, offs_m0, offs_d, offs_dv,  #
                         lo, hi, L, qk_scale, causal_offset,  #
                         D: tl.constexpr, DV: tl.constexpr,  #
                         MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr,  #
                         DOT_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr,  #
                         BLOCK_M: tl.constexpr):
    # Query blocks lo .. hi stream past one key block. MASKED: the causal diagonal and the
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
        qkT = tl.dot(k, qT, input_precision=INPUT_PRECISION)
        pT = tl.math.exp2(qkT * qk_scale - lse2[None, :])
        if HAS_KPM:
            pT = tl.where(key_ok[:, None], pT, 0.0)
        if MASKED:
            if CAUSAL:
                pT = tl.where(offs_n[:, None] <= offs_m[None, :] + causal_offset, pT, 0.0)
        # -- dV_j += P_ijᵀ dO_i --  (BLOCK_N, BLOCK_M) @ (BLOCK_M, BLOCK_DV)
        if DOT_FP32:
            ppT = pT.to(do_base.dtype.element_ty).to(tl.float32)  # round P as the GPU's low-precision dot would
        else:
            ppT = pT.to(do_base.dtype.element_ty)
        dv = tl.dot(ppT, do, dv, input_precision=INPUT_PRECISION)
        # -- dP_ijᵀ = V_j dO_iᵀ, dS_ijᵀ = P_ijᵀ ∘ (dP_ijᵀ − D_i) --  (BLOCK_N, BLOCK_M)
        dpT = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)
        dsT = pT * (dpT - delta[None, :])
        if DOT_FP32:
            dsT = dsT.to(q_base.dtype.element_ty).to(tl.float32)
        else:
            dsT = dsT.to(q_base.dtype.element_ty)
        # -- dK_j += dS_ijᵀ Q_i (times scale at the end) --  (BLOCK_N, BLOCK_M) @ (BLOCK_M, BLOCK_D)
        dk = tl.dot(dsT, tl.trans(qT), dk, input_precision=INPUT_PRECISION)
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
                   H, L, S, qk_scale, sm_scale, CAUSAL_OFFSET, HZ_START,  #
                   D: tl.constexpr, DV: tl.constexpr,  #
                   CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr,  #
                   DOT_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr, INT64: tl.constexpr,  #
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,  #
                   BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    # One program per key block: K_j, V_j, dK_j, dV_j stay on chip; query blocks stream past.
    start_n = tl.program_id(0)
    off_hz = (tl.program_id(1) + HZ_START).to(tl.int64)
    off_b = off_hz // H
    off_h = off_hz % H
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    if INT64:
        offs_n = offs_n.to(tl.int64)
        offs_m0 = offs_m0.to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    # Keys past S read 0; their rows of dK, dV are never stored, so they need no masking later.
    k = tl.load(K + off_b * stride_kb + off_h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                mask=(offs_n[:, None] < S) & (offs_d[None, :] < D), other=0.0)  # (BLOCK_N, BLOCK_D)
    v = tl.load(V + off_b * stride_vb + off_h * stride_vh + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
                mask=(offs_n[:, None] < S) & (offs_dv[None, :] < DV), other=0.0)  # (BLOCK_N, BLOCK_DV)
    if DOT_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    key_ok = offs_n < S  # (BLOCK_N,) keys that are present (padding: P = 0, zero dK, dV)
    if HAS_KPM:
        present = tl.load(KPM + off_b * stride_kpm_b + offs_n * stride_kpm_n, mask=offs_n < S, other=0)
        key_ok = key_ok & (present != 0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    # Query blocks: [lo, mid) causal diagonal (masked), [mid, full) see every key of the
    # block (unmasked), [full, L) the ragged end of L (masked). Causal: query i sees key j
    # iff j <= i + CAUSAL_OFFSET, so blocks before the one holding query
    # start_n*BLOCK_N - CAUSAL_OFFSET see nothing and are skipped.
    full = (L // BLOCK_M) * BLOCK_M
    if CAUSAL:
        lo = (tl.maximum(start_n * BLOCK_N - CAUSAL_OFFSET, 0) // BLOCK_M) * BLOCK_M
        mid = tl.minimum(tl.cdiv(tl.maximum(start_n * BLOCK_N + BLOCK_N - 1 - CAUSAL_OFFSET, 0), BLOCK_M) * BLOCK_M,
                         full)
        tail = tl.maximum(lo, full)
    else:
        lo = 0
        mid = 0
        tail = full
    q_base = Q + off_b * stride_qb + off_h * stride_qh
    do_base = DO + off_b * stride_dob + off_h * stride_doh
    lse_base = LSE + off_hz * L
    delta_base = Delta + off_hz * L
    dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, key_ok, q_base, do_base, lse_base, delta_base,  #
                                  stride_qm, stride_qd, stride_dom, stride_dod,  #
                                  offs_n, offs_m0, offs_d, offs_dv, lo, mid, L, qk_scale, CAUSAL_OFFSET,  #
                                  D, DV, True, CAUSAL, HAS_KPM, DOT_FP32, INPUT_PRECISION, BLOCK_M)
    dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, key_ok, q_base, do_base, lse_base, delta_base,  #
                                  stride_qm, stride_qd, stride_dom, stride_dod,  #
                                  offs_n, offs_m0, offs_d, offs_dv, tl.maximum(lo, mid), full, L, qk_scale,
                                  CAUSAL_OFFSET,  #
                                  D, DV, False, CAUSAL, HAS_KPM, DOT_FP32, INPUT_PRECISION, BLOCK_M)
    dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, key_ok, q_base, do_base, lse_base, delta_base,  #
                                  stride_qm, stride_qd, stride_dom, stride_dod,  #
                                  offs_n, offs_m0, offs_d, offs_dv, tail, L, L, qk_scale, CAUSAL_OFFSET,  #
                                  D, DV, True, CAUSAL, HAS_KPM, DOT_FP32, INPUT_PRECISION, BLOCK_M)
    dk = dk * sm_scale
    tl.store(DK + off_b * stride_dkb + off_h * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
             dk.to(DK.dtype.element_ty), mask=(offs_n[:, None] < S) & (offs_d[None, :] < D))
    tl.store(DVal + off_b * stride_dvb + off_h * stride_dvh + offs_n[:, None] * stride_dvn
             + offs_dv[None, :] * stride_dvd,
             dv.to(DVal.dtype.element_ty), mask=(offs_n[:, None] < S) & (offs_dv[None, :] < DV))


@triton.jit
def _attn_bwd_dq_inner(dq, q, do, lse2, delta,  #
                       k_base, v_base, kpm_base,  #
                       stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                       offs_m, offs_n0, offs_d, offs_dv,  #
                       lo, hi, S, qk_scale, causal_offset,  #
                       D: tl.constexpr, DV: tl.constexpr,  #
                       MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr,  #
                       DOT_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr,  #
                       BLOCK_N: tl.constexpr):
    # Key blocks lo .. hi stream past one query block. MASKED: the causal diagonal and the
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
        qk = tl.dot(q, kT, input_precision=INPUT_PRECISION)
        p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if MASKED:
            visible = offs_n[None, :] < S
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + causal_offset)
            p = tl.where(visible, p, 0.0)
        if HAS_KPM:
            present = tl.load(kpm_base + offs_n * stride_kpm_n, mask=offs_n < S, other=0)
            p = tl.where(present[None, :] != 0, p, 0.0)
        # -- dP_ij = dO_i V_jᵀ, dS_ij = P_ij ∘ (dP_ij − D_i) --
        dp = tl.dot(do, vT, input_precision=INPUT_PRECISION)
        ds = p * (dp - delta[:, None])
        if DOT_FP32:
            ds = ds.to(k_base.dtype.element_ty).to(tl.float32)
        else:
            ds = ds.to(k_base.dtype.element_ty)
        # -- dQ_i += dS_ij K_j (times scale at the end) --  (BLOCK_M, BLOCK_N) @ (BLOCK_N, BLOCK_D)
        dq = tl.dot(ds, tl.trans(kT), dq, input_precision=INPUT_PRECISION)
    return dq


@triton.jit
def _attn_bwd_dq(Q, K, V, KPM, DO, LSE, Delta, DQ,  #
                 stride_qb, stride_qh, stride_qm, stride_qd,  #
                 stride_kb, stride_kh, stride_kn, stride_kd,  #
                 stride_vb, stride_vh, stride_vn, stride_vd,  #
                 stride_dob, stride_doh, stride_dom, stride_dod,  #
                 stride_dqb, stride_dqh, stride_dqm, stride_dqd,  #
                 stride_kpm_b, stride_kpm_n,  #
                 H, L, S, qk_scale, sm_scale, CAUSAL_OFFSET, HZ_START,  #
                 D: tl.constexpr, DV: tl.constexpr,  #
                 CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr,  #
                 DOT_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr, INT64: tl.constexpr,  #
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,  #
                 BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    # One program per query block: Q_i, dO_i, dQ_i stay on chip; key blocks stream past.
    start_m = tl.program_id(0)
    off_hz = (tl.program_id(1) + HZ_START).to(tl.int64)
    off_b = off_hz // H
    off_h = off_hz % H
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
    # Key range as in the forward: causal skips blocks after the block's last query; blocks
    # ending at or before its first query are fully visible (unmasked), the rest masked.
    if CAUSAL:
        hi = tl.maximum(tl.minimum(S, (start_m + 1) * BLOCK_M + CAUSAL_OFFSET), 0)
        full = (tl.maximum(tl.minimum(S, start_m * BLOCK_M + 1 + CAUSAL_OFFSET), 0) // BLOCK_N) * BLOCK_N
    else:
        hi = S
        full = (S // BLOCK_N) * BLOCK_N
    k_base = K + off_b * stride_kb + off_h * stride_kh
    v_base = V + off_b * stride_vb + off_h * stride_vh
    kpm_base = KPM + off_b * stride_kpm_b
    dq = _attn_bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base, kpm_base,  #
                            stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                            offs_m, offs_n0, offs_d, offs_dv, 0, full, S, qk_scale, CAUSAL_OFFSET,  #
                            D, DV, False, CAUSAL, HAS_KPM, DOT_FP32, INPUT_PRECISION, BLOCK_N)
    dq = _attn_bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base, kpm_base,  #
                            stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                            offs_m, offs_n0, offs_d, offs_dv, full, hi, S, qk_scale, CAUSAL_OFFSET,  #
                            D, DV, True, CAUSAL, HAS_KPM, DOT_FP32, INPUT_PRECISION, BLOCK_N)
    dq = dq * sm_scale
    tl.store(DQ + off_b * stride_dqb + off_h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
             dq.to(DQ.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < D))


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


SMEM_BUDGET = 96 * 1024  # bytes; fits A100 (164 KB) and H100/H200 (227 KB) with room for Triton's own buffers

# (BLOCK_M, BLOCK_N, num_stages) in order of preference, per input element size in bytes.
# Forward and dQ: a query block stays on chip while key blocks stream past.
_CANDIDATES = {
    2: [(128, 64, 3), (128, 32, 3), (64, 64, 2), (64, 32, 2), (32, 32, 2), (16, 16, 1)],
    4: [(64, 64, 2), (64, 32, 2), (32, 32, 2), (32, 16, 2), (16, 16, 1)],
}
_DQ_CANDIDATES = {  # the tutorial's BLOCK_M2, BLOCK_N2 = 128, 32
    2: [(128, 32, 3), (64, 32, 3), (64, 16, 2), (32, 16, 2), (16, 16, 1)],
    4: [(64, 32, 2), (64, 16, 2), (32, 16, 2), (16, 16, 1)],
}
# dK, dV: a key block stays on chip while query blocks stream past (BLOCK_M1, BLOCK_N1 = 32, 128).
_DKDV_CANDIDATES = {
    2: [(32, 128, 3), (32, 64, 3), (16, 64, 2), (16, 32, 2), (16, 16, 1)],
    4: [(32, 64, 2), (16, 64, 2), (16, 32, 2), (16, 16, 1)],
}
# GPUs before sm_80 (Colab's T4, sm_75): 64 KB of shared memory per block and no cp.async,
# so one stage and smaller tiles. Triton's mma v2 path there stages the dot operands through
# shared memory. Compiled for sm_75 without a GPU (``bench/gpu.py --compile-only 75``), the
# forward needed at most elem·4·max(BLOCK_M, BLOCK_N)·BLOCK_D bytes and the backward kernels
# elem·5·resident·BLOCK_D (resident: BLOCK_N for dK/dV, BLOCK_M for dQ), with elem = 2 for
# fp16 and 3 for bf16 (its dots run in fp32 there); fp32 (not measured) is taken as 4.
# ``_smem_bytes_pre_sm80`` is that upper bound; tests/test_flash_triton.py pins the numbers.
SMEM_BUDGET_PRE_SM80 = 64 * 1024
_PRE_SM80_CANDIDATES = {
    "fwd": [(128, 64, 1), (64, 64, 1), (64, 32, 1), (32, 32, 1), (16, 16, 1)],
    "dq": [(128, 32, 1), (64, 32, 1), (32, 16, 1), (16, 16, 1)],
    "dkdv": [(32, 128, 1), (32, 64, 1), (16, 32, 1), (16, 16, 1)],
}
_PRE_SM80_ELEM = {torch.float16: 2.0, torch.bfloat16: 3.0, torch.float32: 4.0}


def _smem_bytes_pre_sm80(dtype: torch.dtype, kind: str, block_m: int, block_n: int, block_d: int,
                         block_dv: int) -> float:
    """sm_80 之前的 GPU(T4) 上一个程序实例要的片上内存上界（按 sm_75 编译结果拟合，单位字节）。"""
    elem, width = _PRE_SM80_ELEM[dtype], max(block_d, block_dv)
    if kind == "fwd":
        return elem * 4 * max(block_m, block_n) * width
    resident = block_n if kind == "dkdv" else block_m
    return elem * 5 * resident * width


_INTERPRET_BLOCK = 32  # numpy on the CPU: one program per 32 rows keeps the padding waste low
_KINDS = ("fwd", "dq", "dkdv")


def _smem_bytes(elem: int, resident: int, streamed: int, num_stages: int, block_d: int, block_dv: int,
                kind: str = "fwd") -> int:
    """片上内存估计：常驻的一块（前向只有 Q_i；反向是两个矩阵）加上 num_stages 份流过的块。"""
    if kind == "fwd":  # Q_i resident; K_j and V_j stream
        return elem * (resident * block_d + num_stages * streamed * (block_d + block_dv))
    # dq: Q_i, dO_i resident, K_j, V_j stream; dkdv: K_j, V_j resident, Q_i, dO_i stream
    return elem * (resident + num_stages * streamed) * (block_d + block_dv)


def candidate_configs(D: int, Dv: int, dtype: torch.dtype, interpret: bool, *, kind: str = "fwd",
                      block_m: int | None = None, block_n: int | None = None, capability: tuple | None = None) -> list:
    """按头维度和精度列出某个核函数可用的块大小与 warp 数（从快到稳；一套固定候选，不做自动调优）。

    Args:
        D, Dv: head dims of q/k and of v.
        dtype: the inputs' dtype (its element size picks the tiles).
        interpret: True under Triton's interpreter (one small configuration).
        kind: ``"fwd"`` (forward), ``"dq"`` or ``"dkdv"`` (the backward kernels).
        block_m, block_n: user-chosen BLOCK_M / BLOCK_N; then there is exactly one
            configuration (retrying it after OutOfResources would fail again).
        capability: the GPU's (major, minor); before (8, 0) smaller one-stage tiles within
            64 KB. None: sm_80 or newer.

    Returns:
        A non-empty list of dicts with BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV, num_warps, num_stages.
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
    block_d, block_dv = max(16, _next_pow2(D)), max(16, _next_pow2(Dv))
    elem = 4 if dtype == torch.float32 else 2
    pre_sm80 = capability is not None and tuple(capability) < (8, 0)
    if interpret:
        tiles = [(_INTERPRET_BLOCK, _INTERPRET_BLOCK, 1)]
    else:
        tiles = []
        if pre_sm80:
            for bm, bn, stages in _PRE_SM80_CANDIDATES[kind]:
                if _smem_bytes_pre_sm80(dtype, kind, bm, bn, block_d, block_dv) <= SMEM_BUDGET_PRE_SM80:
                    tiles.append((bm, bn, stages))
        else:
            for bm, bn, stages in {"fwd": _CANDIDATES, "dq": _DQ_CANDIDATES, "dkdv": _DKDV_CANDIDATES}[kind][elem]:
                resident, streamed = (bn, bm) if kind == "dkdv" else (bm, bn)
                if _smem_bytes(elem, resident, streamed, stages, block_d, block_dv, kind) <= SMEM_BUDGET:
                    tiles.append((bm, bn, stages))
        tiles = tiles or [(16, 16, 1)]
    if block_m is not None or block_n is not None:  # one configuration: the user's blocks
        bm, bn, _ = tiles[0]
        tiles = [(block_m or bm, block_n or bn, 1 if interpret or pre_sm80 else 2)]
    out = []
    for bm, bn, stages in tiles:
        resident = bn if kind == "dkdv" else bm
        num_warps = 8 if not interpret and resident >= 128 and max(block_d, block_dv) >= 128 else 4
        out.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d, BLOCK_DV=block_dv,
                        num_warps=num_warps, num_stages=stages))
    return out


def default_config(D: int, Dv: int, dtype: torch.dtype, interpret: bool, *, kind: str = "fwd") -> dict:
    """首选配置：candidate_configs 的第一个。"""
    return candidate_configs(D, Dv, dtype, interpret, kind=kind)[0]


def grid_chunks(n_heads: int, limit: int | None = None) -> list:
    """把 B·H 个头切成每次启动不超过 ``limit``（CUDA 网格第 1 维上限 65535）个的几段。

    Args:
        n_heads: B * H.
        limit: programs allowed on grid axis 1; default ``MAX_GRID_Y`` (read at call time).

    Returns:
        ``[(start, count), ...]``: launch ``count`` heads from head ``start`` (the kernel's
        ``HZ_START``); empty for ``n_heads == 0``.
    """
    limit = MAX_GRID_Y if limit is None else limit
    return [(start, min(limit, n_heads - start)) for start in range(0, n_heads, limit)]


def needs_int64(spans, max_block: int = MAX_HEAD_DIM) -> bool:
    """块内偏移（行号 × 行步长 + 列号 × 列步长）是否可能超出 int32：超出时核函数改用 int64。

    The kernels add the per-head base offset in int64 always; the offsets inside one head,
    ``row * row_stride + col * col_stride``, are int32 unless this says they might reach
    2³¹. Rows are computed up to ``rows + BLOCK`` (masked lanes still compute addresses),
    columns up to ``BLOCK_D``; both blocks are at most ``max_block``.

    Args:
        spans: ``(rows, row_stride, cols, col_stride)`` per tensor (strides in elements).

    Returns:
        True when some offset may reach 2³¹ (the kernel must use int64).
    """
    return any((rows + max_block) * abs(rs) + max(cols, max_block) * abs(cs) >= INT32_LIMIT
               for rows, rs, cols, cs in spans)


def _spans(*tensors) -> list:
    return [(t.shape[2], t.stride(2), t.shape[3], t.stride(3)) for t in tensors]


def _check_head_dims(D: int, Dv: int) -> None:
    if max(D, Dv) > MAX_HEAD_DIM:
        raise ValueError(f"the Triton kernel supports head dims up to {MAX_HEAD_DIM}, got D={D}, Dv={Dv}; "
                         "use backend='torch'")


def _kpm_args(key_padding_mask, dummy):
    if key_padding_mask is None:
        return dummy, (0, 0)  # never read (HAS_KPM=False)
    kpm = key_padding_mask.to(torch.int8)  # (B,S), 1 = key present
    return kpm, kpm.stride()


def _precision(dtype: torch.dtype, dot_fp32: bool):
    return "ieee" if dtype == torch.float32 or dot_fp32 else None


def _run_first_fitting(configs: list, run) -> dict:
    """Run ``run(cfg)`` with the first configuration this GPU's shared memory accepts."""
    for cfg in configs[:-1]:
        try:
            run(cfg)
            return cfg
        except OutOfResources:  # a smaller configuration may fit
            continue
    run(configs[-1])  # the smallest: its OutOfResources goes to the caller
    return configs[-1]


def launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask, causal: bool, scale: float,
           *, interpret: bool, dot_fp32: bool | None = None, block_m: int | None = None, block_n: int | None = None,
           capability: tuple | None = None, causal_offset: int = 0):
    """启动前向核函数（输入已由 attn_lib.flash 检查过）。返回 (out (B,H,L,Dv), lse (B,H,L) float32)。

    Args:
        interpret: Triton runs its interpreter in this process (picks the tile sizes).
        dot_fp32: compute every ``tl.dot`` in fp32; default ``interpret``.
        capability: the GPU's compute capability (tile sizes for GPUs before sm_80).
    """
    B, H, L, D = q.shape
    S, Dv = k.shape[2], v.shape[3]
    _check_head_dims(D, Dv)
    dot_fp32 = interpret if dot_fp32 is None else dot_fp32
    configs = candidate_configs(D, Dv, q.dtype, interpret, block_m=block_m, block_n=block_n, capability=capability)
    out = torch.empty(B, H, L, Dv, dtype=q.dtype, device=q.device)  # (B,H,L,Dv)
    lse = torch.empty(B, H, L, dtype=torch.float32, device=q.device)  # (B,H,L)
    if B * H * L == 0:
        return out, lse
    kpm, kpm_strides = _kpm_args(key_padding_mask, q)
    int64 = needs_int64(_spans(q, k, v, out) + [(S, kpm_strides[1], 1, 0)])

    def run(cfg):
        for start, count in grid_chunks(B * H):
            grid = (triton.cdiv(L, cfg["BLOCK_M"]), count)
            _attn_fwd[grid](
                q, k, v, kpm, out, lse,  #
                *q.stride(), *k.stride(), *v.stride(), *out.stride(), *kpm_strides,  #
                H, L, S, scale * LOG2E, int(causal_offset), start,  #
                D=D, DV=Dv, CAUSAL=causal, HAS_KPM=key_padding_mask is not None,  #
                DOT_FP32=dot_fp32, INPUT_PRECISION=_precision(q.dtype, dot_fp32), INT64=int64,  #
                BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=cfg["BLOCK_D"], BLOCK_DV=cfg["BLOCK_DV"],  #
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
            )

    _run_first_fitting(configs, run)
    return out, lse


def launch_backward(q, k, v, out, lse, dout, key_padding_mask, causal: bool, scale: float,
                    *, interpret: bool, dot_fp32: bool | None = None, block_m: int | None = None,
                    block_n: int | None = None, capability: tuple | None = None, causal_offset: int = 0):
    """启动三个反向核函数（输入已由 attn_lib.flash 检查过）。返回 (dq, dk, dv)，形状和精度同 q, k, v。

    Args:
        out, lse: what ``launch`` returned for these inputs; dout: dLoss/dout (B, H, L, Dv).
        interpret, dot_fp32, block_m, block_n, capability: as in ``launch`` (block_m: query
            blocks, block_n: key blocks, in both backward kernels).
    """
    B, H, L, D = q.shape
    S, Dv = k.shape[2], v.shape[3]
    _check_head_dims(D, Dv)
    dot_fp32 = interpret if dot_fp32 is None else dot_fp32
    if B * H == 0 or L == 0 or S == 0:  # no query or no key: every gradient is 0
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dq = torch.empty(B, H, L, D, dtype=q.dtype, device=q.device)  # (B,H,L,D), every row written
    dk = torch.empty(B, H, S, D, dtype=k.dtype, device=q.device)  # (B,H,S,D), every key written
    dv = torch.empty(B, H, S, Dv, dtype=v.dtype, device=q.device)  # (B,H,S,Dv)
    lse = lse.contiguous()  # (B,H,L), indexed as off_hz * L + m
    delta = torch.empty(B, H, L, dtype=torch.float32, device=q.device)  # (B,H,L)
    kpm, kpm_strides = _kpm_args(key_padding_mask, q)
    int64 = needs_int64(_spans(q, k, v, out, dout, dq, dk, dv) + [(S, kpm_strides[1], 1, 0)])
    precision = _precision(q.dtype, dot_fp32)
    has_kpm = key_padding_mask is not None
    block_dv = max(16, _next_pow2(Dv))

    # D_i = rowsum(dO_i ∘ O_i): a light pass, one program per 64 queries (32 interpreted)
    pre_m = _INTERPRET_BLOCK if interpret else 64
    for start, count in grid_chunks(B * H):
        _attn_bwd_preprocess[(triton.cdiv(L, pre_m), count)](
            out, dout, delta, *out.stride(), *dout.stride(), H, L, start,  #
            DV=Dv, INT64=int64, BLOCK_M=pre_m, BLOCK_DV=block_dv)

    common = dict(D=D, DV=Dv, CAUSAL=causal, HAS_KPM=has_kpm, DOT_FP32=dot_fp32,
                  INPUT_PRECISION=precision, INT64=int64)

    def run_dkdv(cfg):
        for start, count in grid_chunks(B * H):
            _attn_bwd_dkdv[(triton.cdiv(S, cfg["BLOCK_N"]), count)](
                q, k, v, kpm, dout, lse, delta, dk, dv,  #
                *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dk.stride(), *dv.stride(), *kpm_strides,  #
                H, L, S, scale * LOG2E, scale, int(causal_offset), start, **common,  #
                BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=cfg["BLOCK_D"], BLOCK_DV=cfg["BLOCK_DV"],  #
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])

    def run_dq(cfg):
        for start, count in grid_chunks(B * H):
            _attn_bwd_dq[(triton.cdiv(L, cfg["BLOCK_M"]), count)](
                q, k, v, kpm, dout, lse, delta, dq,  #
                *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dq.stride(), *kpm_strides,  #
                H, L, S, scale * LOG2E, scale, int(causal_offset), start, **common,  #
                BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=cfg["BLOCK_D"], BLOCK_DV=cfg["BLOCK_DV"],  #
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])

    blocks = dict(block_m=block_m, block_n=block_n, capability=capability)
    _run_first_fitting(candidate_configs(D, Dv, q.dtype, interpret, kind="dkdv", **blocks), run_dkdv)
    _run_first_fitting(candidate_configs(D, Dv, q.dtype, interpret, kind="dq", **blocks), run_dq)
    return dq, dk, dv


__all__ = ["launch", "launch_backward", "default_config", "candidate_configs", "grid_chunks", "needs_int64",
           "MAX_HEAD_DIM", "MAX_GRID_Y", "SMEM_BUDGET", "SMEM_BUDGET_PRE_SM80"]
