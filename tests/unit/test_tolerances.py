"""The tolerance table's helpers (attn_lib.tolerances) pass what is close and fail what is not."""
import pytest
import torch

from attn_lib.tolerances import assert_close, assert_flash_rule, tolerance


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
