"""第 8、9 章（书中不单独讲）：Triton 路径的两个公开入口（前向、反向）和导入核函数的规则；本模块不导入 Triton。

``flash_attention_triton`` and ``flash_attention_triton_backward`` check their inputs once and
call the launchers (``attn_lib._triton_launch``) through ``load_kernel()``; the unchecked cores
``triton_forward_core`` / ``triton_backward_core`` are what ``attn_lib.flash`` calls below its
own door. Both take grouped-query attention (k, v with H_kv heads, ``enable_gqa``) and the
band of ``attn_lib._band`` (``is_causal``, ``causal_offset``, ``window_size``). Whether Triton
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

from . import device as _device
from ._band import NO_WINDOW, band
from ._numerics import dot_fp32, dot_input_precision, overflow_error, resolve_scale, work_dtype
from ._validate import (check_all_finite, check_attention_inputs, check_block, check_bool, check_key_padding_mask,
                        check_no_grad_needed, check_saved, check_triton_device, check_triton_inputs)


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


# --- stand-ins for issue 17's shared checks (branch gqa-paths: attn_lib._validate.check_window_size and the
# head rule of check_attention_inputs(..., enable_gqa=)), with their wording; replace them at merge ---
_WINDOW_EXAMPLE = "e.g. window_size=(256, 0) for 256 keys back and none ahead, or (-1, -1) for no window"


def _check_window_size(window_size, is_causal: bool) -> tuple:
    """window_size 是两个 >= -1 的整数；因果时 right 只能是 0 或 -1（gqa-paths 的 check_window_size 的替身）。"""
    if not isinstance(window_size, (tuple, list)):
        raise TypeError(f"window_size must be a pair (left, right) of ints, as a tuple or list, got {window_size!r} "
                        f"({type(window_size).__name__}); {_WINDOW_EXAMPLE}")
    if len(window_size) != 2:
        raise ValueError(f"window_size must be a pair (left, right) of ints, got {len(window_size)} values "
                         f"{tuple(window_size)!r}; {_WINDOW_EXAMPLE}")
    for side in window_size:
        if isinstance(side, bool) or not isinstance(side, numbers.Integral):
            raise TypeError(f"window_size must be a pair (left, right) of ints, got {side!r} "
                            f"({type(side).__name__}) in {tuple(window_size)!r}; {_WINDOW_EXAMPLE}")
    left, right = (int(side) for side in window_size)
    if left < -1 or right < -1:
        raise ValueError(f"window_size must be a pair of ints >= -1 (-1: unbounded on that side), got "
                         f"{(left, right)!r}; {_WINDOW_EXAMPLE}")
    if is_causal and right not in (-1, 0):
        raise ValueError(f"window_size's right side must be 0 or -1 with is_causal=True (a causal query sees no "
                         f"later key), got {(left, right)!r}; pass window_size=({left}, 0), or is_causal=False "
                         "for a window that looks ahead")
    return left, right


def _check_qkv(q, k, v, scale, check_finite: bool, enable_gqa: bool):
    """check_attention_inputs 加上 GQA 的头数规则（H_kv 整除 H，H_kv != H 要 enable_gqa=True）。"""
    gqa = check_bool("enable_gqa", enable_gqa)
    heads = [t.shape[1] if isinstance(t, torch.Tensor) and t.dim() == 4 else None for t in (q, k, v)]
    H, Hk, Hv = heads
    if None in heads or Hk != Hv or Hk == H:
        return check_attention_inputs(q, k, v, None, scale, check_finite=check_finite)
    if Hk == 0 or H < Hk or H % Hk:
        divisors = [d for d in range(1, H + 1) if H % d == 0] or [1]
        raise ValueError(f"k must have a number of heads H_kv that divides q's H={H} (query head h uses key/value "
                         f"head h // (H // H_kv)), got H_kv={Hk}; use one of {divisors} key/value heads")
    if not gqa:
        raise ValueError(f"k must have H={H} heads like q, got H_kv={Hk}; pass enable_gqa=True to share each "
                         f"key/value head among H // H_kv = {H // Hk} query heads (grouped-query attention)")
    (B, _, L, S, D, Dv), scale = check_attention_inputs(q[:, :Hk], k, v, None, scale, check_finite=False)
    if check_bool("check_finite", check_finite):
        for name, t in (("q", q), ("k", k), ("v", v)):
            check_all_finite(name, t)
    return (B, H, L, S, D, Dv), scale


def _raise_if_overflowed(lse, S: int, key_padding_mask, lo, hi, dtype) -> None:
    """溢出规则：看得见键（带内、未被填充）的行，lse 却不是有限数，就是分数溢出了。"""
    L = lse.shape[2]
    if lse.numel() == 0:
        return
    i = torch.arange(L, device=lse.device)  # (L,)
    start = torch.zeros_like(i) if lo is None else (i + lo).clamp(0, S)  # (L,) first key the band allows
    end = torch.full_like(i, S) if hi is None else (i + hi + 1).clamp(0, S)  # (L,) keys < end
    has_key = (end > start)[None, None, :]  # (L,) -> (1,1,L)
    if key_padding_mask is not None:
        present = torch.nn.functional.pad(key_padding_mask.to(torch.int32).cumsum(-1), (1, 0))  # (B,S) -> (B,S+1)
        n = present.shape[0]
        seen = present.gather(1, end.expand(n, L)) - present.gather(1, start.expand(n, L))  # (B,S+1) -> (B,L)
        has_key = has_key & (seen > 0)[:, None, :]  # (B,L) -> (B,1,L)
    if bool((~torch.isfinite(lse) & has_key).any()):
        raise overflow_error(work_dtype(dtype))


def _check_offset(causal_offset) -> int:
    if isinstance(causal_offset, bool) or not isinstance(causal_offset, numbers.Integral):
        raise TypeError(f"causal_offset must be an int, got {causal_offset!r} ({type(causal_offset).__name__}); "
                        "pass 0 (top-left, as SDPA) or S - L (bottom-right, as in KV-cache decoding)")
    return int(causal_offset)


def check_triton_door(q, k, v, scale, is_causal, key_padding_mask, block_m=None, block_n=None, *, check_finite=True,
                      causal_offset=0, window_size=NO_WINDOW, enable_gqa=False):
    """Triton 入口的全部检查（一次）：返回（(B, H, L, S, D, Dv)，解析后的 scale，是否解释器）。"""
    dims, scale = _check_qkv(q, k, v, scale, check_finite, enable_gqa)
    check_triton_inputs(q, k, v)
    _check_window_size(window_size, check_bool("is_causal", is_causal))
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
        lo, hi = band(is_causal, tuple(int(side) for side in window_size), int(causal_offset))
        _raise_if_overflowed(lse, S, key_padding_mask, lo, hi, q.dtype)
    return out, lse


def flash_attention_triton_backward(q, k, v, out, lse, dout, *, is_causal: bool = False, scale: float | None = None,
                                    key_padding_mask=None, block_m: int | None = None, block_n: int | None = None,
                                    check_finite: bool = True, causal_offset: int = 0, window_size=NO_WINDOW,
                                    enable_gqa: bool = False):
    """用 Triton 核函数算 FlashAttention 的反向（FlashAttention-2）：由 dout 求 dq, dk, dv，不存 L×S 矩阵。

    Recomputes ``P_ij = exp(S_ij − lse_i)`` block by block from the saved log-sum-exp, with
    ``D_i = rowsum(dO_i ∘ O_i)``, ``dS_ij = P_ij ∘ (dP_ij − D_i)`` (see
    attn_lib/flash_triton_backward.py). A query that sees no key gets zero gradients. With
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
