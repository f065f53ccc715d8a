"""The Triton backward kernels (attn_lib/flash/triton/forward.py, ``_attn_bwd_*``) against the float64 reference's autograd.

``flash_attention_triton_backward(q, k, v, out, lse, dout)`` gives dq, dk, dv; the answer is
``torch.autograd`` through ``attn_lib.attention`` in float64. float32 must agree within the
float32 tolerance of ``attn_lib.tolerances``; float16 / bfloat16 follow flash-attn's rule
(error at most twice that of a naive backward computed in the same precision, plus a small
floor). Without a GPU these run under Triton's interpreter (attn_lib.device decides that
once per process); on a CUDA machine they run the compiled kernels on CUDA tensors.
"""
import importlib.util
import os

import pytest
import torch

import attn_lib
from attn_lib.flash.autograd import flash_attention, flash_attention_triton, flash_attention_triton_backward, load_kernel
from attn_lib.flash.naive import naive_attention
from attn_lib.tolerances import (FLASH_ERROR_FLOOR, FLASH_ERROR_RATIO, FLOAT32_ATOL, assert_close, assert_flash_rule,
                                 max_abs_error)

from attn_paths import flash_inputs as make_inputs, reference_grads

# Triton is pinned in requirements.txt, so this always runs (never skipped when installed).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

DEVICE = torch.device(os.environ.get("ATTN_LIB_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu"))


def naive_grads(q, k, v, dout, kpm, causal, dtype):
    """A naive backward in ``dtype``: autograd through the plain formula, every step in dtype."""
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    B, H, L, D = q.shape
    S = k.shape[2]
    visible = torch.ones(B, 1, L, S, dtype=torch.bool)  # (B,1,L,S)
    if causal:
        visible = visible & torch.ones(L, S, dtype=torch.bool).tril()
    if kpm is not None:
        visible = visible & kpm[:, None, None, :]
    seen = visible.any(-1, keepdim=True)  # (B,1,L,1) rows with at least one key
    s = (q @ k.transpose(-2, -1)) * D**-0.5  # (B,H,L,D) @ (B,H,D,S) -> (B,H,L,S)
    s = s.masked_fill(~visible, float("-inf")).masked_fill(~seen, 0.0)
    p = torch.softmax(s, dim=-1).masked_fill(~seen, 0.0)  # (B,H,L,S)
    out = p @ v  # (B,H,L,S) @ (B,H,S,Dv) -> (B,H,L,Dv)
    out.backward(dout.to(dtype))
    return q.grad, k.grad, v.grad


def assert_grad_flash_rule(fast, naive, ref, dtype, what):
    """flash-attn's gradient rule: error <= FLASH_ERROR_RATIO x the naive error + atol.

    As in flash-attn's tests, atol is twice the rounding error of the reference gradient
    stored in ``dtype`` (``(g + 0.3 - 0.3) - g``): a gradient is rounded to dtype when it is
    stored, so ties within one rounding step are not failures.
    """
    r = ref.to(dtype)
    atol = max(FLASH_ERROR_FLOOR, 2 * float(((r + 0.3 - 0.3) - r).abs().max())) if r.numel() else FLASH_ERROR_FLOOR
    fast_err, naive_err = max_abs_error(fast, ref), max_abs_error(naive, ref)
    assert fast_err <= FLASH_ERROR_RATIO * naive_err + atol, (
        f"{what}: error {fast_err:.3e} > {FLASH_ERROR_RATIO} x naive error {naive_err:.3e} + atol {atol:.2e}")
    return fast_err, naive_err, atol


def run_backward(q, k, v, dout, kpm, causal, dtype, **blocks):
    """Forward and backward with the Triton kernels on DEVICE; results back on the CPU."""
    ql, kl, vl, dol = (t.to(DEVICE, dtype) for t in (q, k, v, dout))
    kpm_dev = None if kpm is None else kpm.to(DEVICE)
    out, lse = flash_attention_triton(ql, kl, vl, is_causal=causal, key_padding_mask=kpm_dev, **blocks)
    grads = flash_attention_triton_backward(ql, kl, vl, out, lse, dol, is_causal=causal, key_padding_mask=kpm_dev,
                                            **blocks)
    for g, t in zip(grads, (ql, kl, vl)):
        assert g.shape == t.shape and g.dtype == dtype and g.device == t.device
    return [g.cpu() for g in grads]


