"""Moved verbatim from tests/kernels/test_causal_offset.py and tests/kernels/test_gqa_window_flash.py (their
Triton-backend tests: forward and backward through the FlashAttention core with a band offset, and
flash_attention(backend="triton") with GQA and a window under the interpreter), for the Triton tests to merge
into tests/flash/triton/; written for the old API (``_flash_unchecked``, ``causal_offset``,
``key_padding_mask``), not yet migrated. The torch-backend tests of both files are in tests/flash/.
"""
import importlib.util
import os

import pytest
import torch

pytest.skip("moved verbatim, written for the old API: to be merged into the Triton tests", allow_module_level=True)

import attn_lib
from attn_lib.flash.autograd import _flash_unchecked
from attn_lib.tolerances import assert_close

from attn_paths import flash_inputs

# --- from tests/kernels/test_causal_offset.py ---------------------------------------------------------------
DEVICE = torch.device(os.environ.get("ATTN_LIB_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu"))
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def offset_mask(L, S, offset):
    """(L, S) bool, True = query i may see key j, i.e. j <= i + offset."""
    return torch.ones(L, S, dtype=torch.bool).tril(diagonal=offset)


def reference(q, k, v, kpm, offset, dout):
    """float64 output and gradients of attn_lib.attention with the explicit bool mask."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    L, S = q.shape[2], k.shape[2]
    mask = offset_mask(L, S, offset)[None, None]  # (1,1,L,S)
    if kpm is not None:
        mask = mask & kpm[:, None, None, :]  # (B,1,L,S)
    out, _ = attn_lib.attention(q, k, v, mask=mask)  # (B,H,L,Dv)
    out.backward(dout.double())
    return out.detach(), q.grad, k.grad, v.grad


# The interpreter's tile is 32: lengths around 32 and 64 make several query and key blocks,
# so that the offset moves which blocks are skipped, fully visible or masked.
TRITON_SHAPES = [(33, 70, 37), (70, 33, -37), (45, 45, 0), (37, 66, 5), (66, 37, -40), (17, 40, 70)]


@needs_triton
@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("L,S,offset", TRITON_SHAPES)
def test_triton_forward_backward(L, S, offset, padding):
    q, k, v, kpm = flash_inputs(1, 2, L, S, 16, seed=L + S, padding=padding)
    dout = torch.randn(1, 2, L, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(L))
    ref_out, *ref_grads = reference(q, k, v, kpm, offset, dout)
    qg, kg, vg = (t.float().to(DEVICE).requires_grad_() for t in (q, k, v))
    kd = None if kpm is None else kpm.to(DEVICE)
    out = _flash_unchecked(qg, kg, vg, is_causal=True, scale=16 ** -0.5, key_padding_mask=kd, backend="triton",
                           check_overflow=True, causal_offset=offset)
    out.backward(dout.float().to(DEVICE))
    assert_close(out.detach().cpu(), ref_out, dtype=torch.float32)
    for got, want, name in zip((qg.grad, kg.grad, vg.grad), ref_grads, ("dq", "dk", "dv")):
        assert_close(got.cpu(), want, dtype=torch.float32, what=name)


# --- from tests/kernels/test_gqa_window_flash.py -----------------------------------------------------------

def qkv(H, Hkv, L, S, D=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g, dtype=dtype).requires_grad_()
                 for s in ((2, H, L, D), (2, Hkv, S, D), (2, Hkv, S, D)))


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
