"""The tolerance tables' helpers (attn_lib.tolerances) pass what is close and fail what is not: assert_close for
outputs and gradients, tolerance, lse_atol, max_abs_error, assert_flash_rule."""
import numpy as np
import pytest
import torch

from attn_lib.tolerances import (FLASH_ERROR_FLOOR, FLASH_ERROR_RATIO, GRAD_TOLERANCES, LSE_ATOL, TOLERANCES,
                                 assert_close, assert_flash_rule, lse_atol, max_abs_error, tolerance)

DTYPES = ("float64", "float32", "float16", "bfloat16")


def test_tolerance_helpers_can_fail():
    a = torch.ones(3, dtype=torch.float32)
    assert_close(a, a.double())
    with pytest.raises(AssertionError, match="differ beyond"):
        assert_close(a + 1e-3, a.double())
    assert tolerance(torch.float16)["atol"] > tolerance(torch.float32)["atol"] > tolerance("float64")["atol"]
    ref = torch.zeros(4, dtype=torch.float64)
    assert_flash_rule(ref + 1e-3, ref + 1e-3, ref)
    with pytest.raises(AssertionError, match="exceeds"):
        assert_flash_rule(ref + 1e-2, ref + 1e-3, ref)


@pytest.mark.parametrize("name", DTYPES)
def test_tolerance_reads_the_tables_for_torch_numpy_and_names(name):
    torch_dtype = getattr(torch, name)
    assert tolerance(name) == tolerance(torch_dtype) == TOLERANCES[name]
    assert tolerance(torch_dtype, kind="gradient") == GRAD_TOLERANCES[name]
    assert tolerance(name, kind="output") == TOLERANCES[name]
    if name in ("float64", "float32", "float16"):
        assert tolerance(np.dtype(name)) == TOLERANCES[name]
    got = tolerance(name)
    got["rtol"] = -1.0  # a copy: changing it leaves the table alone
    assert TOLERANCES[name]["rtol"] != -1.0
    assert lse_atol(torch_dtype) == LSE_ATOL[name]


@pytest.mark.parametrize("name", DTYPES)
def test_gradients_are_allowed_at_least_the_output_tolerance(name):
    out, grad = TOLERANCES[name], GRAD_TOLERANCES[name]
    assert grad["rtol"] >= out["rtol"] and grad["atol"] >= out["atol"]


def test_unknown_dtype_or_kind_is_refused():
    with pytest.raises(KeyError, match="no output tolerance for dtype int32"):
        tolerance(torch.int32)
    with pytest.raises(KeyError, match="no gradient tolerance"):
        tolerance("float8", kind="gradient")
    with pytest.raises(KeyError):
        tolerance(torch.float32, kind="weights")
    with pytest.raises(KeyError, match="no log-sum-exp tolerance"):
        lse_atol(torch.int64)


def test_assert_close_kind_gradient_uses_the_gradient_table():
    ref = torch.ones(5, dtype=torch.float64)
    out_tol, grad_tol = TOLERANCES["float32"], GRAD_TOLERANCES["float32"]
    between = (out_tol["atol"] + out_tol["rtol"] + grad_tol["atol"] + grad_tol["rtol"]) / 2  # past one, within the other
    got = (ref + between).float()
    with pytest.raises(AssertionError, match="differ beyond"):
        assert_close(got, ref)
    assert_close(got, ref, kind="gradient")
    with pytest.raises(AssertionError, match="dq"):
        assert_close((ref + 2 * (grad_tol["atol"] + grad_tol["rtol"])).float(), ref, kind="gradient", what="dq")


def test_assert_close_uses_the_given_dtype_and_reports_shapes():
    ref = torch.zeros(3, dtype=torch.float64)
    loose = ref + TOLERANCES["float16"]["atol"] / 2
    assert_close(loose, ref, dtype=torch.float16)
    with pytest.raises(AssertionError, match="differ beyond"):
        assert_close(loose, ref)  # float64's own table
    with pytest.raises(AssertionError, match="shapes differ"):
        assert_close(torch.zeros(2), torch.zeros(3))
    with pytest.raises(AssertionError):
        assert_close(torch.tensor([float("nan")]), torch.tensor([float("nan")]))  # nan is never close


def test_max_abs_error():
    assert max_abs_error(torch.tensor([1.0, -2.0]), np.array([1.5, 0.0])) == 2.0
    assert max_abs_error(torch.zeros(0), torch.zeros(0)) == 0.0
    assert max_abs_error(torch.tensor([1.0], dtype=torch.bfloat16), torch.tensor([1.0])) == 0.0
    with pytest.raises(ValueError, match="shapes differ"):
        max_abs_error(torch.zeros(2), torch.zeros(3))


def test_flash_rule_bound_is_ratio_times_naive_error_plus_floor():
    ref = torch.zeros(4, dtype=torch.float64)
    naive_err = 1e-3
    bound = FLASH_ERROR_RATIO * naive_err + FLASH_ERROR_FLOOR
    assert_flash_rule(ref + bound, ref + naive_err, ref)  # exactly at the bound: allowed
    just_above = float(np.nextafter(bound, np.inf))
    with pytest.raises(AssertionError, match="exceeds"):
        assert_flash_rule(ref + just_above, ref + naive_err, ref)
