"""第 3–9 章共用（书中不单独讲）：数值规则只写在这一处——工作精度、默认缩放、溢出的界和报错、点积精度。

Every attention path (reference, numpy twin, SDPA fast path, tiled torch, Triton) takes these
rules from here, so that a reader who learns one rule in one chapter finds it true everywhere:

- the working dtype: float64 stays float64, everything else computes in float32;
- the default scale ``1 / sqrt(D)``;
- overflow: a row that sees at least one key but whose scores (or log-sum-exp) are not
  finite overflowed and raises ``overflow_error`` (one message); a row that sees no key
  gives zeros;
- the dot precision: fp32 dots are IEEE, not TF32; ``DOT_FP32`` (every ``tl.dot`` in fp32)
  under Triton's interpreter and for bfloat16 before sm_80.
"""
from __future__ import annotations

import math
from typing import Any

OVERFLOW_MESSAGE = "attention scores overflowed to +inf"
LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2): natural log = log2 * LN2
FLOAT32_MAX = 3.4028234663852886e38


def work_dtype(dtype):
    """工作精度：float64 保持 float64，其余（float32、float16、bfloat16）一律用 float32 计算（torch 或 numpy 的 dtype）。"""
    if hasattr(dtype, "kind"):  # a numpy dtype
        import numpy as np

        return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)
    import torch

    return torch.float64 if dtype == torch.float64 else torch.float32


def resolve_scale(scale: float | None, D: int) -> float:
    """缩放系数：None 时取默认的 1/sqrt(D)，否则原样返回（调用方已经检查过它）。"""
    return 1.0 / math.sqrt(D) if scale is None else float(scale)


def base2_factor(scale: float, dtype) -> tuple[float, float]:
    """以 2 为底算分数时乘的两个因子 (a, b)：分数 = (q·k)·a·b，a·b = scale·log2(e)。

    Normally ``(scale·log2(e), 1.0)``: one multiplication. When ``scale·log2(e)`` would not
    fit the working dtype (``scale`` near float32's largest number) the product is split,
    ``(scale, log2(e))``, so that a valid score never overflows on the way.
    """
    folded = scale * LOG2E
    fits = folded <= FLOAT32_MAX or str(dtype).endswith("float64")
    return (folded, 1.0) if fits else (scale, LOG2E)


def overflow_error(dtype: Any) -> ValueError:
    """分数溢出时所有路径共用的报错（消息开头固定，见 OVERFLOW_MESSAGE）。

    Args:
        dtype: the working dtype in which the scores overflowed (torch or numpy).

    Returns:
        The ``ValueError`` to raise.
    """
    name = str(dtype).replace("torch.", "")
    return ValueError(
        f"{OVERFLOW_MESSAGE} (|scale·q·k| exceeds the range of {name}); "
        "compute in float64 or use a smaller scale"
    )


def rows_with_keys(L: int, S: int, key_padding_mask, is_causal: bool, causal_offset: int, device, *,
                   window_size=(-1, -1)):
    """哪些查询行至少看得见一个键：（B 或 1, 1, L）布尔张量（只读掩码，不读 q、k、v）；因果规则和滑动窗口合成一条带。"""
    import torch

    from .band import band

    lo, hi = band(is_causal, window_size, causal_offset)
    i = torch.arange(L, device=device)  # (L,)
    start = torch.zeros_like(i) if lo is None else (i + lo).clamp(0, S)  # (L,) first visible key
    end = torch.full_like(i, S) if hi is None else (i + hi + 1).clamp(0, S)  # (L,) sees keys < end
    if key_padding_mask is None:
        return (end > start)[None, None, :]  # (L,) -> (1,1,L)
    present = torch.nn.functional.pad(key_padding_mask.to(torch.int32).cumsum(-1), (1, 0))  # (B,S) -> (B,S+1)
    Bm = present.shape[0]
    seen = present.gather(1, end.expand(Bm, L)) - present.gather(1, start.expand(Bm, L))  # (B,S+1) -> (B,L)
    return ((seen > 0) & (end > start))[:, None, :]  # (B,L) -> (B,1,L)


def raise_if_overflowed(lse, L: int, S: int, key_padding_mask, is_causal: bool, causal_offset: int, dtype, *,
                        window_size=(-1, -1)) -> None:
    """溢出规则（分块路径）：看得见键的行，log-sum-exp 却是 ±inf 或 nan，就是分数溢出了。

    A row that sees no key has ``lse = -inf`` and a zero output: not an overflow. One
    reduction and one host sync.

    Raises:
        ValueError: ``overflow_error(work_dtype(dtype))``.
    """
    import torch

    if lse.numel() == 0:
        return
    has_key = rows_with_keys(L, S, key_padding_mask, is_causal, causal_offset, lse.device,
                             window_size=window_size)  # (B|1,1,L)
    if bool((~torch.isfinite(lse) & has_key).any()):
        raise overflow_error(work_dtype(dtype))


def dot_fp32(dtype, capability, interpret: bool) -> bool:
    """Triton 的 DOT_FP32：解释器里（它的 bf16 tl.dot 不对）和 sm_80 之前 GPU 上的 bfloat16，每个 tl.dot 改用 fp32。"""
    import torch

    return bool(interpret) or (dtype == torch.bfloat16 and capability is not None and tuple(capability) < (8, 0))


def dot_input_precision(dtype, dot_fp32_on: bool):
    """tl.dot 的 input_precision：fp32 点积（含 DOT_FP32）用 "ieee"（GPU 默认是 TF32）；其余 None。"""
    import torch

    return "ieee" if dtype == torch.float32 or dot_fp32_on else None


__all__ = ["OVERFLOW_MESSAGE", "LOG2E", "LN2", "work_dtype", "resolve_scale", "base2_factor", "overflow_error",
           "rows_with_keys", "raise_if_overflowed", "dot_fp32", "dot_input_precision"]
