"""第 8、9 章（FlashAttention 的唯一入口：第 08 章前向、第 09 章反向）：按设备在纯 torch 分块实现和 Triton 核函数之间选一个，结果与 attn_lib.attention 相同。

``flash_attention(q, k, v, causal=..., scale=..., key_padding_mask=..., backend=...)``

- ``backend="auto"``: the Triton kernel when q is on a CUDA device and Triton is importable,
  otherwise the tiled torch path (``attn_lib.flash_torch``).
- ``backend="torch"``: the tiled torch path on any device.
- ``backend="triton"``: the Triton kernels (``flash_attention_triton`` forward,
  ``flash_attention_triton_backward`` backward). Whether Triton compiles GPU kernels or runs
  its interpreter (on CPU tensors, without a GPU) is decided once per process by
  ``attn_lib.device.triton_interprets()``, before the kernel module is imported; nothing here
  changes ``TRITON_INTERPRET`` per call. Importing attn_lib imports neither Triton nor CUDA.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import numbers

import torch

from . import device as _device
from ._validate import check_bool, check_positive_int, check_qkv_shapes, check_same_dtype, check_scale
from ._numerics import overflow_error, work_dtype
from . import flash_torch as _tiles
from .flash_torch import check_key_padding_mask, flash_attention_torch
from .reference import check_attention_inputs

BACKENDS = ("auto", "torch", "triton")
OVERFLOW_MESSAGE = "attention scores overflowed to +inf"


def triton_available() -> bool:
    """本机能否导入 Triton（只查找，不导入）。"""
    return importlib.util.find_spec("triton") is not None


def load_kernel():
    """导入 Triton 核函数模块 attn_lib.flash_triton（第一次调用时导入；之后返回同一个模块）。

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
    return importlib.import_module("attn_lib.flash_triton")


def kernel_flags(dtype: torch.dtype, device, interpret: bool) -> dict:
    """核函数的精度开关：DOT_FP32（每个 tl.dot 改用 fp32 计算）和 tl.dot 的 input_precision。

    ``DOT_FP32`` is on under the interpreter (its bf16 ``tl.dot`` is wrong) and for bfloat16
    on GPUs older than sm_80 (Colab's T4 is sm_75: Triton has no bf16 ``tl.dot`` there; the
    inputs are rounded to bf16 exactly as before and multiplied in fp32). fp32 dots use
    ``"ieee"`` (the GPU default would be TF32).

    Args:
        dtype: the inputs' dtype.
        device: the inputs' device (its compute capability is read on CUDA).
        interpret: whether Triton runs its interpreter in this process.

    Returns:
        ``{"dot_fp32": bool, "input_precision": "ieee" or None, "capability": (major, minor) or None}``
        (capability None under the interpreter).
    """
    capability = None if interpret else _device.cuda_capability(device)
    dot_fp32 = bool(interpret) or (dtype == torch.bfloat16 and capability < (8, 0))
    return {"dot_fp32": dot_fp32, "input_precision": "ieee" if dtype == torch.float32 or dot_fp32 else None,
            "capability": capability}


def _triton_mode_for(q) -> bool:
    """Return whether the kernel runs interpreted; refuse tensors the process's Triton cannot run."""
    interpret = _device.triton_interprets()
    if not interpret and q.device.type != "cuda":
        raise ValueError(
            f"backend='triton' got tensors on {q.device}, but Triton in this process compiles GPU kernels "
            "(a CUDA device is present); expected CUDA tensors. Remedy: move q, k, v (and the mask) to "
            f"'cuda', use backend='torch', or start Python with {_device.TRITON_ENV}=1 to run the kernel "
            "under Triton's interpreter."
        )
    return interpret


def _check_scale_type(scale) -> None:
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
        raise TypeError(f"scale must be a positive number or None, got {scale!r}; pass a Python float, "
                        "e.g. scale=0.125 (the Triton kernels take no tensor or string scale)")


