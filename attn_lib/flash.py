"""FlashAttention 的唯一入口:按设备在纯 torch 分块实现和 Triton 核函数之间选一个,结果与 attn_lib.attention 相同。

``flash_attention(q, k, v, causal=..., scale=..., key_padding_mask=..., backend=...)``

- ``backend="auto"``: the Triton kernel when q is on a CUDA device and Triton is importable,
  otherwise the tiled torch path (``attn_lib.flash_torch``).
- ``backend="torch"``: the tiled torch path on any device.
- ``backend="triton"``: the Triton kernel; on CPU tensors it runs under Triton's
  interpreter. This module is the one place that sets ``TRITON_INTERPRET=1``: in
  ``load_kernel`` before the kernel module (and its private copy of Triton) is imported, and
  while the kernel runs; the variable is restored afterwards. Importing attn_lib imports
  neither Triton nor CUDA.
"""
from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import sys

import torch

from ._validate import check_bool, check_positive_int
from .flash_torch import check_key_padding_mask, flash_attention_torch
from .reference import check_attention_inputs

BACKENDS = ("auto", "torch", "triton")
_KERNEL_FILE = os.path.join(os.path.dirname(__file__), "flash_triton.py")
_kernels: dict = {}


def triton_available() -> bool:
    """本机能否导入 Triton(只查找,不导入)。"""
    return importlib.util.find_spec("triton") is not None


@contextlib.contextmanager
def triton_mode(interpret: bool):
    """在这段代码里把 TRITON_INTERPRET 设成 1(解释器)或 0(GPU 编译),结束后恢复原值。"""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


def _triton_modules() -> dict:
    # The compiled extension (triton._C...) is shared; everything else is Python and re-importable.
    return {n: m for n, m in sys.modules.items()
            if (n == "triton" or n.startswith("triton.")) and not n.startswith("triton._C")}


def _imported_triton_interprets():
    """None if Triton is not imported yet, else whether the imported Triton interprets."""
    std = sys.modules.get("triton.language.standard")
    return None if std is None else type(std.zeros).__name__ == "InterpretedFunction"


@contextlib.contextmanager
def _swap_triton(private: dict | None):
    """While active, ``import triton`` inside the block sees ``private`` (the kernel's own copy).

    Modules Triton imports lazily during the block are kept in ``private`` too, and the
    process's own Triton modules are put back afterwards. ``private=None``: no swap.
    """
    if private is None:
        yield
        return
    saved = _triton_modules()
    for n in saved:
        del sys.modules[n]
    sys.modules.update(private)
    try:
        yield
    finally:
        private.update(_triton_modules())
        for n in _triton_modules():
            del sys.modules[n]
        sys.modules.update(saved)


