"""Dictionary lookup (attn_lib.core.lookup): the exact key, and the soft mix of every value, against hand sums."""
import numpy as np
import pytest
import torch

import attn_lib
from attn_lib.core import worked_example as we
from attn_lib.tolerances import assert_close


def test_hard_and_soft_lookup_on_the_dictionary():
    assert attn_lib.hard_lookup("apple", we.DICTIONARY) == 10
    got = attn_lib.soft_lookup(we.FRUIT_PROPORTIONS, we.DICTIONARY)
    assert_close(np.float64(got), np.float64(we.SOURCE_FRUIT_RESULT), dtype="float64", what="10×0.6 + 5×0.4 + 2×0")
    vec = attn_lib.soft_lookup([0.25, 0.75], np.array([[1.0, 0.0], [0.0, 4.0]]))
    assert_close(vec, np.array([0.25, 3.0]), dtype="float64")


def test_soft_lookup_mixes_torch_vectors_as_a_weighted_sum():
    values = torch.tensor([[2.0, 0.0], [0.0, 4.0], [1.0, 1.0]], dtype=torch.float64)
    got = attn_lib.soft_lookup([0.5, 0.25, 0.25], values)
    assert_close(got, 0.5 * values[0] + 0.25 * values[1] + 0.25 * values[2], dtype="float64")


def test_hard_lookup_needs_an_exact_key():
    with pytest.raises(KeyError, match="exact key"):
        attn_lib.hard_lookup("Apple", we.DICTIONARY)


@pytest.mark.parametrize("weights", [[0.5, 0.6], [1.2, -0.2], [0.5, float("nan")]])
def test_soft_lookup_refuses_weights_that_are_not_proportions(weights):
    with pytest.raises(ValueError, match="proportions must"):
        attn_lib.soft_lookup(weights, [1.0, 2.0])


def test_soft_lookup_needs_matching_keys_and_lengths():
    with pytest.raises(KeyError, match="same keys"):
        attn_lib.soft_lookup({"apple": 1.0}, {"pear": 3.0})
    with pytest.raises(ValueError, match="2 proportions for 3 values"):
        attn_lib.soft_lookup([0.5, 0.5], [1.0, 2.0, 3.0])
