"""The worked example's data (attn_lib.core.worked_example): keys, values, query and positions agree, and the
reference attention on them gives the numbers the source prints."""
import numpy as np
import torch

import attn_lib
from attn_lib.core import worked_example as we
from attn_lib.tolerances import assert_close


def test_worked_example_data_is_consistent():
    assert set(we.KEYS) == set(we.VALUES) == set(we.KEY_TOKENS)
    assert all(len(v) == 4 for v in (*we.KEYS.values(), *we.VALUES.values(), we.QUERY))
    assert we.POSITIONS["打翻"] > we.POSITIONS["它"] > we.POSITIONS["书"] > we.POSITIONS["水"]
    q, k, v = we.as_tensors(torch.float32)
    assert q.shape == (1, 1, 1, 4) and k.shape == (1, 1, 3, 4) and v.dtype == torch.float32


def test_tensors_and_arrays_hold_the_listed_vectors():
    q, k, v = we.as_tensors()
    assert q.dtype == torch.float64
    assert q.flatten().tolist() == list(we.QUERY)
    assert k[0, 0].tolist() == [list(we.KEYS[t]) for t in we.KEY_TOKENS]
    assert v[0, 0].tolist() == [list(we.VALUES[t]) for t in we.KEY_TOKENS]
    qa, ka, va = we.as_arrays()
    for a, t in zip((qa, ka, va), (q, k, v)):
        assert a.dtype == np.float64 and np.array_equal(a, t.numpy())


def test_worked_example_numbers():
    q, k, v = we.as_tensors()
    out, scores = attn_lib.attention(q, k, v)
    dots = [sum(a * b for a, b in zip(we.QUERY, we.KEYS[t])) for t in we.KEY_TOKENS]  # by hand
    assert_close(np.array(dots), np.array(we.SOURCE_PRINTED["dots"]), dtype="float64", what="q·k")
    expected_w = torch.softmax(torch.tensor([3.0, 0.6, 2.4], dtype=torch.float64), 0)  # q·k / sqrt(4)
    assert_close(scores.flatten(), expected_w, dtype="float64")
    assert [round(x, 2) for x in scores.flatten().tolist()] == list(we.SOURCE_PRINTED["weights"])
    assert_close(out.flatten(), expected_w @ v[0, 0], dtype="float64")
