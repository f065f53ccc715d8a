"""第 3–8 章共用（书中不单独讲）：输入检查，每条报错都说清是哪个参数、期望什么、实际拿到什么、怎么改。

Shared by every attention path (numpy, torch reference, multi-head, tiled, Triton), so the
same bad input gets the same message whichever path a reader calls. Works on anything with
``.shape`` and ``.ndim`` (torch tensors and numpy arrays); dtype checks are passed in by
the caller because numpy and torch spell dtypes differently.

One rule for the exception types, in every function here:

- ``TypeError``: the argument has the wrong *type* (a str where a number belongs, a float
  where a size belongs, a non-bool flag, mismatched dtypes);
- ``ValueError``: the type is right but the *value* is not (a size < 1, a shape that does
  not fit, a scale <= 0, nan / inf, scores that overflow).

Sizes are ``int`` or integral numpy / torch scalars (``np.int64(8)`` is accepted and
returned as ``8``); bool is refused. Public entry points check once and then call unchecked
cores (``attn_lib.reference._attention_core`` ...), so a layer does not re-check what it
already checked.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

OVERFLOW_MESSAGE = "attention scores overflowed to +inf"


def _shape(x: Any) -> tuple:
    return tuple(int(s) for s in x.shape)


def check_rank(name: str, x: Any, rank: int, layout: str) -> None:
    """检查张量的维数：``x`` 必须正好是 ``rank`` 维，否则报 ValueError（并提示怎么补轴）。

    Args:
        name: the argument's name for the message, e.g. ``"q"``.
        x: a torch tensor or numpy array.
        rank: the required number of axes.
        layout: the expected layout for the message, e.g. ``"(B, H, L, D)"``.
    """
    if x.ndim != rank:
        hint = ""
        if rank == 4 and x.ndim == 2:
            hint = f" For one sequence of one head, add the batch and head axes: {name}[None, None]."
        elif rank == 4 and x.ndim == 3:
            hint = f" For a single head, add the head axis: {name}.unsqueeze(1)."
        elif rank == 3 and x.ndim == 2:
            hint = f" For one sequence, add the batch axis: {name}.unsqueeze(0)."
        raise ValueError(
            f"{name} must be {rank}-D {layout}, got {x.ndim}-D with shape {_shape(x)}.{hint}"
        )


def check_qkv_shapes(q: Any, k: Any, v: Any) -> tuple[int, int, int, int, int, int]:
    """检查 q (B,H,L,D)、k (B,H,S,D)、v (B,H,S,Dv) 的形状是否相容，返回 (B, H, L, S, D, Dv)。

    Args:
        q: (B, H, L, D); k: (B, H, S, D); v: (B, H, S, Dv) (torch tensors or numpy arrays).

    Returns:
        ``(B, H, L, S, D, Dv)`` as ints.
    """
    check_rank("q", q, 4, "(B, H, L, D)")
    check_rank("k", k, 4, "(B, H, S, D)")
    check_rank("v", v, 4, "(B, H, S, Dv)")
    B, H, L, D = _shape(q)
    Bk, Hk, S, Dk = _shape(k)
    Bv, Hv, Sv, Dv = _shape(v)
    if (Bk, Hk) != (B, H) or (Bv, Hv) != (B, H):
        raise ValueError(
            "q, k and v must share batch and head sizes (B, H): "
            f"q has {(B, H)}, k has {(Bk, Hk)}, v has {(Bv, Hv)}."
        )
    if Dk != D:
        raise ValueError(
            f"q and k must have the same head dim D (last axis): q has D={D}, k has D={Dk}. "
            "Every query is compared with every key by a dot product, so their lengths must match."
        )
    if Sv != S:
        raise ValueError(
            f"k and v must have the same number of keys S (axis 2): k has S={S}, v has S={Sv}. "
            "Each key needs exactly one value."
        )
    if D == 0:
        raise ValueError("q and k have head dim D=0; attention needs D >= 1.")
    return B, H, L, S, D, Dv


def check_same_dtype(names: Sequence[str], dtypes: Sequence[Any]) -> None:
    """检查几个输入的精度是否相同，不同就报 TypeError。

    Args:
        names: the arguments' names, e.g. ``("q", "k", "v")``.
        dtypes: their dtypes (torch or numpy), in the same order.
    """
    if len(set(map(str, dtypes))) > 1:
        found = ", ".join(f"{n}={d}" for n, d in zip(names, dtypes))
        raise TypeError(
            f"{', '.join(names)} must have the same dtype, got {found}. "
            f"Cast them first, e.g. k = k.to({names[0]}.dtype)."
        )


def check_mask_shape(mask: Any, target: tuple) -> None:
    """检查掩码形状：必须能广播到分数的形状 (B, H, L, S)，且不能把它变大，否则报 ValueError。

    Args:
        mask: torch tensor or numpy array, e.g. (L, S), (B, 1, 1, S) or (B, H, L, S).
        target: the scores' shape ``(B, H, L, S)``.
    """
    shape = _shape(mask)
    if len(shape) > len(target):
        raise ValueError(
            f"mask has shape {shape} ({len(shape)}-D), more axes than the scores (B, H, L, S) = {target}."
        )
    padded = (1,) * (len(target) - len(shape)) + shape
    for m, t in zip(padded, target):
        if m != t and m != 1:
            raise ValueError(
                f"mask has shape {shape}, which does not broadcast to the scores' shape "
                f"(B, H, L, S) = {target}. Each mask axis must equal the scores' axis or be 1; "
                "e.g. (L, S), (B, 1, 1, S) for key padding, or (B, H, L, S)."
            )


def check_scale(scale: Any) -> float | None:
    """检查缩放系数：None 或一个有限的正实数；返回 float（或 None），否则报 TypeError / ValueError。

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


