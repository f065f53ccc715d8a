"""attn_lib.flash_attention with enable_gqa and window_size on the Triton backend: what flash.py hands to the
Triton entry points (attn_lib.flash.triton.entry.flash_attention_triton / _backward),
and the kernels themselves under Triton's interpreter against the float64 reference."""
import pytest
import torch

import attn_lib
import attn_lib.flash.autograd as flash_module
from attn_lib.flash.tiled_forward import _forward_tiles
from attn_lib.flash.tiled_backward import _backward_tiles
from attn_lib.core.reference import _attention_core
from attn_lib.tolerances import assert_close


def qkv(H, Hkv, L, S, D=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g, dtype=dtype).requires_grad_()
                 for s in ((2, H, L, D), (2, Hkv, S, D), (2, Hkv, S, D)))


def test_flash_py_hands_gqa_and_the_window_to_the_triton_cores(monkeypatch):
    """_forward_core / _backward_core call the unchecked Triton cores (attn_lib.flash.triton.entry.triton_forward_core /
    triton_backward_core: the door has checked once) with causal_offset, window_size and k, v of H_kv heads;
    stand-ins here compute with the tiled torch path."""
    seen = []

    def fake_forward(q, k, v, *, is_causal, scale, key_padding_mask, causal_offset, window_size):
        seen.append(("forward", causal_offset, window_size, k.shape[1]))
        return _forward_tiles(q, k, v, key_padding_mask, causal=is_causal, scale=scale, block_m=16, block_n=16,
                              counter=None, causal_offset=causal_offset, window_size=window_size)

    def fake_backward(q, k, v, out, lse, dout, *, is_causal, scale, key_padding_mask, causal_offset, window_size):
        seen.append(("backward", causal_offset, window_size, k.shape[1]))
        return _backward_tiles(q, k, v, out, lse, dout, key_padding_mask, causal=is_causal, scale=scale,
                               block_m=16, block_n=16, causal_offset=causal_offset, window_size=window_size)

    monkeypatch.setattr(flash_module, "triton_forward_core", fake_forward)
    monkeypatch.setattr(flash_module, "triton_backward_core", fake_backward)
    q, k, v = qkv(6, 2, 9, 14)
    out = flash_module._flash_unchecked(q, k, v, is_causal=True, scale=0.25, key_padding_mask=None,
                                        backend="triton", check_overflow=True, causal_offset=5, window_size=(3, 0))
    out.sum().backward()
    assert seen == [("forward", 5, (3, 0), 2), ("backward", 5, (3, 0), 2)]  # k, v with their H_kv = 2 heads
    ref, _ = _attention_core(q.detach(), k.detach(), v.detach(), None, True, 0.25, check_overflow=True,
                             window_size=(3, 0), offset=5)
    assert_close(out, ref, dtype=torch.float32)
    q4, k4, v4 = qkv(4, 4, 5, 5)
    flash_module._flash_unchecked(q4, k4, v4, is_causal=False, scale=0.25, key_padding_mask=None, backend="triton",
                                  check_overflow=False)
    assert seen[-1] == ("forward", 0, (-1, -1), 4)  # H_kv = H


@pytest.mark.parametrize("config", [(6, 2, (3, 2), False), (4, 1, (5, 0), True)],
                         ids=["gqa-window-3x2", "mqa-causal-window-5"])
def test_triton_kernels_gqa_window_under_the_interpreter(config):
    """Needs the gqa-triton branch (kernels that take window_size and enable_gqa)."""
    H, Hkv, window, causal = config
    q, k, v = qkv(H, Hkv, 33, 37)
    kpm = torch.ones(2, 37, dtype=torch.bool)
    kpm[1, 20:] = False
    out = attn_lib.flash_attention(q, k, v, is_causal=causal, key_padding_mask=kpm, backend="triton",
                                   enable_gqa=True, window_size=window)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = attn_lib.attention(q64, k64, v64, mask=kpm[:, None, None, :], is_causal=causal, enable_gqa=True,
                             window_size=window)[0]
    assert_close(out, ref, dtype=torch.float32)
    for got, want in zip(grads, torch.autograd.grad(ref, (q64, k64, v64), dout.double())):
        assert got.shape == want.shape
        assert_close(got, want, dtype=torch.float32)
