"""第 8、9、13 章（书中不单独讲）：Triton 核函数的配置策略——块大小、片上内存估计、网格分段、偏移用 int32 还是 int64、对角线带的参数（纯 Python，不导入 Triton）。

The kernels (``forward.py``, ``backward.py``, ``decode.py`` beside this file) take their tile
sizes from ``candidate_configs`` / ``decode_configs``: a fixed list per kernel kind and element
size, tried in order by each file's launcher until one fits the GPU's shared memory; no
autotune (multi-config autotune fails in the interpreter).
"""
from __future__ import annotations

import torch

from ...rules.band import Band
from ...rules.names import MAX_HEAD_DIM

MAX_GRID_Y = 65535  # CUDA's gridDim.y (and .z) limit; gridDim.x may reach 2**31 - 1
INT32_LIMIT = 2**31
INTERPRET_BLOCK = 32  # numpy on the CPU: one program per 32 rows keeps the padding waste low


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, n - 1).bit_length()


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
# ``_smem_bytes_pre_sm80`` is that upper bound; tests/flash/triton/test_configs.py pins the numbers.
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
    if kind not in _KINDS:  # an internal argument (the launchers pass it), not a user's: no door to go through
        raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
    block_d, block_dv = max(16, next_pow2(D)), max(16, next_pow2(Dv))
    elem = 4 if dtype == torch.float32 else 2
    pre_sm80 = capability is not None and tuple(capability) < (8, 0)
    if interpret:
        tiles = [(INTERPRET_BLOCK, INTERPRET_BLOCK, 1)]
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


DECODE_MAX_ROWS = 128  # G·L query rows per program of the decode split kernel; more rows: several row blocks
# The decode split kernel's BLOCK_N in order of preference (flash-attn's split-KV kernel: 128 keys for head
# dim 128). Compiled for sm_75 / sm_80 / sm_90 without a GPU as the launcher builds it (bench/gpu.py
# --compile-only SM --decode): below _smem_bytes_pre_sm80 on sm_75; on sm_80+ (two stages, pipelined loads)
# a few KB above _smem_bytes at one stage, the estimate checked here, and within the GPU's limit. A
# configuration the GPU refuses (OutOfResources) makes the launcher try the next BLOCK_N.
_DECODE_BLOCK_N = (128, 64, 32, 16)


def decode_configs(rows: int, D: int, Dv: int, dtype: torch.dtype, interpret: bool, *, capability=None,
                   block_m: int | None = None, block_n: int | None = None) -> list:
    """解码切分核函数（attn_lib/flash/triton/decode.py）的块大小：BLOCK_M 容下一组的 G·L 行（至少 16，至多 DECODE_MAX_ROWS，片上内存不够时减半），BLOCK_N 从大到小试。

    Args:
        rows: G·L, the query rows that share one key/value head.
        D, Dv, dtype: head dims and the inputs' dtype.
        interpret: under Triton's interpreter one configuration (BLOCK_N = 32).
        capability: the GPU's (major, minor); before (8, 0) one stage within 64 KB.
        block_m, block_n: overrides (powers of two >= 16), then exactly one configuration.

    Returns:
        A non-empty list of dicts with BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV, num_warps, num_stages.
    """
    bm = block_m or min(DECODE_MAX_ROWS, max(16, next_pow2(rows)))
    bd, bdv = max(16, next_pow2(D)), max(16, next_pow2(Dv))
    elem = 4 if dtype == torch.float32 else 2
    pre_sm80 = capability is not None and tuple(capability) < (8, 0)

    def fits(bm, bn):
        if pre_sm80:
            return _smem_bytes_pre_sm80(dtype, "fwd", bm, bn, bd, bdv) <= SMEM_BUDGET_PRE_SM80
        return _smem_bytes(elem, bm, bn, 1, bd, bdv) <= SMEM_BUDGET

    if interpret:
        blocks = [INTERPRET_BLOCK]
    else:
        while block_m is None and bm > 16 and not fits(bm, 16):  # fewer rows per program (more row blocks)
            bm //= 2
        blocks = [bn for bn in _DECODE_BLOCK_N if fits(bm, bn)] or [16]
    if block_n is not None:
        blocks = [block_n]
    stages = 1 if interpret or pre_sm80 else 2
    return [dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd, BLOCK_DV=bdv, num_stages=stages,
                 num_warps=8 if not interpret and bm >= 128 and max(bd, bdv) >= 128 else 4) for bn in blocks]


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


def band_args(band: Band, L: int, S: int) -> dict:
    """核函数的对角线带参数：查询 i 看得见键 j 当且仅当 band_lo <= j - i <= band_hi（HAS_LO / HAS_HI 为 False 的一侧不设界）。

    ``band`` is already normalised for these L and S (``Band.resolve``): a side that every
    (i, j) satisfies is unbounded, and a side that hides everything is clamped to ``S`` / ``-L``,
    so the kernels get small runtime ints.

    Returns:
        ``{"band_lo": int, "band_hi": int, "HAS_LO": bool, "HAS_HI": bool}`` (an unbounded side
        passes 0).
    """
    lo, hi = band.lo, band.hi
    return {"band_lo": 0 if lo is None else min(lo, S), "band_hi": 0 if hi is None else max(hi, -L),
            "HAS_LO": lo is not None, "HAS_HI": hi is not None}


def spans(*tensors) -> list:
    """``(rows, row_stride, cols, col_stride)`` of each (B, H, rows, cols) tensor, for ``needs_int64``."""
    return [(t.shape[2], t.stride(2), t.shape[3], t.stride(3)) for t in tensors]


def key_mask_args(key_mask, dummy):
    """The key mask as the kernels read it: int8 (B, S), 1 = present, and its strides; ``dummy`` and (0, 0) without one."""
    if key_mask is None:
        return dummy, (0, 0)  # never read (HAS_KPM=False)
    kpm = key_mask.to(torch.int8)  # (B,S), 1 = key present
    return kpm, kpm.stride()


def scale_args(qk_scale: tuple) -> dict:
    """``qk_scale`` (scale·log2(e), or scale alone when that overflows float32) and ``SPLIT_SCALE`` from the base-2 factors."""
    a, b = qk_scale
    return {"qk_scale": a, "SPLIT_SCALE": b != 1.0}


def block_args(cfg: dict) -> dict:
    """A configuration's launch keywords: BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV, num_warps, num_stages."""
    return {name: cfg[name] for name in ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_DV", "num_warps", "num_stages")}


__all__ = ["block_args", "key_mask_args", "scale_args", "spans", "next_pow2", "band_args", "candidate_configs", "decode_configs", "default_config", "grid_chunks", "needs_int64", "MAX_HEAD_DIM",
           "MAX_GRID_Y", "SMEM_BUDGET", "SMEM_BUDGET_PRE_SM80", "INTERPRET_BLOCK"]
