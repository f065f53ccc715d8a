"""第 6、10、12、13 章共用（书中不单独讲）：掩码、位置编码、KV 缓存和小模型的入口检查，与其他入口同一套措辞。

Sizes go through ``check_int`` (so ``causal_mask(2.0)`` and ``sinusoidal_positions(3.0, 4)``
word the same mistake the same way, and both take a 0-d integer tensor), flags through
``check_bool``; every function here returns the normalised value it checked.
"""
from __future__ import annotations

import math
import numbers

import torch

from .heads import check_cache_fits
from .layers import check_tensor_layout
from .shapes import check_rank
from .values import check_align, check_bool, check_int, check_window_size


def check_base(base) -> float:
    """位置编码的 base：有限的正实数（常用 10000.0）；返回 float。"""
    if isinstance(base, bool) or not isinstance(base, numbers.Real):
        raise TypeError(f"base must be a positive number (the usual 10000.0), got {base!r}")
    value = float(base)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"base must be finite and > 0 (the usual 10000.0), got {value}")
    return value


def check_sinusoidal_args(L, d_model, base, dtype) -> tuple[int, int, float]:
    """sinusoidal_positions 的参数：L >= 0、d_model >= 1 的整数，base 为正，dtype 是浮点 dtype；返回 (L, d_model, base)。"""
    L = check_int("L", L, 0)
    d_model = check_int("d_model", d_model, 1)
    base = check_base(base)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch dtype, got {dtype!r}")
    return L, d_model, base


def check_rotary_args(x, positions, base) -> tuple[torch.Tensor | None, float]:
    """apply_rotary 的参数：x (B, H, L, D) 浮点、D 为偶数，positions 是 (L,) 或 (B, L) 的整数；返回 (positions, base)。"""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor of shape (B, H, L, D), got {type(x).__name__}")
    check_rank("x", x, 4, "(B, H, L, D)")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}; convert with x.float()")
    B, H, L, D = x.shape
    if D % 2:
        raise ValueError(
            f"apply_rotary needs an even head dim D (it rotates pairs of channels 2i, 2i+1), got D={D}. "
            f"Choose a head dim of {f'{D - 1} or {D + 1}' if D > 1 else 2}."
        )
    base = check_base(base)
    return (None if positions is None else _positions(positions, B, L, x.device)), base


MAX_POSITION = 2**53  # float64 holds every integer up to here exactly: the angle p·θ_i is computed from it


def _positions(positions, B: int, L: int, device) -> torch.Tensor:
    """positions -> int64 tensor (L,) or (B, L) on ``device``, each |p| <= 2**53."""
    if isinstance(positions, torch.Tensor):
        if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
            raise TypeError(
                f"positions must hold integers (token indices), got dtype {positions.dtype}; "
                "use torch.arange(L) or positions.long()"
            )
        biggest = 0  # read where the positions are (a meta tensor has no values to read); Python ints, so -2**63 fits
        if positions.numel() and positions.device.type != "meta":
            low, high = (int(x) for x in torch.stack([positions.min(), positions.max()]).tolist())
            biggest = max(abs(low), abs(high))
        pos = positions.to(device=device, dtype=torch.int64)
    else:
        if isinstance(positions, (str, bytes, bytearray, numbers.Number)) or not hasattr(positions, "__iter__"):
            raise TypeError(f"positions must be a 1-D sequence of L ints or an int tensor, got {positions!r}")
        values = list(positions)
        for p in values:
            if isinstance(p, bool) or not isinstance(p, numbers.Integral):
                raise TypeError(f"positions must contain ints, got {p!r}")
        biggest = max((abs(int(p)) for p in values), default=0)
        if biggest <= MAX_POSITION:
            pos = torch.tensor([int(p) for p in values], dtype=torch.int64, device=device).reshape(-1)  # (L,)
    if biggest > MAX_POSITION:
        raise ValueError(f"positions must lie in -2**53 .. 2**53 (float64 represents the angle p·θ exactly only "
                         f"there), got a position of magnitude {biggest}; number the tokens from 0")
    if pos.shape not in ((L,), (B, L)):
        raise ValueError(
            f"positions must have shape (L,) = ({L},) or (B, L) = ({B}, {L}), one position per token, "
            f"got {tuple(pos.shape)}"
        )
    return pos


def check_causal_args(L, S, align) -> tuple[int, int]:
    """causal_mask 的参数：L、S 是 >= 0 的整数（S 默认等于 L），align 是 "top-left" 或 "bottom-right"；返回 (L, S)。"""
    L = check_int("L", L, 0)
    S = L if S is None else check_int("S", S, 0)
    check_align(align)
    return L, S


def check_window_mask_args(L, S, window, align) -> tuple:
    """sliding_window_mask 的参数：L、S、align 同 causal_mask，window = (window_size, is_causal)；返回 (L, S, is_causal, (left, right))。"""
    L, S = check_causal_args(L, S, align)
    window_size, is_causal = window
    is_causal = check_bool("is_causal", is_causal)
    return L, S, is_causal, check_window_size(window_size, is_causal)


def check_bool_mask(mask, dtype) -> None:
    """bool_to_additive 的参数：mask 是布尔张量，dtype 是能放下 -inf 的浮点 dtype。"""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        found = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a bool tensor (True = may attend), got {found}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating dtype (it has to hold -inf), got {dtype}")


