"""Autograd audit: every exported public function that takes tensors either supports autograd
(backward runs and its gradients match the float64 autograd of an independent formula) or
refuses ``requires_grad`` inputs with a clear error naming what to use instead.

Every callable in ``attn_lib.__all__`` must appear in exactly one table below, so a new export
has to be classified before the suite passes.
"""
from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

import attn_lib
from attn_lib.tolerances import assert_close

GEN_SEED = 11


def _r(*shape, seed=0, positive=False):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(GEN_SEED + seed), dtype=torch.float64)
    return (x.abs() + 0.1 if positive else x).requires_grad_()


def _sdpa(q, k, v, mask=None, causal=False):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


def _fused_reference(layer, x, causal):
    """float64 multi-head attention from a fused layer's weights, with torch's SDPA."""
    C, H = layer.d_model, layer.num_heads
    qkv = F.linear(x, layer.qkv.weight, layer.qkv.bias)  # (B,L,3C)
    q, k, v = (t.reshape(x.shape[0], x.shape[1], H, C // H).transpose(1, 2) for t in qkv.split(C, -1))
    out = _sdpa(q, k, v, causal=causal).transpose(1, 2).reshape(x.shape)  # (B,H,L,D) -> (B,L,C)
    return F.linear(out, layer.out_proj.weight, layer.out_proj.bias)


def _looped_reference(layer, x, causal):
    outs = [_sdpa(layer.w_q[h](x)[:, None], layer.w_k[h](x)[:, None], layer.w_v[h](x)[:, None], causal=causal)[:, 0]
            for h in range(layer.num_heads)]
    return layer.out_proj(torch.cat(outs, -1))


def _rope_reference(x, base=10000.0):
    """Rotary embedding written out: channel pair (2i, 2i+1) at position m turns by m·base^(-2i/D)."""
    B, H, L, D = x.shape
    angle = torch.arange(L, dtype=torch.float64)[:, None] * base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    c, s = torch.cos(angle), torch.sin(angle)  # (L,D/2)
    even, odd = x[..., 0::2], x[..., 1::2]  # (B,H,L,D/2)
    return torch.stack([even * c - odd * s, even * s + odd * c], dim=-1).reshape(B, H, L, D)


def _self_reference(layer, x, causal):
    return _sdpa(layer.w_q(x)[:, None], layer.w_k(x)[:, None], layer.w_v(x)[:, None], causal=causal)[:, 0]


MASK = torch.rand(5, 7, generator=torch.Generator().manual_seed(3)) > 0.3  # (L,S)
MASK[:, 0] = True

# name -> (inputs() -> tuple of tensors, ours(*inputs), independent float64 formula(*inputs))
AUTOGRAD = {
    "attention": (lambda: (_r(2, 2, 5, 4), _r(2, 2, 7, 4, seed=1), _r(2, 2, 7, 3, seed=2)),
                  lambda q, k, v: attn_lib.attention(q, k, v, mask=MASK)[0],
                  lambda q, k, v: _sdpa(q, k, v, mask=MASK)),
    "softmax": (lambda: (_r(3, 6),), lambda x: attn_lib.softmax(x), lambda x: torch.softmax(x, -1)),
    "naive_softmax": (lambda: (_r(3, 6),), lambda x: attn_lib.naive_softmax(x), lambda x: torch.softmax(x, -1)),
    "online_softmax": (lambda: (_r(3, 7),), lambda x: attn_lib.online_softmax(x, 3), lambda x: torch.softmax(x, -1)),
    "online_logsumexp": (lambda: (_r(3, 7),), lambda x: attn_lib.online_logsumexp(x, [2, 5]),
                         lambda x: torch.logsumexp(x, -1)),
    "online_max_and_sum": (lambda: (_r(3, 7),), lambda x: torch.stack(attn_lib.online_max_and_sum(x, 2)),
                           lambda x: torch.stack([x.amax(-1), torch.exp(x - x.amax(-1, keepdim=True)).sum(-1)])),
    "online_softmax_update": (lambda: (_r(3), _r(3, positive=True, seed=1), _r(3, 4, seed=2)),
                              lambda m, l, p: torch.stack(attn_lib.online_softmax_update(m, l, p)),
                              lambda m, l, p: torch.stack([torch.maximum(m, p.amax(-1)),
                                                           l * torch.exp(m - torch.maximum(m, p.amax(-1)))
                                                           + torch.exp(p - torch.maximum(m, p.amax(-1))[:, None]).sum(-1)])),
    "online_weighted_sum": (lambda: (_r(3, 7), _r(3, 7, 2, seed=1)),
                            lambda x, v: attn_lib.online_weighted_sum(x, v, 3),
                            lambda x, v: (torch.softmax(x, -1)[..., None, :] @ v)[..., 0, :]),
    "split_heads": (lambda: (_r(2, 3, 8),), lambda x: attn_lib.split_heads(x, 2),
                    lambda x: x.reshape(2, 3, 2, 4).permute(0, 2, 1, 3)),
    "merge_heads": (lambda: (_r(2, 2, 3, 4),), lambda x: attn_lib.merge_heads(x),
                    lambda x: x.permute(0, 2, 1, 3).reshape(2, 3, 8)),
    "dot": (lambda: (_r(4), _r(4, seed=1)), lambda a, b: attn_lib.dot(a, b), lambda a, b: (a * b).sum()),
    "dot_query_keys": (lambda: (_r(4), _r(5, 4, seed=1)), lambda q, K: attn_lib.dot_query_keys(q, K),
                       lambda q, K: K @ q),
    "dot_all": (lambda: (_r(3, 4), _r(5, 4, seed=1)), lambda Q, K: attn_lib.dot_all(Q, K), lambda Q, K: Q @ K.T),
    "euclidean_distance": (lambda: (_r(3, 4), _r(5, 4, seed=1)), lambda Q, K: attn_lib.euclidean_distance(Q, K),
                           lambda Q, K: torch.cdist(Q, K)),
    "apply_rotary": (lambda: (_r(2, 2, 5, 6),), lambda x: attn_lib.apply_rotary(x), _rope_reference),
    "merge_partials": (lambda: (_r(3, 4, 2), _r(3, 4, seed=1)), lambda o, l: attn_lib.merge_partials(o, l)[0],
                       lambda o, l: (torch.softmax(l, -1)[..., None] * o).sum(-2)),
    "soft_lookup": (lambda: (torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64, requires_grad=True), _r(3, 2)),
                    lambda w, v: attn_lib.soft_lookup(w, v), lambda w, v: w @ v),
}

# Layers: (constructor, independent float64 recomputation from the layer's own weights)
LAYERS = {
    "MultiHeadAttention": (lambda causal: attn_lib.MultiHeadAttention(8, 2, is_causal=causal), _fused_reference),
    "LoopedMultiHeadAttention": (lambda causal: attn_lib.LoopedMultiHeadAttention(8, 2, is_causal=causal),
                                 _looped_reference),
    "SelfAttention": (lambda causal: attn_lib.SelfAttention(8, 4, 3, bias=True, is_causal=causal), _self_reference),
}

# Functions that take tensors but have no differentiable output: what they return says so.
NOT_DIFFERENTIABLE = {
    "causal_mask": "builds a bool mask from sizes",
    "padding_mask": "builds a bool mask from integer lengths",
    "sliding_window_mask": "builds a bool mask from sizes and a window",
    "bool_to_additive": "input is a bool mask: no gradient can flow into it",
    "additive_to_bool": "returns a bool tensor: nothing differentiable to drop",
    "assert_close": "a test helper, returns None",
    "count_parameters": "returns an int",
    "sinusoidal_positions": "builds a table from sizes",
    "generate": "returns integer token ids, under torch.no_grad (the model trains with tiny_lm.train_lm)",
}

# Exported callables without tensor inputs.
NO_TENSORS = {"hard_lookup", "cuda_available", "default_device", "try_gpu", "tolerance", "standard_attention_io",
              "flash_attention_io", "tiled_attention_io", "IOCounter"}

# Made differentiable by the FlashAttention backward and audited by its tests (tests/kernels/test_flash_backward.py,
# tests/kernels/test_flash_triton_backward.py).
OWNED_ELSEWHERE = {"flash_attention", "flash_attention_torch", "naive_attention", "flash_attention_triton",
                   "flash_attention_torch_backward", "flash_attention_triton_backward",  # compute gradients
                   "KVCache",  # a container for generation: tests/unit/test_positions_cache.py
                   "flash_decoding"}  # forward only, refuses requires_grad: tests/kernels/test_flash_decoding.py


def _public_callables() -> set[str]:
    return {n for n in attn_lib.__all__ if callable(getattr(attn_lib, n)) and not isinstance(getattr(attn_lib, n), dict)}


def test_every_export_is_classified():
    tables = [set(AUTOGRAD), set(LAYERS), set(NOT_DIFFERENTIABLE), NO_TENSORS, OWNED_ELSEWHERE]
    classified = set().union(*tables)
    assert sum(map(len, tables)) == len(classified), "a name is in two tables"
    missing = _public_callables() - classified
    assert not missing, f"classify these exports in tests/contracts/test_autograd_audit.py: {sorted(missing)}"
    stale = classified - _public_callables()
    assert not stale, f"no longer exported: {sorted(stale)}"


@pytest.mark.parametrize("name", sorted(AUTOGRAD))
def test_backward_matches_float64_formula(name):
    make, ours, formula = AUTOGRAD[name]
    inputs = make()
    out = ours(*inputs)
    assert isinstance(out, torch.Tensor) and out.requires_grad, f"{name}: the output dropped the graph"
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    grads = torch.autograd.grad((out * weights).sum(), inputs)
    fresh = [t.detach().clone().requires_grad_() for t in inputs]
    expected = torch.autograd.grad((formula(*fresh) * weights).sum(), fresh)
    for i, (g, e) in enumerate(zip(grads, expected)):
        assert torch.isfinite(g).all(), f"{name}: non-finite gradient for input {i}"
        assert_close(g, e, dtype="float64", what=f"{name}: gradient of input {i}")


@pytest.mark.parametrize("name", sorted(LAYERS))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("need_weights", [False, True])
def test_layer_backward_matches_float64_formula(name, causal, need_weights):
    build, formula = LAYERS[name]
    torch.manual_seed(0)
    layer = build(causal).double()
    x = _r(2, 5, 8)
    out = layer(x, need_weights=need_weights)
    out = out[0] if need_weights else out
    params = [x, *layer.parameters()]
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    grads = torch.autograd.grad((out * weights).sum(), params)
    expected = torch.autograd.grad((formula(layer, x, causal) * weights).sum(), params)
    for i, (g, e) in enumerate(zip(grads, expected)):
        assert_close(g, e, dtype="float64", what=f"{name}: gradient {i}")


@pytest.mark.parametrize("name", sorted(NOT_DIFFERENTIABLE))
def test_non_differentiable_outputs_say_so(name):
    x = torch.tensor([0.0, float("-inf")], requires_grad=True)
    calls = {
        "causal_mask": lambda: attn_lib.causal_mask(3),
        "sliding_window_mask": lambda: attn_lib.sliding_window_mask(3, 5, window_size=(1, 0)),
        "padding_mask": lambda: attn_lib.padding_mask(torch.tensor([2, 1])),
        "bool_to_additive": lambda: attn_lib.bool_to_additive(torch.tensor([True, False])),
        "additive_to_bool": lambda: attn_lib.additive_to_bool(x),
        "assert_close": lambda: attn_lib.assert_close(x.detach()[:1], torch.zeros(1)),
        "count_parameters": lambda: attn_lib.count_parameters(attn_lib.SelfAttention(2)),
        "sinusoidal_positions": lambda: attn_lib.sinusoidal_positions(4, 6),
        "generate": lambda: attn_lib.generate(attn_lib.models.tiny_lm.build_lm(), torch.tensor([[1, 2]]), 2),
    }
    out = calls[name]()
    if isinstance(out, torch.Tensor):
        assert not out.requires_grad  # built from sizes or a bool mask, or a bool result
        assert out.dtype == torch.bool or name in ("bool_to_additive", "sinusoidal_positions", "generate")
    else:
        assert out is None or isinstance(out, int)
