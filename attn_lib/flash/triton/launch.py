"""第 8、9 章（书中不单独讲）：Triton 核函数的启动器——分配输出、选配置、按网格分段启动前向和三个反向核函数。

Imported by ``attn_lib.flash.autograd.load_kernel()`` only (it imports Triton), after the process's
Triton mode is fixed. Inputs are already checked by the door (``attn_lib.flash.autograd``); nothing is
checked here. The configuration API (``candidate_configs`` ...) and the kernels are
re-exported so that ``load_kernel()`` is one handle on everything Triton.
"""
from __future__ import annotations

import torch
import triton
from triton.runtime.errors import OutOfResources

from ...rules.numerics import base2_factor, dot_input_precision
from . import configs as _config
from ...rules.band import NO_WINDOW
from .backward_dq import _attn_bwd_dq
from .configs import (INTERPRET_BLOCK, MAX_GRID_Y, MAX_HEAD_DIM, SMEM_BUDGET, SMEM_BUDGET_PRE_SM80,  # noqa: F401
                             _next_pow2, _smem_bytes, _smem_bytes_pre_sm80, band_args, candidate_configs,
                             default_config, needs_int64)
from .forward import _attn_fwd
from .backward import _attn_bwd_dkdv, _attn_bwd_preprocess


def grid_chunks(n_heads: int, limit: int | None = None) -> list:
    """把 B·H 个头切成每次启动不超过 limit 个的几段（默认本模块的 MAX_GRID_Y，调用时读取）。"""
    return _config.grid_chunks(n_heads, MAX_GRID_Y if limit is None else limit)


def _chunks(n_heads: int) -> list:
    return grid_chunks(n_heads)


def _spans(*tensors) -> list:
    return [(t.shape[2], t.stride(2), t.shape[3], t.stride(3)) for t in tensors]


def _kpm_args(key_padding_mask, dummy):
    if key_padding_mask is None:
        return dummy, (0, 0)  # never read (HAS_KPM=False)
    kpm = key_padding_mask.to(torch.int8)  # (B,S), 1 = key present
    return kpm, kpm.stride()


def _scale_args(scale: float) -> dict:
    """qk_scale (scale·log2(e), or scale alone when that overflows float32) and SPLIT_SCALE."""
    a, b = base2_factor(scale, torch.float32)
    return {"qk_scale": a, "SPLIT_SCALE": b != 1.0}


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


def _blocks(cfg: dict) -> dict:
    return dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=cfg["BLOCK_D"], BLOCK_DV=cfg["BLOCK_DV"],
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask, causal: bool, scale: float,
           *, interpret: bool, dot_fp32: bool | None = None, block_m: int | None = None, block_n: int | None = None,
           capability: tuple | None = None, causal_offset: int = 0, window_size=NO_WINDOW, enable_gqa=None):
    """启动前向核函数（输入已检查过）。返回 (out (B,H,L,Dv), lse (B,H,L) float32)。

    Args:
        q, k, v: (B, H, L, D), (B, H_kv, S, D), (B, H_kv, S, Dv) with H_kv dividing H (GQA:
            query head h reads key/value head h // (H // H_kv) in place).
        interpret: Triton runs its interpreter in this process (picks the tile sizes).
        dot_fp32: compute every ``tl.dot`` in fp32; default ``interpret``.
        capability: the GPU's compute capability (tile sizes for GPUs before sm_80).
        causal_offset, window_size: with ``causal``, the band of ``attn_lib.rules.band.band(causal,
            window_size, causal_offset)``: query i sees key j iff lo <= j - i <= hi.
        enable_gqa: not read (the head counts decide; the door has checked them).
    """
    B, H, L, D = q.shape
    H_kv, S, Dv = k.shape[1], k.shape[2], v.shape[3]
    dot_fp32 = interpret if dot_fp32 is None else dot_fp32
    configs = candidate_configs(D, Dv, q.dtype, interpret, block_m=block_m, block_n=block_n, capability=capability)
    out = torch.empty(B, H, L, Dv, dtype=q.dtype, device=q.device)  # (B,H,L,Dv)
    lse = torch.empty(B, H, L, dtype=torch.float32, device=q.device)  # (B,H,L)
    if B * H * L == 0:
        return out, lse
    kpm, kpm_strides = _kpm_args(key_padding_mask, q)
    int64 = needs_int64(_spans(q, k, v, out) + [(S, kpm_strides[1], 1, 0)])
    sc = _scale_args(scale)
    bands = band_args(causal, window_size, causal_offset, L, S)

    def run(cfg):
        for start, count in _chunks(B * H):
            _attn_fwd[(triton.cdiv(L, cfg["BLOCK_M"]), count)](
                q, k, v, kpm, out, lse,  #
                *q.stride(), *k.stride(), *v.stride(), *out.stride(), *kpm_strides,  #
                H, H // H_kv, L, S, sc["qk_scale"], bands["band_lo"], bands["band_hi"], start,  #
                D=D, DV=Dv, HAS_LO=bands["HAS_LO"], HAS_HI=bands["HAS_HI"], HAS_KPM=key_padding_mask is not None,  #
                DOT_FP32=dot_fp32, INPUT_PRECISION=dot_input_precision(q.dtype, dot_fp32), INT64=int64,  #
                SPLIT_SCALE=sc["SPLIT_SCALE"], **_blocks(cfg))

    _run_first_fitting(configs, run)
    return out, lse