def check_additive_mask(mask) -> torch.Tensor:
    """additive_to_bool 的参数：只含 0 和 -inf 的浮点张量；返回 -inf 的位置（mask 的形状，True = 盖住）。"""
    if not isinstance(mask, torch.Tensor) or not mask.is_floating_point():
        found = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a floating tensor of 0 and -inf, got {found}")
    hidden = torch.isneginf(mask)  # same shape as mask
    other = ~hidden & (mask != 0)
    if other.any():
        bad = mask[other][0].item()
        raise ValueError(
            f"mask has {int(other.sum())} entries that are neither 0 nor -inf (e.g. {bad}); "
            "such a bias cannot be expressed as a bool mask, pass the float mask to attention as it is"
        )
    return hidden


def check_lengths(lengths, S) -> tuple[list[int], int]:
    """padding_mask 的参数：lengths 是 B 个 0..S 的整数（列表或一维整数张量，不收 bytes / str），S >= 0；返回 (lengths, S)。"""
    if isinstance(lengths, torch.Tensor):
        if lengths.is_floating_point() or lengths.dtype == torch.bool:
            raise TypeError(
                f"lengths must be a 1-D integer tensor or a list of ints, got dtype {lengths.dtype}; "
                "convert with lengths.long()"
            )
        if lengths.ndim != 1:
            raise ValueError(
                f"lengths must be a 1-D integer tensor or a list of ints, got dtype {lengths.dtype} "
                f"and shape {tuple(lengths.shape)}"
            )
        values = [int(n) for n in lengths.tolist()]
    else:
        if isinstance(lengths, (numbers.Number, str, bytes, bytearray)) or not hasattr(lengths, "__iter__"):
            raise TypeError(
                f"lengths must be a sequence of B ints (one per sentence), got {lengths!r}; "
                f"for one sentence use [{lengths!r}]"
            )
        values = list(lengths)
        for n in values:
            if isinstance(n, bool) or not isinstance(n, numbers.Integral):
                raise TypeError(f"lengths must contain ints, got {n!r} in {values!r}")
        values = [int(n) for n in values]
    if not values:
        raise ValueError("lengths is empty: need one length per sentence in the batch")
    if min(values) < 0:
        raise ValueError(f"lengths must be >= 0, got {values}")
    S = max(values) if S is None else check_int("S", S, 0)
    if max(values) > S:
        raise ValueError(f"a length exceeds the padded length S={S}: lengths={values}")
    return values, S


def check_tiny_batch(ids, lengths, it_index, max_len: int | None) -> None:
    """TinyItModel.forward 的参数：ids (B, L) 整数，lengths 与 it_index (B,) 整数；正余弦表够长（L <= max_len）。"""
    for name, t, rank, layout in (("ids", ids, 2, "(B, L)"), ("lengths", lengths, 1, "(B,)"),
                                  ("it_index", it_index, 1, "(B,)")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape {layout}, got {type(t).__name__}")
        check_rank(name, t, rank, layout)
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers, got dtype {t.dtype}; convert with {name}.long()")
    B, L = ids.shape
    if lengths.shape[0] != B or it_index.shape[0] != B:
        raise ValueError(f"ids, lengths and it_index must have the same batch size B, got {B}, "
                         f"{lengths.shape[0]} and {it_index.shape[0]}")
    if max_len is not None and L > max_len:
        raise ValueError(f"ids has L={L} positions but the model's position table has max_len={max_len}; "
                         f"build the model with max_len >= {L}")
    if B and (int(lengths.min()) < 0 or int(lengths.max()) > L):
        raise ValueError(f"lengths must be in 0..L={L} (the real tokens of each padded sentence), got lengths from "
                         f"{int(lengths.min())} to {int(lengths.max())}")


def check_train_args(steps, batch_size, lr) -> tuple[int, int, float]:
    """tiny_model.train 的参数：steps >= 0、batch_size >= 1 的整数，lr 是有限的正数；返回规范化后的值。"""
    steps = check_int("steps", steps, 0)
    batch_size = check_int("batch_size", batch_size, 1)
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real):
        raise TypeError(f"lr must be a positive number, got {lr!r} ({type(lr).__name__})")
    if not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be finite and > 0, got {lr}")
    return steps, batch_size, float(lr)


def check_cache_append(cache, k, v) -> None:
    """KVCache.append 的入口检查：k (B, H, S, D)、v (B, H, S, Dv) 是同精度同设备的浮点张量，且与缓存相容。"""
    for name, t in (("k", k), ("v", v)):
        check_tensor_layout(name, t, "(B, H, S, D)")
        check_rank(name, t, 4, "(B, H, S, D)")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if k.dtype != v.dtype:
        raise TypeError(f"k and v must have the same dtype, got k={k.dtype}, v={v.dtype}; cast one, e.g. v.to(k.dtype)")
    if k.shape[:3] != v.shape[:3] or k.device != v.device:
        raise ValueError(
            f"k and v must share (B, H, S) and device: k is {tuple(k.shape)} on {k.device}, "
            f"v is {tuple(v.shape)} on {v.device}"
        )
    B, H, _, D = k.shape
    check_cache_fits(cache, (B, H, D, v.shape[-1]), k.dtype, k.device)


def check_cache_mask_args(cache, L, is_causal) -> int:
    """KVCache.attention_mask 的参数：is_causal 是 True / False，L 是 0 到缓存长度之间的整数；返回 int(L)。"""
    check_bool("is_causal", is_causal)
    L = check_int("L", L, 0)
    if L > len(cache):
        raise ValueError(
            f"L must be at most the number of cached positions S={len(cache)} (the new queries are the last L "
            f"cached positions), got {L}; append their keys and values first"
        )
    return L


__all__ = ["check_causal_args", "check_window_mask_args", "check_bool_mask", "check_additive_mask", "check_base", "check_sinusoidal_args", "check_rotary_args", "check_lengths", "check_tiny_batch",
           "check_train_args", "check_cache_append",
           "check_cache_mask_args"]