def _check_triton_common(q, causal, key_padding_mask, B, S, block_m, block_n) -> None:
    check_bool("causal", causal)
    check_key_padding_mask(key_padding_mask, B, S, q.device)
    if q.dtype == torch.float64:
        raise TypeError("the Triton kernel takes float16, bfloat16 or float32; for float64 use backend='torch' "
                        "(got q.dtype=torch.float64)")
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if value is not None and (check_positive_int(name, value) < 16 or value & (value - 1)):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.dot's smallest tile), got {value}")


def check_overflow(lse: torch.Tensor, dtype=torch.float32) -> None:
    """核函数之后检查一次：某行的 log-sum-exp 是 +inf 或 NaN，说明分数溢出（看不见任何键的行是 -inf，不算）。

    Args:
        lse: (B, H, L) log-sum-exp from the forward kernel.
        dtype: the dtype the scores were computed in (the kernel's float32 accumulator).

    Raises:
        ValueError: a scaled score overflowed to +inf.
    """
    if lse.numel() and bool((torch.isnan(lse) | torch.isposinf(lse)).any()):
        raise ValueError(f"{OVERFLOW_MESSAGE} (|scale·q·k| exceeds the range of {dtype}); "
                         "compute in float64 or use a smaller scale")


def flash_attention_triton(q, k, v, *, causal: bool = False, scale: float | None = None, key_padding_mask=None,
                           block_m: int | None = None, block_n: int | None = None):
    """用 Triton 核函数算 FlashAttention 前向；没有 GPU 时走 Triton 解释器。返回 (out, lse)。

    Args:
        q, k, v: (B, H, L, D), (B, H, S, D), (B, H, S, Dv); float16, bfloat16 or float32;
            any strides. Head dims up to 256. On CUDA tensors when Triton compiles; on CPU
            tensors under the interpreter (see ``attn_lib.device.triton_interprets``).
        causal, scale, key_padding_mask: as in ``flash_attention``.
        block_m, block_n: override the kernel's BLOCK_M / BLOCK_N (powers of two >= 16).

    Returns:
        ``(out, lse)``: out (B, H, L, Dv) in q's dtype; lse (B, H, L) float32, natural log,
        ``-inf`` for a query that sees no key.

    Raises:
        ValueError: a scaled score overflowed to +inf in float32 (checked once, on lse);
            q, k or v requires grad while grad mode is on (this function has no autograd:
            ``flash_attention`` has).
    """
    _check_scale_type(scale)
    (B, H, L, S, D, Dv), scale = check_attention_inputs(q, k, v, None, scale)
    _check_triton_common(q, causal, key_padding_mask, B, S, block_m, block_n)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise ValueError(
            "flash_attention_triton returns (out, lse) without a gradient, but q, k or v requires grad "
            "(expected: no autograd here); to train, use attn_lib.flash_attention(q, k, v, backend='triton'), "
            "which runs flash_attention_triton_backward in its backward; or call this under torch.no_grad()"
        )
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    interpret = _triton_mode_for(q)
    module = load_kernel()
    flags = kernel_flags(q.dtype, q.device, interpret)
    out, lse = module.launch(q, k, v, key_padding_mask, causal, scale, interpret=interpret,
                             dot_fp32=flags["dot_fp32"], capability=flags["capability"], block_m=block_m,
                             block_n=block_n)
    check_overflow(lse)
    return out, lse


def _check_like(name: str, t, shape: tuple, dtype, device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}; pass what "
                         "flash_attention_triton returned for these q, k, v")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if str(t.device) != str(device):
        raise ValueError(f"{name} is on {t.device} but q is on {device}")


