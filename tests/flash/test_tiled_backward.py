"""The tiled torch backward (``attn_lib.flash.tiled_backward``: ``flash_attention_torch_backward`` and its
core ``backward_core``) against the float64 reference's autograd (``attn_lib.attention`` with a bool mask
built here) and ``torch.autograd.gradcheck`` in float64 (through ``attn_lib.flash_attention(backend="torch")``,
whose backward it is).

Covered: shapes around the block sizes, causal and not, key masks with rows and sequences that see no
key (zero gradients), grouped-query attention (dk, dv summed over a group), sliding windows,
``align="bottom-right"`` and any band offset through the core's settings, a scale beyond the base-2
factor's range, low precision, the dtypes returned, one and three threads, the tiles visited (a band
costs O(L·window)) and that no (B, H, L, S) tensor and no repeated K/V is ever allocated.
"""
import os
import subprocess
import sys

import pytest
import torch

import attn_lib
import attn_lib.flash.tiled_backward as tiled_backward
import attn_lib.flash.tiled_forward as tiled_forward
from attn_lib import flash_attention, flash_attention_torch, flash_attention_torch_backward
from attn_lib.costs.io_model import largest_tensor
from attn_lib.rules.band import Band
from attn_lib.rules.settings import AttentionSettings
from attn_lib.tolerances import assert_close

from attn_paths import flash_inputs, reference_grads, visible_band


@pytest.fixture
def small_blocks(monkeypatch, request):
    """Make flash_attention's default blocks small (and not dividing the lengths) for one test."""
    bm, bn = request.param
    for module, names in ((tiled_forward, ("DEFAULT_BLOCK_M", "DEFAULT_BLOCK_N")),
                          (tiled_backward, ("DEFAULT_BWD_BLOCK_M", "DEFAULT_BWD_BLOCK_N"))):
        for name, value in zip(names, (bm, bn)):
            monkeypatch.setattr(module, name, value)
    return bm, bn


