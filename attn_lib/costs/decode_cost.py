"""第 13 章（让模型写字）：一次解码步读多少字节、做多少次浮点运算，和 GPU 的平衡点比一比。

A decode step attends L new queries (1 for plain generation) to the S cached keys of every
key/value head. Counted per step, for batch B, H query heads, H_kv key/value heads, head
dim D (values Dv), ``bytes_per_value`` bytes a number (2 for fp16 / bf16):

- FLOPs: ``2 * B * H * L * S * (D + Dv)``: the scores ``q k^T`` (one multiply and one add per
  product term, as the datasheets count) and the weighted sum ``p v``; the softmax adds O(S)
  per row and is left out. For L > 1 (a chunked step) every query is counted against all S
  keys, an upper bound: the causal mask hides a triangle of at most L * L pairs.
- bytes: the cache ``B * H_kv * S * (D + Dv)`` numbers, read once per key/value head when the
  query heads of a group share the pass (``kv_read_per="kv_head"``, the grouped layout), or
  once per query head (``kv_read_per="query_head"``: a kernel that walks the cache for every
  query head, as torch SDPA's CPU kernel appears to do for enable_gqa: inferred from timings in
  chapter 13, not from its C++ source); plus q read and the output written.

The ratio FLOPs / bytes is the step's arithmetic intensity. A GPU's balance point is its peak
FLOP/s over its memory bandwidth (bytes/s): below it a kernel waits on memory (memory-bound),
above it on arithmetic. A prefill (N queries at once, ``prefill_cost``) reads K/V once per block
of ``block_m`` queries, so its intensity grows with the block and the group size.

Device figures (dense fp16 / bf16 tensor-core peak, memory bandwidth), from NVIDIA's pages:

- T4: "Mixed Precision (FP16/FP32) 65 FP16 TFLOPS", "GPU Memory 16 GB GDDR6, 300 GB/sec",
  https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf
  (Turing has no structured sparsity: the figure is dense).
- A100 SXM 80GB: "BFLOAT16 Tensor Core 312 TFLOPS | 624 TFLOPS*" (* with sparsity), "GPU Memory
  Bandwidth 2,039 GB/s" (80GB SXM),
  https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf ;
  108 SMs (FlashAttention paper, section 2.1, as in chapter 08).
- H100 SXM: "FP16 Tensor Core 1,979 teraFLOPS" and "BFLOAT16 Tensor Core 1,979 teraFLOPS", both
  marked "with sparsity" (dense is half: 989.5), "GPU memory bandwidth 3.35TB/s",
  https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet ; 132 SMs
  ("The H100 SXM5 GPU has 132 SMs"), https://developer.nvidia.com/blog/nvidia-hopper-architecture-in-depth/
- H200 SXM: "BFLOAT16 Tensor Core 1,979 TFLOPS" and "FP16 Tensor Core 1,979 TFLOPS" with
  sparsity (dense 989.5), "GPU Memory Bandwidth 4.8TB/s", https://www.nvidia.com/en-us/data-center/h200/

TB/s and TFLOP/s are decimal (10^12). These are peaks; measured kernels reach a fraction of them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..checks import check_choice, check_positive_int

FP16_BYTES = 2  # bytes per value in fp16 / bf16
KV_READ_PER = ("kv_head", "query_head")


@dataclass(frozen=True)
class GpuSpec:
    """一块 GPU 的两个峰值：稠密 fp16/bf16 张量核心算力（TFLOP/s）和显存带宽（TB/s），附出处。

    Attributes:
        name: the product, as the datasheet names it.
        peak_tflops: dense fp16 / bf16 tensor-core peak, 10^12 FLOP/s.
        bandwidth_tb_s: memory bandwidth, 10^12 bytes/s.
        num_sms: streaming multiprocessors (None where the cited pages do not give them).
        source: the URL the figures come from.
    """

    name: str
    peak_tflops: float
    bandwidth_tb_s: float
    num_sms: int | None
    source: str

    @property
    def balance_point(self) -> float:
        """平衡点：峰值算力 ÷ 显存带宽，单位 FLOP/字节；算术强度低于它的核函数受限于读显存。"""
        return self.peak_tflops / self.bandwidth_tb_s


GPUS = {
    "T4": GpuSpec("T4", 65.0, 0.300, None,
                  "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
                  "t4-tensor-core-datasheet-951643.pdf"),
    "A100 SXM 80GB": GpuSpec("A100 SXM 80GB", 312.0, 2.039, 108,
                             "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                             "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    "H100 SXM": GpuSpec("H100 SXM", 1979 / 2, 3.35, 132,
                        "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"),
    "H200 SXM": GpuSpec("H200 SXM", 1979 / 2, 4.8, None, "https://www.nvidia.com/en-us/data-center/h200/"),
}


@dataclass(frozen=True)
class StepCost:
    """一次注意力计算的账：浮点运算次数，以及读 K/V、读 q、写输出各多少字节。"""

    flops: int
    kv_bytes: int
    q_bytes: int
    out_bytes: int

    @property
    def bytes(self) -> int:
        """读写显存的字节数合计。"""
        return self.kv_bytes + self.q_bytes + self.out_bytes

    @property
    def intensity(self) -> float:
        """算术强度：每读写一个字节做几次浮点运算（FLOP/字节）。"""
        return self.flops / self.bytes

    def seconds(self, gpu: GpuSpec) -> tuple[float, float]:
        """在 gpu 的峰值下的两个下限：（只算读写显存要几秒，只算浮点运算要几秒）；实际至少是较大的那个。"""
        if not isinstance(gpu, GpuSpec):
            raise TypeError(f"gpu must be a GpuSpec, got {type(gpu).__name__}; take one from "
                            "attn_lib.costs.decode_cost.GPUS, e.g. GPUS['H100 SXM']")
        return self.bytes / (gpu.bandwidth_tb_s * 1e12), self.flops / (gpu.peak_tflops * 1e12)


def _sizes(batch, num_heads, num_kv_heads, seqlen, head_dim, head_dim_v, bytes_per_value):
    B, H, H_kv, S, D = (check_positive_int(n, v) for n, v in (
        ("batch", batch), ("num_heads", num_heads), ("num_kv_heads", num_kv_heads), ("seqlen", seqlen),
        ("head_dim", head_dim)))
    Dv = D if head_dim_v is None else check_positive_int("head_dim_v", head_dim_v)
    if H % H_kv:
        raise ValueError(f"num_kv_heads must divide num_heads={H}, got {H_kv}; "
                         f"use one of {[d for d in range(1, H + 1) if H % d == 0]}")
    return B, H, H_kv, S, D, Dv, check_positive_int("bytes_per_value", bytes_per_value)


def decode_step_cost(batch: int, num_heads: int, num_kv_heads: int, seqlen: int, head_dim: int, *,
                     q_len: int = 1, head_dim_v: int | None = None, bytes_per_value: int = FP16_BYTES,
                     kv_read_per: str = "kv_head") -> StepCost:
    """一次解码步（L 个新查询对缓存里的 S 个键）的浮点运算和读写字节数。

    Args:
        batch, num_heads, num_kv_heads: B, H and H_kv (H_kv divides H).
        seqlen: S, the cached keys each query attends to.
        head_dim, head_dim_v: D and Dv (Dv = D by default).
        q_len: L, the new queries of the step (1 for plain generation).
        bytes_per_value: 2 for fp16 / bf16, 4 for fp32.
        kv_read_per: ``"kv_head"`` (each cached head read once a step, the grouped layout) or
            ``"query_head"`` (read once per query head).

    Returns:
        A ``StepCost``: flops ``2*B*H*L*S*(D+Dv)``, kv_bytes ``B*R*S*(D+Dv)*bytes`` with R = H_kv
        or H, q_bytes ``B*H*L*D*bytes``, out_bytes ``B*H*L*Dv*bytes``.
    """
    B, H, H_kv, S, D, Dv, nbytes = _sizes(batch, num_heads, num_kv_heads, seqlen, head_dim, head_dim_v,
                                          bytes_per_value)
    L = check_positive_int("q_len", q_len)
    reads = H_kv if check_choice("kv_read_per", kv_read_per, KV_READ_PER) == "kv_head" else H
    return StepCost(flops=2 * B * H * L * S * (D + Dv), kv_bytes=B * reads * S * (D + Dv) * nbytes,
                    q_bytes=B * H * L * D * nbytes, out_bytes=B * H * L * Dv * nbytes)


def prefill_cost(batch: int, num_heads: int, num_kv_heads: int, seqlen: int, head_dim: int, *,
                 head_dim_v: int | None = None, bytes_per_value: int = FP16_BYTES, is_causal: bool = True,
                 block_m: int = 128) -> StepCost:
    """预填充（一次读入 N 个位置，N 个查询对 N 个键）的浮点运算和读写字节数，按分块算法记账。

    Args:
        batch, num_heads, num_kv_heads, head_dim, head_dim_v, bytes_per_value: as ``decode_step_cost``.
        seqlen: N, the prompt's positions (queries and keys).
        is_causal: count only the pairs the causal mask keeps (query i sees keys 0 .. i).
        block_m: queries per block; a block's group of query heads reads each key/value it needs
            once (the tiled kernel of chapter 08 with the grouped layout of chapter 12), q is read
            and the output written once.

    Returns:
        A ``StepCost``: flops ``2*B*H*pairs*(D+Dv)`` with pairs = N(N+1)/2 causal, N*N otherwise;
        kv_bytes ``B*H_kv*(D+Dv)*bytes`` times the keys summed over the query blocks.
    """
    B, H, H_kv, N, D, Dv, nbytes = _sizes(batch, num_heads, num_kv_heads, seqlen, head_dim, head_dim_v,
                                          bytes_per_value)
    block_m = check_positive_int("block_m", block_m)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be True or False, got {is_causal!r}")
    pairs = N * (N + 1) // 2 if is_causal else N * N
    blocks = math.ceil(N / block_m)
    keys_read = sum(min((m + 1) * block_m, N) for m in range(blocks)) if is_causal else blocks * N
    return StepCost(flops=2 * B * H * pairs * (D + Dv), kv_bytes=B * H_kv * keys_read * (D + Dv) * nbytes,
                    q_bytes=B * H * N * D * nbytes, out_bytes=B * H * N * Dv * nbytes)


__all__ = ["FP16_BYTES", "GPUS", "GpuSpec", "StepCost", "decode_step_cost", "prefill_cost"]
