"""第 8、9 章（Triton 路径的两个公开入口与核函数的导入规则）：flash_attention_triton、flash_attention_triton_backward；本模块不导入 Triton。

``flash_attention_triton`` and ``flash_attention_triton_backward`` check their inputs once
(``attn_lib.checks.doors``) and run the launcher of ``forward.py`` / ``backward.py`` beside this
file, each of which holds its kernels, its launcher and its grid. ``triton_forward`` and
``triton_backward`` are the unchecked cores that ``attn_lib.flash.autograd`` calls below its
own door. Whether Triton compiles GPU kernels or runs its interpreter (on CPU tensors, without
a GPU) is decided once per process by ``attn_lib.device.triton_interprets()``, before a kernel
file is imported (``load_kernels``); nothing here changes ``TRITON_INTERPRET`` per call.
Importing attn_lib imports neither Triton nor CUDA.
"""
from __future__ import annotations

import importlib

import torch

from ... import device
from ...checks.doors import check_triton_backward_call, check_triton_call
from ...rules.names import NO_WINDOW
from ...rules.numerics import autocast_off, dot_fp32, dot_input_precision
from ...rules.settings import AttentionSettings, Options, raise_if_overflowed

KERNEL_FILES = ("forward", "backward", "decode")


def load_kernels(name: str = "forward"):
    """导入一个 Triton 核函数文件（forward、backward 或 decode，连同它的启动器；第一次调用时导入，之后是同一个模块）。

    Before the import, ``attn_lib.device.triton_interprets()`` fixes the process's Triton
    mode: without a CUDA device it sets ``TRITON_INTERPRET=1`` so that ``@triton.jit`` builds
    interpreted kernels that run on CPU tensors.

    Raises:
        ImportError: triton is not installed (the doors say so before anything runs).
        RuntimeError: Triton was already imported in compiled mode on a machine without a GPU.
    """
    device.triton_interprets()
    return importlib.import_module(f"{__package__}.{name}")


def kernel_flags(dtype: torch.dtype, where, interpret: bool, *, capability: tuple | None = None) -> dict:
    """核函数的精度开关：DOT_FP32（每个 tl.dot 改用 fp32 计算）和 GPU 的计算能力（规则见 attn_lib.rules.numerics）。

    Args:
        where: the tensors' device (its compute capability is asked for when compiling).
        capability: the GPU's (major, minor) instead of asking ``where`` (``bench/gpu.py
            --compile-only`` builds for a GPU this machine does not have); ignored when interpreting.

    Returns:
        ``{"dot_fp32": bool, "input_precision": "ieee" or None, "capability": (major, minor) or None}``
        (capability None under the interpreter).
    """
    if interpret:
        capability = None
    elif capability is None:
        capability = device.cuda_capability(where)
    fp32 = dot_fp32(dtype, capability, interpret)
    return {"dot_fp32": fp32, "input_precision": dot_input_precision(dtype, fp32), "capability": capability}


def launch_target(q, target=None) -> dict:
    """The machine a launch is for: this process's Triton mode and q's GPU, or ``target = (interpret, capability)``."""
    interpret, capability = (device.triton_interprets(), None) if target is None else target
    return {"interpret": interpret, **kernel_flags(q.dtype, q.device, interpret, capability=capability)}


def triton_forward(q, k, v, settings: AttentionSettings):
    """无检查的 Triton 前向（调用方已检查）：返回 (out (B,H,L,Dv), lse (B,H,L))，不查溢出；k、v 可以只有 H_kv 个头。"""
    return load_kernels("forward").launch(q, k, v, settings)


def triton_backward(q, k, v, saved, settings: AttentionSettings):
    """无检查的 Triton 反向：saved = (out, lse, dout)；返回 (dq, dk, dv)，dk、dv 有 k、v 的 H_kv 个头（组内求和）。"""
    return load_kernels("backward").launch(q, k, v, saved, settings)


