"""第 8、9 章（FlashAttention 前向的 Triton 核函数；第 9 章数它内层循环里的 tl.dot）：与 attn_lib/flash/tiled_forward.py 同一个算法，一个程序实例算一块查询；核函数、网格和启动器都在这一个文件里，从上往下读。

Imported only through ``attn_lib.flash.triton.entry.load_kernels("forward")``, after
``attn_lib.device.triton_interprets()`` has fixed, once per process, whether Triton runs
compiled GPU kernels or its interpreter (``TRITON_INTERPRET=1`` on a machine without a CUDA
device: the interpreter runs the kernel with numpy on the CPU, so the tests and the book run
it without a GPU). The backward kernels are chapter 9's ``backward.py`` beside this file; the
tile sizes come from ``configs.py`` (pure Python).

Structure and names follow the Triton fused-attention tutorial (FlashAttention-2) and the
FlashAttention paper (Dao et al. 2022, arXiv 2205.14135, Algorithm 1):

- grid = (ceil(L / BLOCK_M), B * H) (``grid``): program (start_m, off_hz) owns queries
  ``start_m*BLOCK_M .. +BLOCK_M`` of head ``off_hz``; Q_i stays in registers/SRAM, together
  with the running statistics ``m_i`` (row max, base 2), ``l_i`` (row sum) and ``acc``.
- GQA (``enable_gqa``): k, v have H_kv heads, G = H // H_kv; query head h reads key/value head
  ``h // G`` in place (K and V are never repeated).
- ``attn_fwd_inner`` streams K_j, V_j blocks of BLOCK_N keys from HBM: paper lines 6-12.
  ``attn_fwd`` runs it over three stages of key blocks (``_key_range``): the band's left edge
  (masked), the blocks every query of the block fully sees (no masking work), the band's right
  edge with the ragged end of S (masked).
- ``exp2`` with ``log2(e)`` multiplied into the scores (``qk_scale``), as in the tutorial.
- The band (``settings.band``, ``attn_lib.rules.band``: causal, sliding windows and the
  alignment in one rule): query i sees key j iff ``band_lo <= j - i <= band_hi``; ``HAS_LO`` /
  ``HAS_HI`` (constexpr) are False for an unbounded side. ``_key_range`` skips the key blocks
  nobody in the query block sees, so a window of width w costs O(L·w), not O(L·S).

Common to every kernel (forward, backward, decode):

- Any L and S and any head dim 1..256: loads are masked, the head dims are padded to
  BLOCK_D / BLOCK_DV = next power of two (at least 16, the smallest ``tl.dot``). The head dims
  are compile-time constants (``D``, ``DV``, as HEAD_DIM in the tutorial), so for D = BLOCK_D
  the head-dim masks are all-true and fold away.
- Plain pointer arithmetic with masks (no ``tl.make_block_ptr``, gone in Triton 3.9), a fixed
  list of configurations tried in order (``run_first_fitting``; no autotune: multi-config
  autotune fails in the interpreter).
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

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from ...rules.numerics import LN2, LOG2E
from ...rules.settings import AttentionSettings
from .configs import band_args, block_args, candidate_configs, grid_chunks, key_mask_args, needs_int64, scale_args, spans
from .entry import launch_target

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
def attn_fwd_inner(acc, l_i, m_i, q,  #
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
def _stage_bounds(stage: tl.constexpr, first, full, last, end):
    # The key (or query) blocks of one of the three stages: [first, full), [full, last), [last, end).
    if stage == 0:
        return first, full
    if stage == 1:
        return full, last
    return last, end


@triton.jit
def attn_fwd(Q, K, V, KPM, Out, LSE,  #
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
    q = tl.load(Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=(offs_m[:, None] < L) & (offs_d[None, :] < D), other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    first, full, last, end = _key_range(start_m, L, S, band_lo, band_hi, HAS_LO, HAS_HI, BLOCK_M, BLOCK_N)
    for stage in tl.static_range(3):  # the band's left edge (masked), whole blocks, the right edge (masked)
        lo, hi = _stage_bounds(stage, first, full, last, end)
        acc, l_i, m_i = attn_fwd_inner(acc, l_i, m_i, q, K + off_b * stride_kb + off_hkv * stride_kh,  #
                                       V + off_b * stride_vb + off_hkv * stride_vh, KPM + off_b * stride_kpm_b,  #
                                       stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                                       offs_m, offs_n, offs_d, offs_dv, lo, hi, S, qk_scale, band_lo, band_hi,  #
                                       D, DV, stage != 1, HAS_LO, HAS_HI, HAS_KPM, DOT_FP32, INPUT_PRECISION,
                                       SPLIT_SCALE, BLOCK_N)
    # Paper line 12 after the last block: O_i = acc / l_i; log-sum-exp in natural log.
    # l_i == 0: the row saw no key (lse = -inf, output 0). An overflowed score (+inf) makes
    # l_i NaN, so lse is NaN and the caller's overflow rule reports it after the kernel.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * _LN2)
    tl.store(LSE + off_hz * L + offs_m, lse, mask=offs_m < L)
    tl.store(Out + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od,
             (acc / l_safe[:, None]).to(Out.dtype.element_ty), mask=(offs_m[:, None] < L) & (offs_dv[None, :] < DV))


def grid(L: int, count: int, cfg: dict) -> tuple:
    """The forward's grid: one program per block of BLOCK_M queries (axis 0) of each of ``count`` heads (axis 1)."""
    return (triton.cdiv(L, cfg["BLOCK_M"]), count)