def check_case(shape, dtype, causal, padding, *, seed=0, **blocks):
    B, H, L, S, D, Dv = shape
    q, k, v, kpm = make_inputs(B, H, L, S, D, Dv, seed=seed, padding=padding)
    dout = torch.randn(B, H, L, Dv, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    ref = reference_grads(q, k, v, dout, kpm, causal)
    got = run_backward(q, k, v, dout, kpm, causal, dtype, **blocks)
    for name, g, r in zip(("dq", "dk", "dv"), got, ref):
        assert torch.isfinite(g).all(), f"{name} has nan/inf"
        if dtype == torch.float32:
            assert_close(g, r, what=f"triton {name} float32 {shape}")
    if dtype != torch.float32:
        naive = naive_grads(q, k, v, dout, kpm, causal, dtype)
        for name, g, n, r in zip(("dq", "dk", "dv"), got, naive, ref):
            assert_grad_flash_rule(g, n, r, dtype, what=f"triton {name} {dtype} {shape}")
    return got, ref


CASES = [  # (B, H, L, S, D, Dv), dtype, causal, padding
    ((1, 1, 1, 1, 16, 16), torch.float32, False, False),
    ((1, 1, 1, 113, 16, 16), torch.float32, True, True),  # one query: causal sees key 0 only
    ((1, 2, 17, 97, 32, 32), torch.float32, True, True),  # L < S, causal: keys past L get no gradient
    ((2, 1, 97, 17, 20, 24), torch.float32, True, False),  # L > S, D != Dv, neither a power of two
    ((1, 1, 113, 113, 64, 64), torch.float32, True, False),
    ((2, 2, 113, 97, 16, 40), torch.float32, False, True),  # batch entry 1 fully padded
    ((1, 1, 97, 1, 8, 8), torch.float32, False, False),  # one key, D < 16 padded to 16
    ((2, 1, 97, 113, 40, 24), torch.float16, False, True),
    ((1, 2, 113, 97, 64, 64), torch.float16, True, False),
    ((1, 1, 17, 1, 16, 16), torch.float16, True, False),
    ((2, 1, 113, 113, 32, 32), torch.bfloat16, True, True),
    ((1, 1, 17, 97, 128, 64), torch.bfloat16, False, False),
    ((2, 1, 1, 17, 16, 16), torch.bfloat16, True, True),
]


@pytest.mark.parametrize("shape,dtype,causal,padding", CASES,
                         ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple) else str(c).replace("torch.", ""))
def test_backward_matches_reference_autograd(shape, dtype, causal, padding):
    check_case(shape, dtype, causal, padding)


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (16, 64), (64, 16)])
def test_blocks_smaller_than_and_not_dividing_the_lengths(block_m, block_n):
    # several query and key blocks: causal skipping in both kernels, ragged ends of L and S
    check_case((1, 2, 97, 113, 16, 16), torch.float32, True, True, block_m=block_m, block_n=block_n)
    check_case((1, 1, 113, 50, 24, 16), torch.float32, True, False, block_m=block_m, block_n=block_n)


