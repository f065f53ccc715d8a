"""第 8 章（FlashAttention 前向的 Triton 核函数）：与 attn_lib/flash/tiled_forward.py 同一个算法，一个程序实例算一块查询。

Do not import this module directly: ``attn_lib.flash.autograd.load_kernel()`` imports the launchers
(``attn_lib.flash.triton.launch``, which import this module) after
``attn_lib.device.triton_interprets()`` has fixed, once per process, whether Triton runs
compiled GPU kernels or its interpreter (``TRITON_INTERPRET=1`` on a machine without a CUDA
device: the interpreter runs the kernel with numpy on the CPU, so the tests and the book run
it without a GPU). The backward kernels are chapter 9's ``attn_lib/flash/triton/backward.py``;
the tile sizes are chosen by ``attn_lib/flash/triton/configs.py`` (pure Python).

Structure and names follow the Triton fused-attention tutorial (FlashAttention-2) and the
FlashAttention paper (Dao et al. 2022, arXiv 2205.14135, Algorithm 1):

- grid = (ceil(L / BLOCK_M), B * H): program (start_m, off_hz) owns queries
  ``start_m*BLOCK_M .. +BLOCK_M`` of head ``off_hz``; Q_i stays in registers/SRAM, together
  with the running statistics ``m_i`` (row max, base 2), ``l_i`` (row sum) and ``acc``.
- GQA (``enable_gqa``): k, v have H_kv heads, G = H // H_kv; query head h reads key/value head
  ``h // G`` in place (K and V are never repeated).
- ``_attn_fwd_inner`` streams K_j, V_j blocks of BLOCK_N keys from HBM: paper lines 6-12.
  The middle stage covers key blocks every query of the block fully sees (no masking work);
  the two masked stages cover the band's left edge, and its right edge with the ragged end of S.
- ``exp2`` with ``log2(e)`` multiplied into the scores (``qk_scale``), as in the tutorial.
- The band of ``attn_lib.rules.band`` (causal and sliding windows in one rule): query i sees key j
  iff ``band_lo <= j - i <= band_hi``; ``HAS_LO`` / ``HAS_HI`` (constexpr) are False for an
  unbounded side. ``is_causal`` is ``band_hi = causal_offset`` (0: top-left, ``S - L``:
  bottom-right, as in KV-cache decoding); ``window_size=(left, right)`` adds
  ``band_lo = offset - left``. ``_key_range`` skips the key blocks nobody in the query block sees,
  so a window of width w costs O(L·w), not O(L·S).

Common to every kernel (forward and backward):

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
  ``attn_lib.rules.numerics`` holds both rules.
- Launch limits: CUDA allows at most 65535 programs on grid axis 1, so the B·H heads are
  launched in chunks (``HZ_START`` is the chunk's first head). Per-head offsets are int64;
  offsets inside a head are int32 unless one could reach 2³¹ (``INT64``).
"""
from __future__ import annotations

import triton
import triton.language as tl

from attn_lib.rules.numerics import LN2, LOG2E

_LN2 = tl.constexpr(LN2)
_LOG2E = tl.constexpr(LOG2E)


@triton.jit
def _base2_scores(qk, qk_scale, SPLIT_SCALE: tl.constexpr):
    # Scores in base 2, qk · scale · log2(e): one factor, or two when their product overflows float32.
    qk = qk * qk_scale
    if SPLIT_SCALE:
        qk = qk * _LOG2E
    return qk


@triton.jit
def _in_band(visible, diff, band_lo, band_hi, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr):
    # visible & (band_lo <= j - i <= band_hi), diff = j - i; a side without HAS_* is unbounded.
    if HAS_LO:
        visible = visible & (diff >= band_lo)
    if HAS_HI:
        visible = visible & (diff <= band_hi)
    return visible