def flash_attention_triton_backward(q, k, v, out, lse, dout, *, causal: bool = False, scale: float | None = None,
                                    key_padding_mask=None, block_m: int | None = None, block_n: int | None = None):
    """用 Triton 核函数算 FlashAttention 的反向（FlashAttention-2）：由 dout 求 dq, dk, dv，不存 L×S 矩阵。

    Recomputes ``P_ij = exp(S_ij − lse_i)`` block by block from the saved log-sum-exp, with
    ``D_i = rowsum(dO_i ∘ O_i)``, ``dS_ij = P_ij ∘ (dP_ij − D_i)`` (see attn_lib/flash_triton.py).
    Only metadata is checked here (shapes, dtypes, devices): the forward already checked the
    values. A query that sees no key gets zero gradients.

    Args:
        q, k, v: the forward's inputs, (B, H, L, D), (B, H, S, D), (B, H, S, Dv).
        out: the forward's output (B, H, L, Dv), q's dtype.
        lse: the forward's log-sum-exp (B, H, L) float32, natural log, -inf for rows with no key.
        dout: gradient of the loss with respect to ``out``, (B, H, L, Dv), q's dtype.
        causal, scale, key_padding_mask: as in the forward call.
        block_m, block_n: override BLOCK_M (query blocks) / BLOCK_N (key blocks), powers of two >= 16.

    Returns:
        ``(dq, dk, dv)`` with the shapes and dtype of q, k, v (contiguous).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_same_dtype(("q", "k", "v"), (q.dtype, k.dtype, v.dtype))
    if len({str(q.device), str(k.device), str(v.device)}) > 1:
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, H, L, S, D, Dv = check_qkv_shapes(q, k, v)
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"q must be a floating-point tensor, got {q.dtype}")
    _check_triton_common(q, causal, key_padding_mask, B, S, block_m, block_n)
    _check_like("out", out, (B, H, L, Dv), q.dtype, q.device)
    _check_like("dout", dout, (B, H, L, Dv), q.dtype, q.device)
    _check_like("lse", lse, (B, H, L), torch.float32, q.device)
    _check_scale_type(scale)
    scale = check_scale(scale)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    interpret = _triton_mode_for(q)
    module = load_kernel()
    flags = kernel_flags(q.dtype, q.device, interpret)
    return module.launch_backward(q, k, v, out, lse, dout, key_padding_mask, causal, scale, interpret=interpret,
                                  dot_fp32=flags["dot_fp32"], capability=flags["capability"], block_m=block_m,
                                  block_n=block_n)


def choose_backend(q, backend: str = "auto") -> str:
    """按 backend 参数和 q 所在设备决定用哪条路径：'torch' 或 'triton'。

    Args:
        q: the queries (only their device is looked at).
        backend: ``"auto"``, ``"torch"`` or ``"triton"``.

    Returns:
        ``"torch"`` or ``"triton"``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        on_cuda = isinstance(q, torch.Tensor) and q.is_cuda
        return "triton" if on_cuda and triton_available() else "torch"
    return backend


def rows_with_keys(L: int, S: int, key_padding_mask, is_causal: bool, causal_offset: int, device):
    """哪些查询行至少看得见一个键：(B 或 1, 1, L) 布尔张量（只读掩码，不读 q、k、v）。"""
    i = torch.arange(L, device=device)  # (L,)
    limit = (i + causal_offset + 1).clamp(0, S) if is_causal else torch.full_like(i, S)  # (L,) keys 0..limit-1
    if key_padding_mask is None:
        return (limit > 0)[None, None, :]  # (L,) -> (1,1,L)
    if S == 0:
        return torch.zeros(key_padding_mask.shape[0], 1, L, dtype=torch.bool, device=device)  # (B,1,L)
    present = key_padding_mask.to(torch.int32).cumsum(-1)  # (B,S) present keys among 0..j
    seen = present.gather(1, (limit - 1).clamp(min=0).expand(present.shape[0], L))  # (B,S) -> (B,L)
    return ((seen > 0) & (limit > 0))[:, None, :]  # (B,L) -> (B,1,L)