def run_first_fitting(configs: list, run) -> dict:
    """Run ``run(cfg)`` with the first configuration this GPU's shared memory accepts; return it."""
    for cfg in configs[:-1]:
        try:
            run(cfg)
            return cfg
        except OutOfResources:  # a smaller configuration may fit
            continue
    run(configs[-1])  # the smallest: its OutOfResources goes to the caller
    return configs[-1]


def launch(q, k, v, settings: AttentionSettings, *, target=None):
    """启动前向核函数（输入已检查过）。返回 (out (B,H,L,Dv), lse (B,H,L) float32)。

    Args:
        q, k, v: (B, H, L, D), (B, H_kv, S, D), (B, H_kv, S, Dv) with H_kv dividing H (GQA:
            query head h reads key/value head h // (H // H_kv) in place).
        settings: the band, the base-2 scale factors, the key mask and the block sizes.
        target: ``(interpret, capability)`` to launch for; default this process's Triton mode and
            q's GPU (``bench/gpu.py --compile-only`` passes the GPU it compiles for).
    """
    (B, H, L, D), (H_kv, S), Dv = q.shape, k.shape[1:3], v.shape[3]
    tgt = launch_target(q, target)
    configs = candidate_configs(D, Dv, q.dtype, tgt["interpret"], block_m=settings.block_m, block_n=settings.block_n,
                                capability=tgt["capability"])
    out = torch.empty(B, H, L, Dv, dtype=q.dtype, device=q.device)  # (B,H,L,Dv)
    lse = torch.empty(B, H, L, dtype=torch.float32, device=q.device)  # (B,H,L)
    if B * H * L == 0:
        return out, lse
    kpm, kpm_strides = key_mask_args(settings.key_mask, q)
    int64 = needs_int64(spans(q, k, v, out) + [(S, kpm_strides[1], 1, 0)])
    sc, bands = scale_args(settings.qk_scale), band_args(settings.band, L, S)

    def run(cfg):
        for start, count in grid_chunks(B * H):
            attn_fwd[grid(L, count, cfg)](
                q, k, v, kpm, out, lse,  #
                *q.stride(), *k.stride(), *v.stride(), *out.stride(), *kpm_strides,  #
                H, H // H_kv, L, S, sc["qk_scale"], bands["band_lo"], bands["band_hi"], start,  #
                D=D, DV=Dv, HAS_LO=bands["HAS_LO"], HAS_HI=bands["HAS_HI"], HAS_KPM=settings.key_mask is not None,  #
                DOT_FP32=tgt["dot_fp32"], INPUT_PRECISION=tgt["input_precision"], INT64=int64,  #
                SPLIT_SCALE=sc["SPLIT_SCALE"], **block_args(cfg))

    run_first_fitting(configs, run)
    return out, lse


__all__ = ["attn_fwd", "attn_fwd_inner", "grid", "launch", "run_first_fitting"]
