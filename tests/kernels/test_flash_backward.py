"""Backward of the tiled FlashAttention (attn_lib.flash.tiled_backward.flash_attention_torch_backward) and the
differentiable entry point attn_lib.flash_attention(backend="torch"), against the float64 reference's
autograd (attn_lib.attention); overflowing scores refused on every path, fully masked rows are not an
overflow. (The refusals of bad arguments, e.g. a scale or key_padding_mask that requires grad, are rows of
tests/contracts/test_bad_input.py.)"""
import os
import subprocess
import sys

import pytest
import torch

import attn_lib
import attn_lib.flash.tiled_forward as flash_torch
import attn_lib.flash.tiled_backward as flash_torch_backward
from attn_lib.flash.autograd import FlashAttentionFunction, flash_attention
from attn_lib import flash_attention_torch, flash_attention_torch_backward, naive_attention
from attn_lib.costs.io_model import largest_tensor
from attn_lib.tolerances import assert_close

from attn_paths import flash_inputs as make_inputs, reference_grads

OVERFLOW = "attention scores overflowed to \\+inf"


@pytest.fixture
def small_blocks(monkeypatch, request):
    """Make flash_attention's default blocks small (and not dividing the lengths) for one test."""
    bm, bn = request.param
    for name, value in (("DEFAULT_BLOCK_M", bm), ("DEFAULT_BLOCK_N", bn),
                        ("DEFAULT_BWD_BLOCK_M", bm), ("DEFAULT_BWD_BLOCK_N", bn)):
        monkeypatch.setattr(flash_torch if "BWD" not in name else flash_torch_backward, name, value)
    return bm, bn


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
    q, k, v, kpm = make_inputs(2, 1, L, S, D, Dv, padding=padding, seed=L + S)
    inputs = tuple(t.requires_grad_() for t in (q, k, v))
    fn = lambda q, k, v: flash_attention(q, k, v, is_causal=causal, key_padding_mask=kpm, backend="torch")  # noqa: E731
    assert fn(*inputs).grad_fn is not None
    # fast_mode: compares J·u for random u (numerically and analytically) instead of the full Jacobian.
    assert torch.autograd.gradcheck(fn, inputs, fast_mode=True, atol=1e-8)


@pytest.mark.parametrize("small_blocks", [(7, 5)], indirect=True)
def test_gradcheck_blocks_7x5_causal_padding(small_blocks):
    q, k, v, kpm = make_inputs(2, 1, 17, 13, 2, 2, padding=True, seed=5)
    inputs = tuple(t.requires_grad_() for t in (q, k, v))
    fn = lambda q, k, v: flash_attention(q, k, v, is_causal=True, key_padding_mask=kpm, backend="torch")  # noqa: E731
    assert torch.autograd.gradcheck(fn, inputs, atol=1e-8)  # the full Jacobian, once


