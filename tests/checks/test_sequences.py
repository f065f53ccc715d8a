"""attn_lib.checks.sequences: positions, masks, the KV cache and chapter 10's model, at their entries.

The normalised values a check returns (positions as int64 on x's device) are compared with tensors built
here; refusals with their whole message.
"""
import pytest
import torch

from attn_lib import apply_rotary
from attn_lib.checks.sequences import check_rotary_args, check_tiny_batch


@pytest.mark.parametrize("positions", [[], torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int32)],
                         ids=["empty list", "empty int64 tensor", "empty int32 tensor"])
def test_no_positions_for_no_tokens(positions):
    x = torch.zeros(1, 2, 0, 4)  # L = 0
    pos, base = check_rotary_args(x, positions, 100.0)
    assert pos.dtype == torch.int64 and pos.shape == (0,) and base == 100.0
    assert apply_rotary(x, positions).shape == (1, 2, 0, 4)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_positions_of_any_integer_dtype_become_int64(dtype):
    x = torch.zeros(2, 1, 3, 4)
    pos, _ = check_rotary_args(x, torch.tensor([[0, 1, 2], [5, 6, 7]], dtype=dtype), 10000.0)
    assert pos.dtype == torch.int64 and torch.equal(pos, torch.tensor([[0, 1, 2], [5, 6, 7]]))


def test_positions_on_a_device_without_values_are_taken_as_they_are():
    """A meta tensor has a shape but no values: its range cannot be read, and is not."""
    x = torch.zeros(1, 1, 3, 4, device="meta")
    pos, _ = check_rotary_args(x, torch.empty(3, dtype=torch.int32, device="meta"), 10000.0)
    assert pos.device.type == "meta" and pos.dtype == torch.int64 and pos.shape == (3,)
    assert apply_rotary(x, torch.empty(3, dtype=torch.int64, device="meta")).shape == (1, 1, 3, 4)


def _batch(B=2, L=3):
    ids = torch.zeros(B, L, dtype=torch.long)  # (B,L)
    return ids, torch.zeros(B, dtype=torch.long)  # it_index (B,)


def test_a_batch_as_long_as_the_position_table_is_accepted():
    ids, it_index = _batch(L=4)
    assert check_tiny_batch(ids, torch.tensor([4, 0]), it_index, 4) is None  # L = max_len, lengths 0 .. L
    with pytest.raises(ValueError) as info:
        check_tiny_batch(ids, torch.tensor([4, 0]), it_index, 3)
    assert str(info.value) == ("ids has L=4 positions but the model's position table has max_len=3; build the model "
                               "with max_len >= 4")


@pytest.mark.parametrize("lengths,low,high", [([-1, 2], -1, 2), ([0, 5], 0, 5), ([-2, 7], -2, 7)])
def test_lengths_outside_the_padded_sentence_are_refused_with_their_range(lengths, low, high):
    ids, it_index = _batch(L=3)
    with pytest.raises(ValueError) as info:
        check_tiny_batch(ids, torch.tensor(lengths), it_index, None)
    assert str(info.value) == (f"lengths must be in 0..L=3 (the real tokens of each padded sentence), got lengths from "
                               f"{low} to {high}")
