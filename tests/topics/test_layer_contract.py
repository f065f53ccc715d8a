"""The layers keep the functions' contract: flags and sizes checked, one meaning for a mask,
one overflow rule, scale a real number, validation once (check_finite), backend= choice.

Each test here guards a mistake the layers once made: flags coerced with bool(), a 3-D mask read
as (H, L, S) in MultiHeadAttention, scale="0.5" accepted, overflowing scores returned as zeros or
NaN, numpy integers refused with misleading messages.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import attn_lib
from attn_lib import LoopedMultiHeadAttention, MultiHeadAttention, SelfAttention
from attn_lib.core import numpy_ref
from attn_lib.rules.numerics import OVERFLOW_MESSAGE
from attn_lib.tolerances import assert_close

from attn_paths import DISTINGUISHABLE, mha_reference64, randn64, seed_weights

LAYERS = [MultiHeadAttention, LoopedMultiHeadAttention]


# ---------------------------------------------------------------------------------------------
# Flags must be real bools, sizes ints (numpy integers accepted)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [lambda **kw: MultiHeadAttention(8, 2, **kw),
                                  lambda **kw: LoopedMultiHeadAttention(8, 2, **kw),
                                  lambda **kw: SelfAttention(8, **kw)], ids=["mha", "looped", "self"])
@pytest.mark.parametrize("flag,value", [("is_causal", "False"), ("bias", "no"), ("is_causal", 1), ("bias", 0),
                                        ("check_finite", "yes")])
def test_layer_flags_must_be_bools(make, flag, value):
    with pytest.raises(TypeError, match=f"{flag} must be True or False, got {value!r}"):
        make(**{flag: value})


@pytest.mark.parametrize("make", [lambda: MultiHeadAttention(8, 2), lambda: LoopedMultiHeadAttention(8, 2),
                                  lambda: SelfAttention(8)], ids=["mha", "looped", "self"])
def test_need_weights_must_be_a_bool(make):
    with pytest.raises(TypeError, match="need_weights must be True or False, got 'no'"):
        make()(randn64(1, 3, 8, dtype=torch.float32), need_weights="no")


def test_false_flags_mean_false():
    assert MultiHeadAttention(8, 2, bias=False).qkv.bias is None
    assert MultiHeadAttention(8, 2, is_causal=False).is_causal is False
    assert SelfAttention(8, is_causal=np.bool_(True)).is_causal is True


def test_numpy_integers_are_sizes():
    layer = MultiHeadAttention(np.int64(8), np.int32(2))
    assert (layer.d_model, layer.num_heads, layer.head_dim) == (8, 2, 4)
    assert type(layer.d_model) is int and type(layer.num_heads) is int
    assert LoopedMultiHeadAttention(np.int64(8), np.int64(4)).head_dim == 2
    assert SelfAttention(np.int64(4), np.int16(3)).d_k == 3
    x = randn64(2, 7)
    assert torch.equal(attn_lib.online_softmax(x, np.int64(3)), attn_lib.online_softmax(x, 3))
    assert torch.equal(attn_lib.causal_mask(np.int64(3), np.int64(4)), attn_lib.causal_mask(3, 4))
    assert np.array_equal(numpy_ref.causal_mask(np.int64(3)), numpy_ref.causal_mask(3))
    assert attn_lib.flash_attention_torch(*(randn64(1, 1, 5, 4),) * 3, block_m=np.int64(2))[0].shape == (1, 1, 5, 4)


@pytest.mark.parametrize("call,exc,pattern", [
    (lambda: MultiHeadAttention(np.int64(0), 2), ValueError, r"d_model must be a positive int, got 0"),
    (lambda: attn_lib.online_softmax(randn64(5), np.float64(2)), TypeError, r"splits must be a positive int, got"),
])
def test_one_exception_rule_type_vs_value(call, exc, pattern):
    """TypeError for a wrong type, ValueError for a wrong value, for numpy scalars too (the Python
    int and float cases are rows of tests/topics/test_bad_input.py)."""
    with pytest.raises(exc, match=pattern):
        call()


# ---------------------------------------------------------------------------------------------
# A 3-D mask means (B, L, S) in every layer (broadcast over heads); 4-D is per head
# ---------------------------------------------------------------------------------------------
def _per_batch_mask(B, L, S):
    """A different pattern per sequence, every row sees at least one key."""
    gen = torch.Generator().manual_seed(5)
    mask = torch.rand(B, L, S, generator=gen) < 0.5  # (B,L,S)
    mask[..., 0] = True
    mask[0, :, 1:] = False  # sequence 0: only key 0
    return mask


@pytest.mark.parametrize("Layer", LAYERS)
@pytest.mark.parametrize("need_weights", [False, True])
def test_3d_mask_is_per_sequence_when_B_equals_H(Layer, need_weights):
    B = H = 2
    L, C = 5, 8
    fused = seed_weights(MultiHeadAttention(C, H)).double()
    layer = fused if Layer is MultiHeadAttention else LoopedMultiHeadAttention.from_fused(fused)
    x = randn64(B, L, C)
    mask = _per_batch_mask(B, L, L)  # (B,L,S)
    with torch.no_grad():
        out = layer(x, mask=mask, need_weights=need_weights)
        out = out[0] if need_weights else out
        expected = mha_reference64(fused, x, mask=mask[:, None])  # (B,1,L,S): the same pattern in every head
        per_head = mha_reference64(fused, x, mask=mask[None])  # (1,H,L,S): the old reading
    assert_close(out, expected, dtype="float64", what=f"{Layer.__name__} 3-D mask")
    assert (out - per_head).abs().max() > DISTINGUISHABLE, "the test must tell (B, L, S) from (H, L, S)"
    if need_weights:
        weights = layer(x, mask=mask, need_weights=True)[1]  # (B,H,L,S)
        assert torch.equal(weights > 0, mask[:, None].expand(B, H, L, L) & (weights > 0))
        assert (weights[0, :, :, 1:] == 0).all()


def test_self_attention_3d_mask_means_the_same():
    B, L, C = 2, 5, 8
    layer = seed_weights(SelfAttention(C, bias=True)).double()
    x = randn64(B, L, C)
    mask = _per_batch_mask(B, L, L)
    with torch.no_grad():
        out, w = layer(x, mask=mask, need_weights=True)
    assert (w[0, :, 1:] == 0).all() and torch.equal(w > 0, mask & (w > 0))
    assert_close(layer(x, mask=mask), out, dtype="float64", what="SelfAttention (B, L, S) mask, both paths")


def test_4d_mask_is_per_head_and_wrong_3d_shapes_are_refused():
    B, H, L, C = 2, 2, 4, 8
    layer = seed_weights(MultiHeadAttention(C, H)).double()
    x = randn64(B, L, C)
    mask4 = torch.rand(B, H, L, L, generator=torch.Generator().manual_seed(2)) < 0.6  # (B,H,L,S)
    assert_close(layer(x, mask=mask4), mha_reference64(layer, x, mask=mask4), dtype="float64", what="4-D mask")
    with pytest.raises(ValueError, match=r"a 3-D mask means \(B, L, S\) = \(2, 4, 4\).*got \(3, 4, 4\).*4-D"):
        layer(x, mask=torch.ones(3, L, L, dtype=torch.bool))


# ---------------------------------------------------------------------------------------------
# The fast path (need_weights=False) is the reference's result, masks and edge rows included
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("kind", ["none", "bool", "additive", "padding"])
@pytest.mark.parametrize("causal", [False, True])
def test_fast_path_matches_the_weights_path(dtype, kind, causal):
    B, H, L, S, C = 3, 2, 6, 7, 8
    dt = getattr(torch, dtype)
    layer = seed_weights(MultiHeadAttention(C, H, is_causal=causal)).to(dt)
    xq, xk = randn64(B, L, C, dtype=dt), randn64(B, S, C, seed=2, dtype=dt)
    gen = torch.Generator().manual_seed(3)
    mask = None
    if kind == "bool":
        mask = torch.rand(B, H, L, S, generator=gen) < 0.5
        mask[0, 0, 0] = False  # a query that sees no key
    elif kind == "additive":
        mask = torch.randn(B, 1, L, S, generator=gen).to(dt).masked_fill(torch.rand(B, 1, L, S, generator=gen) < 0.3,
                                                                          float("-inf"))
        mask[1, 0, 2] = float("-inf")
    elif kind == "padding":
        mask = attn_lib.padding_mask([S, 2, 0], S)  # the last sequence has no keys
    with torch.no_grad():
        fast = layer(xq, xk, mask=mask)
        slow, _ = layer(xq, xk, mask=mask, need_weights=True)
    assert not torch.isnan(fast).any()
    assert_close(fast, slow.double(), dtype=dtype, what="need_weights=False vs True")


def test_fast_path_is_differentiable_like_the_reference():
    layer = seed_weights(MultiHeadAttention(8, 2, is_causal=True)).double()
    x = randn64(2, 5, 8).requires_grad_()
    mask = attn_lib.padding_mask([5, 3])
    grads = []
    for need in (False, True):
        out = layer(x, mask=mask, need_weights=need)
        out = out[0] if need else out
        grads.append(torch.autograd.grad(out.square().sum(), [x, layer.qkv.weight]))
    for a, b in zip(*grads):
        assert_close(a, b, dtype="float64", what="gradient, fast vs reference path")


# ---------------------------------------------------------------------------------------------
# backend="torch" (the tiled FlashAttention path)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("Layer", [MultiHeadAttention, SelfAttention])
def test_flash_backend_matches_reference(Layer):
    C = 8
    ref = seed_weights(Layer(C, **({"num_heads": 2} if Layer is MultiHeadAttention else {}), is_causal=True)).double()
    flash = Layer(C, **({"num_heads": 2} if Layer is MultiHeadAttention else {}), is_causal=True, backend="torch")
    flash = flash.double()
    flash.load_state_dict(ref.state_dict())
    x = randn64(3, 6, C)
    pad = attn_lib.padding_mask([6, 4, 1])  # (B,1,1,S)
    with torch.no_grad():
        assert_close(flash(x, mask=pad), ref(x, mask=pad), dtype="float64", what=f"{Layer.__name__} flash backend")
        assert_close(flash(x, mask=pad[:, 0]), ref(x, mask=pad), dtype="float64", what="(B, 1, S) padding")
        assert_close(flash(x), ref(x), dtype="float64", what="no mask")


# ---------------------------------------------------------------------------------------------
# scale: a real number on every path; not differentiable
# ---------------------------------------------------------------------------------------------
Q = randn64(1, 2, 3, 4)
QN = Q.numpy()


@pytest.mark.parametrize("call", [
    lambda s: attn_lib.attention(Q, Q, Q, scale=s),
    lambda s: numpy_ref.attention(QN, QN, QN, scale=s),
    lambda s: attn_lib.flash_attention(Q, Q, Q, scale=s),
    lambda s: attn_lib.flash_attention_torch(Q, Q, Q, scale=s),
    lambda s: attn_lib.naive_attention(Q, Q, Q, scale=s),
], ids=["attention", "numpy", "flash_attention", "flash_attention_torch", "naive_attention"])
def test_scale_must_be_a_real_number(call):
    for bad in ("0.5", b"1", 1j, [0.5], None.__class__):
        with pytest.raises(TypeError, match="scale must be a positive number or None"):
            call(bad)
    out = call(0.5)
    out = out[0] if isinstance(out, tuple) else out
    for same in (np.float32(0.5), np.float64(0.5), torch.tensor(0.5), np.array(0.5)):
        again = call(same)
        again = again[0] if isinstance(again, tuple) else again
        assert np.array_equal(np.asarray(again), np.asarray(out))


# ---------------------------------------------------------------------------------------------
# Overflowing scores: one error on every path this module owns; all-masked rows are not overflow
# ---------------------------------------------------------------------------------------------
def _overflowing(dtype=torch.float32):
    q = torch.full((1, 1, 3, 4), 1e20, dtype=dtype)  # q·k = 4e40 > 3.4e38
    return q, q.clone(), torch.ones(1, 1, 3, 4, dtype=dtype)


def test_reference_and_numpy_raise_on_overflow():
    q, k, v = _overflowing()
    pattern = re.escape(OVERFLOW_MESSAGE) + r" to \+inf \(\|scale·q·k\| exceeds the range of float32\); compute in float64 or use a smaller scale"
    with pytest.raises(ValueError, match=pattern):
        attn_lib.attention(q, k, v)
    with pytest.raises(ValueError, match=pattern):
        numpy_ref.attention(q.numpy(), k.numpy(), v.numpy())
    out, _ = attn_lib.attention(q.double(), k.double(), v.double())  # float64 has the range: fine
    assert_close(out, torch.ones(1, 1, 3, 4, dtype=torch.float64), dtype="float64")
    hidden = torch.zeros(3, 3, dtype=torch.bool)  # every key hidden: zeros, not an overflow
    out, scores = attn_lib.attention(q, k, v, mask=hidden)
    assert (out == 0).all() and (scores == 0).all()
    out, _ = numpy_ref.attention(q.numpy(), k.numpy(), v.numpy(), mask=hidden.numpy())
    assert (out == 0).all()


@pytest.mark.parametrize("need_weights", [False, True])
def test_layers_raise_on_overflow(need_weights):
    layer = MultiHeadAttention(4, 1, bias=False)
    with torch.no_grad():
        layer.qkv.weight.copy_(torch.eye(4).repeat(3, 1))
        layer.out_proj.weight.copy_(torch.eye(4))
    x = torch.full((1, 3, 4), 1e20)
    with pytest.raises(ValueError, match=re.escape(OVERFLOW_MESSAGE)):
        layer(x, need_weights=need_weights)


# ---------------------------------------------------------------------------------------------
# check_finite: the one data scan a caller can turn off
# ---------------------------------------------------------------------------------------------
def test_check_finite_can_be_turned_off():
    bad = Q.clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="q contains nan or inf"):
        attn_lib.attention(bad, Q, Q)
    out, _ = attn_lib.attention(bad, Q, Q, check_finite=False)  # the caller's choice: nan propagates
    assert torch.isnan(out[0, 0, 0]).all() and not torch.isnan(out[0, 0, 1:]).any()
    x = randn64(1, 3, 8, dtype=torch.float32)
    x[0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="query contains nan or inf"):
        MultiHeadAttention(8, 2)(x)
    assert torch.isnan(MultiHeadAttention(8, 2, check_finite=False)(x)).any()
    with pytest.raises(TypeError, match="check_finite must be True or False"):
        attn_lib.attention(Q, Q, Q, check_finite=None)


def test_the_layer_scans_each_input_once(monkeypatch):
    """Self-attention passes one tensor three times: it is scanned once, and attend() scans nothing more
    than the output."""
    import attn_lib.checks.layers as sa

    calls = []
    real = sa.all_finite
    monkeypatch.setattr(sa, "all_finite", lambda t: calls.append(tuple(t.shape)) or real(t))
    MultiHeadAttention(8, 2)(randn64(2, 3, 8, dtype=torch.float32))
    assert calls == [(2, 3, 8)], calls  # the input once (the output is checked one entry per row)


def test_softmax_gradient_through_fully_masked_rows_is_finite():
    x = torch.tensor([[0.5, float("-inf"), 1.0], [float("-inf")] * 3], requires_grad=True)
    p = attn_lib.softmax(x)
    (g,) = torch.autograd.grad((p * torch.arange(3.0)).sum(), x)
    assert torch.isfinite(g).all() and (g[1] == 0).all()
    q = randn64(1, 1, 2, 3).requires_grad_()
    mask = torch.tensor([[0.0, 0.0], [float("-inf"), float("-inf")]], dtype=torch.float64)  # row 1 sees nothing
    out, _ = attn_lib.attention(q, q, q, mask=mask)
    (gq,) = torch.autograd.grad(out.sum(), q)
    assert torch.isfinite(gq).all()


def test_overflow_to_minus_inf_is_an_overflow_too():
    """Scores that overflow downwards make a row look fully masked; it still has visible keys: an error."""
    q = torch.full((1, 1, 3, 4), 1e20)
    k = -q  # q·k = -4e40 < -3.4e38
    v = torch.ones(1, 1, 3, 4)
    exact = re.escape(OVERFLOW_MESSAGE) + r" to -inf \(\|scale·q·k\| exceeds the range of float32\)"
    with pytest.raises(ValueError, match=exact):
        attn_lib.attention(q, k, v)
    with pytest.raises(ValueError, match=re.escape(OVERFLOW_MESSAGE) + r" to [+-]inf \(\|scale·q·k\| exceeds the range of float32\)"):
        numpy_ref.attention(q.numpy(), k.numpy(), v.numpy())  # its direction: test_numpy_names_the_downward_overflow
    layer = MultiHeadAttention(4, 1, bias=False)
    with torch.no_grad():
        layer.qkv.weight.copy_(torch.cat([torch.eye(4), -torch.eye(4), torch.eye(4)]))
    with pytest.raises(ValueError, match=re.escape(OVERFLOW_MESSAGE)):
        layer(torch.full((1, 3, 4), 1e20))  # need_weights=False: the fused path must not return zeros


def test_numpy_names_the_downward_overflow():
    q = np.full((1, 1, 3, 4), 1e20, dtype=np.float32)
    with pytest.raises(ValueError, match=re.escape(OVERFLOW_MESSAGE) + " to -inf"):
        numpy_ref.attention(q, -q, np.ones((1, 1, 3, 4), dtype=np.float32))


def test_an_overflowing_score_that_is_hidden_is_not_an_error():
    """Row 0 may see only key 1 by its mask, and the causal rule hides key 1 from it: row 0 sees nothing,
    and its overflowing score for key 1 (1e20 · 1e20 > 3.4e38) is hidden, not an overflow."""
    q = torch.tensor([[1e20], [1e-20]])[None, None]  # (1,1,2,1)
    k = torch.tensor([[1.0], [1e20]])[None, None]
    v = torch.tensor([[1.0], [2.0]])[None, None]
    mask = torch.tensor([[False, True], [True, True]])
    out, scores = attn_lib.attention(q, k, v, mask=mask, is_causal=True, scale=1.0)
    assert out[0, 0, 0, 0] == 0 and (scores[0, 0, 0] == 0).all()
    expected = torch.softmax(torch.tensor([1e-20, 1.0], dtype=torch.float64), 0) @ torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert_close(out[0, 0, 1, 0], expected, dtype="float32", what="the row that sees keys")
    np_out, _ = numpy_ref.attention(q.numpy(), k.numpy(), v.numpy(), mask=mask.numpy(), is_causal=True, scale=1.0)
    assert np_out[0, 0, 0, 0] == 0
    assert_close(np_out[0, 0, 1, 0], expected, dtype="float32", what="numpy: the row that sees keys")
