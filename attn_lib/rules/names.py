"""第 5–13 章共用（书中不单独讲）：检查和各条路径共用的名字与上限，只写在这一处。

A leaf: it imports nothing of attn_lib, so the check package (``attn_lib.checks``) and every
path that needs one of these names can import it without a circle.
"""
from __future__ import annotations

import importlib.util

BACKENDS = ("auto", "reference", "sdpa", "torch", "triton")  # what a layer's `backend` takes
FLASH_BACKENDS = ("auto", "torch", "triton")  # what flash_attention's and flash_decoding's `backend` take
ALIGNMENTS = ("top-left", "bottom-right")  # `align`: where is_causal and window_size put query 0 when L != S
NO_WINDOW = (-1, -1)  # window_size meaning "no window" (flash-attn's default)
MAX_HEAD_DIM = 256  # the Triton kernels' largest head dim (BLOCK_D <= 256)
MAX_DECODE_QUERIES = 16  # more new queries than this are a prefill: the forward paths parallelise over queries
DEVICE_ENV = "ATTN_LIB_DEVICE"  # overrides the device choice everywhere (attn_lib.device)
TRITON_ENV = "TRITON_INTERPRET"  # Triton's own switch between compiled kernels and its interpreter



def triton_available() -> bool:
    """本机能否导入 Triton（只查找，不导入）：每条 Triton 路径和自动选后端都问这一句。"""
    return importlib.util.find_spec("triton") is not None


__all__ = ["triton_available", "BACKENDS", "FLASH_BACKENDS", "ALIGNMENTS", "NO_WINDOW", "MAX_HEAD_DIM", "MAX_DECODE_QUERIES",
           "DEVICE_ENV", "TRITON_ENV"]
