"""第 3–13 章共用（书中不单独讲）：标量参数的检查——开关、大小、缩放系数、滑动窗口、对齐、选项、轴。"""
from __future__ import annotations

import math
import numbers
from typing import Any

from ..rules.names import ALIGNMENTS


def check_bool(name: str, value: Any) -> bool:
    """检查开关参数必须是 True 或 False（不把 "no"、1 之类当真），返回它（numpy 的 np.bool_ 也收，返回 bool）。"""
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
        return bool(value)
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def _is_integral(value: Any) -> bool:
    if isinstance(value, numbers.Integral):
        return True
    # a 0-d torch tensor / numpy array of an integer dtype
    dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
    return dtype is not None and shape is not None and len(shape) == 0 and "int" in str(dtype)


def check_int(name: str, value: Any, minimum: int = 1) -> int:
    """检查大小参数（块大小、头数、长度）：必须是整数且 >= minimum；类型不对报 TypeError，值不对报 ValueError。

    Args:
        name: the argument's name for the message.
        value: an int or an integral numpy / torch scalar (bool is refused).
        minimum: the smallest allowed value.

    Returns:
        ``int(value)``.
    """
    expected = "a positive int" if minimum == 1 else f"an int >= {minimum}"
    if isinstance(value, bool) or not _is_integral(value):
        hint = f"; use int({value!r})" if isinstance(value, float) and value.is_integer() else ""
        raise TypeError(f"{name} must be {expected}, got {value!r} ({type(value).__name__}){hint}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be {expected}, got {value}")
    return value


def check_counts(**sizes: Any) -> None:
    """检查几个计数参数（可以是 0）：每个都是 >= 0 的整数，如 ``check_counts(B=B, L=L)``。"""
    for name, value in sizes.items():
        check_int(name, value, 0)


def check_positive_int(name: str, value: Any) -> int:
    """检查正整数参数（块大小、头数、长度）：``check_int(name, value, 1)``；返回 int。"""
    return check_int(name, value, 1)


def _numel(x: Any) -> int:
    n = 1
    for s in x.shape:
        n *= int(s)
    return n


def check_scale(scale: Any) -> float | None:
    """检查缩放系数：None 或一个有限的正实数；返回 float（或 None），每条路径都用这一条规则。

    Accepted: a Python int/float, a numpy real scalar, a 0-d numpy array or a one-element
    torch tensor *without* ``requires_grad`` (scale is a constant, not a parameter: no path
    differentiates with respect to it). Refused: str, bool, complex, a tensor that requires grad.

    Args:
        scale: None (use 1/sqrt(D)) or a positive finite number.

    Returns:
        ``float(scale)`` or None.
    """
    if scale is None:
        return None
    if getattr(scale, "requires_grad", False):
        raise TypeError(
            "scale is not differentiable: got a tensor with requires_grad=True, and its gradient would be "
            "silently dropped. Pass a plain number (scale=float(s.detach())), or multiply q by the "
            "learnable factor yourself (attention(q * s, k, v, scale=1.0)) so autograd sees it."
        )
    value = None
    if isinstance(scale, numbers.Real) and not isinstance(scale, bool):
        value = float(scale)
    elif hasattr(scale, "dtype") and hasattr(scale, "shape") and _numel(scale) == 1:
        kind = str(scale.dtype)
        if not any(w in kind for w in ("bool", "complex")) and any(w in kind for w in ("float", "int")):
            value = float(scale.reshape(()) if hasattr(scale, "reshape") else scale)
    if value is None:
        raise TypeError(
            f"scale must be a positive number or None, got {scale!r} ({type(scale).__name__}); "
            "e.g. scale=0.125, or leave it as None for 1/sqrt(D)."
        )
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"scale must be finite and > 0, got {value}. Leave it as None for the usual 1/sqrt(D)."
        )
    return value


