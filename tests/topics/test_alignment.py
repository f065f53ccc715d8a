"""``align="bottom-right"`` on every path that takes it, against an oracle written from flash-attn's documented
rule (``flash_attn_func``'s docstring): query i sees key j iff

    i + S - L - left  <=  j  <=  i + S - L + right        (-1: unbounded; is_causal sets right = 0)

and a row that sees no key gives a zero output (attn_lib's choice; its log-sum-exp is -inf). The oracle below
builds that visibility one (i, j) at a time and computes softmax attention over it in float64 with plain
torch operations; nothing of attn_lib is used to compute it. Forward outputs and, in float64, gradients.
The Triton cases run the kernels under Triton's interpreter on CPU tensors: tiny sizes, float32.
"""
from __future__ import annotations

import importlib.util
import math

import pytest
import torch

import attn_lib
from attn_lib import LoopedMultiHeadAttention, MultiHeadAttention
from attn_lib.tolerances import assert_close, lse_atol

from attn_paths import DISTINGUISHABLE, randn64, seed_weights

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="the optional triton package is not installed")


def visible(L: int, S: int, is_causal: bool = False, window=None) -> torch.Tensor:
    """(L, S) bool, True where query i sees key j under the bottom-right rule."""
    left, right = window if window is not None else (-1, -1)
    right = 0 if is_causal else right
    return torch.tensor([[(left < 0 or j >= i + S - L - left) and (right < 0 or j <= i + S - L + right)
                          for j in range(S)] for i in range(L)], dtype=torch.bool)


def oracle(q, k, v, seen: torch.Tensor, scale: float | None = None):
    """float64 softmax attention over the keys ``seen`` (L, S) allows: (output, log-sum-exp); zeros and -inf for
    a row that sees nothing. Differentiable (a dead row's scores are replaced by zeros before the softmax, so no
    nan reaches the gradient)."""
    q, k, v = q.double(), k.double(), v.double()
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (B,H,L,D) @ (B,H,D,S) -> (B,H,L,S)
    hidden = scores.masked_fill(~seen, float("-inf"))  # (B,H,L,S)
    alive = seen.any(-1, keepdim=True)  # (L,1)
    p = torch.softmax(torch.where(alive, hidden, torch.zeros_like(hidden)), dim=-1) * alive  # (B,H,L,S)
    return p @ v, torch.logsumexp(hidden, dim=-1)  # (B,H,L,Dv), (B,H,L)


# (L, S, is_causal, window): the issue's example first; L > S leaves the first rows with no key at all.
CASES = [(2, 6, True, (1, 0)), (2, 6, True, None), (4, 7, True, (2, 0)), (4, 6, False, (1, 1)), (5, 3, False, (0, 1)),
         (6, 2, True, None), (5, 5, True, (1, 0)), (3, 8, False, (-1, 2)), (7, 3, True, (1, -1))]
CASE_IDS = [f"L{L}-S{S}-{'causal' if c else 'any'}-{w}" for L, S, c, w in CASES]


def _inputs(L, S, D=8, Dv=5, dtype=torch.float64, seed=0):
    return (randn64(2, 2, L, D, seed=seed, dtype=dtype), randn64(2, 2, S, D, seed=seed + 1, dtype=dtype),
            randn64(2, 2, S, Dv, seed=seed + 2, dtype=dtype))


def _dead_rows_are_zero(out, seen, what):
    dead = ~seen.any(-1)  # (L,)
    assert bool((out[:, :, dead] == 0).all()), f"{what}: a row that sees no key must give exactly 0"


def test_the_oracle_reads_the_rule_as_flash_attn_s_docstring_illustrates():
    """flash-attn's docstring: causal, L=2, S=5 -> [[1 1 1 1 0], [1 1 1 1 1]]; L=5, S=2 -> rows 0-2 see nothing."""
    assert visible(2, 5, is_causal=True).int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert visible(5, 2, is_causal=True).int().tolist() == [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]
    assert visible(2, 6, is_causal=True, window=(1, 0)).int().tolist() == [[0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1]]


