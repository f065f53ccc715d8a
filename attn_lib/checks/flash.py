"""第 8、9 章（书中不单独讲）：分块路径和 Triton 路径多出来的检查——键填充掩码、反向要的张量、块大小、设备。"""
from __future__ import annotations

from typing import Any

from .tensors import check_on_q_device, check_tensor
from .values import check_positive_int

MAX_HEAD_DIM = 256  # the Triton kernels' largest head dim (BLOCK_D <= 256)


def check_key_padding_mask(key_padding_mask, B: int, S: int, device) -> None:
    """检查键填充掩码：None，或布尔张量，形状 (B, S)，True = 这个键存在，与 q 同设备、不求导。"""
    import torch

    if key_padding_mask is None:
        return
    check_tensor("key_padding_mask", key_padding_mask, none_ok=True)
    if key_padding_mask.requires_grad:
        raise ValueError(
            "key_padding_mask requires grad, but it is not differentiable (a key is either present or not); "
            "pass a bool tensor (True = key present), e.g. key_padding_mask.detach() > 0.5"
        )
    if key_padding_mask.dtype != torch.bool:
        raise TypeError(
            f"key_padding_mask must be bool (True = key present), got {key_padding_mask.dtype}; "
            "for a 0/1 tensor use key_padding_mask.bool()"
        )
    if tuple(key_padding_mask.shape) != (B, S):
        raise ValueError(
            f"key_padding_mask must have shape (B, S) = {(B, S)} (one flag per key of each sequence), "
            f"got {tuple(key_padding_mask.shape)}"
        )
    check_on_q_device("key_padding_mask", key_padding_mask, device)


def check_no_grad_needed(fn_name: str, *tensors) -> None:
    """前向专用函数的检查：需要梯度的输入会被拒绝，并指出该用哪个可求导的函数。"""
    import torch

    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        if "triton" in fn_name:
            raise ValueError(
                f"{fn_name} returns (out, lse) without a gradient, but q, k or v requires grad "
                "(expected: no autograd here); to train, use attn_lib.flash_attention(q, k, v, backend='triton'), "
                "which runs flash_attention_triton_backward in its backward; or call this under torch.no_grad()"
            )
        raise ValueError(
            f"{fn_name} is forward-only (it writes into preallocated buffers, which autograd cannot follow), "
            "but q, k or v requires grad; to train, call attn_lib.flash_attention(q, k, v, backend='torch'), "
            "whose backward is the tiled FlashAttention-2 backward, or wrap this call in torch.no_grad()"
        )


def check_saved(q, out, lse, dout, B: int, H: int, L: int, Dv: int, *, forward: str, same_dtype: bool = False) -> None:
    """检查反向传播的输入 out、lse、dout：张量、浮点、形状、设备；same_dtype 时 out、dout 须是 q 的精度、lse 须是 float32。

    Args:
        forward: the name of the forward function whose (out, lse) belong here, for the remedy.
        same_dtype: the Triton kernels' rule (out, dout in q's dtype, lse float32).
    """
    import torch

    for name, t, shape in (("out", out, (B, H, L, Dv)), ("lse", lse, (B, H, L)), ("dout", dout, (B, H, L, Dv))):
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


def check_triton_inputs(q, k, v) -> None:
    """Triton 核函数的额外要求：不收 float64，头维度不超过 256。"""
    import torch

    if q.dtype == torch.float64:
        raise TypeError("the Triton kernel takes float16, bfloat16 or float32; for float64 use backend='torch' "
                        "(got q.dtype=torch.float64)")
    D, Dv = int(q.shape[-1]), int(v.shape[-1])
    if max(D, Dv) > MAX_HEAD_DIM:
        raise ValueError(f"the Triton kernel supports head dims up to {MAX_HEAD_DIM}, got D={D}, Dv={Dv}; "
                         "use backend='torch'")


def check_triton_device(q, interpret: bool) -> None:
    """Triton 编译 GPU 核函数时（有 CUDA 设备），只收 CUDA 张量；解释器收 CPU 张量。"""
    from .. import device as _device

    if not interpret and q.device.type != "cuda":
        raise ValueError(
            f"backend='triton' got tensors on {q.device}, but Triton in this process compiles GPU kernels "
            "(a CUDA device is present); expected CUDA tensors. Remedy: move q, k, v (and the mask) to "
            f"'cuda', use backend='torch', or start Python with {_device.TRITON_ENV}=1 to run the kernel "
            "under Triton's interpreter."
        )