SHAPES = [  # (B, H, L, S, D, Dv)
    (1, 1, 1, 1, 16, 16),
    (2, 2, 17, 97, 8, 12),
    (1, 2, 97, 17, 16, 8),
    (2, 1, 113, 113, 8, 8),
    (1, 1, 1, 113, 16, 16),
    (1, 1, 113, 1, 16, 16),
]
BLOCKS = [(None, None), (16, 16), (7, 5)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("padding", [False, True], ids=["nopad", "pad"])
def test_float64_grads_match_reference_autograd(shape, causal, padding):
    B, H, L, S, D, Dv = shape
    q, k, v, kpm = make_inputs(B, H, L, S, D, Dv, padding=padding, seed=1)
    dout = torch.randn(B, H, L, Dv, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    expected = reference_grads(q, k, v, dout, kpm, causal)
    out, lse = flash_attention_torch(q, k, v, is_causal=causal, key_padding_mask=kpm)
    for bm, bn in BLOCKS:
        grads = flash_attention_torch_backward(q, k, v, out, lse, dout, is_causal=causal, key_padding_mask=kpm,
                                               block_m=bm, block_n=bn)
        for name, g, e, t in zip("qkv", grads, expected, (q, k, v)):
            assert g.shape == t.shape and g.dtype == t.dtype
            assert torch.isfinite(g).all(), f"d{name} has nan/inf (blocks {bm}x{bn})"
            assert_close(g, e, what=f"d{name}, blocks {bm}x{bn}")


def test_custom_scale_and_non_contiguous_dout():
    q, k, v, kpm = make_inputs(2, 3, 33, 40, 8, 5, padding=True, seed=2)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = flash_attention(qg, kg, vg, is_causal=True, scale=0.3, key_padding_mask=kpm, backend="torch")
    out.sum().backward()  # dout is an expanded (stride 0) tensor of ones
    expected = reference_grads(q, k, v, torch.ones(2, 3, 33, 5, dtype=torch.float64), kpm, True, scale=0.3)
    for name, g, e in zip("qkv", (qg.grad, kg.grad, vg.grad), expected):
        assert_close(g, e, what=f"d{name}")


def test_rows_that_see_no_key_get_zero_gradients():
    q, k, v, _ = make_inputs(2, 2, 9, 6, 4)
    kpm = torch.ones(2, 6, dtype=torch.bool)
    kpm[1] = False  # sequence 1: every key absent
    kpm[0, 0] = False  # causal: query 0 of sequence 0 sees only key 0, which is absent
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = flash_attention(qg, kg, vg, is_causal=True, key_padding_mask=kpm, backend="torch")
    out.backward(torch.randn_like(out))
    for g in (qg.grad, kg.grad, vg.grad):
        assert torch.isfinite(g).all()
    assert torch.all(qg.grad[1] == 0) and torch.all(kg.grad[1] == 0) and torch.all(vg.grad[1] == 0)
    assert torch.all(qg.grad[0, :, 0] == 0)  # query 0 of sequence 0 sees no key
    assert torch.all(kg.grad[0, :, 0] == 0) and torch.all(vg.grad[0, :, 0] == 0)  # absent key: no gradient
    assert qg.grad[0, :, 1:].abs().sum() > 0


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float32_grads_within_tolerance(causal):
    q, k, v, kpm = make_inputs(2, 2, 97, 113, 16, 8, padding=True, seed=3)
    dout = torch.randn(2, 2, 97, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    q32, k32, v32 = (t.float().requires_grad_() for t in (q, k, v))
    out = flash_attention(q32, k32, v32, is_causal=causal, key_padding_mask=kpm, backend="torch")
    assert out.dtype == torch.float32
    out.backward(dout.float())
    expected = reference_grads(q32, k32, v32, dout.float(), kpm, causal)  # float64 on the rounded inputs
    for name, g, e in zip("qkv", (q32.grad, k32.grad, v32.grad), expected):
        assert g.dtype == torch.float32
        assert_close(g, e, dtype=torch.float32, what=f"float32 d{name}")


def test_low_precision_grads_are_finite_and_close():
    """float16 / bfloat16 inputs: computed in float32, returned in the input dtype."""
    q, k, v, kpm = make_inputs(1, 2, 40, 50, 16, padding=True, seed=6)
    dout = torch.randn(1, 2, 40, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for dtype in (torch.float16, torch.bfloat16):
        ql, kl, vl = (t.to(dtype).requires_grad_() for t in (q, k, v))
        out = flash_attention(ql, kl, vl, is_causal=True, key_padding_mask=kpm, backend="torch")
        out.backward(dout.to(dtype))
        expected = reference_grads(ql, kl, vl, dout.to(dtype), kpm, True)
        for name, g, e in zip("qkv", (ql.grad, kl.grad, vl.grad), expected):
            assert g.dtype == dtype
            assert_close(g, e, dtype=dtype, what=f"{dtype} d{name}")


def test_backward_never_allocates_the_score_matrix():
    B, H, L, S, D = 1, 2, 128, 160, 8
    q, k, v, kpm = make_inputs(B, H, L, S, D, padding=True, seed=8)
    q, k, v = (t.float().requires_grad_() for t in (q, k, v))
    dout = torch.randn(B, H, L, D)

    def train_step(fn):
        out = fn(q, k, v)
        torch.autograd.backward(out, dout)

    _, naive_largest = largest_tensor(train_step, lambda q, k, v: naive_attention(q, k, v, key_padding_mask=kpm))
    assert naive_largest >= B * H * L * S  # the spy does see a (B,H,L,S) tensor when there is one
    with pytest.MonkeyPatch.context() as mp:
        for name in ("DEFAULT_BLOCK_M", "DEFAULT_BLOCK_N", "DEFAULT_BWD_BLOCK_M", "DEFAULT_BWD_BLOCK_N"):
            mp.setattr(flash_torch if "BWD" not in name else flash_torch_backward, name, 32)
        _, largest = largest_tensor(train_step, lambda q, k, v: flash_attention(q, k, v, key_padding_mask=kpm,
                                                                                 is_causal=True, backend="torch"))
    assert largest <= max(B * H * 32 * 32, B * H * max(L, S) * D), largest  # a tile or an O(N·D) buffer
    assert largest < B * H * L * S // 4


def test_saves_no_score_matrix_for_backward():
    q, k, v, _ = make_inputs(1, 2, 200, 300, 8)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        flash_attention(q, k, v, backend="torch")
    assert saved and max(saved) <= 2 * 300 * 8  # q, k, v, out, lse: never 200×300 per head


def test_graph_with_shared_input_matches_reference():
    """h = lin(x); loss = flash(h, h, h).sum() + h.sum(): the weight's gradient equals the reference's."""
    grads = {}
    for path in ("flash", "reference"):
        torch.manual_seed(0)
        lin = torch.nn.Linear(16, 16, dtype=torch.float64)
        x = torch.randn(2, 3, 37, 16, dtype=torch.float64)  # (B,H,L,C)
        h = lin(x)  # (B,H,L,C) -> (B,H,L,D)
        if path == "flash":
            out = flash_attention(h, h, h, is_causal=True, backend="torch")  # (B,H,L,D)
        else:
            out, _ = attn_lib.attention(h, h, h, is_causal=True)  # (B,H,L,D)
        loss = out.sum() + h.sum()
        loss.backward()
        grads[path] = (lin.weight.grad.clone(), lin.bias.grad.clone())
    for g, e in zip(grads["flash"], grads["reference"]):
        assert_close(g, e, what="lin grad")
    assert grads["flash"][0].abs().max() > 1  # not a vacuous comparison of zeros


def test_function_used_only_when_grad_is_needed():
    q, k, v, _ = make_inputs(1, 1, 5, 6, 4)
    assert flash_attention(q, k, v, backend="torch").grad_fn is None
    qg = q.clone().requires_grad_()
    out = flash_attention(qg, k, v, backend="torch")
    assert type(out.grad_fn).__name__ == "FlashAttentionFunctionBackward"
    with torch.no_grad():
        assert flash_attention(qg, k, v, backend="torch").grad_fn is None
    assert issubclass(FlashAttentionFunction, torch.autograd.Function)


def test_double_backward_is_refused():
    # Second-order gradients are refused as soon as they are asked for (create_graph=True),
    # naming the path that has them, instead of returning a detached gradient.
    q, k, v, _ = make_inputs(1, 1, 5, 6, 4)
    qg = q.clone().requires_grad_()
    out = flash_attention(qg, k, v, backend="torch")
    dout = torch.ones_like(out, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"no second-order gradients.*attn_lib\.attention"):
        torch.autograd.grad(out, qg, dout, create_graph=True)


def test_naive_attention_backward_with_key_padding():
    q, k, v, kpm = make_inputs(2, 2, 11, 13, 4, 3, padding=True, seed=9)
    inputs = tuple(t.requires_grad_() for t in (q, k, v))
    fn = lambda q, k, v: naive_attention(q, k, v, is_causal=True, key_padding_mask=kpm)  # noqa: E731
    assert torch.autograd.gradcheck(fn, inputs, fast_mode=True, atol=1e-8)
    out = fn(*inputs)
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, dout)
    for g, e in zip(got, reference_grads(q, k, v, dout, kpm, True)):
        assert torch.isfinite(g).all()
        assert_close(g, e)


# ---------------------------------------------------------------------------------------------
# Overflowing scores: one error on every tiled path; fully masked rows are not an overflow
# ---------------------------------------------------------------------------------------------
def _qkv(requires_grad=False, dtype=torch.float32):
    q, k, v, _ = make_inputs(1, 2, 5, 6, 4)
    return tuple(t.to(dtype).requires_grad_(requires_grad) for t in (q, k, v))


def _overflowing(dtype):
    q, k, v = _qkv(dtype=dtype)
    return q.detach() * 0 + 1e20, k.detach() * 0 + 1e20, v.detach()  # scale·q·k = 2e40 > 3.4e38


@pytest.mark.parametrize("path", ["tiled", "naive", "flash_attention", "flash_attention_grad"])
def test_overflowing_scores_raise(path):
    q, k, v = _overflowing(torch.float32)
    with pytest.raises(ValueError, match=OVERFLOW + " \\(\\|scale·q·k\\| exceeds the range of float32\\); "
                                          "compute in float64 or use a smaller scale"):
        if path == "tiled":
            flash_attention_torch(q, k, v, block_m=2, block_n=4)
        elif path == "naive":
            naive_attention(q, k, v)
        elif path == "flash_attention":
            flash_attention(q, k, v, backend="torch")
        else:
            flash_attention(q.requires_grad_(), k, v, backend="torch")
    # The same numbers in float64 do not overflow, and agree with the reference.
    q64, k64, v64 = (t.detach().double() for t in (q, k, v))
    out, _ = flash_attention_torch(q64, k64, v64, block_m=2, block_n=4)
    assert_close(out, attn_lib.attention(q64, k64, v64)[0])


def test_fully_masked_rows_are_not_an_overflow():
    q, k, v = _qkv()
    kpm = torch.zeros(1, 6, dtype=torch.bool)
    for fn in (lambda: flash_attention_torch(q, k, v, key_padding_mask=kpm)[0],
               lambda: naive_attention(q, k, v, key_padding_mask=kpm)):
        assert torch.all(fn() == 0)


_THREADS_SCRIPT = """
import sys, torch
from attn_lib import flash_attention_torch, flash_attention_torch_backward
q, k, v, kpm, dout, path = torch.load(sys.argv[1])
results = {}
for n in (1, 3):
    torch.set_num_threads(n)
    out, lse = flash_attention_torch(q, k, v, is_causal=True, key_padding_mask=kpm, block_m=16, block_n=8)
    grads = flash_attention_torch_backward(q, k, v, out, lse, dout, is_causal=True, key_padding_mask=kpm,
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
    q, k, v, kpm = make_inputs(B, H, 45, 38, 8, 6, padding=True, seed=10)
    dout = torch.randn(B, H, 45, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    torch.save((q, k, v, kpm, dout, str(tmp_path / "out.pt")), tmp_path / "in.pt")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, str(tmp_path / "in.pt")], check=True, env=env,
                   timeout=300)
    results = torch.load(tmp_path / "out.pt")
    for a, b in zip(results[1], results[3]):  # equal up to rounding (a batched product may sum in another order)
        assert torch.equal(torch.isneginf(a), torch.isneginf(b))
        fin = torch.isfinite(a)
        assert_close(a[fin], b[fin], what="3 threads vs 1")
    expected = reference_grads(q, k, v, dout, kpm, True)
    for g, e in zip(results[3][2:], expected):
        assert_close(g, e)


@pytest.mark.parametrize("layer_name", ["MultiHeadAttention", "SelfAttention"])
def test_layers_train_on_the_flash_path(layer_name):
    """A layer with backend="torch" gets the same gradients (input and every parameter) as the
    same layer on the reference path, with causal masking and key padding."""
    import attn_lib

    Layer = getattr(attn_lib, layer_name)
    kwargs = {"num_heads": 2} if layer_name == "MultiHeadAttention" else {}
    torch.manual_seed(0)
    ref = Layer(8, **kwargs, is_causal=True).double()
    flash = Layer(8, **kwargs, is_causal=True, backend="torch").double()
    flash.load_state_dict(ref.state_dict())
    x = torch.randn(2, 7, 8, dtype=torch.float64)  # (B,L,C)
    pad = attn_lib.padding_mask([7, 4], 7)  # (B,1,1,S)
    grads = []
    for layer in (ref, flash):
        xi = x.clone().requires_grad_()
        layer.zero_grad()
        out = layer(xi, mask=pad)  # (B,L,C)
        (out * torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out)).sum().backward()
        grads.append([xi.grad] + [p.grad for p in layer.parameters()])
    assert len(grads[1]) > 1 and all(g is not None for g in grads[1])
    for g_ref, g_flash in zip(*grads):
        assert_close(g_flash, g_ref, dtype="float64", what=f"{layer_name} gradient, flash vs reference")


@pytest.mark.parametrize("L,S", [(37, 29), (0, 5), (4, 0)])
def test_tiled_forward_and_backward_build_every_buffer_on_the_input_device(L, S):
    # Under a "meta" default device any tensor created without an explicit device lands on meta:
    # the result then differs or the call fails. On a GPU the same slip would put a buffer on the CPU.
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 6, generator=g, dtype=torch.float64) for n in (L, S, S))
    pad = torch.ones(2, S, dtype=torch.bool)
    pad[1, : S // 2] = False
    kw = dict(is_causal=True, key_padding_mask=pad, block_m=16, block_n=8)
    out, lse = flash_attention_torch(q, k, v, **kw)
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    grads = flash_attention_torch_backward(q, k, v, out, lse, dout, **kw)
    with torch.device("meta"):
        out_m, lse_m = flash_attention_torch(q, k, v, **kw)
        grads_m = flash_attention_torch_backward(q, k, v, out, lse, dout, **kw)
    for got, want in zip((out_m, lse_m, *grads_m), (out, lse, *grads)):
        assert got.device == want.device and got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_a_scale_beyond_the_working_range_of_the_base_2_factor():
    # scale * log2(e) does not fit float32: the scores are scaled in two steps, forward and backward
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 4, generator=g) * 1e-19 for n in (6, 7, 7))  # q.k ~ 1e-38
    v = v * 1e19
    dout = torch.randn(1, 2, 6, 4, generator=g)
    scale = 3e38  # scale * q.k ~ 1
    out, lse = flash_attention_torch(q, k, v, scale=scale, is_causal=True, block_m=4, block_n=4)
    dq, dk, dv = flash_attention_torch_backward(q, k, v, out, lse, dout, scale=scale, is_causal=True, block_m=4,
                                                block_n=4)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    want, _ = attn_lib.attention(q64, k64, v64, is_causal=True, scale=scale)
    want.backward(dout.double())
    assert_close(out, want.detach().float())
    for got, ref in ((dq, q64.grad), (dk, k64.grad), (dv, v64.grad)):
        assert_close(got / ref.abs().max(), (ref / ref.abs().max()).float(), what="gradient / its largest entry")


def test_gradients_come_back_in_the_inputs_dtype():
    q, k, v, kpm = make_inputs(1, 2, 9, 7, 8, 8, padding=True, seed=4)
    q, k, v = q.half(), k.half(), v.half()
    out, lse = flash_attention_torch(q, k, v, key_padding_mask=kpm)
    grads = flash_attention_torch_backward(q, k, v, out, lse, torch.ones_like(out), key_padding_mask=kpm)
    assert [g.dtype for g in grads] == [torch.float16] * 3


def test_the_causal_backward_visits_only_tiles_some_query_sees(monkeypatch):
    # L = 32 queries, S = 64 keys, tiles of 16: key block j is seen by query blocks j.. (causal, top-left):
    # (0, 0), (1, 0), (1, 1); key blocks 2 and 3 are seen by no query. Also correct with block_m = 1.
    calls = []
    real = flash_torch_backward._attn_bwd_dkdv
    monkeypatch.setattr(flash_torch_backward, "_attn_bwd_dkdv", lambda *a: calls.append(1) or real(*a))
    q, k, v, _ = make_inputs(1, 1, 32, 64, 4, 4, padding=False, seed=5)
    dout = torch.randn(1, 1, 32, 4, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    out, lse = flash_attention_torch(q, k, v, is_causal=True)
    flash_attention_torch_backward(q, k, v, out, lse, dout, is_causal=True, block_m=16, block_n=16)
    assert len(calls) == 3
    grads = flash_attention_torch_backward(q, k, v, out, lse, dout, is_causal=True, block_m=1, block_n=16)
    for g, e in zip(grads, reference_grads(q, k, v, dout, None, True)):
        assert_close(g, e)
