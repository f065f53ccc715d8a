"""第 8、9 章（书中不单独讲）：Triton 路径的两个公开入口（前向、反向）和导入核函数的规则；本模块不导入 Triton。

``flash_attention_triton`` and ``flash_attention_triton_backward`` check their inputs once and
call the launchers (``attn_lib.flash.triton.launch``) through ``load_kernel()``; the unchecked cores
``triton_forward_core`` / ``triton_backward_core`` are what ``attn_lib.flash.autograd`` calls below its
own door. Both take grouped-query attention (k, v with H_kv heads, ``enable_gqa``) and the
band of ``attn_lib.rules.band`` (``is_causal``, ``causal_offset``, ``window_size``). Whether Triton
compiles GPU kernels or runs its interpreter (on CPU tensors, without a GPU) is decided once
per process by ``attn_lib.device.triton_interprets()``, before the kernels are imported;
nothing here changes ``TRITON_INTERPRET`` per call. Importing attn_lib imports neither Triton
nor CUDA.
"""
from __future__ import annotations

import importlib
import importlib.util
import numbers

import torch

from ... import device as _device
from ...rules.band import NO_WINDOW
from ...rules.numerics import dot_fp32, dot_input_precision, raise_if_overflowed, resolve_scale
from ...checks import (check_attention_inputs, check_block, check_bool, check_key_padding_mask, check_no_grad_needed,
                        check_saved, check_triton_device, check_triton_inputs, check_window_size)


def triton_available() -> bool:
    """本机能否导入 Triton（只查找，不导入）。"""
    return importlib.util.find_spec("triton") is not None