@pytest.mark.parametrize("L,S,is_causal,window", CASES, ids=CASE_IDS)
def test_the_masks_are_the_rule(L, S, is_causal, window):
    seen = visible(L, S, is_causal, window)
    if window is not None:
        got = attn_lib.sliding_window_mask(L, S, window_size=window, is_causal=is_causal, align="bottom-right")
        assert torch.equal(got, seen), "sliding_window_mask"
    if is_causal:
        assert torch.equal(attn_lib.causal_mask(L, S, align="bottom-right"), visible(L, S, True)), "causal_mask"


FLOAT64_PATHS = {
    "attention": lambda q, k, v, c, w: attn_lib.attention(q, k, v, is_causal=c, window_size=w, align="bottom-right")[0],
    "flash_attention": lambda q, k, v, c, w: attn_lib.flash_attention(q, k, v, is_causal=c, window_size=w,
                                                                      align="bottom-right", backend="torch"),
    "naive_attention": lambda q, k, v, c, w: attn_lib.naive_attention(q, k, v, is_causal=c, align="bottom-right"),
}


FLOAT64_CASES = [pytest.param(name, *case, id=f"{name}-{case_id}") for name in sorted(FLOAT64_PATHS)
                 for case, case_id in zip(CASES, CASE_IDS)
                 if name != "naive_attention" or (case[2] and case[3] is None)]  # naive: no window, align only causal


@pytest.mark.parametrize("name,L,S,is_causal,window", FLOAT64_CASES)
def test_every_float64_path_gives_the_rule_s_output_and_gradients(name, L, S, is_causal, window):
    seen = visible(L, S, is_causal, window)
    q, k, v = (t.requires_grad_() for t in _inputs(L, S))
    out = FLOAT64_PATHS[name](q, k, v, is_causal, window)
    expected, _ = oracle(q, k, v, seen)
    assert_close(out, expected, dtype="float64", what=name)
    _dead_rows_are_zero(out, seen, name)
    dout = randn64(*out.shape, seed=9)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for what, g, e in zip("qkv", grads, torch.autograd.grad(expected, (q, k, v), dout)):
        assert_close(g, e, dtype="float64", kind="gradient", what=f"{name}: d{what}")


@pytest.mark.parametrize("L,S,is_causal,window", CASES, ids=CASE_IDS)
def test_the_tiled_forward_and_backward_give_the_rule_s_answer(L, S, is_causal, window):
    seen = visible(L, S, is_causal, window)
    q, k, v = _inputs(L, S)
    kw = dict(is_causal=is_causal, window_size=window, align="bottom-right", block_m=2, block_n=3)  # several tiles
    out, lse = attn_lib.flash_attention_torch(q, k, v, **kw)
    q64, k64, v64 = (t.clone().requires_grad_() for t in (q, k, v))
    expected, expected_lse = oracle(q64, k64, v64, seen)
    assert_close(out, expected, dtype="float64", what="flash_attention_torch")
    assert_close(lse, expected_lse, dtype="float64", what="flash_attention_torch lse")  # -inf where nothing is seen
    _dead_rows_are_zero(out, seen, "flash_attention_torch")
    dout = randn64(*out.shape, seed=9)
    grads = attn_lib.flash_attention_torch_backward(q, k, v, out, lse, dout, **kw)
    for what, g, e in zip("qkv", grads, torch.autograd.grad(expected, (q64, k64, v64), dout)):
        assert_close(g, e, dtype="float64", kind="gradient", what=f"flash_attention_torch_backward: d{what}")


TRITON_CASES = [(2, 6, True, (1, 0)), (5, 3, True, None), (3, 5, False, (1, 1))]


