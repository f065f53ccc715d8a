import math

import numpy as np
import pytest
import torch

import attn_lib
from attn_lib import numpy_ref


def test_softmax_matches_torch_and_sums_to_one():
    x = torch.randn(4, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p = attn_lib.softmax(x)
    assert torch.allclose(p, torch.softmax(x, -1))
    assert torch.allclose(p.sum(-1), torch.ones(4, dtype=torch.float64))
    assert torch.allclose(attn_lib.softmax(x, dim=0), torch.softmax(x, 0))


def test_naive_overflows_stable_does_not():
    x = torch.tensor([1000.0, 999.0, 998.0])
    assert torch.isnan(attn_lib.naive_softmax(x)).any()
    p = attn_lib.softmax(x)
    assert torch.allclose(p, torch.softmax(x - 1000, -1))
    with np.errstate(all="ignore"):
        assert np.isnan(numpy_ref.naive_softmax(x.numpy().astype(np.float64))).any()
    assert np.allclose(numpy_ref.softmax(x.numpy()), p.numpy())


def test_minus_inf_gets_zero_and_all_minus_inf_row_is_zeros():
    x = torch.tensor([[0.0, -math.inf, 1.0], [-math.inf, -math.inf, -math.inf]])
    p = attn_lib.softmax(x)
    assert p[0, 1] == 0 and torch.isclose(p[0].sum(), torch.tensor(1.0))
    assert torch.equal(p[1], torch.zeros(3))
    assert np.allclose(numpy_ref.softmax(x.numpy()), p.numpy(), atol=1e-7)


def test_half_precision_and_dtype_preserved():
    x = torch.tensor([10.0, 0.0, -5.0], dtype=torch.float16)
    p = attn_lib.softmax(x)
    assert p.dtype == torch.float16
    assert torch.allclose(p.float(), torch.softmax(x.float(), -1), atol=1e-3)
