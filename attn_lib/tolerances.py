"""第 1–13 章与全部测试共用：全书唯一一处容差表：每条快速路径与参考实现比较时用的 rtol / atol 都写在这里。

Every test and every notebook that compares a path (numpy, tiled CPU, fused multi-head,
Triton) with the float64 reference takes its tolerance from here, so a reader can see in
one place how close "equal" is for each precision.

- ``TOLERANCES[dtype]``: elementwise ``|a - b| <= atol + rtol * |b|`` against the float64
  reference, for inputs of unit scale (randn).
- ``FLASH_ERROR_RATIO``: a rule borrowed from flash-attn's tests for low precision: the fast
  path's max error may be at most this many times the max error of a naive path computed in the
  same low precision. flash-attn measures both errors against a float32 reference (its
  ``attention_ref(..., upcast=True)``); here the reference is float64, and ``FLASH_ERROR_FLOOR``
  (this book's addition) is added to the bound so that two errors near 0 are no failure.
- ``LSE_ATOL[dtype]``: absolute tolerance of a path's log-sum-exp (B, H, L) against the
  float64 one computed from the unrounded float64 inputs (so the 16-bit rows include the
  rounding of q and k to that precision).
- ``FLOAT32_ATOL``: the absolute bound a float32 output must also meet under the flash rule.
- ``GRAD_TOLERANCES[dtype]``: the same comparison for gradients (dq, dk, dv), whose sums over L
  and S round more than an output's; ``tolerance(dtype, kind="gradient")``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

# dtype name -> (rtol, atol). Keys are strings so numpy and torch dtypes share one table.
TOLERANCES: dict[str, dict[str, float]] = {
    "float64": {"rtol": 1e-10, "atol": 1e-12},
    "float32": {"rtol": 1e-5, "atol": 2e-6},
    "float16": {"rtol": 5e-3, "atol": 5e-3},
    "bfloat16": {"rtol": 4e-2, "atol": 4e-2},
}

# Gradients sum over L and S in an order each path chooses (and that a thread count changes), so their
# float32 rounding is larger than an output's: dtype name -> (rtol, atol) for dq, dk, dv against float64.
GRAD_TOLERANCES: dict[str, dict[str, float]] = {
    "float64": {"rtol": 1e-10, "atol": 1e-12},
    "float32": {"rtol": 1e-4, "atol": 1e-5},
    "float16": {"rtol": 1e-2, "atol": 1e-2},
    "bfloat16": {"rtol": 8e-2, "atol": 8e-2},
}

# Not numbers of a path but of a measurement: a browser's layout rounds lengths to fractions of a pixel, and an
# asymptotic ratio of the IO model is "at its limit" once two successive sizes agree to within 2 %.
LAYOUT_PX = 0.5
ASYMPTOTE_RTOL = 0.02

FLASH_ERROR_RATIO = 2.0
FLASH_ERROR_FLOOR = 1e-5
FLOAT32_ATOL = 1e-5

# dtype name -> atol for log-sum-exp values against float64 (inputs rounded to the dtype).
LSE_ATOL: dict[str, float] = {
    "float64": 1e-12,
    "float32": 1e-4,
    "float16": 3e-2,
    "bfloat16": 3e-2,
}


def lse_atol(dtype: Any) -> float:
    """取某个精度下 log-sum-exp 的绝对容差（见 LSE_ATOL）。

    Args:
        dtype: a torch or numpy floating dtype, or its name.
    """
    name = dtype_name(dtype)
    if name not in LSE_ATOL:
        raise KeyError(f"no log-sum-exp tolerance for dtype {name}; known: {sorted(LSE_ATOL)}")
    return LSE_ATOL[name]


def dtype_name(dtype: Any) -> str:
    """把 torch / numpy 的 dtype 统一成 'float32' 这样的名字。"""
    name = str(dtype)
    return name.replace("torch.", "")


def tolerance(dtype: Any, *, kind: str = "output") -> dict[str, float]:
    """取某个精度的容差，返回 {'rtol': ..., 'atol': ...}（kind="gradient" 时取梯度的那一张表）。

    Args:
        dtype: a torch or numpy floating dtype (or its name, e.g. ``"float16"``).
        kind: ``"output"`` (TOLERANCES) or ``"gradient"`` (GRAD_TOLERANCES).
    """
    name = dtype_name(dtype)
    table = {"output": TOLERANCES, "gradient": GRAD_TOLERANCES}[kind]
    if name not in table:
        raise KeyError(f"no {kind} tolerance for dtype {name}; known: {sorted(table)}")
    return dict(table[name])


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if str(x.dtype) in ("torch.bfloat16", "torch.float16"):
            x = x.float()
        return x.double().numpy()
    return np.asarray(x, dtype=np.float64)


def max_abs_error(actual: Any, expected: Any) -> float:
    """两个数组（torch 或 numpy）之间的最大绝对误差，按 float64 计算。

    Args:
        actual, expected: arrays or tensors of the same shape.

    Returns:
        ``max |actual - expected|`` as a float (0.0 for empty arrays).
    """
    a, e = _to_numpy(actual), _to_numpy(expected)
    if a.shape != e.shape:
        raise ValueError(f"shapes differ: actual {a.shape} vs expected {e.shape}")
    return float(np.max(np.abs(a - e))) if a.size else 0.0


def assert_close(actual: Any, expected: Any, *, dtype: Any = None, what: str = "output", kind: str = "output") -> None:
    """断言 actual 与 expected 在 ``dtype`` 精度的容差内一致，不一致时报出最大误差和位置。

    Args:
        actual: the fast path's result (torch tensor or numpy array).
        expected: the reference result, usually computed in float64.
        dtype: the precision the fast path ran in; defaults to ``actual``'s dtype.
        what: a name for the message.
        kind: ``"output"`` or ``"gradient"`` (which table, see ``tolerance``).
    """
    tol = tolerance(dtype if dtype is not None else actual.dtype, kind=kind)
    a, e = _to_numpy(actual), _to_numpy(expected)
    if a.shape != e.shape:
        raise AssertionError(f"{what}: shapes differ, actual {a.shape} vs expected {e.shape}")
    bad = ~np.isclose(a, e, rtol=tol["rtol"], atol=tol["atol"], equal_nan=False)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        err = float(np.max(np.abs(a - e)))
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {a.size} elements differ beyond rtol={tol['rtol']}, "
            f"atol={tol['atol']}; max abs error {err:.3e}; first at {idx}: "
            f"actual {a[idx]!r} vs expected {e[idx]!r}"
        )


def assert_flash_rule(fast: Any, naive_same_precision: Any, reference: Any, *, what: str = "output",
                      kind: str = "output") -> None:
    """借自 flash-attn 测试的规则：快速路径的误差不超过同精度朴素实现误差的 FLASH_ERROR_RATIO 倍（梯度再加上存成这种精度时的一次舍入）。

    Args:
        fast: the fast path's output (or gradient) in low precision.
        naive_same_precision: a naive attention (or its autograd gradient) computed in the same low precision.
        reference: the float64 reference.
        kind: ``"gradient"`` also allows FLASH_ERROR_RATIO x the error of the reference rounded to
            ``fast``'s dtype: a gradient is rounded when it is stored, so a tie within one rounding is
            no failure (flash-attn's backward tests add the same kind of term).
    """
    fast_err = max_abs_error(fast, reference)
    naive_err = max_abs_error(naive_same_precision, reference)
    if kind == "gradient":
        naive_err += max_abs_error(reference.to(fast.dtype), reference)
    bound = FLASH_ERROR_RATIO * naive_err + FLASH_ERROR_FLOOR
    if not fast_err <= bound:
        raise AssertionError(
            f"{what}: fast-path error {fast_err:.3e} exceeds {FLASH_ERROR_RATIO} x naive error "
            f"{naive_err:.3e} (+{FLASH_ERROR_FLOOR:g})"
        )
