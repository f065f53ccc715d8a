"""Device choice (attn_lib.device): the ATTN_LIB_DEVICE override, try_gpu's index, and importing attn_lib touches
neither CUDA nor Triton."""
import subprocess
import sys

import pytest
import torch

import attn_lib
from attn_lib.device import cuda_available, try_gpu
from attn_lib.rules.names import DEVICE_ENV


def test_device_override(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert attn_lib.try_gpu() == torch.device("cpu")
    assert attn_lib.default_device() == torch.device("cpu")
    monkeypatch.setenv(DEVICE_ENV, "meta")  # any torch device, whether or not a GPU exists
    assert attn_lib.try_gpu(3) == torch.device("meta")
    monkeypatch.delenv(DEVICE_ENV)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert attn_lib.default_device().type == expected


def test_an_override_that_is_not_a_device_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "gpu0")
    with pytest.raises(ValueError, match=f"{DEVICE_ENV}='gpu0' is not a torch device"):
        try_gpu()


def test_try_gpu_falls_back_to_cpu_for_a_missing_index(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    assert cuda_available() == torch.cuda.is_available()
    missing = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert try_gpu(missing) == torch.device("cpu")
    with pytest.raises(ValueError):
        try_gpu(-1)


def test_import_does_not_touch_cuda():
    code = "import attn_lib, torch, sys; print(torch.cuda.is_initialized()); print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
