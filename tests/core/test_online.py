"""Online softmax (attn_lib.core.online): the running (max, sum) update equals torch.softmax / logsumexp on any
split of the row, and online_weighted_sum equals softmax(x) @ v."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attn_lib
from attn_lib.core.online import (online_logsumexp, online_max_and_sum, online_softmax, online_softmax_update,
                                     online_weighted_sum, split_row)
from attn_lib.tolerances import assert_close

from attn_paths import randn64


def f64(x):
    return torch.tensor(x, dtype=torch.float64)


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
    expected = torch.softmax(x, -1).nan_to_num(0.0)  # torch gives nan for a row of only -inf; the rule is zeros
    assert_close(online_softmax(x, pieces), expected, what="online softmax")
    # the running max is the row's max, the running sum the sum of exp(x - max)
    m, l = online_max_and_sum(x, pieces)
    assert torch.equal(m, x.amax(-1))
    finite = torch.isfinite(m)
    ref_l = torch.exp(x[finite] - m[finite, None]).sum(-1)
    assert_close(l[finite], ref_l, dtype="float64", what="running sum")
    assert torch.all(l[~finite] == 0)
    lse = online_logsumexp(x, pieces)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(torch.logsumexp(x, -1)))
    assert_close(lse[finite], torch.logsumexp(x, -1)[finite], dtype="float64", what="online log-sum-exp")


@settings(max_examples=100)
@given(row_and_splits(), st.integers(1, 5))
def test_online_weighted_sum_is_attention_output(case, dv):
    x, pieces = case
    v = torch.randn(3, x.shape[-1], dv, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected = (torch.softmax(x, -1).nan_to_num(0.0)[:, None, :] @ v).squeeze(1)  # (3,1,S) @ (3,S,dv) -> (3,dv)
    assert_close(online_weighted_sum(x, v, pieces), expected, what="online weighted sum")


def test_one_update_step_by_hand():
    # Row [1, 3 | 2]: after the first piece m = 3, l = e^-2 + 1; the second piece keeps m.
    m0 = torch.tensor(float("-inf"), dtype=torch.float64)
    l0 = torch.tensor(0.0, dtype=torch.float64)
    m1, l1 = online_softmax_update(m0, l0, torch.tensor([1.0, 3.0], dtype=torch.float64))
    assert float(m1) == 3.0
    assert_close(l1, f64(math.exp(-2) + 1), what="l after [1, 3]")
    m2, l2 = online_softmax_update(m1, l1, torch.tensor([2.0], dtype=torch.float64))
    assert float(m2) == 3.0
    assert_close(l2, f64(math.exp(-2) + 1 + math.exp(-1)), what="l after [2]")
    # a larger maximum later rescales what l already holds by exp(m_old - m_new)
    m3, l3 = online_softmax_update(m2, l2, torch.tensor([5.0], dtype=torch.float64))
    assert float(m3) == 5.0
    assert_close(l3, f64(sum(math.exp(t - 5.0) for t in (1, 3, 2, 5))), what="l after [5]")


def test_large_scores_do_not_overflow_and_block_size_form():
    x = torch.tensor([[1000.0, 999.0, -1000.0, 998.0, 1001.0]])
    out = online_softmax(x, 2)
    assert torch.isfinite(out).all()
    assert_close(out, torch.softmax(x.double(), -1), dtype=torch.float32)
    assert split_row(5, 2) == [(0, 2), (2, 4), (4, 5)]
    assert split_row(5, [1, 4]) == [(0, 1), (1, 5)]


def test_low_precision_is_computed_in_float32():
    x = torch.randn(4, 33, generator=torch.Generator().manual_seed(0)).half()
    out = online_softmax(x, 8)
    assert out.dtype == torch.float16
    assert_close(out, torch.softmax(x.double(), -1), dtype=torch.float16)


# --- one update step with a row that has seen nothing; any number of leading axes ---------------
def test_online_softmax_update_one_step_by_hand():
    m, l = torch.tensor([1.0, float("-inf")]), torch.tensor([2.0, 0.0])
    piece = torch.tensor([[3.0, 0.0], [float("-inf"), float("-inf")]])
    m_new, l_new = attn_lib.online_softmax_update(m, l, piece)
    assert torch.equal(m_new, torch.tensor([3.0, float("-inf")]))
    expected = 2.0 * torch.exp(torch.tensor(1.0 - 3.0)) + 1.0 + torch.exp(torch.tensor(-3.0))
    assert_close(l_new[0], expected, dtype="float32")
    assert l_new[1] == 0


@pytest.mark.parametrize("shape", [(6,), (2, 6), (2, 3, 6)])
def test_online_functions_on_any_leading_axes(shape):
    x = randn64(*shape, seed=4) * 3
    x[..., 0] = x[..., 0] - 1000  # one row far below the others (when there are several rows)
    if len(shape) > 1:
        x[0] = x[0] - 1000
    v = randn64(*shape, 2, seed=5)
    m, l = attn_lib.online_max_and_sum(x, 4)
    assert_close(m, x.amax(-1), dtype="float64")
    assert_close(l, torch.exp(x - x.amax(-1, keepdim=True)).sum(-1), dtype="float64")
    assert_close(attn_lib.online_logsumexp(x, [1, 5]), torch.logsumexp(x, -1), dtype="float64")
    expected = (torch.softmax(x, -1)[..., None, :] @ v)[..., 0, :]
    assert_close(attn_lib.online_weighted_sum(x, v, 4), expected, dtype="float64", what="softmax(x) @ v")
    x16, v16 = x.to(torch.float16), v.to(torch.float16)
    out16 = attn_lib.online_weighted_sum(x16, v16, 4)
    assert out16.dtype == torch.float16
    assert_close(out16, (torch.softmax(x16.double(), -1)[..., None, :] @ v16.double())[..., 0, :], dtype="float16")


def test_online_weighted_sum_of_no_keys_is_zeros_on_the_device_of_x():
    got = online_weighted_sum(torch.zeros(2, 0), torch.zeros(2, 0, 3), 2)  # S = 0: no finite score in any row
    assert torch.equal(got, torch.zeros(2, 3))
    meta = torch.device("meta")  # a device other than the CPU that every machine has
    got = online_weighted_sum(torch.zeros(2, 0, device=meta), torch.zeros(2, 0, 3, device=meta), 2)
    assert got.device == meta and got.shape == (2, 3)


def test_online_softmax_builds_its_running_state_on_the_input_device():
    # Under a "meta" default device a tensor created without an explicit device lands on meta.
    x = randn64(3, 10)
    want = online_softmax(x, 4)
    with torch.device("meta"):
        got = online_softmax(x, 4)
    assert got.device == x.device
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_online_softmax_is_computed_in_float32(dtype):
    x = (randn64(4, 300) * 4).to(dtype)
    assert_close(online_softmax(x, 64), torch.softmax(x.double(), -1), dtype=dtype, what="online, 16-bit")
    m, l = online_max_and_sum(x, 7)
    assert m.dtype == l.dtype == torch.float32
    assert torch.equal(m, x.float().amax(-1))