def _numel(x: Any) -> int:
    n = 1
    for s in x.shape:
        n *= int(s)
    return n


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


def _is_integral(value: Any) -> bool:
    if isinstance(value, numbers.Integral):
        return True
    # a 0-d torch tensor / numpy array of an integer dtype
    dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
    return dtype is not None and shape is not None and len(shape) == 0 and "int" in str(dtype)


def check_positive_int(name: str, value: Any) -> int:
    """检查正整数参数（块大小、头数、长度）：``check_int(name, value, 1)``；返回 int。

    Args:
        name: the argument's name for the message.
        value: the value to check (bool is refused).

    Returns:
        ``int(value)``.
    """
    return check_int(name, value, 1)


def check_last_dim(name: str, x: Any, expected: int, what: str) -> None:
    """检查最后一维的大小（比如隐藏层维度 d_model），不相等就报 ValueError。

    Args:
        name: the argument's name for the message.
        x: tensor or array (..., C).
        expected: the required size of the last axis.
        what: what ``expected`` is, for the message, e.g. ``"the layer's d_model"``.
    """
    if x.shape[-1] != expected:
        raise ValueError(
            f"{name} has last dimension {int(x.shape[-1])} (shape {_shape(x)}), "
            f"but {what} is {expected}."
        )


def check_divisible(d_model: int, num_heads: int) -> int:
    """检查隐藏层维度能否被头数整除，返回每个头的维度 D = d_model // num_heads。

    Args:
        d_model: hidden size C (positive int).
        num_heads: H (positive int).

    Returns:
        The head dim ``D = C // H``.
    """
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


def check_bool(name: str, value: Any) -> bool:
    """检查开关参数必须是 True 或 False（不把 "no"、1 之类当真），返回它（numpy 的 np.bool_ 也收，返回 bool）。"""
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
        return bool(value)
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def overflow_error(dtype: Any) -> ValueError:
    """分数溢出成 +inf 时所有路径共用的报错（消息开头固定，见 OVERFLOW_MESSAGE）。

    Args:
        dtype: the working dtype in which the scores overflowed (torch or numpy).

    Returns:
        The ``ValueError`` to raise.
    """
    name = str(dtype).replace("torch.", "")
    return ValueError(
        f"{OVERFLOW_MESSAGE} (|scale·q·k| exceeds the range of {name}); "
        "compute in float64 or use a smaller scale"
    )


def all_finite(t: Any) -> bool:
    """张量里是否没有 nan / inf：先求一次和（任何 nan/inf 都会让和不有限），只有和本身溢出时才逐元素检查。

    One reduction in the tensor's own precision (float32 for float16 / bfloat16), one host
    sync on CUDA; the elementwise scan runs only when the sum is not finite.
    """
    import torch

    acc = torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else None
    return bool(torch.isfinite(t.sum(dtype=acc))) or bool(torch.isfinite(t).all())
