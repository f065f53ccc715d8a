"""Device choice (attn_lib.device): the ATTN_LIB_DEVICE override; importing attn_lib touches no CUDA."""
import subprocess
import sys

import torch

import attn_lib


def test_device_override(monkeypatch):
    monkeypatch.setenv("ATTN_LIB_DEVICE", "cpu")
    assert attn_lib.try_gpu() == torch.device("cpu")
    monkeypatch.delenv("ATTN_LIB_DEVICE")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert attn_lib.default_device().type == expected


def test_import_does_not_touch_cuda():
    code = "import attn_lib, torch, sys; print(torch.cuda.is_initialized()); print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