def raise_if_overflowed(lse, L: int, S: int, key_padding_mask, is_causal: bool, causal_offset: int, dtype) -> None:
    """溢出规则（所有路径同一条）：看得见键的行，log-sum-exp 却是 ±inf 或 nan，就是分数溢出了。

    A row that sees no key has ``lse = -inf`` and a zero output: that is not an overflow. One
    reduction and one host sync.

    Raises:
        ValueError: ``overflow_error(work_dtype(dtype))``.
    """
    if lse.numel() == 0:
        return
    has_key = rows_with_keys(L, S, key_padding_mask, is_causal, causal_offset, lse.device)  # (B|1,1,L)
    if bool((~torch.isfinite(lse) & has_key).any()):
        raise overflow_error(work_dtype(dtype))


def _forward_core(backend: str, q, k, v, is_causal, scale, key_padding_mask, causal_offset):
    """无检查的前向：返回 (out (B,H,L,Dv), lse (B,H,L))，不检查溢出。"""
    if backend == "triton":
        interpret = _device.triton_interprets()
        flags = kernel_flags(q.dtype, q.device, interpret)
        return load_kernel().launch(q, k, v, key_padding_mask, is_causal, scale, interpret=interpret,
                                    dot_fp32=flags["dot_fp32"], capability=flags["capability"],
                                    causal_offset=causal_offset)
    return _tiles._forward_tiles(q, k, v, key_padding_mask, causal=is_causal, scale=scale,
                                 block_m=_tiles.DEFAULT_BLOCK_M, block_n=_tiles.DEFAULT_BLOCK_N, counter=None,
                                 causal_offset=causal_offset)


def _backward_core(backend: str, q, k, v, out, lse, dout, is_causal, scale, key_padding_mask, causal_offset):
    """无检查的反向：返回 (dq, dk, dv)。"""
    if backend == "triton":
        interpret = _device.triton_interprets()
        flags = kernel_flags(q.dtype, q.device, interpret)
        return load_kernel().launch_backward(q, k, v, out, lse, dout, key_padding_mask, is_causal, scale,
                                             interpret=interpret, dot_fp32=flags["dot_fp32"],
                                             capability=flags["capability"], causal_offset=causal_offset)
    with torch.no_grad():
        return _tiles._backward_tiles(q, k, v, out, lse, dout, key_padding_mask, causal=is_causal, scale=scale,
                                      block_m=_tiles.DEFAULT_BWD_BLOCK_M, block_n=_tiles.DEFAULT_BWD_BLOCK_N,
                                      causal_offset=causal_offset)


def _checked_forward(backend, q, k, v, is_causal, scale, key_padding_mask, check_overflow, causal_offset):
    out, lse = _forward_core(backend, q, k, v, is_causal, scale, key_padding_mask, causal_offset)
    if check_overflow:
        raise_if_overflowed(lse, q.shape[2], k.shape[2], key_padding_mask, is_causal, causal_offset, q.dtype)
    return out, lse


