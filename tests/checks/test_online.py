"""attn_lib.checks.online: the doors of the online-softmax functions (chapter 08), called directly.

What each door returns (the piece lengths a split gives) is written out by hand; each refusal with its
whole message. The same mistakes through the public functions are rows of tests/topics/test_bad_input.py.
"""
import numpy as np
import pytest
import torch

from attn_lib.checks.online import check_online_row, check_online_update, check_online_values, check_splits

NAN, INF = float("nan"), float("inf")


def _refusal(call, error):
    with pytest.raises(error) as info:
        call()
    return str(info.value)


@pytest.mark.parametrize("n,splits,lengths", [
    (5, 2, [2, 2, 1]),  # a block size: the last piece is shorter
    (5, 5, [5]),
    (5, 7, [5]),  # a block longer than the row: one piece
    (5, np.int64(2), [2, 2, 1]),  # numpy ints count as ints
    (5, [2, 3], [2, 3]),  # the lengths themselves
    (5, (1, 1, 3), [1, 1, 3]),
])
def test_a_split_gives_its_piece_lengths(n, splits, lengths):
    assert check_splits(n, splits) == lengths


@pytest.mark.parametrize("splits,error,message", [
    ([2, 2], ValueError, "piece lengths [2, 2] sum to 4, but the row has 5 entries"),
    (True, TypeError, "splits must be a positive int, got True (bool)"),
    ([2, "3"], TypeError, "splits[1] must be a positive int, got '3' (str)"),
])
def test_a_split_that_does_not_cut_the_row_is_refused(splits, error, message):
    assert _refusal(lambda: check_splits(5, splits), error) == message


def test_the_row_door_splits_the_last_axis():
    assert check_online_row(torch.zeros(2, 5), 3) == [3, 2]
    assert _refusal(lambda: check_online_row(torch.zeros(()), 2), ValueError) == \
        "x must have at least one axis (the row to normalise is the last one)"
    assert _refusal(lambda: check_online_row(torch.tensor([0.0, INF]), 2), ValueError) == (
        "x contains 0 nan and 1 +inf entries; softmax of such a row is undefined. Only -inf is allowed "
        "(it means 'masked').")


def test_the_values_door_takes_broadcasting_leading_axes():
    assert check_online_values(torch.zeros(3, 5), torch.zeros(5, 2), 5) == [5]  # v's () broadcasts with x's (3,)
    assert check_online_values(torch.zeros(3, 5), torch.zeros(3, 5, 2), [1, 4]) == [1, 4]


@pytest.mark.parametrize("x,v,message", [
    (torch.zeros(5), torch.zeros(4, 2), "v must have shape (..., S, Dv) with S = 5 (x's last axis), got (4, 2)"),
    (torch.zeros(2, 5), torch.zeros(3, 5, 2),
     "v's leading axes (3,) do not broadcast with x's (2,) (x (2, 5) is (..., S), v (3, 5, 2) is (..., S, Dv))"),
    (torch.zeros(5), torch.full((5, 2), NAN), "v contains nan or inf; the weighted sum would be nan. Check what "
     "produced it."),
])
def test_the_values_door_refuses_values_that_do_not_fit(x, v, message):
    assert _refusal(lambda: check_online_values(x, v, 2), ValueError) == message


def test_the_update_door_takes_a_masked_piece():
    assert check_online_update(torch.zeros(2), torch.zeros(2), torch.tensor([[0.0, -INF], [0.0, 0.0]])) is None


@pytest.mark.parametrize("m,l,piece,error,message", [
    (torch.zeros(2), torch.zeros(3), torch.zeros(2, 4), ValueError,
     "piece must have shape (..., P) with ... = m's shape; got piece (2, 4), m (2,), l (3,) (m and l must have "
     "the same shape)"),
    (torch.zeros(2), torch.zeros(2), torch.zeros(3, 4), ValueError,
     "piece must have shape (..., P) with ... = m's shape; got piece (3, 4), m (2,), l (2,) (m and l must have "
     "the same shape)"),
    (torch.zeros(2), torch.zeros(2), torch.tensor([[0.0, NAN], [0.0, 0.0]]), ValueError,
     "piece contains 1 nan and 0 +inf entries; softmax of such a row is undefined. Only -inf is allowed "
     "(it means 'masked')."),
    (torch.zeros(2, dtype=torch.long), torch.zeros(2), torch.zeros(2, 4), TypeError,
     "m must be a floating-point tensor (float16/bfloat16/float32/float64), got torch.int64; convert with "
     "m.float()"),
])
def test_the_update_door_refuses_what_does_not_fit(m, l, piece, error, message):
    assert _refusal(lambda: check_online_update(m, l, piece), error) == message
