"""Dictionary lookup (attn_lib.core.lookup): the exact key, and the soft mix of every value."""
import numpy as np
import pytest

import attn_lib
from attn_lib.core import worked_example as we


def test_hard_and_soft_lookup_on_the_dictionary():
    assert attn_lib.hard_lookup("apple", we.DICTIONARY) == 10
    assert attn_lib.soft_lookup(we.FRUIT_PROPORTIONS, we.DICTIONARY) == pytest.approx(we.SOURCE_FRUIT_RESULT)
    vec = attn_lib.soft_lookup([0.25, 0.75], np.array([[1.0, 0.0], [0.0, 4.0]]))
    assert np.allclose(vec, [0.25, 3.0])