def qkv(B, H, Hkv, L, S, D=12, Dv=10, dtype=torch.float64, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    shapes = ((B, H, L, D), (B, Hkv, S, D), (B, Hkv, S, Dv))
    return tuple(torch.randn(*s, generator=g, dtype=torch.float64).to(dtype).requires_grad_(requires_grad)
                 for s in shapes)


def half_padded(B, S):
    key_mask = torch.ones(B, S, dtype=torch.bool)
    key_mask[-1, S // 2:] = False  # the last sequence's second half is absent
    return key_mask


def masked_reference(q, k, v, visible, scale=None, seed=1):
    """float64 (out, dq, dk, dv) of attn_lib.attention with the bool mask ``visible``, and the dout used."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, _ = attn_lib.attention(q, k, v, mask=visible, enable_gqa=True, scale=scale)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), dout)), dout


def ids(c):
    if isinstance(c, tuple):
        return "x".join(map(str, c))
    return "causal" if c is True else "full" if c is False else str(c)


# --- gradcheck ---------------------------------------------------------------------------------------------

# (L, S, D, Dv): L, S in {1, 17, 97, 113}, L != S both ways, D != Dv. Small head dims keep gradcheck fast.
GRADCHECK_SHAPES = [(1, 1, 3, 2), (17, 1, 2, 3), (1, 17, 3, 2), (17, 97, 2, 3), (97, 17, 3, 2), (113, 113, 2, 2),
                    (97, 113, 2, 3)]


@pytest.mark.parametrize("shape", GRADCHECK_SHAPES, ids=lambda s: "L{}_S{}_D{}_Dv{}".format(*s))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("padding", [False, True], ids=["nopad", "pad"])
@pytest.mark.parametrize("small_blocks", [(16, 8)], indirect=True)
def test_gradcheck_float64(shape, causal, padding, small_blocks):
    """torch.autograd.gradcheck on flash_attention(backend='torch'); with padding, batch entry 1 has no key at all."""
    L, S, D, Dv = shape
    q, k, v, key_mask = flash_inputs(2, 1, L, S, D, Dv, padding=padding, seed=L + S)
    inputs = tuple(t.requires_grad_() for t in (q, k, v))
    fn = lambda q, k, v: flash_attention(q, k, v, is_causal=causal, key_mask=key_mask, backend="torch")  # noqa: E731
    assert fn(*inputs).grad_fn is not None
    # fast_mode: compares J·u for random u (numerically and analytically) instead of the full Jacobian.
    assert torch.autograd.gradcheck(fn, inputs, fast_mode=True)


@pytest.mark.parametrize("small_blocks", [(7, 5)], indirect=True)
def test_gradcheck_full_jacobian_blocks_7x5_causal_padding(small_blocks):
    q, k, v, key_mask = flash_inputs(2, 1, 17, 13, 2, 2, padding=True, seed=5)
    inputs = tuple(t.requires_grad_() for t in (q, k, v))
    fn = lambda q, k, v: flash_attention(q, k, v, is_causal=True, key_mask=key_mask, backend="torch")  # noqa: E731
    assert torch.autograd.gradcheck(fn, inputs)  # the full Jacobian, once


@pytest.mark.parametrize("config", [(6, 2, (3, 2), False, "top-left"), (8, 1, (2, 0), True, "top-left"),
                                    (4, 4, (-1, 1), False, "top-left"), (6, 3, (2, 0), True, "bottom-right")], ids=ids)
def test_gradcheck_float64_gqa_windows_and_alignment(config, monkeypatch):
    H, Hkv, window, causal, align = config
    for module, name, value in ((tiled_backward, "DEFAULT_BWD_BLOCK_M", 3), (tiled_backward, "DEFAULT_BWD_BLOCK_N", 4),
                                (tiled_forward, "DEFAULT_BLOCK_M", 4), (tiled_forward, "DEFAULT_BLOCK_N", 3)):
        monkeypatch.setattr(module, name, value)
    q, k, v = qkv(1, H, Hkv, 7, 9, D=3, Dv=2, requires_grad=True)
    key_mask = half_padded(1, 9)
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attention(q, k, v, is_causal=causal, key_mask=key_mask, backend="torch",
                                        enable_gqa=True, window_size=window, align=align), (q, k, v))


# --- against the reference's autograd ---------------------------------------------------------------------

SHAPES = [  # (B, H, L, S, D, Dv)
    (1, 1, 1, 1, 16, 16),
    (2, 2, 17, 97, 8, 12),
    (1, 2, 97, 17, 16, 8),
    (2, 1, 113, 113, 8, 8),
    (1, 1, 1, 113, 16, 16),
    (1, 1, 113, 1, 16, 16),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("padding", [False, True], ids=["nopad", "pad"])
def test_float64_gradients_match_the_reference_for_every_block_size(shape, causal, padding):
    B, H, L, S, D, Dv = shape
    q, k, v, key_mask = flash_inputs(B, H, L, S, D, Dv, padding=padding, seed=1)
    dout = torch.randn(B, H, L, Dv, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    expected = reference_grads(q, k, v, dout, key_mask, causal)
    out, lse = flash_attention_torch(q, k, v, is_causal=causal, key_mask=key_mask)
    for bm, bn in [(None, None), (16, 16), (7, 5)]:
        grads = flash_attention_torch_backward(q, k, v, out, lse, dout, is_causal=causal, key_mask=key_mask,
                                               block_m=bm, block_n=bn)
        for name, g, e, t in zip("qkv", grads, expected, (q, k, v)):
            assert g.shape == t.shape and g.dtype == t.dtype
            assert bool(torch.isfinite(g).all()), f"d{name} has nan/inf (blocks {bm}x{bn})"
            assert_close(g, e, what=f"d{name}, blocks {bm}x{bn}", kind="gradient")


HEADS = [(6, 2), (8, 1), (4, 4)]
WINDOWS = [(0, 0), (1, 0), (5, 0), (3, 2), (-1, 4), (50, 50)]  # (50, 50): wider than every sequence here
WINDOW_CASES = [(w, False) for w in WINDOWS] + [(w, True) for w in WINDOWS if w[1] <= 0]


@pytest.mark.parametrize("heads", HEADS, ids=ids)
@pytest.mark.parametrize("window,causal", WINDOW_CASES, ids=ids)
@pytest.mark.parametrize("lengths", [(13, 11), (13, 17)], ids=ids)
def test_gqa_and_window_gradients_match_the_reference(heads, window, causal, lengths):
    (H, Hkv), (L, S) = heads, lengths
    q, k, v = qkv(2, H, Hkv, L, S)
    key_mask = half_padded(2, S)
    visible = visible_band(L, S, causal, window) & key_mask[:, None, None, :]  # (B,1,L,S)
    (ref_out, *ref_grads), dout = masked_reference(q, k, v, visible)
    for bm, bn in [(4, 3), (5, 7)]:  # do not divide L = 13, S = 11 / 17
        out, lse = flash_attention_torch(q, k, v, is_causal=causal, key_mask=key_mask, block_m=bm, block_n=bn,
                                         enable_gqa=True, window_size=window)
        grads = flash_attention_torch_backward(q, k, v, out, lse, dout, is_causal=causal, key_mask=key_mask,
                                               block_m=bm, block_n=bn, enable_gqa=True, window_size=window)
        for got, want, name in zip(grads, ref_grads, "qkv"):
            assert got.shape == want.shape  # dk, dv have H_kv heads
            assert_close(got, want, dtype=torch.float64, what=f"d{name} blocks {bm}x{bn}", kind="gradient")


# (L, S): bottom-right for L < S, L > S and L = S, and a single query at the end.
ALIGNED = [(5, 11), (11, 5), (7, 7), (1, 17), (9, 13), (13, 9)]


@pytest.mark.parametrize("padding", [False, True], ids=["nopad", "pad"])
@pytest.mark.parametrize("L,S", ALIGNED, ids=ids)
def test_bottom_right_causal_gradients(L, S, padding):
    q, k, v, key_mask = flash_inputs(2, 2, L, S, 8, 6, seed=L * 31 + S, padding=padding)
    visible = torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)[None, None]  # (1,1,L,S)
    if key_mask is not None:
        visible = visible & key_mask[:, None, None, :]  # (B,1,L,S)
    (_, *ref_grads), dout = masked_reference(q, k, v, visible, seed=S)
    kw = dict(is_causal=True, align="bottom-right", key_mask=key_mask)
    for bm, bn in ((2, 3), (4, 2), (16, 16)):
        out, lse = flash_attention_torch(q, k, v, block_m=bm, block_n=bn, **kw)
        grads = flash_attention_torch_backward(q, k, v, out, lse, dout, block_m=bm, block_n=bn, **kw)
        for got, want, name in zip(grads, ref_grads, ("dq", "dk", "dv")):
            assert_close(got, want, dtype=torch.float64, what=f"{name} (blocks {bm}x{bn})", kind="gradient")


@pytest.mark.parametrize("L,S,window,causal", [(7, 13, (3, 0), True), (13, 9, (3, 0), True), (9, 9, (3, 0), True),
                                               (6, 14, (2, 1), False)], ids=ids)
def test_bottom_right_window_gradients(L, S, window, causal):
    q, k, v = qkv(1, 6, 3, L, S)
    (_, *ref_grads), dout = masked_reference(q, k, v, visible_band(L, S, causal, window, offset=S - L))
    kw = dict(is_causal=causal, window_size=window, align="bottom-right", enable_gqa=True, block_m=4, block_n=3)
    out, lse = flash_attention_torch(q, k, v, **kw)
    for got, want in zip(flash_attention_torch_backward(q, k, v, out, lse, dout, **kw), ref_grads):
        assert_close(got, want, dtype=torch.float64, kind="gradient")


# Offsets that no alignment gives: inside the matrix, and past either end (every row sees all keys / none).
OFFSETS = [(9, 13, 3), (13, 9, -2), (6, 9, 20), (9, 6, -20)]


@pytest.mark.parametrize("padding", [False, True], ids=["nopad", "pad"])
@pytest.mark.parametrize("L,S,offset", OFFSETS, ids=ids)
def test_the_core_follows_any_band_offset(L, S, offset, padding):
    q, k, v, key_mask = flash_inputs(2, 2, L, S, 8, 6, seed=L * 31 + S, padding=padding)
    visible = torch.ones(L, S, dtype=torch.bool).tril(diagonal=offset)[None, None]  # (1,1,L,S)
    if key_mask is not None:
        visible = visible & key_mask[:, None, None, :]  # (B,1,L,S)
    (ref_out, *ref_grads), dout = masked_reference(q, k, v, visible, seed=S)
    for bm, bn in ((2, 3), (4, 2), (16, 16)):
        settings = AttentionSettings(band=Band.resolve(L, S, is_causal=True, offset=offset), scale=8 ** -0.5,
                                     work_dtype=torch.float64, key_mask=key_mask, backend="torch", block_m=bm,
                                     block_n=bn)
        out, lse = tiled_forward.forward_core(q, k, v, settings)
        assert_close(out, ref_out, dtype=torch.float64)
        grads = tiled_backward.backward_core(q, k, v, (out, lse, dout), settings)
        for got, want, name in zip(grads, ref_grads, ("dq", "dk", "dv")):
            assert_close(got, want, dtype=torch.float64, what=f"{name} (blocks {bm}x{bn})", kind="gradient")


def test_a_custom_scale_and_an_expanded_dout():
    q, k, v, key_mask = flash_inputs(2, 3, 33, 40, 8, 5, padding=True, seed=2)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = flash_attention(qg, kg, vg, is_causal=True, scale=0.3, key_mask=key_mask, backend="torch")
    out.sum().backward()  # dout is an expanded (stride 0) tensor of ones
    expected = reference_grads(q, k, v, torch.ones(2, 3, 33, 5, dtype=torch.float64), key_mask, True, scale=0.3)
    for name, g, e in zip("qkv", (qg.grad, kg.grad, vg.grad), expected):
        assert_close(g, e, what=f"d{name}", kind="gradient")


def test_a_scale_beyond_the_range_of_the_base_2_factor():
    # scale·log2(e) does not fit float32: the scores are scaled in two steps, forward and backward
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 4, generator=g) * 1e-19 for n in (6, 7, 7))  # q·k ~ 1e-38
    v = v * 1e19
    dout = torch.randn(1, 2, 6, 4, generator=g)
    scale = 3e38  # scale·q·k ~ 1
    out, lse = flash_attention_torch(q, k, v, scale=scale, is_causal=True, block_m=4, block_n=4)
    dq, dk, dv = flash_attention_torch_backward(q, k, v, out, lse, dout, scale=scale, is_causal=True, block_m=4,
                                                block_n=4)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    want, _ = attn_lib.attention(q64, k64, v64, is_causal=True, scale=scale)
    want.backward(dout.double())
    for got, ref in ((dq, q64.grad), (dk, k64.grad), (dv, v64.grad)):
        assert_close(got / ref.abs().max(), (ref / ref.abs().max()).float(), what="gradient / its largest entry",
                     kind="gradient")


@pytest.mark.parametrize("window, causal", [((-1, -1), True), ((1, 0), False), ((0, 1), False)], ids=ids)
def test_a_score_that_overflows_outside_the_band_leaves_the_gradients_finite(window, causal):
    """A hidden pair whose float32 score overflows to +inf changes no gradient (as in the reference): the
    backward hides band positions by min(score, -inf) too, which also holds for +inf."""
    q, k, v = qkv(1, 4, 2, 5, 5, D=4, Dv=3, dtype=torch.float32)
    q[:, :, 0], k[:, :, 4] = 1e20, 1e20  # query 0 never sees key 4 in these bands; scale·q·k = inf in float32
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = flash_attention(q, k, v, is_causal=causal, window_size=window, backend="torch", enable_gqa=True)
    out.sum().backward()
    assert all(bool(torch.isfinite(t.grad).all()) for t in (q, k, v))
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want, _ = attn_lib.attention(*ref, is_causal=causal, window_size=window, enable_gqa=True)
    for got, e in zip((q.grad, k.grad, v.grad), torch.autograd.grad(want.sum(), ref)):
        assert_close(got / e.abs().max(), e / e.abs().max(), dtype=torch.float32, kind="gradient")


# --- rows that see nothing, precision, dtypes ----------------------------------------------------------------

def test_rows_that_see_no_key_get_zero_gradients():
    q, k, v, _ = flash_inputs(2, 2, 9, 6, 4)
    key_mask = torch.ones(2, 6, dtype=torch.bool)
    key_mask[1] = False  # sequence 1: every key absent
    key_mask[0, 0] = False  # causal: query 0 of sequence 0 sees only key 0, which is absent
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = flash_attention(qg, kg, vg, is_causal=True, key_mask=key_mask, backend="torch")
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=out.dtype))
    zero = torch.zeros(())
    for g in (qg.grad, kg.grad, vg.grad):
        assert bool(torch.isfinite(g).all())
        assert torch.equal(g[1], zero.expand_as(g[1]).to(g.dtype))  # sequence 1 sees nothing
    assert torch.equal(qg.grad[0, :, 0], zero.expand_as(qg.grad[0, :, 0]).to(qg.dtype))  # query 0 sees no key
    for g in (kg.grad, vg.grad):  # absent key 0: no gradient
        assert torch.equal(g[0, :, 0], zero.expand_as(g[0, :, 0]).to(g.dtype))
    assert bool(qg.grad[0, :, 1:].abs().sum() > 0)


def test_window_rows_that_see_no_key_get_zero_outputs_and_zero_gradients():
    q, k, v = qkv(2, 6, 2, 12, 5, requires_grad=True)
    key_mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    out = flash_attention(q, k, v, key_mask=key_mask, backend="torch", enable_gqa=True, window_size=(1, 0))
    # window (1, 0): queries >= 6 see no key at all; in sequence 1, queries >= 3 see only padding
    assert not bool(out[:, :, 6:].any()) and not bool(out[1, :, 3:].any())
    assert bool(out[0, :, :6].abs().sum(-1).gt(0).all())
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=out.dtype)).sum().backward()
    assert not bool(q.grad[:, :, 6:].any()) and not bool(q.grad[1, :, 3:].any())
    assert not bool(k.grad[1, :, 2:].any()) and not bool(v.grad[1, :, 2:].any())  # padding keys
    assert bool(q.grad[0, :, 1:5].abs().sum(-1).gt(0).all())


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float32_gradients_within_tolerance(causal):
    q, k, v, key_mask = flash_inputs(2, 2, 97, 113, 16, 8, padding=True, seed=3)
    dout = torch.randn(2, 2, 97, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    q32, k32, v32 = (t.float().requires_grad_() for t in (q, k, v))
    out = flash_attention(q32, k32, v32, is_causal=causal, key_mask=key_mask, backend="torch")
    assert out.dtype == torch.float32
    out.backward(dout.float())
    expected = reference_grads(q32, k32, v32, dout.float(), key_mask, causal)  # float64 on the rounded inputs
    for name, g, e in zip("qkv", (q32.grad, k32.grad, v32.grad), expected):
        assert g.dtype == torch.float32
        assert_close(g, e, dtype=torch.float32, what=f"float32 d{name}", kind="gradient")


def test_a_float32_gqa_window_backward_matches_the_float64_reference():
    q, k, v = qkv(2, 8, 2, 33, 29, dtype=torch.float32, requires_grad=True)
    key_mask = half_padded(2, 29)
    visible = visible_band(33, 29, True, (7, 0)) & key_mask[:, None, None, :]
    (_, *ref_grads), dout = masked_reference(q, k, v, visible)
    out = flash_attention(q, k, v, is_causal=True, key_mask=key_mask, backend="torch", enable_gqa=True,
                          window_size=(7, 0))
    for got, want in zip(torch.autograd.grad(out, (q, k, v), dout.float()), ref_grads):
        assert_close(got, want, dtype=torch.float32, kind="gradient")


def test_low_precision_gradients_are_finite_and_close():
    """float16 / bfloat16 inputs: computed in float32, returned in the input dtype."""
    q, k, v, key_mask = flash_inputs(1, 2, 40, 50, 16, padding=True, seed=6)
    dout = torch.randn(1, 2, 40, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for dtype in (torch.float16, torch.bfloat16):
        ql, kl, vl = (t.to(dtype).requires_grad_() for t in (q, k, v))
        out = flash_attention(ql, kl, vl, is_causal=True, key_mask=key_mask, backend="torch")
        out.backward(dout.to(dtype))
        expected = reference_grads(ql, kl, vl, dout.to(dtype), key_mask, True)
        for name, g, e in zip("qkv", (ql.grad, kl.grad, vl.grad), expected):
            assert g.dtype == dtype
            assert_close(g, e, dtype=dtype, what=f"{dtype} d{name}", kind="gradient")


def test_gradients_come_back_in_the_inputs_dtype():
    q, k, v, key_mask = flash_inputs(1, 2, 9, 7, 8, 8, padding=True, seed=4)
    q, k, v = q.half(), k.half(), v.half()
    out, lse = flash_attention_torch(q, k, v, key_mask=key_mask)
    grads = flash_attention_torch_backward(q, k, v, out, lse, torch.ones_like(out), key_mask=key_mask)
    assert [g.dtype for g in grads] == [torch.float16] * 3


@pytest.mark.parametrize("L,S", [(37, 29), (0, 5), (4, 0)])
def test_every_buffer_is_built_on_the_input_device(L, S):
    # Under a "meta" default device any tensor created without an explicit device lands on meta.
    q, k, v = qkv(2, 2, 2, L, S, D=6, Dv=6)
    key_mask = torch.ones(2, S, dtype=torch.bool)
    key_mask[1, : S // 2] = False
    kw = dict(is_causal=True, key_mask=key_mask, block_m=16, block_n=8)
    out, lse = flash_attention_torch(q, k, v, **kw)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    want = flash_attention_torch_backward(q, k, v, out, lse, dout, **kw)
    with torch.device("meta"):
        got = flash_attention_torch_backward(q, k, v, out, lse, dout, **kw)
    for g, w in zip(got, want):
        assert g.device == w.device and g.dtype == w.dtype and torch.equal(g, w)


_THREADS_SCRIPT = """
import sys, torch
from attn_lib import flash_attention_torch, flash_attention_torch_backward
q, k, v, key_mask, dout, path = torch.load(sys.argv[1])
results = {}
for n in (1, 3):
    torch.set_num_threads(n)
    out, lse = flash_attention_torch(q, k, v, is_causal=True, key_mask=key_mask, block_m=16, block_n=8)
    grads = flash_attention_torch_backward(q, k, v, out, lse, dout, is_causal=True, key_mask=key_mask,
                                           block_m=16, block_n=8)
    results[n] = (out, lse, *grads)
torch.save(results, path)
"""


@pytest.mark.parametrize("B,H", [(1, 3), (3, 1)], ids=["heads", "batch"])
def test_one_and_three_intra_op_threads_give_the_same_numbers(B, H, tmp_path):
    """The tiled forward and backward agree with 1 and 3 torch threads (and with the reference).

    In a fresh interpreter: the thread count is process-wide, and changing it in a process forked
    after torch's thread pool started (as a mutation-testing worker is) can hang.
    """
    q, k, v, key_mask = flash_inputs(B, H, 45, 38, 8, 6, padding=True, seed=10)
    dout = torch.randn(B, H, 45, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    torch.save((q, k, v, key_mask, dout, str(tmp_path / "out.pt")), tmp_path / "in.pt")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, str(tmp_path / "in.pt")], check=True, env=env,
                   timeout=300)
    results = torch.load(tmp_path / "out.pt")
    for a, b in zip(results[1], results[3]):  # equal up to rounding (a batched product may sum in another order)
        assert torch.equal(torch.isneginf(a), torch.isneginf(b))
        fin = torch.isfinite(a)
        assert_close(a[fin], b[fin], what="3 threads vs 1")
    for g, e in zip(results[3][2:], reference_grads(q, k, v, dout, key_mask, True)):
        assert_close(g, e, kind="gradient")


# --- tiles visited, memory -------------------------------------------------------------------------------------

@pytest.fixture
def tiles_visited(monkeypatch):
    """Counts the calls of attn_bwd_dkdv: one per (query block, key block) tile the backward computes."""
    calls = []
    real = tiled_backward.attn_bwd_dkdv
    monkeypatch.setattr(tiled_backward, "attn_bwd_dkdv", lambda *a: calls.append(1) or real(*a))
    return calls


def test_the_causal_backward_visits_only_tiles_some_query_sees(tiles_visited):
    # L = 32 queries, S = 64 keys, tiles of 16: key block j is seen by query blocks j.. (causal, top-left):
    # (0, 0), (1, 0), (1, 1); key blocks 2 and 3 are seen by no query. Also correct with block_m = 1.
    q, k, v, _ = flash_inputs(1, 1, 32, 64, 4, 4, padding=False, seed=5)
    dout = torch.randn(1, 1, 32, 4, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    out, lse = flash_attention_torch(q, k, v, is_causal=True)
    flash_attention_torch_backward(q, k, v, out, lse, dout, is_causal=True, block_m=16, block_n=16)
    assert len(tiles_visited) == 3
    del tiles_visited[:]
    flash_attention_torch_backward(q, k, v, out, lse, dout, is_causal=True, align="bottom-right", block_m=16,
                                   block_n=16)
    assert len(tiles_visited) == 2 * 4 - 1  # offset 32: query block 0 sees key blocks 0..2, block 1 sees 0..3
    grads = flash_attention_torch_backward(q, k, v, out, lse, dout, is_causal=True, block_m=1, block_n=16)
    for g, e in zip(grads, reference_grads(q, k, v, dout, None, True)):
        assert_close(g, e, kind="gradient")


def count_backward_tiles(N, window, block, causal, calls):
    q, k, v = qkv(1, 2, 1, N, N, D=4, Dv=4, dtype=torch.float32)
    out, lse = flash_attention_torch(q, k, v, is_causal=causal, block_m=block, block_n=block, enable_gqa=True,
                                     window_size=window)
    del calls[:]
    flash_attention_torch_backward(q, k, v, out, lse, torch.ones_like(out), is_causal=causal, block_m=block,
                                   block_n=block, enable_gqa=True, window_size=window)
    return len(calls)


def test_the_cost_is_linear_in_the_window_not_quadratic(tiles_visited):
    """N = 1024, window 64 back, tiles of 64: each key block is seen by at most 2 query blocks,
    2·N/64 tiles, where full causal computes (N/64)(N/64 + 1)/2."""
    N, b = 1024, 64
    n = N // b
    assert count_backward_tiles(N, (64, 0), b, True, tiles_visited) == 2 * n - 1
    assert count_backward_tiles(N, (-1, -1), b, True, tiles_visited) == n * (n + 1) // 2


def test_the_backward_never_allocates_the_score_matrix():
    B, H, L, S, D = 1, 2, 128, 160, 8
    q, k, v, key_mask = flash_inputs(B, H, L, S, D, padding=True, seed=8)
    q, k, v = (t.float() for t in (q, k, v))
    out, lse = flash_attention_torch(q, k, v, key_mask=key_mask, is_causal=True)
    dout = torch.randn(B, H, L, D, generator=torch.Generator().manual_seed(0))
    _, largest = largest_tensor(flash_attention_torch_backward, q, k, v, out, lse, dout, key_mask=key_mask,
                                is_causal=True, block_m=32, block_n=32)
    # the two tiles (scores / P and dP / dS, one (2, B·H·32·32) buffer) or an O(N·D) buffer
    assert largest <= max(2 * B * H * 32 * 32, B * H * max(L, S) * D), largest
    assert largest < B * H * L * S // 4
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    ref, _ = attn_lib.attention(qg, kg, vg, mask=key_mask[:, None, None, :], is_causal=True)
    _, naive_largest = largest_tensor(torch.autograd.backward, ref, dout)
    assert naive_largest >= B * H * L * S  # the spy does see a (B,H,L,S) tensor when there is one


def test_a_train_step_allocates_no_score_matrix_and_no_repeated_k_v():
    """The largest tensor any aten op returns during the call, forward and backward
    (attn_lib.costs.io_model.largest_tensor, independent of the allocator). L is small and S large, so K, V
    repeated to H heads (B·H·S·D) or the scores (B·H·L·S) would be the largest tensors; the tiled path stays
    at its inputs, its O(L·D) accumulators and one (B·H_kv, G·BLOCK_M, BLOCK_N) tile."""
    B, H, Hkv, L, S, D = 1, 8, 1, 16, 1024, 16
    q, k, v = qkv(B, H, Hkv, L, S, D=D, Dv=D, dtype=torch.float32, requires_grad=True)
    tile = B * Hkv * (H // Hkv) * L * 256  # the backward's default BLOCK_N = 256, the forward's 256 too
    bound = max(q.numel(), k.numel(), v.numel(), 2 * tile)  # the backward keeps its two tiles in one buffer

    def train_step():
        out = flash_attention(q, k, v, backend="torch", enable_gqa=True, window_size=(100, 0), is_causal=True)
        out.sum().backward()

    _, largest = largest_tensor(train_step)
    assert largest <= bound < B * H * S * D == B * H * L * S  # 2x below the repeated K and the scores
    _, naive = largest_tensor(attn_lib.attention, q.detach(), k.detach(), v.detach(), enable_gqa=True)
    assert naive >= B * H * L * S  # the spy does see a (B, H, L, S) tensor where one is made
