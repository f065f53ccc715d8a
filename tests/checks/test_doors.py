"""attn_lib.checks.doors: what each functional door returns, and what it refuses, entry by entry.

The settings a door returns are compared with the values the call asked for (backend, scale, blocks, band
from ``Band.resolve`` with the arguments written out); refusals with their whole message. The kernel
backend's doors run with the package's presence and the process's interpreter mode given (nothing is
compiled); a tensor subclass that reports ``is_cuda`` stands in for a GPU tensor where only that flag is read.
"""
import pytest
import torch

import attn_lib.checks.flash as flash_checks
from attn_lib.checks.doors import (check_flash_call, check_naive_call, check_tiled_backward_call, check_tiled_call,
                                   check_triton_backward_call, check_triton_call, resolve_band)
from attn_lib.rules.band import Band
from attn_lib.rules.settings import Options


class ClaimsCuda(torch.Tensor):
    """A CPU tensor that says it lives on a GPU (the door reads only ``is_cuda`` to choose the backend)."""

    @property
    def is_cuda(self):
        return True


def _qkv(B=1, H=2, L=3, S=5, D=4, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, n, D, generator=g, dtype=dtype) for n in (L, S, S)]


def _saved(B=1, H=2, L=3, Dv=4, dtype=torch.float32, lse_dtype=torch.float32):
    return torch.zeros(B, H, L, Dv, dtype=dtype), torch.zeros(B, H, L, dtype=lse_dtype), torch.zeros(B, H, L, Dv,
                                                                                                     dtype=dtype)


def _message(call):
    with pytest.raises((TypeError, ValueError, ImportError)) as info:
        call()
    return str(info.value)


def _interpreter():
    """The process runs the kernels under the interpreter: CPU tensors are accepted."""
    return True


def test_an_entry_without_a_window_ignores_the_window_it_was_handed():
    options = Options(is_causal=True, window_size=(1, 0))
    assert resolve_band(options, 4, 4, window=False) == Band.resolve(4, 4, is_causal=True) == Band(None, 0)
    assert resolve_band(options, 4, 4) == Band(-1, 0)


def test_the_naive_door_keeps_its_scale_and_names_its_backend():
    q, k, v = _qkv()
    settings = check_naive_call(q, k, v, Options(scale=0.25, is_causal=True, window_size=(1, 0)))
    assert (settings.backend, settings.scale) == ("naive", 0.25)
    assert settings.band == Band(None, 0)  # naive_attention has no window: the causal rule alone
    assert check_naive_call(q, k, v, Options()).scale == 0.5  # 1 / sqrt(D), D = 4


def test_the_naive_door_checks_its_key_mask():
    q, k, v = _qkv()
    keys = torch.tensor([[True, True, False, True, True]])
    assert torch.equal(check_naive_call(q, k, v, Options(key_mask=keys)).key_mask, keys)
    got = _message(lambda: check_naive_call(q, k, v, Options(key_mask=keys.float())))
    assert got == ("key_mask must be bool (True = key present; torch.nn.MultiheadAttention's key_padding_mask is the "
                   "opposite, True = padding), got torch.float32; for a 0/1 tensor use key_mask.bool()")


def test_the_tiled_doors_name_their_backend_and_keep_the_blocks():
    q, k, v = _qkv()
    settings = check_tiled_call(q, k, v, Options(block_m=32, block_n=3), None)
    assert (settings.backend, settings.block_m, settings.block_n) == ("torch", 32, 3)
    settings = check_tiled_backward_call(q, k, v, _saved(), Options(block_n=5))
    assert (settings.backend, settings.block_m, settings.block_n) == ("torch", None, 5)
    assert check_flash_call(q, k, v, Options(backend="torch", block_m=7), None).block_m == 7


def test_auto_takes_the_kernels_for_a_gpu_query_when_they_are_installed(kernels_present, monkeypatch):
    q, k, v = _qkv()
    gpu_q = q.as_subclass(ClaimsCuda)
    assert check_flash_call(gpu_q, k, v, Options(), _interpreter).backend == "triton"
    assert check_flash_call(q, k, v, Options(), _interpreter).backend == "torch"
    monkeypatch.setattr(flash_checks, "triton_available", lambda: False)
    assert check_flash_call(gpu_q, k, v, Options(), _interpreter).backend == "torch"


def test_auto_keeps_the_torch_path_for_what_the_kernels_cannot_take(kernels_present):
    """float64, or a head dim over 256, on a GPU: "auto" falls back to the tiled torch path instead of refusing."""
    q64, k64, v64 = _qkv(dtype=torch.float64)
    assert check_flash_call(q64.as_subclass(ClaimsCuda), k64, v64, Options(), _interpreter).backend == "torch"
    wide = torch.zeros(1, 1, 2, 257)  # (B,H,L,D): D over the kernels' 256
    assert check_flash_call(wide.as_subclass(ClaimsCuda), wide, wide, Options(), _interpreter).backend == "torch"
    q, k, v = _qkv()
    assert check_flash_call(q.as_subclass(ClaimsCuda), k, v, Options(), _interpreter).backend == "triton"


def test_the_kernel_doors_check_the_kernels_limits(kernels_present):
    q, k, v = _qkv()
    assert check_flash_call(q, k, v, Options(backend="triton", block_m=16), _interpreter).backend == "triton"
    q64, k64, v64 = _qkv(dtype=torch.float64)
    want = "the Triton kernel takes float16, bfloat16 or float32; for float64 use backend='torch' (got torch.float64)"
    assert _message(lambda: check_flash_call(q64, k64, v64, Options(backend="triton"), _interpreter)) == want
    assert _message(lambda: check_triton_call(q64, k64, v64, Options(), _interpreter)) == want
    assert _message(lambda: check_triton_backward_call(q64, k64, v64, _saved(dtype=torch.float64), Options(),
                                                       _interpreter)) == want
    got = _message(lambda: check_flash_call(q, k, v, Options(backend="triton"), lambda: False))  # compiled kernels
    assert got.startswith("backend='triton' got tensors on cpu, but Triton in this process compiles GPU kernels")
    got = _message(lambda: check_flash_call(q, k, v, Options(backend="triton", block_m=24), _interpreter))
    assert got == "block_m must be a power of two >= 16 (tl.dot's smallest tile), got 24"


def test_the_kernel_backward_door_names_its_backend_and_checks_the_saved_dtypes(kernels_present):
    q, k, v = _qkv()
    settings = check_triton_backward_call(q, k, v, _saved(), Options(block_n=32), _interpreter)
    assert (settings.backend, settings.block_n) == ("triton", 32)
    got = _message(lambda: check_triton_backward_call(q, k, v, _saved(lse_dtype=torch.float64), Options(),
                                                      _interpreter))
    assert got == "lse must be torch.float32, got torch.float64; pass what flash_attention_triton returned"


@pytest.mark.parametrize("which", [1, 2], ids=["k", "v"])
def test_the_kernel_forward_door_refuses_a_key_or_value_that_requires_grad(kernels_present, which):
    qkv = _qkv()
    assert check_triton_call(*qkv, Options(), _interpreter).backend == "triton"
    qkv[which].requires_grad_()
    got = _message(lambda: check_triton_call(*qkv, Options(), _interpreter))
    assert got.startswith("flash_attention_triton returns (out, lse) without a gradient, but q, k or v requires grad")
