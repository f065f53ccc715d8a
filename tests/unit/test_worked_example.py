"""The worked example's data (attn_lib.core.worked_example): keys, values, query and positions agree."""
import torch

from attn_lib.core import worked_example as we


def test_worked_example_data_is_consistent():
    assert set(we.KEYS) == set(we.VALUES) == set(we.KEY_TOKENS)
    assert all(len(v) == 4 for v in (*we.KEYS.values(), *we.VALUES.values(), we.QUERY))
    assert we.POSITIONS["打翻"] > we.POSITIONS["它"] > we.POSITIONS["书"] > we.POSITIONS["水"]
    q, k, v = we.as_tensors(torch.float32)
    assert q.shape == (1, 1, 1, 4) and k.shape == (1, 1, 3, 4) and v.dtype == torch.float32
