"""Autograd audit: every exported callable is classified, and each class is checked against what really
happens, so that a wrong classification fails:

- ``AUTOGRAD`` / ``LAYERS``: differentiable. A float64 input with requires_grad gives an output with a
  ``grad_fn``, finite gradients, equal to the float64 autograd of an independent formula;
- ``REFUSES_GRAD``: forward-only. An input that requires grad is refused with the shared error (which
  names the differentiable entry to use instead); the same call under ``torch.no_grad()`` runs;
- ``NOT_DIFFERENTIABLE``: the output is a bool / integer tensor or a Python value, or (``"detached"``, as
  the docstring says) floating tensors without a graph although the inputs required grad; or the function
  refuses a floating input outright (``"refuses float"``: its tensor argument is a bool mask or a size);
- ``NO_TENSORS``: takes no tensor and returns no tensor.

Every callable in ``attn_lib.__all__`` must appear in exactly one table, so a new export has to be
classified before the suite passes.
"""
from __future__ import annotations

import importlib.util
import re

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
    "flash_attention": (lambda: (_r(1, 2, 5, 4), _r(1, 2, 7, 4, seed=1), _r(1, 2, 7, 3, seed=2)),
                        lambda q, k, v: attn_lib.flash_attention(q, k, v, is_causal=True, backend="torch"),
                        lambda q, k, v: _sdpa(q, k, v, causal=True)),
    "naive_attention": (lambda: (_r(1, 2, 5, 4), _r(1, 2, 7, 4, seed=1), _r(1, 2, 7, 3, seed=2)),
                        lambda q, k, v: attn_lib.naive_attention(q, k, v, is_causal=True),
                        lambda q, k, v: _sdpa(q, k, v, causal=True)),
    "KVCache": (lambda: (_r(1, 2, 3, 4), _r(1, 2, 3, 4, seed=1), _r(1, 2, 1, 4, seed=2), _r(1, 2, 1, 4, seed=3)),
                lambda *kv: _appended(*kv), lambda k0, v0, k1, v1: torch.cat([torch.cat([k0, k1], 2),
                                                                            torch.cat([v0, v1], 2)], -1)),
}


def _appended(k0, v0, k1, v1):
    """Two appends to one cache: the keys and values it returns keep the graph to both steps' inputs."""
    cache = attn_lib.KVCache()
    cache.append(k0, v0)
    keys, values = cache.append(k1, v1)  # (1,2,4,4) each
    return torch.cat([keys, values], -1)  # (1,2,4,8)


# Layers: (constructor, independent float64 recomputation from the layer's own weights)
LAYERS = {
    "MultiHeadAttention": (lambda causal: attn_lib.MultiHeadAttention(8, 2, is_causal=causal), _fused_reference),
    "LoopedMultiHeadAttention": (lambda causal: attn_lib.LoopedMultiHeadAttention(8, 2, is_causal=causal),
                                 _looped_reference),
    "SelfAttention": (lambda causal: attn_lib.SelfAttention(8, 4, 3, bias=True, is_causal=causal), _self_reference),
}

HAS_TRITON = importlib.util.find_spec("triton") is not None


def _qkv32(requires_grad: bool, D: int = 16):
    gen = torch.Generator().manual_seed(5)
    return tuple(torch.randn(1, 2, n, D, generator=gen).requires_grad_(requires_grad) for n in (3, 4, 4))


# Forward-only entries: name -> call(q, k, v) (float32 (1, 2, L, 16), requiring grad or not).
REFUSES_GRAD = {
    "flash_attention_torch": lambda q, k, v: attn_lib.flash_attention_torch(q, k, v),
    "flash_attention_triton": lambda q, k, v: attn_lib.flash_attention_triton(q, k, v),
    "flash_decoding": lambda q, k, v: attn_lib.flash_decoding(q[:, :, :1], k, v),
}
REFUSAL = (r"^(\w+) (is forward-only|returns \(out, lse\) without a gradient), but q, k or v requires grad "
           r"\(expected: no autograd here\); to train, (call|use) attn_lib\.flash_attention\(q, k, v, backend='(torch|triton)'\)")
NEEDS_TRITON = {"flash_attention_triton", "flash_attention_triton_backward"}


def _backward(fn):
    """A gradient entry called on a forward's (out, lse) computed without a graph, with q, k, v requiring grad."""
    def call(x):
        q, k, v = _qkv32(True)  # D = 16: the Triton kernels' smallest tile
        forward = attn_lib.flash_attention_torch if fn is attn_lib.flash_attention_torch_backward \
            else attn_lib.flash_attention_triton
        with torch.no_grad():
            out, lse = forward(q, k, v)
        return fn(q, k, v, out, lse, torch.ones_like(out) * x.detach().sum())
    return call