def launch_backward(q, k, v, out, lse, dout, key_padding_mask, causal: bool, scale: float,
                    *, interpret: bool, dot_fp32: bool | None = None, block_m: int | None = None,
                    block_n: int | None = None, capability: tuple | None = None, causal_offset: int = 0,
                    window_size=NO_WINDOW, enable_gqa=None):
    """启动三个反向核函数（输入已检查过）。返回 (dq, dk, dv)，形状和精度同 q, k, v（dk、dv 是 H_kv 个头）。

    Args:
        out, lse: what ``launch`` returned for these inputs; dout: dLoss/dout (B, H, L, Dv).
        interpret, dot_fp32, block_m, block_n, capability, causal_offset, window_size, enable_gqa:
            as in ``launch`` (block_m: query blocks, block_n: key blocks, in both backward kernels).
            GQA: one dK/dV program per key block of a key/value head sums over its query heads.
    """
    B, H, L, D = q.shape
    H_kv, S, Dv = k.shape[1], k.shape[2], v.shape[3]
    dot_fp32 = interpret if dot_fp32 is None else dot_fp32
    if B * H == 0 or L == 0 or S == 0:  # no query or no key: every gradient is 0
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dq = torch.empty(B, H, L, D, dtype=q.dtype, device=q.device)  # (B,H,L,D), every row written
    dk = torch.empty(B, H_kv, S, D, dtype=k.dtype, device=q.device)  # (B,H_kv,S,D), every key written
    dv = torch.empty(B, H_kv, S, Dv, dtype=v.dtype, device=q.device)  # (B,H_kv,S,Dv)
    lse = lse.contiguous()  # (B,H,L), indexed as off_hz * L + m
    delta = _preprocess(out, dout, interpret)  # (B,H,L)
    kpm, kpm_strides = _kpm_args(key_padding_mask, q)
    sc = _scale_args(scale)
    bands = band_args(causal, window_size, causal_offset, L, S)
    common = dict(D=D, DV=Dv, HAS_LO=bands["HAS_LO"], HAS_HI=bands["HAS_HI"], HAS_KPM=key_padding_mask is not None,
                  DOT_FP32=dot_fp32, INPUT_PRECISION=dot_input_precision(q.dtype, dot_fp32),
                  SPLIT_SCALE=sc["SPLIT_SCALE"],
                  INT64=needs_int64(_spans(q, k, v, out, dout, dq, dk, dv) + [(S, kpm_strides[1], 1, 0)]))
    args = (H, H // H_kv, L, S, sc["qk_scale"], scale, bands["band_lo"], bands["band_hi"])

    def run_dkdv(cfg):
        for start, count in _chunks(B * H_kv):  # one program per key block of each key/value head
            _attn_bwd_dkdv[(triton.cdiv(S, cfg["BLOCK_N"]), count)](
                q, k, v, kpm, dout, lse, delta, dk, dv,  #
                *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dk.stride(), *dv.stride(), *kpm_strides,  #
                *args, start, **common, **_blocks(cfg))

    def run_dq(cfg):
        for start, count in _chunks(B * H):
            _attn_bwd_dq[(triton.cdiv(L, cfg["BLOCK_M"]), count)](
                q, k, v, kpm, dout, lse, delta, dq,  #
                *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dq.stride(), *kpm_strides,  #
                *args, start, **common, **_blocks(cfg))

    blocks = dict(block_m=block_m, block_n=block_n, capability=capability)
    _run_first_fitting(candidate_configs(D, Dv, q.dtype, interpret, kind="dkdv", **blocks), run_dkdv)
    _run_first_fitting(candidate_configs(D, Dv, q.dtype, interpret, kind="dq", **blocks), run_dq)
    return dq, dk, dv


def _preprocess(out, dout, interpret: bool):
    """D_i = rowsum(dO_i ∘ O_i): a light pass, one program per 64 queries (32 interpreted). Returns (B,H,L) float32."""
    B, H, L, Dv = out.shape
    delta = torch.empty(B, H, L, dtype=torch.float32, device=out.device)  # (B,H,L)
    pre_m = INTERPRET_BLOCK if interpret else 64
    int64 = needs_int64(_spans(out, dout))
    for start, count in _chunks(B * H):
        _attn_bwd_preprocess[(triton.cdiv(L, pre_m), count)](
            out, dout, delta, *out.stride(), *dout.stride(), H, L, start,  #
            DV=Dv, INT64=int64, BLOCK_M=pre_m, BLOCK_DV=max(16, _next_pow2(Dv)))
    return delta


__all__ = ["launch", "launch_backward", "candidate_configs", "default_config", "grid_chunks", "needs_int64",
           "MAX_HEAD_DIM", "MAX_GRID_Y", "SMEM_BUDGET", "SMEM_BUDGET_PRE_SM80"]
