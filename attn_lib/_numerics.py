"""第 3–9 章共用（书中不单独讲）：数值规则只写在这一处——工作精度、默认缩放、溢出的界和报错、点积精度。

Every attention path (reference, numpy twin, SDPA fast path, tiled torch, Triton) takes these
rules from here, so that a reader who learns one rule in one chapter finds it true everywhere:

- the working dtype: float64 stays float64, everything else computes in float32;
- the default scale ``1 / sqrt(D)``;
- a score that overflows the working dtype raises ``overflow_error`` (one message);
- fp32 dots are IEEE, not TF32 (``dot_input_precision``).
"""
from __future__ import annotations

import math
from typing import Any

OVERFLOW_MESSAGE = "attention scores overflowed to +inf"


def work_dtype(dtype):
    """工作精度：float64 保持 float64，其余（float32、float16、bfloat16）一律用 float32 计算。"""
    import torch

    return torch.float64 if dtype == torch.float64 else torch.float32


def resolve_scale(scale: float | None, D: int) -> float:
    """缩放系数：None 时取默认的 1/sqrt(D)，否则原样返回（调用方已经检查过它）。"""
    return 1.0 / math.sqrt(D) if scale is None else float(scale)


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


__all__ = ["OVERFLOW_MESSAGE", "work_dtype", "resolve_scale", "overflow_error"]