# Exports whose outputs carry no gradient: name -> (kind, call(x)); x is a float64 tensor (2,) with
# requires_grad, for the calls that have a float argument to give it to.
NOT_DIFFERENTIABLE = {
    "causal_mask": ("bool", lambda x: attn_lib.causal_mask(3)),
    "sliding_window_mask": ("bool", lambda x: attn_lib.sliding_window_mask(3, 5, window_size=(1, 0))),
    "padding_mask": ("bool", lambda x: attn_lib.padding_mask(torch.tensor([2, 1]))),
    "additive_to_bool": ("bool", lambda x: attn_lib.additive_to_bool(x * 0 + torch.tensor([0.0, float("-inf")],
                                                                                          dtype=x.dtype))),
    "generate": ("integer", lambda x: attn_lib.generate(attn_lib.models.tiny_lm.build_lm(), torch.tensor([[1, 2]]), 2)),
    "assert_close": ("python", lambda x: attn_lib.assert_close(x, x.detach())),
    "count_parameters": ("python", lambda x: attn_lib.count_parameters(attn_lib.SelfAttention(2))),
    "flash_attention_torch_backward": ("detached", _backward(attn_lib.flash_attention_torch_backward)),
    "flash_attention_triton_backward": ("detached", _backward(attn_lib.flash_attention_triton_backward)),
    "bool_to_additive": ("refuses float", lambda x: attn_lib.bool_to_additive(x)),
    "sinusoidal_positions": ("refuses float", lambda x: attn_lib.sinusoidal_positions(x[0], 6)),
}

# Exported callables that take no tensor and return none: name -> a call.
NO_TENSORS = {
    "hard_lookup": lambda: attn_lib.hard_lookup("apple", {"apple": 10, "pear": 3}),
    "cuda_available": attn_lib.cuda_available,
    "default_device": attn_lib.default_device,
    "try_gpu": attn_lib.try_gpu,
    "tolerance": lambda: attn_lib.tolerance("float32"),
    "standard_attention_io": lambda: attn_lib.standard_attention_io(16, 4),
    "flash_attention_io": lambda: attn_lib.flash_attention_io(16, 4, 64),
    "tiled_attention_io": lambda: attn_lib.tiled_attention_io(16, 16, 4, 4, 4),
    "IOCounter": attn_lib.IOCounter,
}


def _public_callables() -> set[str]:
    return {n for n in attn_lib.__all__ if callable(getattr(attn_lib, n)) and not isinstance(getattr(attn_lib, n), dict)}


def test_every_export_is_classified():
    tables = [set(AUTOGRAD), set(LAYERS), set(REFUSES_GRAD), set(NOT_DIFFERENTIABLE), set(NO_TENSORS)]
    classified = set().union(*tables)
    assert sum(map(len, tables)) == len(classified), "a name is in two tables"
    missing = _public_callables() - classified
    assert not missing, f"classify these exports in tests/topics/test_autograd_audit.py: {sorted(missing)}"
    stale = classified - _public_callables()
    assert not stale, f"no longer exported: {sorted(stale)}"


@pytest.mark.parametrize("name", sorted(AUTOGRAD))
def test_backward_matches_float64_formula(name):
    make, ours, formula = AUTOGRAD[name]
    inputs = make()
    out = ours(*inputs)
    assert isinstance(out, torch.Tensor) and out.grad_fn is not None, f"{name}: the output dropped the graph"
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


@pytest.mark.parametrize("name", sorted(REFUSES_GRAD))
def test_forward_only_entries_refuse_inputs_that_require_grad(name):
    if name in NEEDS_TRITON and not HAS_TRITON:
        pytest.skip("the optional triton package is not installed")
    call = REFUSES_GRAD[name]
    for which in range(3):  # q, k or v alone requires grad
        inputs = [t.requires_grad_(i == which) for i, t in enumerate(_qkv32(False))]
        with pytest.raises(ValueError, match=REFUSAL) as info:
            call(*inputs)
        assert re.match(REFUSAL, str(info.value)).group(1) == name  # the message names the entry called
    with torch.no_grad():
        out = call(*_qkv32(True))  # the refusal is about autograd only
    out = out[0] if isinstance(out, tuple) else out
    assert out.grad_fn is None and bool(torch.isfinite(out).all())


def test_flash_decoding_refuses_new_keys_that_require_grad():
    q, k, v = _qkv32(False)
    new = k[:, :, :1].clone().requires_grad_()
    with pytest.raises(ValueError, match=REFUSAL):
        attn_lib.flash_decoding(q[:, :, :1], k, v, new, v[:, :, :1], cache_seqlens=torch.tensor([2]))


@pytest.mark.parametrize("name", sorted(NOT_DIFFERENTIABLE))
def test_non_differentiable_outputs_are_what_the_table_says(name):
    kind, call = NOT_DIFFERENTIABLE[name]
    if name in NEEDS_TRITON and not HAS_TRITON:
        pytest.skip("the optional triton package is not installed")
    x = torch.tensor([0.5, -1.5], dtype=torch.float64, requires_grad=True)
    if kind == "refuses float":
        with pytest.raises(TypeError):
            call(x)
        return
    out = call(x)
    if kind == "python":
        assert out is None or (isinstance(out, int) and not isinstance(out, bool)), f"{name}: {type(out).__name__}"
        return
    outs = out if isinstance(out, tuple) else (out,)
    assert outs and all(isinstance(t, torch.Tensor) for t in outs), f"{name}: {type(out).__name__}"
    for t in outs:
        if kind == "bool":
            assert t.dtype == torch.bool, f"{name}: {t.dtype}"
        elif kind == "integer":
            assert not t.is_floating_point() and t.dtype != torch.bool, f"{name}: {t.dtype}"
        else:  # "detached": floating results without a graph, though every input required grad
            assert t.is_floating_point() and t.grad_fn is None and not t.requires_grad, f"{name}: {t.grad_fn}"


@pytest.mark.parametrize("name", sorted(NO_TENSORS))
def test_exports_without_tensors_return_no_tensor(name):
    out = NO_TENSORS[name]()
    values = out.values() if isinstance(out, dict) else [out]
    assert not any(isinstance(v, torch.Tensor) for v in values), f"{name} returned a tensor"
