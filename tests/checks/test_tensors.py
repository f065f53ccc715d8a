"""attn_lib.checks.tensors: the nan / inf scan and the attention inputs as a whole.

The scan is compared with torch's own ``isfinite`` over every element; the door's result with the
sizes of the tensors given.
"""
import pytest
import torch

import attn_lib
from attn_lib.checks.tensors import all_finite, check_attention_inputs
from attn_lib.rules.settings import Options

FLOAT32_MAX = torch.finfo(torch.float32).max


@pytest.mark.parametrize("values", [[FLOAT32_MAX, FLOAT32_MAX], [-FLOAT32_MAX, -FLOAT32_MAX, 1.0],
                                    [FLOAT32_MAX, float("inf")], [float("nan"), 0.0], [1.0, -2.0]],
                         ids=["sum overflows up", "sum overflows down", "inf", "nan", "small"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_scan_agrees_with_every_element_even_where_the_sum_overflows(values, dtype):
    t = torch.tensor(values).to(dtype)  # float32's largest is inf in float16
    assert all_finite(t) == bool(torch.isfinite(t).all())


def test_finite_inputs_whose_sum_overflows_are_accepted():
    q = torch.full((1, 1, 2, 2), FLOAT32_MAX / 2)  # the sum of q overflows float32; every entry is finite
    k = torch.zeros(1, 1, 3, 2)
    out, _ = attn_lib.attention(q, k, torch.eye(3, 2)[None, None])
    assert torch.equal(out, torch.eye(3, 2).mean(0).expand(1, 1, 2, 2))  # equal scores: the mean of the values


def test_an_entry_without_the_gqa_keyword_does_not_read_it():
    q, k, v = torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 6)
    options = Options(enable_gqa="not a flag, and not read")
    dims, scale = check_attention_inputs(q, k, v, None, options, gqa_keyword=False)
    assert dims == (1, 2, 3, 5, 4, 6) and scale is None
    with pytest.raises(TypeError) as info:
        check_attention_inputs(q, k, v, None, options)
    assert str(info.value) == "enable_gqa must be True or False, got 'not a flag, and not read'"