def _import_kernel(name: str, interpret: bool, private: dict | None):
    with triton_mode(interpret), _swap_triton(private):
        spec = importlib.util.spec_from_file_location(name, _KERNEL_FILE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def load_kernel(interpret: bool):
    """导入 Triton 核函数模块:interpret=True 时在 TRITON_INTERPRET=1 下导入(CPU 上用解释器运行)。

    Triton decides when ``triton`` is first imported whether ``@triton.jit`` (its own library
    functions included) builds GPU kernels or interpreted Python, and torch itself sometimes
    imports triton. So the interpreted kernel always gets a private copy of Triton's Python
    modules, imported with ``TRITON_INTERPRET=1`` set (``attn_lib._flash_triton_interpreted``);
    the process's own ``triton`` is left as it was. The GPU kernel is the ordinary module
    ``attn_lib.flash_triton`` (also private when the process's Triton already interprets).

    Raises:
        ImportError: triton is not installed.
    """
    if interpret in _kernels:
        return _kernels[interpret][0]
    if not triton_available():
        raise ImportError("backend='triton' needs the triton package (pip install triton); use backend='torch'")
    if interpret:
        name, private = "attn_lib._flash_triton_interpreted", {}
    else:
        name, private = "attn_lib.flash_triton", ({} if _imported_triton_interprets() is True else None)
    _kernels[interpret] = (_import_kernel(name, interpret, private), private)
    return _kernels[interpret][0]


def flash_attention_triton(q, k, v, *, causal: bool = False, scale: float | None = None, key_padding_mask=None,
                           block_m: int | None = None, block_n: int | None = None):
    """用 Triton 核函数算 FlashAttention 前向;CPU 张量走 Triton 解释器。返回 (out, lse)。

    Args:
        q, k, v: (B, H, L, D), (B, H, S, D), (B, H, S, Dv); float16, bfloat16 or float32;
            any strides. Head dims up to 256.
        causal, scale, key_padding_mask: as in ``flash_attention``.
        block_m, block_n: override the kernel's BLOCK_M / BLOCK_N (powers of two >= 16).

    Returns:
        ``(out, lse)``: out (B, H, L, Dv) in q's dtype, lse (B, H, L) float32.
    """
    (B, H, L, S, D, Dv), scale = check_attention_inputs(q, k, v, None, scale)
    _check_common(causal, key_padding_mask, B, S, q.device)
    if q.dtype == torch.float64:
        raise TypeError("the Triton kernel takes float16, bfloat16 or float32; for float64 use backend='torch'")
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if value is not None and (check_positive_int(name, value) < 16 or value & (value - 1)):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.dot's smallest tile), got {value}")
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    interpret = q.device.type != "cuda"
    module = load_kernel(interpret)
    # Triton reads the switch again while it runs, and may import more of its own modules.
    with triton_mode(interpret), _swap_triton(_kernels[interpret][1]):
        return module.launch(q, k, v, key_padding_mask, causal, scale, interpret=interpret,
                             block_m=block_m, block_n=block_n)


def _check_common(causal, key_padding_mask, B, S, device) -> None:
    check_bool("causal", causal)
    check_key_padding_mask(key_padding_mask, B, S, device)


def choose_backend(q, backend: str = "auto") -> str:
    """按 backend 参数和 q 所在设备决定用哪条路径:'torch' 或 'triton'。

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


class FlashAttentionFunction(torch.autograd.Function):
    """可求导的 FlashAttention:前向存 q、k、v、输出和 lse(从不存 L×S 矩阵),反向按 FlashAttention-2 分块重算。

    ``FlashAttentionFunction.apply(q, k, v, causal, scale, key_padding_mask, backend)`` with
    ``backend`` ``"torch"`` or ``"triton"`` (already resolved by ``choose_backend``). The
    forward is the backend's forward (``flash_attention_torch`` / ``flash_attention_triton``,
    both return ``(out, lse)``); the backward is ``flash_attention_backward_torch`` /
    ``flash_attention_triton_backward``. Gradients flow to q, k and v only.
    """

    @staticmethod
    def run_forward(backend: str, q, k, v, causal, scale, key_padding_mask):
        """只跑前向(不建计算图):返回 (out, lse)。"""
        if backend == "triton":
            return flash_attention_triton(q, k, v, causal=causal, scale=scale, key_padding_mask=key_padding_mask)
        return flash_attention_torch(q, k, v, causal=causal, scale=scale, key_padding_mask=key_padding_mask)

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, key_padding_mask, backend):
        out, lse = FlashAttentionFunction.run_forward(backend, q, k, v, causal, scale,
                                                      key_padding_mask)  # (B,H,L,Dv), (B,H,L)
        ctx.save_for_backward(q, k, v, out, lse, key_padding_mask)
        ctx.causal, ctx.scale, ctx.backend = causal, scale, backend
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        from .flash_torch import flash_attention_backward_torch

        q, k, v, out, lse, key_padding_mask = ctx.saved_tensors
        if ctx.backend == "triton":
            backward = flash_attention_triton_backward  # noqa: F821  (the Triton kernels' backward, in this module)
        else:
            backward = flash_attention_backward_torch
        dq, dk, dv = backward(q, k, v, out, lse, dout, causal=ctx.causal, scale=ctx.scale,
                              key_padding_mask=key_padding_mask)
        return dq, dk, dv, None, None, None, None


def flash_attention(q, k, v, *, causal: bool = False, scale: float | None = None, key_padding_mask=None,
                    backend: str = "auto"):
    """FlashAttention:与 attn_lib.attention 结果相同,但不存整张分数矩阵;可以求导(对 q、k、v)。

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
        ValueError: ``scale`` is a tensor that requires grad, or ``key_padding_mask`` requires
            grad (neither is differentiable), or a score overflows to +inf.
    """
    from .flash_torch import check_scale_not_differentiable

    which = choose_backend(q, backend)
    check_scale_not_differentiable(scale)  # (a key_padding_mask that requires grad is refused by the forward)
    needs_grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))
    if needs_grad:
        return FlashAttentionFunction.apply(q, k, v, causal, scale, key_padding_mask, which)
    out, _ = FlashAttentionFunction.run_forward(which, q, k, v, causal, scale, key_padding_mask)
    return out


__all__ = ["flash_attention", "FlashAttentionFunction", "flash_attention_triton", "choose_backend", "load_kernel",
           "triton_available", "triton_mode", "BACKENDS"]
