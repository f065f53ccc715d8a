"""第 8、9、13 章（书中不单独讲）：分块路径和 Triton 路径多出来的检查——键掩码、反向要的张量、块大小、计数器、Triton 能否运行。"""
from __future__ import annotations

from typing import Any

import torch

from ..rules.names import MAX_HEAD_DIM, TRITON_ENV, triton_available
from .tensors import check_on_q_device, check_tensor
from .values import check_positive_int


def check_key_mask(key_mask, B: int, S: int, device) -> None:
    """检查键掩码：None，或布尔张量 (B, S)，True = 这个键存在（与 nn.MultiheadAttention 的 key_padding_mask 相反），与 q 同设备、不求导。"""
    if key_mask is None:
        return
    check_tensor("key_mask", key_mask, none_ok=True)
    if key_mask.requires_grad:
        raise ValueError(
            "key_mask requires grad, but it is not differentiable (a key is either present or not); "
            "pass a bool tensor (True = key present), e.g. key_mask.detach() > 0.5"
        )
    if key_mask.dtype != torch.bool:
        raise TypeError(
            f"key_mask must be bool (True = key present; torch.nn.MultiheadAttention's key_padding_mask is the "
            f"opposite, True = padding), got {key_mask.dtype}; for a 0/1 tensor use key_mask.bool()"
        )
    if tuple(key_mask.shape) != (B, S):
        raise ValueError(
            f"key_mask must have shape (B, S) = {(B, S)} (one flag per key of each sequence), "
            f"got {tuple(key_mask.shape)}"
        )
    check_on_q_device("key_mask", key_mask, device)


def check_no_grad_needed(fn_name: str, *tensors) -> None:
    """前向专用函数的检查：需要梯度的输入会被拒绝，并指出该用哪个可求导的函数。"""
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        if "triton" in fn_name:
            raise ValueError(
                f"{fn_name} returns (out, lse) without a gradient, but q, k or v requires grad "
                "(expected: no autograd here); to train, use attn_lib.flash_attention(q, k, v, backend='triton'), "
                "which runs flash_attention_triton_backward in its backward; or call this under torch.no_grad()"
            )
        raise ValueError(
            f"{fn_name} is forward-only, but q, k or v requires grad (expected: no autograd here); to train, call "
            "attn_lib.flash_attention(q, k, v, backend='torch'), whose backward is the tiled FlashAttention-2 "
            "backward (attn_lib.attention for the reference's), or wrap this call in torch.no_grad()"
        )


def check_saved(q, saved, dims, *, forward: str, same_dtype: bool = False) -> None:
    """检查反向传播的输入 saved = (out, lse, dout)：张量、浮点、形状、设备；same_dtype 时 out、dout 须是 q 的精度、lse 须是 float32。

    Args:
        saved: ``(out, lse, dout)``.
        dims: ``(B, H, L, Dv)`` of this call.
        forward: the name of the forward function whose (out, lse) belong here, for the remedy.
        same_dtype: the Triton kernels' rule (out, dout in q's dtype, lse float32).
    """
    B, H, L, Dv = dims
    for name, t, shape in zip(("out", "lse", "dout"), saved, ((B, H, L, Dv), (B, H, L), (B, H, L, Dv))):
        check_tensor(name, t)
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}; pass what {forward} returned")
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}; pass what {forward} "
                             "returned for these q, k, v")
        want = torch.float32 if name == "lse" else q.dtype
        if same_dtype and t.dtype != want:
            raise TypeError(f"{name} must be {want}, got {t.dtype}; pass what {forward} returned")
        check_on_q_device(name, t, q.device)


def check_block(name: str, value: Any, *, power_of_two: bool) -> int | None:
    """检查块大小 block_m / block_n：None（用默认），或正整数；Triton 还要求是 >= 16 的 2 的幂。"""
    if value is None:
        return None
    value = check_positive_int(name, value)
    if power_of_two and (value < 16 or value & (value - 1)):
        raise ValueError(f"{name} must be a power of two >= 16 (tl.dot's smallest tile), got {value}")
    return value


def check_counter(counter) -> None:
    """IO 计数器：None，或有 load(name, n) 和 store(name, n) 两个方法的对象（如 attn_lib.IOCounter）。"""
    if counter is None:
        return
    if not (callable(getattr(counter, "load", None)) and callable(getattr(counter, "store", None))):
        raise TypeError(f"counter must be None or have methods load(name, n) and store(name, n), got "
                        f"{type(counter).__name__}; e.g. counter=attn_lib.IOCounter()")


def auto_backend(q, k, v) -> str:
    """backend="auto" 选哪条路径：q 在 CUDA 上、装了 Triton、核函数收得下（不是 float64，头维度不超过 256）时是 "triton"，否则 "torch"。

    Looked at before any other check, so it reads shapes and dtypes only of tensors (anything else: "torch",
    whose checks then say what is wrong).
    """
    tensors = all(isinstance(t, torch.Tensor) for t in (q, k, v))
    fits = tensors and q.dtype != torch.float64 and max(q.shape[-1:] + v.shape[-1:], default=0) <= MAX_HEAD_DIM
    return "triton" if fits and q.is_cuda and triton_available() else "torch"


def check_triton_installed() -> None:
    """backend='triton' 需要 triton 包；没有就报 ImportError 并说怎么办。"""
    if not triton_available():
        raise ImportError("backend='triton' needs the triton package (pip install triton); use backend='torch'")


def check_triton_inputs(dtype, D: int, Dv: int) -> None:
    """Triton 核函数的额外要求：不收 float64，头维度不超过 256。"""
    if dtype == torch.float64:
        raise TypeError("the Triton kernel takes float16, bfloat16 or float32; for float64 use backend='torch' "
                        "(got torch.float64)")
    if max(D, Dv) > MAX_HEAD_DIM:
        raise ValueError(f"the Triton kernel supports head dims up to {MAX_HEAD_DIM}, got D={D}, Dv={Dv}; "
                         "use backend='torch'")


def check_triton_device(device, interpret: bool) -> None:
    """Triton 编译 GPU 核函数时（有 CUDA 设备），只收 CUDA 张量；解释器收 CPU 张量。"""
    if not interpret and torch.device(device).type != "cuda":
        raise ValueError(
            f"backend='triton' got tensors on {device}, but Triton in this process compiles GPU kernels "
            "(a CUDA device is present); expected CUDA tensors. Remedy: move q, k, v (and the mask) to "
            f"'cuda', use backend='torch', or start Python with {TRITON_ENV}=1 to run the kernel "
            "under Triton's interpreter."
        )


def check_triton(dtype, device, head_dims: tuple, triton_mode) -> bool:
    """一条 Triton 路径的全部检查：triton 已安装、精度和头维度合核函数、张量在它能跑的设备上；返回是否走解释器。

    Args:
        dtype, device: what the kernels would get (q's dtype and device).
        head_dims: ``(D, Dv)``.
        triton_mode: a function returning this process's Triton mode (True: the interpreter),
            ``attn_lib.device.triton_interprets``; called only here, after Triton is known to be there.
    """
    check_triton_installed()
    check_triton_inputs(dtype, *head_dims)
    interpret = bool(triton_mode())
    check_triton_device(device, interpret)
    return interpret


__all__ = ["auto_backend", "check_key_mask", "check_no_grad_needed", "check_saved", "check_block", "check_counter",
           "triton_available", "check_triton_installed", "check_triton_inputs", "check_triton_device", "check_triton"]
