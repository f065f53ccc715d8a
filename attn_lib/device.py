"""第 8、11 章(设备):设备选择只在这一处:有 GPU 用 GPU,没有就用 CPU;导入本模块不会触碰 CUDA。

Set ``ATTN_LIB_DEVICE=cpu`` (or ``cuda``, ``cuda:1``) to override the choice everywhere.
"""
from __future__ import annotations

import os

ENV_VAR = "ATTN_LIB_DEVICE"


def cuda_available() -> bool:
    """本机是否有可用的 CUDA GPU(只查询,不初始化 CUDA 上下文)。"""
    import torch

    return bool(torch.cuda.is_available())


def try_gpu(index: int = 0):
    """有第 ``index`` 块 GPU 就返回它,否则返回 CPU;环境变量 ATTN_LIB_DEVICE 优先。

    Args:
        index: which CUDA device to prefer.

    Returns:
        ``torch.device``.
    """
    import torch

    forced = os.environ.get(ENV_VAR)
    if forced:
        try:
            return torch.device(forced)
        except RuntimeError:
            raise ValueError(
                f"{ENV_VAR}={forced!r} is not a torch device; use e.g. 'cpu', 'cuda' or 'cuda:1', or unset it"
            ) from None
    if cuda_available() and index < torch.cuda.device_count():
        return torch.device(f"cuda:{index}")
    return torch.device("cpu")


def default_device():
    """全书默认设备:等同于 ``try_gpu()``。"""
    return try_gpu()