def flash_attention_triton(q, k, v, *, is_causal: bool = False, scale: float | None = None, key_mask=None,
                           block_m: int | None = None, block_n: int | None = None, check_finite: bool = True,
                           window_size=NO_WINDOW, enable_gqa: bool = False, align: str = "top-left"):
    """用 Triton 核函数算 FlashAttention 前向；没有 GPU 时走 Triton 解释器。返回 (out, lse)。

    Args:
        q, k, v: (B, H, L, D), (B, H_kv, S, D), (B, H_kv, S, Dv); float16, bfloat16 or float32;
            any strides. Head dims up to 256. On CUDA tensors when Triton compiles; on CPU
            tensors under the interpreter (see ``attn_lib.device.triton_interprets``).
        is_causal, scale, key_mask, check_finite, enable_gqa, window_size, align: as in
            ``flash_attention`` (H_kv != H needs ``enable_gqa=True``; query head h reads key/value
            head h // (H // H_kv) in place, K and V are never repeated).
        block_m, block_n: override the kernel's BLOCK_M / BLOCK_N (powers of two >= 16).

    Returns:
        ``(out, lse)``: out (B, H, L, Dv) in q's dtype; lse (B, H, L) float32, natural log,
        ``-inf`` for a query that sees no key.

    Raises:
        ValueError: a score overflowed in float32 (checked once, on lse, unless ``check_finite``
            is False); q, k or v requires grad while grad mode is on (this function has no
            autograd: ``flash_attention`` has).
    """
    options = Options(is_causal=is_causal, scale=scale, window_size=window_size, align=align, enable_gqa=enable_gqa,
                      check_finite=check_finite, key_mask=key_mask, block_m=block_m, block_n=block_n)
    settings = check_triton_call(q, k, v, options, device.triton_interprets)
    with autocast_off(q.device):
        out, lse = triton_forward(q, k, v, settings)  # (B,H,L,Dv), (B,H,L)
    if settings.check_overflow:
        raise_if_overflowed(lse, q.shape[2], k.shape[2], settings)
    return out, lse


def flash_attention_triton_backward(q, k, v, out, lse, dout, *, is_causal: bool = False, scale: float | None = None,
                                    key_mask=None, block_m: int | None = None, block_n: int | None = None,
                                    check_finite: bool = True, window_size=NO_WINDOW, enable_gqa: bool = False,
                                    align: str = "top-left"):
    """用 Triton 核函数算 FlashAttention 的反向（FlashAttention-2）：由 dout 求 dq, dk, dv，不存 L×S 矩阵。

    Recomputes ``P_ij = exp(S_ij − lse_i)`` block by block from the saved log-sum-exp, with
    ``D_i = rowsum(dO_i ∘ O_i)``, ``dS_ij = P_ij ∘ (dP_ij − D_i)`` (see
    ``attn_lib/flash/triton/backward.py``). A query that sees no key gets zero gradients. With
    GQA, dk and dv of a key/value head sum over the query heads that share it (in the kernel).

    Args:
        q, k, v: the forward's inputs, (B, H, L, D), (B, H_kv, S, D), (B, H_kv, S, Dv).
        out: the forward's output (B, H, L, Dv), q's dtype.
        lse: the forward's log-sum-exp (B, H, L) float32, natural log, -inf for rows with no key.
        dout: gradient of the loss with respect to ``out``, (B, H, L, Dv), q's dtype.
        is_causal, scale, key_mask, check_finite, window_size, enable_gqa, align: as in the
            forward call (check_finite: scan q, k, v for nan / inf).
        block_m, block_n: override BLOCK_M (query blocks) / BLOCK_N (key blocks), powers of two >= 16.

    Returns:
        ``(dq, dk, dv)`` with the shapes and dtype of q, k, v (dk, dv: H_kv heads).
    """
    options = Options(is_causal=is_causal, scale=scale, window_size=window_size, align=align, enable_gqa=enable_gqa,
                      check_finite=check_finite, key_mask=key_mask, block_m=block_m, block_n=block_n)
    settings = check_triton_backward_call(q, k, v, (out, lse, dout), options, device.triton_interprets)
    with autocast_off(q.device):
        return triton_backward(q, k, v, (out, lse, dout), settings)


__all__ = ["flash_attention_triton", "flash_attention_triton_backward", "load_kernels", "kernel_flags",
           "launch_target", "triton_forward", "triton_backward", "KERNEL_FILES"]
