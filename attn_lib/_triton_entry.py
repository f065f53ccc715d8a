"""第 8、9 章（书中不单独讲）：Triton 路径的两个公开入口（前向、反向）和导入核函数的规则；本模块不导入 Triton。

``flash_attention_triton`` and ``flash_attention_triton_backward`` check their inputs once and
call the launchers (``attn_lib._triton_launch``) through ``load_kernel()``. Whether Triton
compiles GPU kernels or runs its interpreter (on CPU tensors, without a GPU) is decided once
per process by ``attn_lib.device.triton_interprets()``, before the kernels are imported;
nothing here changes ``TRITON_INTERPRET`` per call. Importing attn_lib imports neither Triton
nor CUDA.
"""
from __future__ import annotations

import importlib
import importlib.util

import torch

from . import device as _device
from ._numerics import dot_fp32, dot_input_precision, raise_if_overflowed, resolve_scale
from ._validate import (check_attention_inputs, check_block, check_bool, check_key_padding_mask, check_no_grad_needed,
                        check_saved, check_triton_device, check_triton_inputs)


def triton_available() -> bool:
    """本机能否导入 Triton（只查找，不导入）。"""
    return importlib.util.find_spec("triton") is not None


def load_kernel():
    """导入 Triton 核函数和它们的启动器 attn_lib._triton_launch（第一次调用时导入；之后返回同一个模块）。

    Before the import, ``attn_lib.device.triton_interprets()`` fixes the process's Triton
    mode: without a CUDA device it sets ``TRITON_INTERPRET=1`` so that ``@triton.jit`` builds
    interpreted kernels that run on CPU tensors.

    Raises:
        ImportError: triton is not installed.
        RuntimeError: Triton was already imported in compiled mode on a machine without a GPU.
    """
    if not triton_available():
        raise ImportError("backend='triton' needs the triton package (pip install triton); use backend='torch'")
    _device.triton_interprets()
    return importlib.import_module("attn_lib._triton_launch")


def kernel_flags(dtype: torch.dtype, device, interpret: bool) -> dict:
    """核函数的精度开关：DOT_FP32（每个 tl.dot 改用 fp32 计算）和 GPU 的计算能力（规则见 attn_lib._numerics）。

    Returns:
        ``{"dot_fp32": bool, "input_precision": "ieee" or None, "capability": (major, minor) or None}``
        (capability None under the interpreter).
    """
    capability = None if interpret else _device.cuda_capability(device)
    fp32 = dot_fp32(dtype, capability, interpret)
    return {"dot_fp32": fp32, "input_precision": dot_input_precision(dtype, fp32), "capability": capability}


def triton_mode_for(q) -> bool:
    """这个进程里 Triton 是否走解释器；拒绝它跑不了的张量（编译模式下的 CPU 张量）。"""
    interpret = _device.triton_interprets()
    check_triton_device(q, interpret)
    return interpret


def check_triton_door(q, k, v, scale, is_causal, key_padding_mask, block_m=None, block_n=None, *, check_finite=True):
    """Triton 入口的全部检查（一次）：返回（(B, H, L, S, D, Dv)，解析后的 scale，是否解释器）。"""
    dims, scale = check_attention_inputs(q, k, v, None, scale, check_finite=check_finite)
    check_triton_inputs(q, k, v)
    check_bool("is_causal", is_causal)
    check_key_padding_mask(key_padding_mask, dims[0], dims[3], q.device)
    check_block("block_m", block_m, power_of_two=True)
    check_block("block_n", block_n, power_of_two=True)
    return dims, resolve_scale(scale, dims[4]), triton_mode_for(q)


def flash_attention_triton(q, k, v, *, is_causal: bool = False, scale: float | None = None, key_padding_mask=None,
                           block_m: int | None = None, block_n: int | None = None):
    """用 Triton 核函数算 FlashAttention 前向；没有 GPU 时走 Triton 解释器。返回 (out, lse)。

    Args:
        q, k, v: (B, H, L, D), (B, H, S, D), (B, H, S, Dv); float16, bfloat16 or float32;
            any strides. Head dims up to 256. On CUDA tensors when Triton compiles; on CPU
            tensors under the interpreter (see ``attn_lib.device.triton_interprets``).
        is_causal, scale, key_padding_mask: as in ``flash_attention``.
        block_m, block_n: override the kernel's BLOCK_M / BLOCK_N (powers of two >= 16).

    Returns:
        ``(out, lse)``: out (B, H, L, Dv) in q's dtype; lse (B, H, L) float32, natural log,
        ``-inf`` for a query that sees no key.

    Raises:
        ValueError: a score overflowed in float32 (checked once, on lse); q, k or v requires
            grad while grad mode is on (this function has no autograd: ``flash_attention`` has).
    """
    (B, H, L, S, D, Dv), scale, interpret = check_triton_door(q, k, v, scale, is_causal, key_padding_mask,
                                                              block_m, block_n)
    check_no_grad_needed("flash_attention_triton", q, k, v)
    flags = kernel_flags(q.dtype, q.device, interpret)
    out, lse = load_kernel().launch(q, k, v, key_padding_mask, is_causal, scale, interpret=interpret,
                                    dot_fp32=flags["dot_fp32"], capability=flags["capability"], block_m=block_m,
                                    block_n=block_n)
    raise_if_overflowed(lse, L, S, key_padding_mask, is_causal, 0, q.dtype)
    return out, lse


def flash_attention_triton_backward(q, k, v, out, lse, dout, *, is_causal: bool = False, scale: float | None = None,
                                    key_padding_mask=None, block_m: int | None = None, block_n: int | None = None):
    """用 Triton 核函数算 FlashAttention 的反向（FlashAttention-2）：由 dout 求 dq, dk, dv，不存 L×S 矩阵。

    Recomputes ``P_ij = exp(S_ij − lse_i)`` block by block from the saved log-sum-exp, with
    ``D_i = rowsum(dO_i ∘ O_i)``, ``dS_ij = P_ij ∘ (dP_ij − D_i)`` (see
    attn_lib/flash_triton_backward.py). A query that sees no key gets zero gradients.

    Args:
        q, k, v: the forward's inputs, (B, H, L, D), (B, H, S, D), (B, H, S, Dv).
        out: the forward's output (B, H, L, Dv), q's dtype.
        lse: the forward's log-sum-exp (B, H, L) float32, natural log, -inf for rows with no key.
        dout: gradient of the loss with respect to ``out``, (B, H, L, Dv), q's dtype.
        is_causal, scale, key_padding_mask: as in the forward call.
        block_m, block_n: override BLOCK_M (query blocks) / BLOCK_N (key blocks), powers of two >= 16.

    Returns:
        ``(dq, dk, dv)`` with the shapes and dtype of q, k, v.
    """
    (B, H, L, S, D, Dv), scale, interpret = check_triton_door(q, k, v, scale, is_causal, key_padding_mask,
                                                              block_m, block_n)
    check_saved(q, out, lse, dout, B, H, L, Dv, forward="flash_attention_triton", same_dtype=True)
    flags = kernel_flags(q.dtype, q.device, interpret)
    return load_kernel().launch_backward(q, k, v, out, lse, dout, key_padding_mask, is_causal, scale,
                                         interpret=interpret, dot_fp32=flags["dot_fp32"],
                                         capability=flags["capability"], block_m=block_m, block_n=block_n)


__all__ = ["flash_attention_triton", "flash_attention_triton_backward", "load_kernel", "kernel_flags",
           "triton_available"]