@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q,  #
                    k_base, v_base, kpm_base,  #
                    stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                    offs_m, offs_n, offs_d, offs_dv,  #
                    lo, hi, S, qk_scale, band_lo, band_hi,  #
                    D: tl.constexpr, DV: tl.constexpr, MASKED: tl.constexpr,  #
                    HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, HAS_KPM: tl.constexpr,  #
                    DOT_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr, SPLIT_SCALE: tl.constexpr,  #
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
        qk = _base2_scores(tl.dot(q, k, input_precision=INPUT_PRECISION), qk_scale, SPLIT_SCALE)
        if MASKED:  # keys past S and outside the band (lo <= j - i <= hi) are hidden
            visible = _in_band(offs_kn[None, :] < S, offs_kn[None, :] - offs_m[:, None], band_lo, band_hi,
                               HAS_LO, HAS_HI)  # (BLOCK_M, BLOCK_N)
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
def _key_range(start_m, L, S, band_lo, band_hi, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr,  #
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Keys of query block start_m (queries m0 .. m1-1), as attn_lib.rules.band.key_range, cut into
    # [first, full) masked (the band's left edge), [full, last) whole blocks every query of the block
    # sees (no masking work), [last, end) masked (the band's right edge and the ragged end of S).
    # Keys outside [first, end) are seen by no query of the block: their blocks are skipped.
    m0 = start_m * BLOCK_M
    m1 = tl.minimum(m0 + BLOCK_M, L)
    first = m0 * 0
    full = first
    last = first + (S // BLOCK_N) * BLOCK_N
    end = first + S
    if HAS_LO:  # query i sees no key j < i + band_lo; all of the block sees j >= m1 - 1 + band_lo
        first = (tl.maximum(m0 + band_lo, 0) // BLOCK_N) * BLOCK_N
        full = tl.cdiv(tl.maximum(m1 - 1 + band_lo, 0), BLOCK_N) * BLOCK_N
    if HAS_HI:  # query i sees no key j > i + band_hi; all of the block sees j <= m0 + band_hi
        end = tl.minimum(tl.maximum(m1 + band_hi, 0), S)
        last = (tl.minimum(tl.maximum(m0 + band_hi + 1, 0), S) // BLOCK_N) * BLOCK_N
    end = tl.maximum(end, first)
    full = tl.minimum(tl.maximum(full, first), end)
    last = tl.maximum(tl.minimum(last, end), full)
    return first, full, last, end


@triton.jit
def _attn_fwd_band(acc, l_i, m_i, q, k_base, v_base, kpm_base,  #
                   stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                   offs_m, offs_n, offs_d, offs_dv, first, full, last, end, S, qk_scale, band_lo, band_hi,  #
                   D: tl.constexpr, DV: tl.constexpr, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr,  #
                   HAS_KPM: tl.constexpr, DOT_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr,  #
                   SPLIT_SCALE: tl.constexpr, BLOCK_N: tl.constexpr):
    # The three stages of _key_range: the band's left edge (masked), whole blocks (unmasked),
    # the right edge and the ragged end of S (masked).
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, kpm_base,  #
                                    stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                                    offs_m, offs_n, offs_d, offs_dv, first, full, S, qk_scale, band_lo, band_hi,  #
                                    D, DV, True, HAS_LO, HAS_HI, HAS_KPM, DOT_FP32, INPUT_PRECISION, SPLIT_SCALE,
                                    BLOCK_N)
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, kpm_base,  #
                                    stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                                    offs_m, offs_n, offs_d, offs_dv, full, last, S, qk_scale, band_lo, band_hi,  #
                                    D, DV, False, HAS_LO, HAS_HI, HAS_KPM, DOT_FP32, INPUT_PRECISION, SPLIT_SCALE,
                                    BLOCK_N)
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, kpm_base,  #
                                    stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                                    offs_m, offs_n, offs_d, offs_dv, last, end, S, qk_scale, band_lo, band_hi,  #
                                    D, DV, True, HAS_LO, HAS_HI, HAS_KPM, DOT_FP32, INPUT_PRECISION, SPLIT_SCALE,
                                    BLOCK_N)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, KPM, Out, LSE,  #
              stride_qb, stride_qh, stride_qm, stride_qd,  #
              stride_kb, stride_kh, stride_kn, stride_kd,  #
              stride_vb, stride_vh, stride_vn, stride_vd,  #
              stride_ob, stride_oh, stride_om, stride_od,  #
              stride_kpm_b, stride_kpm_n,  #
              H, G, L, S, qk_scale, band_lo, band_hi, HZ_START,  #
              D: tl.constexpr, DV: tl.constexpr,  #
              HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, HAS_KPM: tl.constexpr,  #
              DOT_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr, INT64: tl.constexpr,  #
              SPLIT_SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,  #
              BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    start_m = tl.program_id(0)
    off_hz = (tl.program_id(1) + HZ_START).to(tl.int64)  # this chunk's heads start at HZ_START
    off_b = off_hz // H
    off_h = off_hz % H
    off_hkv = off_h // G  # GQA: the key/value head this query head shares, read in place
    q_base = Q + off_b * stride_qb + off_h * stride_qh
    k_base = K + off_b * stride_kb + off_hkv * stride_kh
    v_base = V + off_b * stride_vb + off_hkv * stride_vh
    o_base = Out + off_b * stride_ob + off_h * stride_oh
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
    first, full, last, end = _key_range(start_m, L, S, band_lo, band_hi, HAS_LO, HAS_HI, BLOCK_M, BLOCK_N)
    acc, l_i, m_i = _attn_fwd_band(acc, l_i, m_i, q, k_base, v_base, KPM + off_b * stride_kpm_b,  #
                                   stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                                   offs_m, offs_n, offs_d, offs_dv, first, full, last, end, S, qk_scale,  #
                                   band_lo, band_hi, D, DV, HAS_LO, HAS_HI, HAS_KPM, DOT_FP32, INPUT_PRECISION,
                                   SPLIT_SCALE, BLOCK_N)
    # Paper line 12 after the last block: O_i = acc / l_i; log-sum-exp in natural log.
    # l_i == 0: the row saw no key (lse = -inf, output 0). An overflowed score (+inf) makes
    # l_i NaN, so lse is NaN and attn_lib.flash.autograd reports it after the kernel.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    acc = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * _LN2)
    tl.store(LSE + off_hz * L + offs_m, lse, mask=offs_m < L)
    tl.store(o_base + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od,
             acc.to(Out.dtype.element_ty), mask=(offs_m[:, None] < L) & (offs_dv[None, :] < DV))
