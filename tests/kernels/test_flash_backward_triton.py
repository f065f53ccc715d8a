"""End to end: attn_lib.flash_attention(..., backend="triton") trains, i.e. its backward (the Triton
kernels' attn_lib.flash.flash_attention_triton_backward, through FlashAttentionFunction) gives
dq, dk, dv within the flash-attn rule of the float64 reference's autograd.

Without a GPU the kernels run under Triton's interpreter (attn_lib.flash sets TRITON_INTERPRET=1);
sizes are small. On a CUDA machine set ATTN_LIB_DEVICE=cuda.
"""
import importlib.util
import os

import pytest
import torch

import attn_lib
import attn_lib.flash
from attn_lib.flash import flash_attention
from attn_lib.naive import naive_attention
from attn_lib.tolerances import assert_flash_rule, max_abs_error

from attn_paths import flash_inputs as make_inputs

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed"),
]

DEVICE = torch.device(os.environ.get("ATTN_LIB_DEVICE", "cpu"))

SHAPES = [(1, 2, 17, 33, 16, 16), (2, 1, 33, 17, 16, 32)]  # (B, H, L, S, D, Dv): lengths not multiples of 16


def grads_of(fn, q, k, v, dout):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(dout)
    return out, (q.grad, k.grad, v.grad)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("causal,padding", [(False, False), (True, True)], ids=["full", "causal_pad"])
def test_triton_backward_matches_reference(shape, dtype, causal, padding):
    B, H, L, S, D, Dv = shape
    q, k, v, kpm = make_inputs(B, H, L, S, D, Dv, padding=padding, seed=11)
    dout = torch.randn(B, H, L, Dv, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    mask = None if kpm is None else kpm[:, None, None, :]  # (B,S) -> (B,1,1,S)
    ql, kl, vl, dl = (t.to(dtype) for t in (q, k, v, dout))
    # Float64 reference on the same (rounded) inputs, by autograd.
    _, expected = grads_of(lambda q, k, v: attn_lib.attention(q, k, v, mask=mask, is_causal=causal)[0],
                           ql.double(), kl.double(), vl.double(), dl.double())
    # Naive backward in the same precision: the flash-attn rule's yardstick.
    _, naive = grads_of(lambda q, k, v: naive_attention(q, k, v, is_causal=causal, key_padding_mask=kpm), ql, kl, vl, dl)
    kpm_dev = None if kpm is None else kpm.to(DEVICE)
    out, got = grads_of(lambda q, k, v: flash_attention(q, k, v, is_causal=causal, key_padding_mask=kpm_dev,
                                                        backend="triton"),
                        *(t.to(DEVICE) for t in (ql, kl, vl, dl)))
    assert type(out.grad_fn).__name__ == "FlashAttentionFunctionBackward"
    for name, g, n, e in zip("qkv", got, naive, expected):
        g = g.cpu()
        assert g.dtype == dtype and torch.isfinite(g).all(), f"d{name}"
        assert_flash_rule(g, n, e, what=f"triton {dtype} d{name}")
        if dtype == torch.float32:
            assert max_abs_error(g, e) <= 1e-4, f"d{name}: {max_abs_error(g, e):.2e}"
    if padding and B > 1:  # batch entry B-1 has no key at all: zero gradients
        assert all(torch.all(g.cpu()[-1] == 0) for g in got)
