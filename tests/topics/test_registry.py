"""The shared registry of tests/attn_paths.py: every path and layer is registered, each follows the calling
convention, and a missing optional package skips."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from attn_lib.tolerances import assert_close

import attn_paths


def test_registry_is_unconditional():
    """Every path and layer is registered whatever is installed; a dropped export fails at import."""
    assert set(attn_paths.PATHS) == {"torch_reference", "numpy_reference", "tiled_cpu_flash", "flash_attention",
                                     "triton_interpreter", "flash_decoding", "flash_decoding_append"}
    assert set(attn_paths.MODULES) == {"multihead", "multihead_reference", "multihead_looped", "self_attention"}


def test_triton_path_skips_without_triton(monkeypatch):
    """Without the triton package the Triton path's tests are skipped with the reason (not an ImportError)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    (param,) = attn_paths.path_params(["triton_interpreter"])
    (mark,) = param.marks
    assert mark.name == "skipif" and mark.args == (True,) and "triton" in mark.kwargs["reason"]
    (other,) = attn_paths.path_params([("torch_reference", "float32")])
    assert other.values == ("torch_reference", "float32") and other.marks[0].args == (False,)


@pytest.mark.parametrize("name", attn_paths.path_params(sorted(attn_paths.PATHS)))
@pytest.mark.parametrize("causal", [False, True])
def test_every_path_follows_the_calling_convention(name, causal):
    """(q, k, v, mask, causal, scale) in, (B, H, L, Dv) out in the input dtype, equal to the float64 oracle;
    a path with ``with_lse`` also gives the log-sum-exp (B, H, L)."""
    path = attn_paths.PATHS[name]
    case = attn_paths.Case(B=2, H=2, L=5, S=7, D=4, Dv=3, causal=causal, seed=1)
    q, k, v, mask = attn_paths.make_inputs(case)
    out = attn_paths.run_path(path, case, q, k, v, mask)
    assert out.shape == (2, 2, 5, 3) and out.dtype == torch.float32
    assert_close(out, attn_paths.reference64(case, q, k, v, mask), dtype=torch.float32, what=name)
    if path.with_lse is not None:
        _, lse = attn_paths.run_path_with_lse(path, case, q, k, v, mask)
        assert_close(lse, attn_paths.lse64(case, q, k, v, mask), dtype=torch.float32, what=f"{name} lse")


@pytest.mark.parametrize("name", sorted(attn_paths.MODULES))
def test_every_layer_entry_builds_runs_and_has_a_float64_twin(name):
    mpath = attn_paths.MODULES[name]
    case = attn_paths.Case(B=2, H=2 if mpath.heads else 1, L=5, S=5, D=4, Dv=4 if mpath.heads else 3, causal=True)
    layer = mpath.build(case)
    xq, xk, xv = attn_paths.module_inputs(case, "self")
    out = mpath.forward(layer, xq, xk, xv, None)
    assert out.shape[:2] == (2, 5) and out.dtype == torch.float32
    assert_close(out, mpath.reference64(layer, xq, xk, xv, None), dtype=torch.float32, what=name)