def load_kernel():
    """导入 Triton 核函数和它们的启动器 attn_lib.flash.triton.launch（第一次调用时导入；之后返回同一个模块）。

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
    return importlib.import_module("attn_lib.flash.triton.launch")


def kernel_flags(dtype: torch.dtype, device, interpret: bool, *, capability: tuple | None = None) -> dict:
    """核函数的精度开关：DOT_FP32（每个 tl.dot 改用 fp32 计算）和 GPU 的计算能力（规则见 attn_lib.rules.numerics）。

    Args:
        capability: the GPU's (major, minor) instead of asking ``device`` (``bench/gpu.py
            --compile-only`` builds for a GPU this machine does not have); ignored when interpreting.

    Returns:
        ``{"dot_fp32": bool, "input_precision": "ieee" or None, "capability": (major, minor) or None}``
        (capability None under the interpreter).
    """
    if interpret:
        capability = None
    elif capability is None:
        capability = _device.cuda_capability(device)
    fp32 = dot_fp32(dtype, capability, interpret)
    return {"dot_fp32": fp32, "input_precision": dot_input_precision(dtype, fp32), "capability": capability}


def triton_mode_for(q) -> bool:
    """这个进程里 Triton 是否走解释器；拒绝它跑不了的张量（编译模式下的 CPU 张量）。"""
    interpret = _device.triton_interprets()
    check_triton_device(q, interpret)
    return interpret


def _check_offset(causal_offset) -> int:
    if isinstance(causal_offset, bool) or not isinstance(causal_offset, numbers.Integral):
        raise TypeError(f"causal_offset must be an int, got {causal_offset!r} ({type(causal_offset).__name__}); "
                        "pass 0 (top-left, as SDPA) or S - L (bottom-right, as in KV-cache decoding)")
    return int(causal_offset)


def check_triton_door(q, k, v, scale, is_causal, key_padding_mask, block_m=None, block_n=None, *, check_finite=True,
                      causal_offset=0, window_size=NO_WINDOW, enable_gqa=False):
    """Triton 入口的全部检查（一次）：返回（(B, H, L, S, D, Dv)，解析后的 scale，是否解释器）。"""
    dims, scale = check_attention_inputs(q, k, v, None, scale, check_finite=check_finite, enable_gqa=enable_gqa)
    check_triton_inputs(q, k, v)
    check_window_size(window_size, check_bool("is_causal", is_causal))
    _check_offset(causal_offset)
    check_key_padding_mask(key_padding_mask, dims[0], dims[3], q.device)
    check_block("block_m", block_m, power_of_two=True)
    check_block("block_n", block_n, power_of_two=True)
    return dims, resolve_scale(scale, dims[4]), triton_mode_for(q)


def triton_forward_core(q, k, v, *, is_causal: bool, scale: float, key_padding_mask=None, causal_offset: int = 0,
                        window_size=NO_WINDOW, block_m=None, block_n=None):
    """无检查的 Triton 前向（调用方已检查）：返回 (out (B,H,L,Dv), lse (B,H,L))，不查溢出；k、v 可以只有 H_kv 个头。"""
    interpret = _device.triton_interprets()  # decided once per process
    flags = kernel_flags(q.dtype, q.device, interpret)
    return load_kernel().launch(q, k, v, key_padding_mask, is_causal, scale, interpret=interpret,
                                dot_fp32=flags["dot_fp32"], capability=flags["capability"], block_m=block_m,
                                block_n=block_n, causal_offset=causal_offset, window_size=window_size)


def triton_backward_core(q, k, v, out, lse, dout, *, is_causal: bool, scale: float, key_padding_mask=None,
                         causal_offset: int = 0, window_size=NO_WINDOW, block_m=None, block_n=None):
    """无检查的 Triton 反向（调用方已检查）：返回 (dq, dk, dv)，dk、dv 有 k、v 的 H_kv 个头（组内求和）。"""
    interpret = _device.triton_interprets()
    flags = kernel_flags(q.dtype, q.device, interpret)
    return load_kernel().launch_backward(q, k, v, out, lse, dout, key_padding_mask, is_causal, scale,
                                         interpret=interpret, dot_fp32=flags["dot_fp32"],
                                         capability=flags["capability"], block_m=block_m, block_n=block_n,
                                         causal_offset=causal_offset, window_size=window_size)


def flash_attention_triton(q, k, v, *, is_causal: bool = False, scale: float | None = None, key_padding_mask=None,
                           block_m: int | None = None, block_n: int | None = None, check_finite: bool = True,
                           causal_offset: int = 0, window_size=NO_WINDOW, enable_gqa: bool = False):
    """用 Triton 核函数算 FlashAttention 前向；没有 GPU 时走 Triton 解释器。返回 (out, lse)。

    Args:
        q, k, v: (B, H, L, D), (B, H_kv, S, D), (B, H_kv, S, Dv); float16, bfloat16 or float32;
            any strides. Head dims up to 256. On CUDA tensors when Triton compiles; on CPU
            tensors under the interpreter (see ``attn_lib.device.triton_interprets``).
        is_causal, scale, key_padding_mask, check_finite, enable_gqa, window_size: as in
            ``flash_attention`` (H_kv != H needs ``enable_gqa=True``; query head h reads key/value
            head h // (H // H_kv) in place, K and V are never repeated).
        block_m, block_n: override the kernel's BLOCK_M / BLOCK_N (powers of two >= 16).
        causal_offset: aligns ``is_causal`` and the window: query i sees key j iff
            ``i + causal_offset - left <= j <= i + causal_offset + right`` (right = 0 with
            ``is_causal``); 0 is top-left (SDPA), ``S - L`` bottom-right (KV-cache decoding).

    Returns:
        ``(out, lse)``: out (B, H, L, Dv) in q's dtype; lse (B, H, L) float32, natural log,
        ``-inf`` for a query that sees no key.

    Raises:
        ValueError: a score overflowed in float32 (checked once, on lse, unless ``check_finite``
            is False); q, k or v requires grad while grad mode is on (this function has no
            autograd: ``flash_attention`` has).
    """
    (B, H, L, S, D, Dv), scale, _ = check_triton_door(
        q, k, v, scale, is_causal, key_padding_mask, block_m, block_n, check_finite=check_finite,
        causal_offset=causal_offset, window_size=window_size, enable_gqa=enable_gqa)
    check_no_grad_needed("flash_attention_triton", q, k, v)
    out, lse = triton_forward_core(q, k, v, is_causal=is_causal, scale=scale, key_padding_mask=key_padding_mask,
                                   causal_offset=causal_offset, window_size=window_size, block_m=block_m,
                                   block_n=block_n)
    if check_finite:
        raise_if_overflowed(lse, L, S, key_padding_mask, is_causal, int(causal_offset), q.dtype,
                            window_size=tuple(int(side) for side in window_size))
    return out, lse


def flash_attention_triton_backward(q, k, v, out, lse, dout, *, is_causal: bool = False, scale: float | None = None,
                                    key_padding_mask=None, block_m: int | None = None, block_n: int | None = None,
                                    check_finite: bool = True, causal_offset: int = 0, window_size=NO_WINDOW,
                                    enable_gqa: bool = False):
    """用 Triton 核函数算 FlashAttention 的反向（FlashAttention-2）：由 dout 求 dq, dk, dv，不存 L×S 矩阵。

    Recomputes ``P_ij = exp(S_ij − lse_i)`` block by block from the saved log-sum-exp, with
    ``D_i = rowsum(dO_i ∘ O_i)``, ``dS_ij = P_ij ∘ (dP_ij − D_i)`` (see
    attn_lib/flash/triton/backward.py). A query that sees no key gets zero gradients. With
    GQA, dk and dv of a key/value head sum over the query heads that share it (in the kernel).

    Args:
        q, k, v: the forward's inputs, (B, H, L, D), (B, H_kv, S, D), (B, H_kv, S, Dv).
        out: the forward's output (B, H, L, Dv), q's dtype.
        lse: the forward's log-sum-exp (B, H, L) float32, natural log, -inf for rows with no key.
        dout: gradient of the loss with respect to ``out``, (B, H, L, Dv), q's dtype.
        is_causal, scale, key_padding_mask, check_finite, causal_offset, window_size, enable_gqa:
            as in the forward call (check_finite: scan q, k, v for nan / inf).
        block_m, block_n: override BLOCK_M (query blocks) / BLOCK_N (key blocks), powers of two >= 16.

    Returns:
        ``(dq, dk, dv)`` with the shapes and dtype of q, k, v (dk, dv: H_kv heads).
    """
    (B, H, L, S, D, Dv), scale, _ = check_triton_door(
        q, k, v, scale, is_causal, key_padding_mask, block_m, block_n, check_finite=check_finite,
        causal_offset=causal_offset, window_size=window_size, enable_gqa=enable_gqa)
    check_saved(q, out, lse, dout, B, H, L, Dv, forward="flash_attention_triton", same_dtype=True)
    return triton_backward_core(q, k, v, out, lse, dout, is_causal=is_causal, scale=scale,
                                key_padding_mask=key_padding_mask, causal_offset=causal_offset,
                                window_size=window_size, block_m=block_m, block_n=block_n)


__all__ = ["flash_attention_triton", "flash_attention_triton_backward", "load_kernel", "kernel_flags",
           "triton_available", "triton_forward_core", "triton_backward_core"]