def check_window_size(window_size: Any, is_causal: bool = False) -> tuple[int, int]:
    """检查滑动窗口 window_size=(left, right)：None（不加窗口），或两个 >= -1 的整数（元组或列表），-1 表示那一侧不限；因果时 right 只能是 0 或 -1。

    flash-attn's meaning: query i sees key j iff ``i + offset - left <= j <= i + offset + right``
    (offset: the alignment, 0 top-left, S - L bottom-right). A side wider than any sequence is
    allowed (it limits nothing); ``attn_lib.rules.band.Band.resolve`` keeps the numbers small.

    Returns:
        ``(left, right)`` as ints; ``(-1, -1)`` for None.
    """
    if window_size is None:
        return -1, -1
    example = "e.g. window_size=(256, 0) for 256 keys back and none ahead, or (-1, -1) for no window"
    if not isinstance(window_size, (tuple, list)):
        raise TypeError(f"window_size must be a pair (left, right) of ints, as a tuple or list, or None, got "
                        f"{window_size!r} ({type(window_size).__name__}); {example}")
    if len(window_size) != 2:
        raise ValueError(f"window_size must be a pair (left, right) of ints, got {len(window_size)} values "
                         f"{tuple(window_size)!r}; {example}")
    for side in window_size:
        if isinstance(side, bool) or not _is_integral(side):
            raise TypeError(f"window_size must be a pair (left, right) of ints, got {side!r} "
                            f"({type(side).__name__}) in {tuple(window_size)!r}; {example}")
    left, right = (int(side) for side in window_size)
    if left < -1 or right < -1:
        raise ValueError(f"window_size must be a pair of ints >= -1 (-1: unbounded on that side), got "
                         f"{(left, right)!r}; {example}")
    if is_causal and right not in (-1, 0):
        raise ValueError(f"window_size's right side must be 0 or -1 with is_causal=True (a causal query sees no "
                         f"later key), got {(left, right)!r}; pass window_size=({left}, 0), or is_causal=False "
                         "for a window that looks ahead")
    return left, right


def check_align(align: Any) -> str:
    """检查对齐方式 align：top-left（SDPA 的 is_causal）或 bottom-right（flash-attn 的 causal 和窗口）；返回它。"""
    if not isinstance(align, str):
        raise TypeError(f'align must be the string "top-left" or "bottom-right", got {align!r} '
                        f'({type(align).__name__}); "top-left" is SDPA\'s is_causal, "bottom-right" flash-attn\'s')
    if align not in ALIGNMENTS:
        raise ValueError(f'align must be "top-left" or "bottom-right", got {align!r}; "top-left" is SDPA\'s '
                         'is_causal (query i sees keys up to i), "bottom-right" flash-attn\'s (up to i + S - L)')
    return align


def check_choice(name: str, value: Any, choices: tuple) -> Any:
    """检查选项参数必须是 choices 之一（如 backend、kind），返回它；不是字符串报 TypeError，不在其中报 ValueError。"""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {choices}, got {value!r} ({type(value).__name__})")
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_dim(x: Any, dim: Any) -> int:
    """检查轴号：整数，且落在 x 的维数之内（0 维张量收 0 或 -1）；返回非负的轴号。"""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"dim must be an int, got {dim!r}")
    n = max(x.ndim, 1)  # a 0-D tensor takes dim 0 or -1, as in torch.softmax
    if not -n <= dim < n:
        kind = "tensor" if hasattr(x, "is_floating_point") else "array"
        raise ValueError(f"dim={dim} is out of range for a {x.ndim}-D {kind}; dim must be in [{-n}, {n - 1}]")
    return int(dim) % n


def check_last_dim(name: str, x: Any, expected: int, what: str) -> None:
    """检查最后一维的大小（比如隐藏层维度 d_model），不相等就报 ValueError。

    Args:
        name: the argument's name for the message.
        x: tensor or array (..., C).
        expected: the required size of the last axis.
        what: what ``expected`` is, for the message, e.g. ``"the layer's d_model"``.
    """
    if x.shape[-1] != expected:
        shape = tuple(int(s) for s in x.shape)
        raise ValueError(
            f"{name} has last dimension {int(x.shape[-1])} (shape {shape}), "
            f"but {what} is {expected}."
        )


def check_divisible(d_model: int, num_heads: int) -> int:
    """检查隐藏层维度能否被头数整除，返回每个头的维度 D = d_model // num_heads。"""
    d_model = check_positive_int("d_model", d_model)
    num_heads = check_positive_int("num_heads", num_heads)
    if d_model % num_heads:
        lo = d_model - d_model % num_heads
        raise ValueError(
            f"d_model={d_model} is not divisible by num_heads={num_heads}: the hidden size must be "
            f"split into {num_heads} equal heads. Choose d_model as a multiple of {num_heads} "
            f"(e.g. {lo or num_heads} or {lo + num_heads}) or a num_heads that divides {d_model}."
        )
    return d_model // num_heads
