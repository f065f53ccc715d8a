"""Bad input gets a clear error that names the argument and what was expected."""
import numpy as np
import pytest
import torch

import attn_lib
from attn_lib import numpy_ref


def t(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype)


BAD_TORCH = [
    ("wrong rank q", (t(3, 4), t(1, 1, 3, 4), t(1, 1, 3, 4)), {}, ValueError, r"q must be 4-D .*q\[None, None\]"),
    ("3-D k", (t(1, 1, 3, 4), t(1, 3, 4), t(1, 1, 3, 4)), {}, ValueError, r"k must be 4-D.*unsqueeze\(1\)"),
    ("mismatched D", (t(1, 1, 3, 4), t(1, 1, 3, 5), t(1, 1, 3, 4)), {}, ValueError, r"same head dim D.*q has D=4, k has D=5"),
    ("mismatched S", (t(1, 1, 3, 4), t(1, 1, 3, 4), t(1, 1, 2, 4)), {}, ValueError, r"same number of keys S.*k has S=3, v has S=2"),
    ("mismatched heads", (t(1, 2, 3, 4), t(1, 1, 3, 4), t(1, 1, 3, 4)), {}, ValueError, r"batch and head sizes"),
    ("int dtype", (t(1, 1, 3, 4, dtype=torch.int64),) * 3, {}, TypeError, r"q must be a floating-point tensor.*torch.int64"),
    ("dtype disagreement", (t(1, 1, 3, 4), t(1, 1, 3, 4, dtype=torch.float64), t(1, 1, 3, 4)), {}, TypeError, r"same dtype.*k=torch.float64"),
    ("mask wrong shape", (t(1, 1, 3, 4), t(1, 1, 5, 4), t(1, 1, 5, 4)), {"mask": torch.ones(3, 4, dtype=torch.bool)}, ValueError, r"mask has shape \(3, 4\).*does not broadcast.*\(1, 1, 3, 5\)"),
    ("mask int dtype", (t(1, 1, 3, 4),) * 3, {"mask": torch.ones(3, 3, dtype=torch.int64)}, TypeError, r"mask must be bool .*mask.bool\(\)"),
    ("mask too many axes", (t(1, 1, 3, 4),) * 3, {"mask": torch.ones(1, 1, 1, 3, 3, dtype=torch.bool)}, ValueError, r"more axes"),
    ("zero scale", (t(1, 1, 3, 4),) * 3, {"scale": 0.0}, ValueError, r"scale must be finite and > 0, got 0.0"),
    ("negative scale", (t(1, 1, 3, 4),) * 3, {"scale": -1}, ValueError, r"scale must be finite and > 0"),
    ("nan input", (torch.full((1, 1, 2, 4), float("nan")), t(1, 1, 3, 4), t(1, 1, 3, 4)), {}, ValueError, r"q contains nan or inf"),
    ("numpy given to torch path", (np.zeros((1, 1, 3, 4)),) * 3, {}, TypeError, r"numpy_ref.attention"),
]


@pytest.mark.parametrize("case", BAD_TORCH, ids=[c[0] for c in BAD_TORCH])
def test_torch_reference_rejects(case):
    _, args, kwargs, exc, pattern = case
    with pytest.raises(exc, match=pattern):
        attn_lib.attention(*args, **kwargs)


@pytest.mark.parametrize("case", [c for c in BAD_TORCH if c[0] not in ("numpy given to torch path",)],
                         ids=[c[0] for c in BAD_TORCH if c[0] not in ("numpy given to torch path",)])
def test_numpy_twin_rejects_with_same_message(case):
    _, args, kwargs, exc, pattern = case
    np_args = [a.numpy() for a in args]
    np_kwargs = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    pattern = pattern.replace(r"torch.int64", "int64").replace(r"torch.float64", "float64")
    pattern = pattern.replace("floating-point tensor", "floating-point array").replace(r"mask.bool\(\)", r"mask.astype\(bool\)")
    with pytest.raises(exc, match=pattern):
        numpy_ref.attention(*np_args, **np_kwargs)


def test_lookup_errors():
    with pytest.raises(KeyError, match="exact key"):
        attn_lib.hard_lookup("fruit", {"apple": 10})
    with pytest.raises(ValueError, match="sum to 1"):
        attn_lib.soft_lookup([0.5, 0.4], [1.0, 2.0])
    with pytest.raises(ValueError, match=">= 0"):
        attn_lib.soft_lookup([1.5, -0.5], [1.0, 2.0])


def test_similarity_errors():
    with pytest.raises(ValueError, match="same length D"):
        attn_lib.dot(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match=r"\(S, D\)"):
        attn_lib.dot_query_keys(torch.zeros(3), torch.zeros(3))
