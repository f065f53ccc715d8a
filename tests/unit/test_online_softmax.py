"""Online softmax: the running (max, sum) update equals softmax on any split of the row."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attn_lib
from attn_lib.online import (online_logsumexp, online_max_and_sum, online_softmax, online_softmax_update,
                                     online_weighted_sum, split_row)
from attn_lib.tolerances import assert_close


@st.composite
def row_and_splits(draw):
    """A few rows of scores (some entries -inf, some rows all -inf) and a random split of S."""
    S = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, S, generator=gen, dtype=torch.float64) * draw(st.sampled_from([1.0, 10.0, 300.0]))
    hide = torch.rand(3, S, generator=gen) < draw(st.sampled_from([0.0, 0.3, 0.9]))
    x = x.masked_fill(hide, float("-inf"))
    if draw(st.booleans()):
        x[1] = float("-inf")  # a row that may see nothing
    cuts = sorted(draw(st.sets(st.integers(1, S - 1), max_size=S - 1))) if S > 1 else []
    bounds = [0, *cuts, S]
    pieces = [b - a for a, b in zip(bounds, bounds[1:])]
    return x, pieces


@settings(max_examples=150)
@given(row_and_splits())
def test_online_softmax_equals_softmax_on_any_split(case):
    x, pieces = case
    expected = attn_lib.softmax(x)
    assert_close(online_softmax(x, pieces), expected, what="online softmax")
    # the running max is the row's max, the running sum the sum of exp(x - max)
    m, l = online_max_and_sum(x, pieces)
    assert torch.equal(m, x.amax(-1))
    finite = torch.isfinite(m)
    ref_l = torch.exp(x[finite] - m[finite, None]).sum(-1)
    assert torch.allclose(l[finite], ref_l, rtol=1e-12, atol=0)
    assert torch.all(l[~finite] == 0)
    lse = online_logsumexp(x, pieces)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(torch.logsumexp(x, -1)))
    assert torch.allclose(lse[finite], torch.logsumexp(x, -1)[finite], rtol=1e-12, atol=1e-12)


@settings(max_examples=100)
@given(row_and_splits(), st.integers(1, 5))
def test_online_weighted_sum_is_attention_output(case, dv):
    x, pieces = case
    v = torch.randn(3, x.shape[-1], dv, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected = (attn_lib.softmax(x)[:, None, :] @ v).squeeze(1)  # (3,1,S) @ (3,S,dv) -> (3,dv)
    assert_close(online_weighted_sum(x, v, pieces), expected, what="online weighted sum")


def test_one_update_step_by_hand():
    # Row [1, 3 | 2]: after the first piece m = 3, l = e^-2 + 1; the second piece keeps m.
    m0 = torch.tensor(float("-inf"), dtype=torch.float64)
    l0 = torch.tensor(0.0, dtype=torch.float64)
    m1, l1 = online_softmax_update(m0, l0, torch.tensor([1.0, 3.0], dtype=torch.float64))
    assert float(m1) == 3.0 and float(l1) == pytest.approx(math.exp(-2) + 1)
    m2, l2 = online_softmax_update(m1, l1, torch.tensor([2.0], dtype=torch.float64))
    assert float(m2) == 3.0 and float(l2) == pytest.approx(math.exp(-2) + 1 + math.exp(-1))
    # a larger maximum later rescales what l already holds by exp(m_old - m_new)
    m3, l3 = online_softmax_update(m2, l2, torch.tensor([5.0], dtype=torch.float64))
    assert float(m3) == 5.0
    assert float(l3) == pytest.approx(sum(math.exp(t - 5.0) for t in (1, 3, 2, 5)))


def test_large_scores_do_not_overflow_and_block_size_form():
    x = torch.tensor([[1000.0, 999.0, -1000.0, 998.0, 1001.0]])
    out = online_softmax(x, 2)
    assert torch.isfinite(out).all()
    assert_close(out, attn_lib.softmax(x.double()), dtype=torch.float32)
    assert split_row(5, 2) == [(0, 2), (2, 4), (4, 5)]
    assert split_row(5, [1, 4]) == [(0, 1), (1, 5)]


def test_low_precision_is_computed_in_float32():
    x = torch.randn(4, 33, generator=torch.Generator().manual_seed(0)).half()
    out = online_softmax(x, 8)
    assert out.dtype == torch.float16
    assert_close(out, attn_lib.softmax(x.double()), dtype=torch.float16)


def test_bad_input_is_rejected():
    x = torch.randn(2, 5)
    with pytest.raises(ValueError, match="sum to 4"):
        online_softmax(x, [1, 3])
    with pytest.raises(ValueError, match="positive int"):
        online_softmax(x, [0, 5])
    with pytest.raises(ValueError, match="positive int"):
        online_softmax(x, 0)
    with pytest.raises(ValueError, match="nan"):
        online_softmax(torch.tensor([1.0, float("nan")]), 1)
    with pytest.raises(TypeError, match="floating-point"):
        online_softmax(torch.tensor([1, 2]), 1)
    with pytest.raises(ValueError, match="shape"):
        online_weighted_sum(x, torch.randn(2, 4, 3), 2)