def test_fp16_dots_without_the_fp32_fallback():
    # The GPU's code path (DOT_FP32 off: P and dS rounded to fp16 and fed to fp16 dots) also
    # runs under the interpreter for fp16 (only its bf16 tl.dot is wrong), so check it here.
    module = load_kernel()
    interpret = attn_lib.device.triton_interprets()
    q, k, v, kpm = make_inputs(2, 1, 97, 113, 40, 24, padding=True)
    dout = torch.randn(2, 1, 97, 24, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ref = reference_grads(q, k, v, dout, kpm, True)
    naive = naive_grads(q, k, v, dout, kpm, True, torch.float16)
    ql, kl, vl, dl = (t.to(DEVICE, torch.float16) for t in (q, k, v, dout))
    kd = kpm.to(DEVICE)
    out, lse = module.launch(ql, kl, vl, kd, True, 40**-0.5, interpret=interpret, dot_fp32=False)
    grads = module.launch_backward(ql, kl, vl, out, lse, dl, kd, True, 40**-0.5, interpret=interpret, dot_fp32=False)
    for name, g, n, r in zip(("dq", "dk", "dv"), grads, naive, ref):
        assert_grad_flash_rule(g.cpu(), n, r, torch.float16, what=f"{name} fp16 dots")


def test_rows_and_keys_that_see_nothing_get_exact_zero_gradients():
    q, k, v, _ = make_inputs(2, 1, 9, 6, 16)
    dout = torch.randn(2, 1, 9, 16, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    kpm = torch.ones(2, 6, dtype=torch.bool)
    kpm[1] = False  # sequence 1: no key at all
    kpm[0, 0] = False  # causal: query 0 of sequence 0 sees nothing; key 0 is padding
    dq, dk, dv = run_backward(q, k, v, dout, kpm, True, torch.float32)
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()
    assert torch.all(dq[1] == 0) and torch.all(dk[1] == 0) and torch.all(dv[1] == 0)
    assert torch.all(dq[0, :, 0] == 0)  # the row that sees no key
    assert torch.all(dk[0, :, 0] == 0) and torch.all(dv[0, :, 0] == 0)  # the padded key
    rq, rk, rv = reference_grads(q, k, v, dout, kpm, True)
    assert rq[0, :, 1:].abs().max() > 0.1  # the other rows do get gradients, and they agree
    for g, r in ((dq, rq), (dk, rk), (dv, rv)):
        assert_close(g[0], torch.nan_to_num(r[0]), what="sequence 0")


def test_strided_inputs_and_scale():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 33, 3, 16, generator=gen, dtype=torch.float64).transpose(1, 2)  # (B,H,L,D) view
    k = torch.randn(2, 40, 3, 16, generator=gen, dtype=torch.float64).transpose(1, 2)  # (B,H,S,D) view
    v = torch.randn(2, 3, 24, 40, generator=gen, dtype=torch.float64).transpose(2, 3)  # (B,H,S,Dv) view
    dout = torch.randn(2, 3, 24, 33, generator=gen, dtype=torch.float64).transpose(2, 3)  # (B,H,L,Dv) view
    ref = reference_grads(q, k, v, dout, None, True, scale=0.3)
    ql, kl, vl, dol = (t.float().to(DEVICE) for t in (q, k, v, dout))
    assert not ql.is_contiguous() and not dol.is_contiguous()
    out, lse = flash_attention_triton(ql, kl, vl, is_causal=True, scale=0.3)
    got = flash_attention_triton_backward(ql, kl, vl, out, lse, dol, is_causal=True, scale=0.3)
    for name, g, r in zip(("dq", "dk", "dv"), got, ref):
        assert_close(g.cpu(), r, what=name)


def test_dout_with_zero_strides():
    # loss = out.sum() hands the backward an expanded tensor of ones (every stride 0)
    q, k, v, kpm = make_inputs(2, 2, 21, 30, 16, padding=True)
    ql, kl, vl = (t.float().to(DEVICE) for t in (q, k, v))
    out, lse = flash_attention_triton(ql, kl, vl, key_padding_mask=kpm.to(DEVICE))
    ones = torch.ones(1, 1, 1, 1, device=DEVICE).expand_as(out)  # (B,H,L,Dv), strides 0
    assert ones.stride() == (0, 0, 0, 0)
    got = flash_attention_triton_backward(ql, kl, vl, out, lse, ones, key_padding_mask=kpm.to(DEVICE))
    want = flash_attention_triton_backward(ql, kl, vl, out, lse, ones.contiguous(), key_padding_mask=kpm.to(DEVICE))
    ref = reference_grads(q, k, v, torch.ones(2, 2, 21, 16, dtype=torch.float64), kpm, False)
    for g, w, r in zip(got, want, ref):
        assert torch.equal(g, w)
        assert_close(g.cpu(), r)


def test_empty_queries_or_keys_give_zero_gradients():
    q = torch.randn(1, 2, 5, 16, device=DEVICE)
    none = torch.randn(1, 2, 0, 16, device=DEVICE)
    out, lse = flash_attention_triton(q, none, none)
    dq, dk, dv = flash_attention_triton_backward(q, none, none, out, lse, torch.ones_like(out))
    assert torch.all(dq == 0) and dk.shape == (1, 2, 0, 16) and dv.shape == (1, 2, 0, 16)
    out, lse = flash_attention_triton(none, q, q)
    dq, dk, dv = flash_attention_triton_backward(none, q, q, out, lse, out)
    assert dq.shape == (1, 2, 0, 16) and torch.all(dk == 0) and torch.all(dv == 0)


def test_heads_launched_in_chunks(monkeypatch):
    # CUDA's grid axis 1 holds at most 65535 programs; with the limit set to 2, B·H = 6 heads
    # need three launches of every kernel, each starting at its own HZ_START.
    module = load_kernel()
    monkeypatch.setattr(module, "MAX_GRID_Y", 2)
    assert module.grid_chunks(6) == [(0, 2), (2, 2), (4, 2)]
    check_case((2, 3, 17, 33, 16, 16), torch.float32, True, True)


def test_int64_offsets_give_the_same_gradients(monkeypatch):
    module = load_kernel()
    monkeypatch.setattr(module, "needs_int64", lambda spans, max_block=256: True)
    got, ref = check_case((1, 2, 33, 20, 16, 16), torch.float32, True, True)
    assert max(max_abs_error(g, r) for g, r in zip(got, ref)) <= FLOAT32_ATOL


def largest_float_tensor(fn, *args, **kwargs):
    """Like attn_lib.costs.io_model.largest_tensor (every aten output is inspected), floating tensors only:
    Triton's interpreter copies the inputs' storage as raw bytes (uint8), which are not attention tensors."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Spy(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    self.largest = max(self.largest, t.numel())
            return out

    with Spy() as spy:
        result = fn(*args, **kwargs)
    return result, spy.largest


def test_backward_never_creates_an_l_by_s_tensor():
    # Forward and backward make only O(L·D + S·D) tensors, never the (B, H, L, S) matrix the
    # naive backward needs (on a GPU the kernels allocate nothing else at all).
    B, H, L, S, D = 1, 2, 97, 113, 16
    q, k, v, kpm = make_inputs(B, H, L, S, D, padding=True)
    q, k, v, kpm = q.float().to(DEVICE), k.float().to(DEVICE), v.float().to(DEVICE), kpm.to(DEVICE)
    dout = torch.randn(B, H, L, D, device=DEVICE)
    (out, lse), fwd_largest = largest_float_tensor(flash_attention_triton, q, k, v, is_causal=True, key_padding_mask=kpm)
    _, bwd_largest = largest_float_tensor(flash_attention_triton_backward, q, k, v, out, lse, dout, is_causal=True,
                                          key_padding_mask=kpm)
    linear = B * H * max(L, S) * D  # the largest of q, k, v, out and their gradients
    assert 0 < fwd_largest <= linear and 0 < bwd_largest <= linear, (fwd_largest, bwd_largest)
    assert linear * 6 < B * H * L * S  # an (L, S) tensor would have been seen
    _, naive_largest = largest_float_tensor(naive_grads, q.cpu(), k.cpu(), v.cpu(), dout.cpu(), kpm.cpu(), True,
                                            torch.float32)
    assert naive_largest >= B * H * L * S  # the spy does see the naive backward's score matrix


# ---------------------------------------------------------------------------------------------
# End to end: attn_lib.flash_attention(..., backend="triton") trains, i.e. its backward (these
# kernels, through FlashAttentionFunction) gives dq, dk, dv within the flash-attn rule of the
# float64 reference's autograd, and within the float32 tolerance in float32.
# ---------------------------------------------------------------------------------------------
END_TO_END_SHAPES = [(1, 2, 17, 33, 16, 16), (2, 1, 33, 17, 16, 32)]  # (B, H, L, S, D, Dv): lengths not multiples of 16


def grads_of(fn, q, k, v, dout):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(dout)
    return out, (q.grad, k.grad, v.grad)


@pytest.mark.parametrize("shape", END_TO_END_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("causal,padding", [(False, False), (True, True)], ids=["full", "causal_pad"])
def test_triton_backward_matches_reference(shape, dtype, causal, padding):
    B, H, L, S, D, Dv = shape
    q, k, v, kpm = make_inputs(B, H, L, S, D, Dv, padding=padding, seed=11)
    dout = torch.randn(B, H, L, Dv, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    ql, kl, vl, dl = (t.to(dtype) for t in (q, k, v, dout))
    expected = reference_grads(ql, kl, vl, dl, kpm, causal)  # float64 on the same (rounded) inputs
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
            assert_close(g, e, what=f"triton float32 d{name}")
    if padding and B > 1:  # batch entry B-1 has no key at all: zero gradients
        assert all(torch.all(g.cpu()[-1] == 0) for g in got)
