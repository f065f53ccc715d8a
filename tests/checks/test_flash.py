"""attn_lib.checks.flash: what the tiled and the kernel paths add to the common checks.

Saved tensors of the tiled backward, the IO counter, and the kernel path's own checks (package present,
dtype and head dims, device), each refusal compared with its whole message. The package's presence and the
process's interpreter mode are given to the checks (nothing is compiled here).
"""
import pytest
import torch

import attn_lib
import attn_lib.checks.flash as flash_checks
from attn_lib.checks.flash import check_counter, check_triton, check_triton_installed


def _qkv(B=1, H=2, L=3, S=5, D=4):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, n, D, generator=g) for n in (L, S, S)]


def test_the_tiled_backward_takes_saved_tensors_of_any_float_dtype():
    """Only the kernels need out, dout in q's dtype and lse in float32; the tiled path casts what it gets
    (float32 values widened to float64 give the same gradients, bit for bit)."""
    q, k, v = _qkv()
    out, lse = attn_lib.flash_attention_torch(q, k, v)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    want = attn_lib.flash_attention_torch_backward(q, k, v, out, lse, dout)
    got = attn_lib.flash_attention_torch_backward(q, k, v, out.double(), lse.double(), dout.double())
    assert all(torch.equal(a, b) and a.dtype == torch.float32 for a, b in zip(got, want))


class _LoadsOnly:
    def load(self, name, n):
        pass


class _StoresOnly:
    def store(self, name, n):
        pass


class _Both(_LoadsOnly, _StoresOnly):
    pass


def test_a_counter_needs_both_methods():
    q, k, v = _qkv()
    counter = attn_lib.IOCounter()
    attn_lib.flash_attention_torch(q, k, v, counter=counter)
    assert sum(counter.reads.values()) > 0 and sum(counter.writes.values()) > 0
    assert check_counter(_Both()) is None and check_counter(None) is None
    for half in (_LoadsOnly(), _StoresOnly()):
        with pytest.raises(TypeError) as info:
            check_counter(half)
        assert str(info.value) == (f"counter must be None or have methods load(name, n) and store(name, n), got "
                                   f"{type(half).__name__}; e.g. counter=attn_lib.IOCounter()")


def test_the_kernel_path_without_its_package_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(flash_checks, "triton_available", lambda: False)
    with pytest.raises(ImportError) as info:
        check_triton_installed()
    assert str(info.value) == "backend='triton' needs the triton package (pip install triton); use backend='torch'"


def test_the_kernel_checks_name_the_device_they_refuse(monkeypatch):
    monkeypatch.setattr(flash_checks, "triton_available", lambda: True)
    assert check_triton(torch.float32, torch.device("cpu"), (16, 16), lambda: True) is True  # the interpreter
    with pytest.raises(ValueError) as info:
        check_triton(torch.float32, torch.device("cpu"), (16, 16), lambda: False)  # compiled kernels
    assert str(info.value).startswith("backend='triton' got tensors on cpu, but Triton in this process compiles "
                                      "GPU kernels (a CUDA device is present); expected CUDA tensors.")
