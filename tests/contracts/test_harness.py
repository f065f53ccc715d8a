"""The test harness itself: the path registry is complete and a missing optional package skips."""
from __future__ import annotations

import importlib.util

import attn_paths


def test_registry_is_unconditional():
    """Every path and layer is registered whatever is installed; a dropped export fails at import."""
    assert set(attn_paths.PATHS) == {"torch_reference", "numpy_reference", "tiled_cpu_flash", "flash_attention",
                                     "triton_interpreter", "flash_decoding"}
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
