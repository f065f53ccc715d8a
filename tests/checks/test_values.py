"""attn_lib.checks.values: flags, the scale and the sliding window.

The scale a check returns is compared with the number given; refusals with their whole message.
"""
import numpy as np
import pytest
import torch

from attn_lib.checks.values import check_bool, check_scale, check_window_size


@pytest.mark.parametrize("scale,value", [
    (torch.tensor(2), 2.0), (np.array(3), 3.0), (torch.tensor([4], dtype=torch.int32), 4.0),
    (np.array([0.5]), 0.5), (np.array([[0.25]], dtype=np.float32), 0.25), (torch.tensor([[0.125]]), 0.125),
], ids=["0-d int tensor", "0-d int array", "int tensor (1,)", "array (1,)", "float32 array (1, 1)", "tensor (1, 1)"])
def test_a_scale_may_be_any_one_element_real_number(scale, value):
    assert check_scale(scale) == value and type(check_scale(scale)) is float


@pytest.mark.parametrize("window,found", [((0, -2), (0, -2)), ((-2, 3), (-2, 3))])
def test_a_window_side_below_minus_one_is_refused(window, found):
    with pytest.raises(ValueError) as info:
        check_window_size(window)
    assert str(info.value) == (f"window_size must be a pair of ints >= -1 (-1: unbounded on that side), got {found!r}; "
                               "e.g. window_size=(256, 0) for 256 keys back and none ahead, or (-1, -1) for no window")


@pytest.mark.parametrize("value,shown", [(np.int64(1), "np.int64(1)"), (np.float64(0.0), "np.float64(0.0)"),
                                         (np.uint8(0), "np.uint8(0)")])
def test_a_numpy_number_is_not_a_flag(value, shown):
    with pytest.raises(TypeError) as info:
        check_bool("is_causal", value)
    assert str(info.value) == f"is_causal must be True or False, got {shown}"


def test_numpy_booleans_are_flags_and_come_back_as_python_bools():
    for value in (np.bool_(True), np.bool_(False), True, False):
        got = check_bool("is_causal", value)
        assert type(got) is bool and got == bool(value)
