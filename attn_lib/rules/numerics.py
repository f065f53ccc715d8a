"""第 3–13 章共用（书中不单独讲）：数值规则只写在这一处——工作精度、默认缩放、float32 的上界和溢出的报错、点积精度。

Every attention path (reference, numpy twin, SDPA fast path, tiled torch, Triton) takes these
rules from here, so that a reader who learns one rule in one chapter finds it true everywhere:

- the working dtype: float64 stays float64, everything else computes in float32;
- the default scale ``1 / sqrt(D)``;
- overflow: a row that sees at least one key but whose scores (or log-sum-exp) are not
  finite overflowed and raises ``overflow_error`` (one message, naming the direction: +inf,
  or -inf when every visible score fell to -inf); a row that sees no key gives zeros;
- the dot precision: fp32 dots are IEEE, not TF32; ``DOT_FP32`` (every ``tl.dot`` in fp32)
  under Triton's interpreter and for bfloat16 before sm_80.
"""
from __future__ import annotations

import math
from typing import Any

OVERFLOW_MESSAGE = "attention scores overflowed"  # every overflow error starts so
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


def projection_dtype(dtype, device):
    """层的投影实际产出的精度：torch.autocast 对这个设备开着时是它的精度（float64 参数不受 autocast 影响），否则就是参数的精度。

    Args:
        dtype: the layer's parameter dtype (a torch dtype).
        device: the input's device.
    """
    import torch

    kind = torch.device(device).type
    if dtype != torch.float64 and _autocast_on(kind):
        return torch.get_autocast_dtype(kind)
    return dtype


def _autocast_on(kind: str) -> bool:
    """这个设备类型上 torch.autocast 是否开着（autocast 不认识的设备类型，如 meta，算没开）。"""
    import torch

    try:
        return bool(torch.is_autocast_enabled(kind))
    except RuntimeError:  # a device type autocast does not know (e.g. meta)
        return False


def autocast_off(device):
    """关掉这个设备上的 torch.autocast（没开时什么也不做）：注意力内核自己管精度（见 work_dtype），不让 autocast 改写它的矩阵乘法。

    Returns:
        A context manager.
    """
    import contextlib

    import torch

    kind = torch.device(device).type
    return torch.autocast(kind, enabled=False) if _autocast_on(kind) else contextlib.nullcontext()


def resolve_scale(scale: float | None, D: int) -> float:
    """缩放系数：None 时取默认的 1/sqrt(D)，否则原样返回（调用方已经检查过它）。"""
    return 1.0 / math.sqrt(D) if scale is None else float(scale)


def base2_factor(scale: float, dtype) -> tuple[float, float]:
    """以 2 为底算评分时乘的两个因子 (a, b)：评分 = (q·k)·a·b，a·b = scale·log2(e)。

    Normally ``(scale·log2(e), 1.0)``: one multiplication. When ``scale·log2(e)`` would not
    fit the working dtype (``scale`` near float32's largest number) the product is split,
    ``(scale, log2(e))``, so that a valid score never overflows on the way.
    """
    folded = scale * LOG2E
    fits = folded <= FLOAT32_MAX or str(dtype).endswith("float64")
    return (folded, 1.0) if fits else (scale, LOG2E)


def overflow_error(dtype: Any, to: str = "+inf") -> ValueError:
    """评分溢出时所有路径共用的报错（消息开头固定，见 OVERFLOW_MESSAGE），并说出溢出的方向。

    Args:
        dtype: the working dtype in which the scores overflowed (torch or numpy).
        to: ``"+inf"``, ``"-inf"`` (every visible score of a row fell to -inf) or ``"±inf"``
            (the direction is not known, e.g. from a nan output).

    Returns:
        The ``ValueError`` to raise.
    """
    name = str(dtype).replace("torch.", "")
    return ValueError(
        f"{OVERFLOW_MESSAGE} to {to} (|scale·q·k| exceeds the range of {name}); "
        "compute in float64 or use a smaller scale"
    )


def dot_fp32(dtype, capability, interpret: bool) -> bool:
    """Triton 的 DOT_FP32：解释器里（它的 bf16 tl.dot 不对）和 sm_80 之前 GPU 上的 bfloat16，每个 tl.dot 改用 fp32。"""
    import torch

    return bool(interpret) or (dtype == torch.bfloat16 and capability is not None and tuple(capability) < (8, 0))


def dot_input_precision(dtype, dot_fp32_on: bool):
    """tl.dot 的 input_precision：fp32 点积（含 DOT_FP32）用 "ieee"（GPU 默认是 TF32）；其余 None。"""
    import torch

    return "ieee" if dtype == torch.float32 or dot_fp32_on else None


__all__ = ["OVERFLOW_MESSAGE", "LOG2E", "LN2", "FLOAT32_MAX", "work_dtype", "projection_dtype", "autocast_off", "resolve_scale", "base2_factor",
           "overflow_error", "dot_fp32", "dot_input_precision"]
