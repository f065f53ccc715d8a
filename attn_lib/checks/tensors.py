"""第 3–13 章共用（书中不单独讲）：张量和数组本身的检查——类型、浮点精度、nan / inf，以及注意力的全部输入。"""
from __future__ import annotations

from typing import Any

from .shapes import check_mask_shape, check_qkv_shapes, check_same_device, check_same_dtype
from .values import check_bool, check_dim, check_scale

_FLOAT_NAMES = "float16/bfloat16/float32/float64"


def check_tensor(name: str, x: Any, *, none_ok: bool = False, twin: str = "") -> None:
    """检查参数是 torch 张量（none_ok 时也收 None）；一种措辞，全库通用（twin：numpy 版里对应的函数名）。"""
    import torch

    if isinstance(x, torch.Tensor) or (none_ok and x is None):
        return
    expected = "a torch.Tensor or None" if none_ok else "a torch.Tensor"
    remedy = f"for numpy arrays use attn_lib.core.numpy_ref.{twin}" if twin else f"convert it with torch.as_tensor({name})"
    raise TypeError(f"{name} must be {expected}, got {type(x).__name__}; {remedy}")


def check_float_tensor(name: str, x: Any, *, twin: str = "") -> None:
    """检查参数是浮点 torch 张量（float16/bfloat16/float32/float64）。"""
    check_tensor(name, x, twin=twin)
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor ({_FLOAT_NAMES}), got {x.dtype}; "
                        f"convert with {name}.float()")


def check_float_array(name: str, x: Any):
    """numpy 版：检查参数是浮点 numpy 数组；返回它。"""
    import numpy as np

    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(x).__name__}; wrap it with np.asarray")
    if x.dtype.kind != "f":
        raise TypeError(f"{name} must be a floating-point array (float16/float32/float64), got {x.dtype}; "
                        f"convert with {name}.astype(np.float64)")
    return x


def all_finite(t: Any) -> bool:
    """张量里是否没有 nan / inf：先求一次和（任何 nan/inf 都会让和不有限），只有和本身溢出时才逐元素检查。

    One reduction in the tensor's own precision (float32 for float16 / bfloat16), one host
    sync on CUDA; the elementwise scan runs only when the sum is not finite. Works on numpy
    arrays too.
    """
    if not hasattr(t, "is_floating_point"):  # numpy
        import numpy as np

        return bool(np.isfinite(t).all())
    import torch

    from ..rules.numerics import work_dtype

    t = t.detach()  # a check, not part of the graph
    return bool(torch.isfinite(t.sum(dtype=work_dtype(t.dtype)))) or bool(torch.isfinite(t).all())


def check_on_q_device(name: str, x: Any, device) -> None:
    """张量 x 必须和 q 在同一个设备上（掩码、长度、保存的结果共用这一句报错）。"""
    import torch

    if str(x.device) != str(torch.device(device)):
        raise ValueError(f"{name} must be on q's device {device}, got {x.device}; move it with {name}.to(q.device)")


def check_all_finite(name: str, t: Any) -> None:
    """检查 q、k、v 之类的输入没有 nan / inf（一次归约）；有就报 ValueError，torch 和 numpy 同一句话。"""
    if _numel(t) and not all_finite(t):
        raise ValueError(
            f"{name} contains nan or inf; attention would turn it into nan. "
            "Check the layer that produced it (masks belong in `mask`, not in q/k/v)."
        )


def _numel(t: Any) -> int:
    return int(t.numel()) if callable(getattr(t, "numel", None)) else int(t.size)


def check_scores_finite(x: Any, name: str = "x") -> None:
    """评分里允许 -inf（表示被盖住），不允许 nan 和 +inf；违反时报 ValueError（torch 或 numpy）。"""
    import numpy as np

    if hasattr(x, "is_floating_point"):
        import torch

        n_nan, n_inf = int(torch.isnan(x).sum()), int(torch.isposinf(x).sum())
    else:
        n_nan, n_inf = int(np.isnan(x).sum()), int(np.isposinf(x).sum())
    if n_nan or n_inf:
        raise ValueError(
            f"{name} contains {n_nan} nan and {n_inf} +inf entries; softmax of such a row is undefined. "
            "Only -inf is allowed (it means 'masked')."
        )


def check_score_row(x: Any) -> None:
    """检查一行（或一批行）评分：浮点 torch 张量，至少一维（最后一维是那一行），只许 -inf，不许 nan / +inf。"""
    check_float_tensor("x", x)
    if x.ndim == 0:
        raise ValueError("x must have at least one axis (the row to normalise is the last one)")
    if x.numel():
        check_scores_finite(x)


def check_softmax_input(x: Any, dim: Any, *, twin: str = "softmax") -> int:
    """softmax 的门：x 是浮点 torch 张量，dim 是它的一个轴；返回非负的轴号（nan / +inf 在算完之后才查，只查有问题的行）。"""
    check_float_tensor("x", x, twin=twin)
    return check_dim(x, dim)


def check_softmax_array(x: Any, dim: Any) -> int:
    """numpy 版 softmax 的门：x 是浮点 numpy 数组，dim 是它的一个轴，只许 -inf；返回非负的轴号。"""
    check_float_array("x", x)
    dim = check_dim(x, dim)
    if x.size:
        check_scores_finite(x)
    return dim


