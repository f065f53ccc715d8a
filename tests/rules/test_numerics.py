"""The numeric rules (attn_lib.rules.numerics): working dtype, default scale, base-2 factors, the overflow message,
autocast, and Triton's dot precision, against the rules as the module states them and against torch / math."""
import math

import numpy as np
import pytest
import torch

from attn_lib.rules.numerics import (FLOAT32_MAX, LN2, LOG2E, OVERFLOW_MESSAGE, autocast_off, base2_factor, dot_fp32,
                                     dot_input_precision, overflow_error, projection_dtype, resolve_scale, work_dtype)
from attn_lib.tolerances import assert_close


@pytest.mark.parametrize("dtype,want", [(torch.float64, torch.float64), (torch.float32, torch.float32),
                                        (torch.float16, torch.float32), (torch.bfloat16, torch.float32)])
def test_work_dtype_keeps_float64_and_computes_everything_else_in_float32(dtype, want):
    assert work_dtype(dtype) is want


@pytest.mark.parametrize("dtype,want", [("float64", "float64"), ("float32", "float32"), ("float16", "float32")])
def test_work_dtype_of_a_numpy_dtype_is_a_numpy_dtype(dtype, want):
    got = work_dtype(np.dtype(dtype))
    assert isinstance(got, np.dtype) and got == np.dtype(want)


def test_the_constants_are_what_their_names_say():
    assert LOG2E == math.log2(math.e) and LN2 == math.log(2)
    assert FLOAT32_MAX == torch.finfo(torch.float32).max
    assert OVERFLOW_MESSAGE == "attention scores overflowed"


@pytest.mark.parametrize("D", [1, 3, 16, 64, 255])
def test_resolve_scale_defaults_to_one_over_sqrt_d(D):
    assert resolve_scale(None, D) == 1 / math.sqrt(D)


@pytest.mark.parametrize("scale", [0.7, 2, np.float32(0.5), 1e-30])
def test_resolve_scale_keeps_a_given_scale_as_a_float(scale):
    got = resolve_scale(scale, 16)
    assert type(got) is float and got == float(scale)


@pytest.mark.parametrize("scale", [0.125, 1.0, 1e30, FLOAT32_MAX / 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_base2_factor_folds_log2e_into_the_scale_when_it_fits(scale, dtype):
    a, b = base2_factor(scale, dtype)
    assert (a, b) == (scale * math.log2(math.e), 1.0)


@pytest.mark.parametrize("scale", [FLOAT32_MAX * 0.9, FLOAT32_MAX])
def test_base2_factor_splits_the_product_near_float32_max(scale):
    a, b = base2_factor(scale, torch.float32)
    assert (a, b) == (scale, math.log2(math.e))
    # each factor fits float32, and a valid score (|scale·q·k·log2 e| < float32 max) stays finite on the way
    a32, b32 = torch.tensor(a, dtype=torch.float32), torch.tensor(b, dtype=torch.float32)
    assert bool(torch.isfinite(a32)) and bool(torch.isfinite(b32))
    dots = torch.tensor([0.5, -0.5, 1e-3], dtype=torch.float32)  # q·k of three scores
    scores = (dots * a32) * b32
    assert bool(torch.isfinite(scores).all())
    want = dots.double() * scale * math.log2(math.e)
    assert_close(scores, want, dtype=torch.float32, what="split base-2 scores")
    folded = dots * torch.tensor(scale * math.log2(math.e), dtype=torch.float32)  # what folding would give
    assert not bool(torch.isfinite(folded).all())


@pytest.mark.parametrize("dtype", [torch.float64, np.dtype("float64"), "float64"])
def test_base2_factor_folds_in_float64_whatever_the_scale(dtype):
    assert base2_factor(FLOAT32_MAX, dtype) == (FLOAT32_MAX * math.log2(math.e), 1.0)


@pytest.mark.parametrize("to", ["+inf", "-inf", "±inf"])
@pytest.mark.parametrize("dtype,name", [(torch.float32, "float32"), (torch.bfloat16, "bfloat16"),
                                        (np.dtype("float64"), "float64")])
def test_overflow_error_names_the_direction_and_the_dtype(to, dtype, name):
    err = overflow_error(dtype, to)
    assert type(err) is ValueError
    text = str(err)
    assert text.startswith(f"{OVERFLOW_MESSAGE} to {to} ")
    assert f"range of {name})" in text and "torch." not in text
    assert "float64" in text.split(";")[1]  # the remedy


def test_overflow_error_says_plus_inf_by_default():
    assert str(overflow_error(torch.float16)).startswith(f"{OVERFLOW_MESSAGE} to +inf ")


def test_projection_dtype_without_autocast_is_the_parameter_dtype():
    for dtype in (torch.float32, torch.float16, torch.float64):
        assert projection_dtype(dtype, "cpu") is dtype
        assert projection_dtype(dtype, torch.device("meta")) is dtype  # a device type autocast does not know


@pytest.mark.parametrize("cast", [torch.bfloat16, torch.float16])
def test_projection_dtype_under_autocast_is_autocast_dtype_except_for_float64(cast):
    with torch.autocast("cpu", dtype=cast):
        assert projection_dtype(torch.float32, "cpu") is cast
        assert projection_dtype(torch.float32, torch.device("cpu")) is cast
        assert projection_dtype(torch.float64, "cpu") is torch.float64
        assert projection_dtype(torch.float32, "meta") is torch.float32  # autocast is on for cpu only
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == cast  # autocast really is on: what torch does
    assert projection_dtype(torch.float32, "cpu") is torch.float32


def test_autocast_off_turns_autocast_off_inside_and_back_on_after():
    a = torch.ones(2, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with autocast_off("cpu"):
            assert (a @ a).dtype == torch.float32
            assert not torch.is_autocast_enabled("cpu")
        assert (a @ a).dtype == torch.bfloat16
        with autocast_off(torch.device("meta")):  # another device type: cpu's autocast stays on
            assert (a @ a).dtype == torch.bfloat16
    with autocast_off("cpu"):  # autocast off already: nothing changes
        assert (a @ a).dtype == torch.float32 and not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("dtype,capability,interpret,want", [
    (torch.float16, (7, 5), False, False),
    (torch.bfloat16, (7, 5), False, True),  # bfloat16 before sm_80
    (torch.bfloat16, (8, 0), False, False),
    (torch.bfloat16, (9, 0), False, False),
    (torch.bfloat16, None, False, False),  # no GPU capability known
    (torch.float32, (7, 5), False, False),
    (torch.float16, None, True, True),  # the interpreter: always fp32 dots
    (torch.bfloat16, (9, 0), True, True),
])
def test_dot_fp32_under_the_interpreter_and_for_bfloat16_before_sm80(dtype, capability, interpret, want):
    assert dot_fp32(dtype, capability, interpret) is want


@pytest.mark.parametrize("dtype,fp32_on,want", [
    (torch.float32, False, "ieee"), (torch.float32, True, "ieee"),
    (torch.float16, False, None), (torch.bfloat16, False, None),
    (torch.float16, True, "ieee"), (torch.bfloat16, True, "ieee"),
])
def test_dot_input_precision_is_ieee_for_every_fp32_dot(dtype, fp32_on, want):
    assert dot_input_precision(dtype, fp32_on) == want