class FlashAttentionFunction(torch.autograd.Function):
    """可求导的 FlashAttention：前向存 q、k、v、输出和 lse（从不存 L×S 矩阵），反向按 FlashAttention-2 分块重算。

    ``FlashAttentionFunction.apply(q, k, v, is_causal, scale, key_padding_mask, backend,
    check_overflow, causal_offset)`` with ``backend`` ``"torch"`` or ``"triton"`` (already
    resolved by ``choose_backend``) and ``scale`` a float; nothing is checked here. The
    forward is the backend's tiled forward (both return ``(out, lse)``); the backward is the
    backend's FlashAttention-2 backward. Gradients flow to q, k and v only.
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale, key_padding_mask, backend, check_overflow, causal_offset):
        out, lse = _checked_forward(backend, q, k, v, is_causal, scale, key_padding_mask, check_overflow,
                                    causal_offset)  # (B,H,L,Dv), (B,H,L)
        ctx.save_for_backward(q, k, v, out, lse, key_padding_mask)
        ctx.args = (is_causal, scale, backend, causal_offset)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse, key_padding_mask = ctx.saved_tensors
        is_causal, scale, backend, causal_offset = ctx.args
        dq, dk, dv = _backward_core(backend, q, k, v, out, lse, dout, is_causal, scale, key_padding_mask,
                                    causal_offset)
        return dq, dk, dv, None, None, None, None, None, None


def _flash_unchecked(q, k, v, *, is_causal: bool, scale: float, key_padding_mask, backend: str,
                     check_overflow: bool, causal_offset: int = 0):
    """FlashAttention 的无检查内核（调用方已检查全部输入）：返回 out (B, H, L, Dv)，需要时可求导。

    Args:
        q, k, v: (B, H, L, D), (B, H, S, D), (B, H, S, Dv), already checked.
        is_causal: with ``causal_offset``: query i sees key j iff ``j <= i + causal_offset``.
        scale: a float (already resolved, e.g. ``1 / sqrt(D)``).
        key_padding_mask: None or bool (B, S), True = key present.
        backend: ``"torch"`` or ``"triton"`` (already resolved).
        check_overflow: check the log-sum-exp for overflow (one reduction and host sync);
            False skips it.
        causal_offset: 0 is SDPA's top-left ``is_causal``; ``S - L`` is the bottom-right
            alignment of KV-cache decoding (``attn_lib.causal_mask(L, S, align="bottom-right")``).

    Returns:
        out (B, H, L, Dv) in q's dtype; differentiable through ``FlashAttentionFunction``
        when grad mode is on and q, k or v requires grad.
    """
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return FlashAttentionFunction.apply(q, k, v, is_causal, scale, key_padding_mask, backend, check_overflow,
                                            causal_offset)
    out, _ = _checked_forward(backend, q, k, v, is_causal, scale, key_padding_mask, check_overflow, causal_offset)
    return out


def flash_attention(q, k, v, *, causal: bool = False, scale: float | None = None, key_padding_mask=None,
                    backend: str = "auto"):
    """FlashAttention：与 attn_lib.attention 结果相同，但不存整张分数矩阵；可以求导（对 q、k、v）。

    Args:
        q: queries, shape (B, H, L, D).
        k: keys, shape (B, H, S, D).
        v: values, shape (B, H, S, Dv).
        causal: query i sees keys 0..i (top-left aligned, as ``attn_lib.causal_mask``).
        scale: multiplies ``q @ kᵀ``; default ``1 / sqrt(D)``. A number (not differentiable).
        key_padding_mask: optional bool (B, S), True = key present (same as
            ``attention(..., mask=key_padding_mask[:, None, None, :])``).
        backend: ``"auto"`` (Triton on CUDA when available, else torch), ``"torch"`` or
            ``"triton"`` (on CPU tensors: Triton's interpreter, slow, for checking).

    Returns:
        Output of shape (B, H, L, Dv) in q's dtype; a query that sees no key gets zeros.
        When grad mode is on and q, k or v requires grad, the output has a ``grad_fn``
        (``FlashAttentionFunction``): the backward is FlashAttention-2's, recomputing the
        attention proportions block by block from the saved log-sum-exp; a query that sees no
        key gets zero gradients.

    Raises:
        TypeError: ``scale`` is a tensor that requires grad (not differentiable).
        ValueError: ``key_padding_mask`` requires grad (not differentiable), or a score
            overflows to +inf.
    """
    which = choose_backend(q, backend)
    if which == "triton":
        _check_scale_type(scale)
    (B, H, L, S, D, Dv), scale = check_attention_inputs(q, k, v, None, scale)
    check_bool("causal", causal)
    if which == "triton":
        _check_triton_common(q, causal, key_padding_mask, B, S, None, None)
        _triton_mode_for(q)
    else:
        check_key_padding_mask(key_padding_mask, B, S, q.device)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    return _flash_unchecked(q, k, v, is_causal=causal, scale=scale, key_padding_mask=key_padding_mask,
                            backend=which, check_overflow=True)


__all__ = ["flash_attention", "FlashAttentionFunction", "flash_attention_triton", "flash_attention_triton_backward",
           "choose_backend", "load_kernel", "kernel_flags", "check_overflow", "triton_available", "BACKENDS"]