def check_row_max(x: Any, m: Any) -> None:
    """用每行的最大值 m 检查整行：m 是 nan 或 +inf，说明这一行里有 nan 或 +inf，报 ValueError（一次同步）。"""
    import torch

    if m.numel() and not bool(torch.isfinite(m).logical_or(torch.isneginf(m)).all()):
        check_scores_finite(x)


def _check_mask_rank(mask: Any, name: str) -> None:
    if mask.ndim == 3:
        raise ValueError(
            f"{name} must be 2-D (L, S) or 4-D (B, H, L, S) (axes of size 1 broadcast), got 3-D with shape "
            f"{tuple(int(s) for s in mask.shape)}; for one pattern per sequence (B, L, S) use "
            f"{name}.unsqueeze(1), for one per head (H, L, S) use {name}[None]"
        )


def check_mask(mask: Any, target: tuple, device, *, check_finite: bool, name: str = "mask") -> None:
    """检查掩码：torch 张量、布尔或浮点、与 q 同设备、能广播到评分矩阵的形状；浮点掩码不许有 nan / +inf。

    Args:
        mask: bool (True = may attend) or additive float tensor.
        target: the shape it must broadcast to, usually the scores' (B, H, L, S).
        device: q's device.
        check_finite: also reduce a float mask once to look for nan / +inf.
        name: the argument's name for the messages.
    """
    import torch

    check_tensor(name, mask, none_ok=True)
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(
            f"{name} must be bool (True = may attend) or float (added to the scores), got {mask.dtype}; "
            f"for a 0/1 mask use {name}.bool()"
        )
    check_on_q_device(name, mask, device)
    check_mask_shape(mask, target)
    top = mask.amax() if check_finite and mask.is_floating_point() and mask.numel() else None  # nan propagates
    if top is not None and bool(torch.isnan(top) | torch.isposinf(top)):
        raise ValueError(f"an additive float {name} may contain -inf (hidden) but not nan or +inf")


def check_attention_inputs(q, k, v, mask, options, *, refuse_3d_mask: bool = False, gqa_keyword: bool = True,
                           names: tuple = ("q", "k", "v")):
    """检查 attention 的全部输入（q、k、v、mask，以及 options 里的 scale、check_finite、enable_gqa），返回 (B, H, L, S, D, Dv) 和规范化后的 scale。

    Args:
        q, k, v: (B, H, L, D), (B, H_kv, S, D), (B, H_kv, S, Dv) float tensors of one dtype and device
            (H_kv = H unless ``options.enable_gqa``).
        mask: None, or a bool / float tensor broadcastable to (B, H, L, S).
        options: an ``attn_lib.rules.settings.Options`` whose ``scale`` (None or a positive
            finite number), ``check_finite`` and ``enable_gqa`` are read. ``check_finite`` also
            scans q, k, v (and a float mask) for nan / inf: the only part that reads the data (on
            CUDA: a host sync); False when the caller knowingly skips it.
        refuse_3d_mask: refuse a 3-D mask (ambiguous: (B, L, S) or (H, L, S)).
        gqa_keyword: False when the caller has no ``enable_gqa`` keyword (``enable_gqa`` is then
            not read).
        names: the three arguments' names for the messages.

    Returns:
        ``((B, H, L, S, D, Dv), scale)`` with ``scale`` a float or None.
    """
    for name, t in zip(names, (q, k, v)):
        check_float_tensor(name, t, twin="attention")
    check_same_dtype(names, (q.dtype, k.dtype, v.dtype))
    check_same_device(names, (q, k, v))
    gqa = check_bool("enable_gqa", options.enable_gqa) if gqa_keyword else False
    dims = check_qkv_shapes(q, k, v, enable_gqa=gqa, gqa_keyword=gqa_keyword, names=names)
    B, H, L, S, _, _ = dims
    if check_bool("check_finite", options.check_finite):
        for name, t in zip(names, (q, k, v)):
            check_all_finite(name, t)
    if mask is not None:
        if refuse_3d_mask:
            _check_mask_rank(mask, "mask")
        check_mask(mask, (B, H, L, S), q.device, check_finite=options.check_finite)
    return dims, check_scale(options.scale)


def check_attention_arrays(q, k, v, mask=None, scale=None, is_causal=False):
    """numpy 版 attention 的门：与 check_attention_inputs 同样的检查、同样的报错，再加 is_causal；返回（(B, H, L, S, D, Dv), scale, mask 数组或 None）。"""
    import numpy as np

    check_bool("is_causal", is_causal)
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float_array(name, t)
    check_same_dtype(("q", "k", "v"), (q.dtype, k.dtype, v.dtype))
    dims = check_qkv_shapes(q, k, v, gqa_keyword=False)
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_all_finite(name, t)
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != bool and mask.dtype.kind != "f":
            raise TypeError(f"mask must be bool (True = may attend) or float (added to the scores), got "
                            f"{mask.dtype}; for a 0/1 mask use mask.astype(bool)")
        _check_mask_rank(mask, "mask")
        check_mask_shape(mask, (dims[0], dims[1], dims[2], dims[3]))  # (B, H, L, S)
        if mask.dtype.kind == "f" and (np.isnan(mask).any() or np.isposinf(mask).any()):
            raise ValueError("an additive float mask may contain -inf (hidden) but not nan or +inf")
    return dims, check_scale(scale), mask
