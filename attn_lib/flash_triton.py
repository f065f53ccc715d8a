"""FlashAttention 前向的 Triton 核函数：与 attn_lib/flash_torch.py 同一个算法，一个程序实例算一块查询。

Do not import this module directly: ``attn_lib.flash.flash_attention_triton`` loads it lazily,
under ``TRITON_INTERPRET=1`` when the tensors are not on a CUDA device (the interpreter runs
the kernel with numpy on the CPU, so the tests and the book run it without a GPU).

Structure and names follow the Triton fused-attention tutorial (FlashAttention-2's forward)
and the FlashAttention paper (Dao et al. 2022, arXiv 2205.14135, Algorithm 1):

- grid = (ceil(L / BLOCK_M), B * H): program (start_m, off_hz) owns queries
  ``start_m*BLOCK_M .. +BLOCK_M`` of head ``off_hz``; Q_i stays in registers/SRAM, together
  with the running statistics ``m_i`` (row max, base 2), ``l_i`` (row sum) and ``acc``.
- ``_attn_fwd_inner`` streams K_j, V_j blocks of BLOCK_N keys from HBM: paper lines 6-12.
  Stage 1 covers key blocks every query of the block may fully see (no masking work);
  stage 2 covers the rest (the causal diagonal and the ragged end of S), masked.
- ``exp2`` with ``log2(e)`` folded into ``qk_scale``, as in the tutorial.
- Any L and S and any head dim 1..256: loads are masked, the head dim is padded to
  BLOCK_D = next power of two (at least 16, the smallest ``tl.dot``). The head dims are
  compile-time constants (``D``, ``DV``, as HEAD_DIM in the tutorial), so for D = BLOCK_D the
  head-dim masks are all-true and fold away; stage 1 loads need no key-bound mask.
- Plain pointer arithmetic with masks (no ``tl.make_block_ptr``, gone in Triton 3.9), one
  explicit configuration (no autotune: multi-config autotune fails in the interpreter).
- fp16 / bf16 / fp32 inputs, fp32 accumulation; fp32 dots use ``input_precision="ieee"``
  (the GPU default would be TF32, 10-bit mantissa). ``DOT_FP32`` makes every dot run in fp32
  after rounding its inputs as the GPU would (the interpreter's bf16 ``tl.dot`` is wrong).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

LOG2E = 1.4426950408889634
MAX_HEAD_DIM = 256


@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q,  #
                    k_base, v_base, kpm_base,  #
                    stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                    offs_m, offs_n, offs_d, offs_dv,  #
                    lo, hi, S, qk_scale,  #
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
                visible = visible & (offs_kn[None, :] <= offs_m[:, None])
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
              H, L, S, qk_scale,  #
              D: tl.constexpr, DV: tl.constexpr,  #
              CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr,  #
              DOT_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr,  #
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,  #
              BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_b = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    q_base = Q + off_b * stride_qb + off_h * stride_qh
    k_base = K + off_b * stride_kb + off_h * stride_kh
    v_base = V + off_b * stride_vb + off_h * stride_vh
    o_base = Out + off_b * stride_ob + off_h * stride_oh
    kpm_base = KPM + off_b * stride_kpm_b
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
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
    # Key range: all S keys, or (causal, top-left aligned) keys <= the block's last query.
    if CAUSAL:
        hi = tl.minimum(S, (start_m + 1) * BLOCK_M)
        # Blocks ending at or before the first query of the block are fully visible.
        full = (tl.minimum(S, start_m * BLOCK_M + 1) // BLOCK_N) * BLOCK_N
    else:
        hi = S
        full = (S // BLOCK_N) * BLOCK_N
    # Stage 1: unmasked key blocks.
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, kpm_base,  #
                                    stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                                    offs_m, offs_n, offs_d, offs_dv, 0, full, S, qk_scale,  #
                                    D, DV, False, CAUSAL, HAS_KPM, DOT_FP32, INPUT_PRECISION, BLOCK_N)
    # Stage 2: the causal diagonal and the ragged end of S, masked.
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, kpm_base,  #
                                    stride_kn, stride_kd, stride_vn, stride_vd, stride_kpm_n,  #
                                    offs_m, offs_n, offs_d, offs_dv, full, hi, S, qk_scale,  #
                                    D, DV, True, CAUSAL, HAS_KPM, DOT_FP32, INPUT_PRECISION, BLOCK_N)
    # Paper line 12 after the last block: O_i = acc / l_i; log-sum-exp in natural log.
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    acc = acc / l_safe[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    tl.store(LSE + off_hz.to(tl.int64) * L + offs_m, lse, mask=offs_m < L)
    tl.store(o_base + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od,
             acc.to(Out.dtype.element_ty), mask=(offs_m[:, None] < L) & (offs_dv[None, :] < DV))


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


SMEM_BUDGET = 96 * 1024  # bytes; fits A100 (164 KB) and H100/H200 (227 KB) with room for Triton's own buffers

# (BLOCK_M, BLOCK_N, num_stages) in order of preference, per input element size in bytes.
_CANDIDATES = {
    2: [(128, 64, 3), (128, 32, 3), (64, 64, 2), (64, 32, 2), (32, 32, 2), (16, 16, 1)],
    4: [(64, 64, 2), (64, 32, 2), (32, 32, 2), (32, 16, 2), (16, 16, 1)],
}


def _smem_bytes(elem: int, block_m: int, block_n: int, num_stages: int, block_d: int, block_dv: int) -> int:
    """Q_i stays in shared memory; K_j and V_j are buffered num_stages deep."""
    return elem * (block_m * block_d + num_stages * block_n * (block_d + block_dv))


def candidate_configs(D: int, Dv: int, dtype: torch.dtype, interpret: bool) -> list:
    """按头维度和精度列出可用的块大小与 warp 数（从快到稳；一套固定候选，不做自动调优）。"""
    block_d, block_dv = max(16, _next_pow2(D)), max(16, _next_pow2(Dv))
    if interpret:  # numpy on the CPU: one program per 32 queries keeps the padding waste low
        return [dict(BLOCK_M=32, BLOCK_N=32, BLOCK_D=block_d, BLOCK_DV=block_dv, num_warps=4, num_stages=1)]
    elem = 4 if dtype == torch.float32 else 2
    out = []
    for block_m, block_n, num_stages in _CANDIDATES[elem]:
        if _smem_bytes(elem, block_m, block_n, num_stages, block_d, block_dv) > SMEM_BUDGET:
            continue
        num_warps = 8 if block_m >= 128 and max(block_d, block_dv) >= 128 else 4
        out.append(dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, BLOCK_DV=block_dv,
                        num_warps=num_warps, num_stages=num_stages))
    return out or [dict(BLOCK_M=16, BLOCK_N=16, BLOCK_D=block_d, BLOCK_DV=block_dv, num_warps=4, num_stages=1)]


def default_config(D: int, Dv: int, dtype: torch.dtype, interpret: bool) -> dict:
    """首选配置：candidate_configs 的第一个。"""
    return candidate_configs(D, Dv, dtype, interpret)[0]


def launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask, causal: bool, scale: float,
           *, interpret: bool, block_m: int | None = None, block_n: int | None = None):
    """启动核函数（输入已由 attn_lib.flash 检查过）。返回 (out (B,H,L,Dv), lse (B,H,L) float32)。"""
    B, H, L, D = q.shape
    S, Dv = k.shape[2], v.shape[3]
    if max(D, Dv) > MAX_HEAD_DIM:
        raise ValueError(f"the Triton kernel supports head dims up to {MAX_HEAD_DIM}, got D={D}, Dv={Dv}; "
                         "use backend='torch'")
    configs = candidate_configs(D, Dv, q.dtype, interpret)
    for cfg in configs:
        if block_m is not None:
            cfg["BLOCK_M"] = block_m
        if block_n is not None:
            cfg["BLOCK_N"] = block_n
    out = torch.empty(B, H, L, Dv, dtype=q.dtype, device=q.device)  # (B,H,L,Dv)
    lse = torch.empty(B, H, L, dtype=torch.float32, device=q.device)  # (B,H,L)
    if key_padding_mask is not None:
        kpm = key_padding_mask.to(torch.int8)  # (B,S), 1 = key present
        kpm_strides = kpm.stride()
    else:
        kpm, kpm_strides = q, (0, 0)  # never read (HAS_KPM=False)
    if B * H * L == 0:
        return out, lse
    dot_fp32 = interpret
    precision = "ieee" if q.dtype == torch.float32 or dot_fp32 else None
    for i, cfg in enumerate(configs):
        grid = (triton.cdiv(L, cfg["BLOCK_M"]), B * H)
        try:
            _attn_fwd[grid](
                q, k, v, kpm, out, lse,  #
                *q.stride(), *k.stride(), *v.stride(), *out.stride(), *kpm_strides,  #
                H, L, S, scale * LOG2E,  #
                D=D, DV=Dv, CAUSAL=causal, HAS_KPM=key_padding_mask is not None,  #
                DOT_FP32=dot_fp32, INPUT_PRECISION=precision,  #
                BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=cfg["BLOCK_D"], BLOCK_DV=cfg["BLOCK_DV"],  #
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
            )
            return out, lse
        except OutOfResources:
            if i == len(configs) - 1:  # a smaller configuration may fit this GPU's shared memory
                raise
    return out, lse


__all__ = ["launch", "default_config", "candidate_configs", "MAX_HEAD_DIM", "SMEM_BUDGET"]