@needs_triton
@pytest.mark.parametrize("L,S,is_causal,window", TRITON_CASES, ids=[f"L{c[0]}-S{c[1]}" for c in TRITON_CASES])
def test_the_triton_kernels_give_the_rule_s_answer(L, S, is_causal, window):
    seen = visible(L, S, is_causal, window)
    q, k, v = _inputs(L, S, D=16, Dv=16, dtype=torch.float32)
    kw = dict(is_causal=is_causal, window_size=window, align="bottom-right")
    out, lse = attn_lib.flash_attention_triton(q, k, v, **kw)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    expected, expected_lse = oracle(q64, k64, v64, seen)
    assert_close(out, expected, dtype=torch.float32, what="flash_attention_triton")
    alive = seen.any(-1)  # (L,)
    assert torch.isneginf(lse[:, :, ~alive]).all()
    assert (lse[:, :, alive] - expected_lse[:, :, alive]).abs().max() <= lse_atol(torch.float32)
    _dead_rows_are_zero(out, seen, "flash_attention_triton")
    dout = randn64(*out.shape, seed=9, dtype=torch.float32)
    grads = attn_lib.flash_attention_triton_backward(q, k, v, out, lse, dout, **kw)
    expected_grads = torch.autograd.grad(expected, (q64, k64, v64), dout.double())
    for what, g, e in zip("qkv", grads, expected_grads):
        assert_close(g, e, dtype=torch.float32, kind="gradient", what=f"flash_attention_triton_backward: d{what}")
    qg = q.clone().requires_grad_()
    routed = attn_lib.flash_attention(qg, k, v, backend="triton", **kw)
    assert_close(routed, expected, dtype=torch.float32, what="flash_attention, backend='triton'")
    (dq,) = torch.autograd.grad(routed, qg, dout)
    assert_close(dq, expected_grads[0], dtype=torch.float32, kind="gradient", what="flash_attention triton: dq")


def test_the_issue_s_example_is_not_top_left():
    """L = 2 queries, S = 6 keys, window (1, 0): bottom-right, query 0 sees keys 3-4 and query 1 keys 4-5;
    top-left they would see 0 and 0-1. The two answers are visibly different."""
    q, k, v = _inputs(2, 6)
    right = attn_lib.attention(q, k, v, is_causal=True, window_size=(1, 0), align="bottom-right")[0]
    left = attn_lib.attention(q, k, v, is_causal=True, window_size=(1, 0))[0]
    assert (right - left).abs().max() > DISTINGUISHABLE
    top_left_rule = torch.tensor([[True] + [False] * 5, [True, True] + [False] * 4])
    assert_close(left, oracle(q, k, v, top_left_rule)[0], dtype="float64", what="the top-left default")


# --- the layers: align matters for cross-attention (L queries, S memory keys) -----------------------------------

def _projected(layer, xq, xk):
    """q, k, v of a fused multi-head layer, recomputed in float64 from its weights: (B,H,L,D), (B,H,S,D) x 2."""
    C, H = layer.d_model, layer.num_heads
    w_q, w_k, w_v = layer.qkv.weight.double().split(C)  # (3C,C) -> 3 x (C,C)
    b_q, b_k, b_v = layer.qkv.bias.double().split(C)

    def heads(y):  # (B,N,C) -> (B,H,N,D)
        return y.reshape(y.shape[0], y.shape[1], H, C // H).transpose(1, 2)

    return heads(xq @ w_q.T + b_q), heads(xk @ w_k.T + b_k), heads(xk @ w_v.T + b_v)


@pytest.mark.parametrize("backend", ["auto", "reference", "sdpa", "torch"])
@pytest.mark.parametrize("Layer", [MultiHeadAttention, LoopedMultiHeadAttention], ids=lambda c: c.__name__)
@pytest.mark.parametrize("L,S,is_causal,window", [(2, 6, True, (1, 0)), (3, 5, True, None), (5, 3, False, (0, 1))],
                         ids=["issue example", "causal", "more queries than keys"])
def test_a_layer_s_align_places_cross_attention_queries(Layer, backend, L, S, is_causal, window):
    fused = seed_weights(MultiHeadAttention(8, 2, is_causal=is_causal, window_size=window, align="bottom-right",
                                            backend=backend)).double()
    layer = fused if Layer is MultiHeadAttention else LoopedMultiHeadAttention.from_fused(fused)
    assert layer.align == "bottom-right"
    xq, xk = randn64(2, L, 8, seed=3).requires_grad_(), randn64(2, S, 8, seed=4)
    out = layer(xq, xk)
    attended, _ = oracle(*_projected(fused, xq, xk), visible(L, S, is_causal, window))  # (B,H,L,D)
    merged = attended.transpose(1, 2).reshape(2, L, 8)  # (B,H,L,D) -> (B,L,C)
    expected = merged @ fused.out_proj.weight.double().T + fused.out_proj.bias.double()
    assert_close(out, expected, dtype="float64", what=f"{Layer.__name__} on {backend}")
    (g,) = torch.autograd.grad(out.square().sum(), xq)
    (e,) = torch.autograd.grad(expected.square().sum(), xq)
    assert_close(g, e, dtype="float64", kind="gradient", what=f"{Layer.__name__} on {backend}: d query")
