"""The multi-head layers with shared key/value heads (num_kv_heads) and sliding windows.

Checked against an independent oracle written here in plain torch (K/V repeated with
``repeat_interleave`` in this file only, the band built from its definition), against today's
layer when num_kv_heads == num_heads, and the gradients of every backend against the reference
backend's. The parameter count is checked against its formula.
"""
import importlib.util

import pytest
import torch

from attn_lib import LoopedMultiHeadAttention, MultiHeadAttention, SelfAttention, count_parameters, padding_mask
from attn_lib.layers.positions import apply_rotary

from attn_paths import visible_band
from attn_lib.models.tiny_model import RotaryMultiHeadAttention
from attn_lib.tolerances import assert_close

HAS_TRITON = importlib.util.find_spec("triton") is not None
FAST = ["sdpa", "torch"] + (["triton"] if HAS_TRITON else [])
HEADS = [(6, 2), (8, 1), (4, 4)]  # (H, H_kv): GQA, MQA, none shared
WINDOWS = [None, (0, 0), (1, 0), (5, 0), (3, 2), (-1, 4), (30, 30)]


def _oracle(layer, query, key, value, *, is_causal, window, pad=None, rope=False):
    """Plain torch: project, split, repeat K/V per query head, softmax over the visible keys, merge, project."""
    C, H, H_kv, D = layer.d_model, layer.num_heads, layer.num_kv_heads, layer.head_dim
    W, b = layer.qkv.weight, layer.qkv.bias
    q = (query @ W[:C].T + b[:C]).unflatten(-1, (H, D)).transpose(1, 2)  # (B,H,L,D)
    k = (key @ W[C:C + H_kv * D].T + b[C:C + H_kv * D]).unflatten(-1, (H_kv, D)).transpose(1, 2)  # (B,H_kv,S,D)
    v = (value @ W[C + H_kv * D:].T + b[C + H_kv * D:]).unflatten(-1, (H_kv, D)).transpose(1, 2)  # (B,H_kv,S,D)
    if rope:
        q, k = apply_rotary(q), apply_rotary(k)
    k, v = k.repeat_interleave(H // H_kv, dim=1), v.repeat_interleave(H // H_kv, dim=1)  # (B,H,S,D)
    L, S = q.shape[2], k.shape[2]
    ok = visible_band(L, S, is_causal, window)  # (L,S)
    if pad is not None:
        ok = ok & pad  # (B,1,1,S) & (L,S) -> (B,1,L,S)
    logits = (q @ k.transpose(-2, -1)) / D ** 0.5  # (B,H,L,S)
    logits = logits.masked_fill(~ok, float("-inf"))
    p = torch.softmax(logits, -1).nan_to_num(0.0)  # a row that sees nothing: zeros
    out = (p @ v).transpose(1, 2).flatten(2)  # (B,H,L,D) -> (B,L,C)
    return layer.out_proj(out), p


def _layer(H, H_kv, window, *, is_causal, backend="reference", Layer=MultiHeadAttention, C=24, seed=0,
           dtype=torch.float64):
    torch.manual_seed(seed)
    return Layer(C, H, num_kv_heads=H_kv, window_size=window, is_causal=is_causal, backend=backend).to(dtype)


def _x(B, L, C=24, seed=1, dtype=torch.float64):
    return torch.randn(B, L, C, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# with is_causal a window's right side must be 0 or -1 (a bad-input row), so those pairs are left out
CAUSAL_WINDOWS = [(c, w) for c in (False, True) for w in WINDOWS if not (c and w is not None and w[1] > 0)]


@pytest.mark.parametrize("is_causal, window", CAUSAL_WINDOWS, ids=str)
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}/{h[1]}")
def test_a_gqa_layer_equals_plain_torch(heads, window, is_causal):
    H, H_kv = heads
    layer = _layer(H, H_kv, window, is_causal=is_causal)
    x = _x(2, 7)
    pad = padding_mask([7, 3]).bool()  # (B,1,1,S) key padding: the second sentence has 3 tokens
    with torch.no_grad():
        out, scores = layer(x, mask=pad, need_weights=True)  # (B,L,C), (B,H,L,S)
        want, p = _oracle(layer, x, x, x, is_causal=is_causal, window=window, pad=pad)
    assert scores.shape == (2, H, 7, 7)
    assert_close(out, want, dtype=torch.float64, what="output")
    assert_close(scores, p, dtype=torch.float64, what="scores")


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}/{h[1]}")
@pytest.mark.parametrize("window", [None, (1, 0), (3, 0)], ids=str)
def test_every_backend_gives_the_reference_layer_output_and_gradients(backend, heads, window):
    H, H_kv = heads
    ref = _layer(H, H_kv, window, is_causal=True, dtype=torch.float32)
    fast = _layer(H, H_kv, window, is_causal=True, backend=backend, dtype=torch.float32)
    x = _x(2, 5, dtype=torch.float32)
    pad = padding_mask([5, 2])  # (B,1,1,S): key padding, accepted by every backend
    x_ref, x_fast = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref, out_fast = ref(x_ref, mask=pad), fast(x_fast, mask=pad)
    assert_close(out_fast, out_ref, dtype=torch.float32, what=f"{backend} output")
    g = torch.randn(out_ref.shape, generator=torch.Generator().manual_seed(2))
    out_ref.backward(g)
    out_fast.backward(g)
    assert_close(x_fast.grad, x_ref.grad, dtype=torch.float32, what=f"{backend} d query")
    for (name, p_fast), p_ref in zip(fast.named_parameters(), ref.parameters()):
        assert_close(p_fast.grad, p_ref.grad, dtype=torch.float32, what=f"{backend} d {name}")


@pytest.mark.parametrize("heads", [(6, 2), (4, 1)], ids=lambda h: f"{h[0]}/{h[1]}")
def test_cross_attention_with_l_not_s_aligns_the_window_top_left(heads):
    H, H_kv = heads
    layer = _layer(H, H_kv, (2, 1), is_causal=False)
    q, kv = _x(2, 5), _x(2, 9, seed=3)  # L = 5 queries, S = 9 keys
    with torch.no_grad():
        out, scores = layer(q, kv, need_weights=True)
        want, p = _oracle(layer, q, kv, kv, is_causal=False, window=(2, 1))
    assert_close(out, want, dtype=torch.float64, what="cross-attention output")
    assert_close(scores, p, dtype=torch.float64, what="cross-attention scores")
    assert not scores[:, :, 0, 2:].any()  # query 0 sees keys 0 and 1 only


def test_rotary_gqa_layer_equals_plain_torch_with_apply_rotary():
    layer = _layer(4, 2, (2, 0), is_causal=True, Layer=RotaryMultiHeadAttention)
    x = _x(2, 6)
    with torch.no_grad():
        out, scores = layer(x, need_weights=True)
        want, p = _oracle(layer, x, x, x, is_causal=True, window=(2, 0), rope=True)
    assert_close(out, want, dtype=torch.float64, what="rope output")
    assert_close(scores, p, dtype=torch.float64, what="rope scores")


@pytest.mark.parametrize("Layer", [MultiHeadAttention, LoopedMultiHeadAttention, RotaryMultiHeadAttention],
                         ids=lambda c: c.__name__)
def test_num_kv_heads_equal_to_num_heads_is_todays_layer(Layer):
    torch.manual_seed(0)
    today = Layer(24, 4, is_causal=True).double()
    torch.manual_seed(0)
    same = Layer(24, 4, num_kv_heads=4, window_size=None, is_causal=True).double()
    assert {k: v.shape for k, v in same.state_dict().items()} == {k: v.shape for k, v in today.state_dict().items()}
    for (name, a), b in zip(same.state_dict().items(), today.state_dict().values()):
        assert torch.equal(a, b), name  # the same weights from the same seed: the same draws in the same order
    x = _x(2, 5)
    with torch.no_grad():
        assert torch.equal(same(x), today(x))
    assert repr(same) == repr(today)


@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}/{h[1]}")
@pytest.mark.parametrize("window", [None, (2, 0)], ids=str)
def test_the_looped_layer_equals_the_fused_one_with_shared_heads(heads, window):
    H, H_kv = heads
    fused = _layer(H, H_kv, window, is_causal=True)
    looped = LoopedMultiHeadAttention.from_fused(fused)
    assert (looped.num_kv_heads, looped.window_size, len(looped.w_k), len(looped.w_q)) == (
        H_kv, fused.window_size, H_kv, H)
    x = _x(2, 6)
    mask = torch.rand(2, 1, 6, 6, generator=torch.Generator().manual_seed(4)) > 0.3  # (B,1,L,S)
    with torch.no_grad():
        a, sa = fused(x, mask=mask, need_weights=True)
        b, sb = looped(x, mask=mask, need_weights=True)
    assert_close(b, a, dtype=torch.float64, what="looped vs fused")
    assert_close(sb, sa, dtype=torch.float64, what="looped vs fused scores")
    assert count_parameters(looped) == count_parameters(fused)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("heads", HEADS + [(12, 3)], ids=lambda h: f"{h[0]}/{h[1]}")
def test_the_parameter_count_follows_the_formula(heads, bias):
    H, H_kv = heads
    C = 24
    D = C // H
    layer = MultiHeadAttention(C, H, num_kv_heads=H_kv, bias=bias)
    qkv_out = C + 2 * H_kv * D
    assert layer.qkv.weight.shape == (qkv_out, C)
    assert count_parameters(layer) == qkv_out * C + C * C + (qkv_out + C if bias else 0)
    if H_kv == H:
        assert count_parameters(layer) == 4 * C * C + (4 * C if bias else 0)  # today's 4C² + 4C


def test_self_attention_takes_a_window():
    torch.manual_seed(0)
    layer = SelfAttention(8, window_size=(1, 0), is_causal=True).double()
    x = _x(2, 6, C=8)
    with torch.no_grad():
        out, scores = layer(x, need_weights=True)  # (B,L,d_v), (B,L,L)
    assert torch.equal(scores > 0, visible_band(6, 6, True, (1, 0)).expand(2, 6, 6))
    q, k, v = layer.w_q(x), layer.w_k(x), layer.w_v(x)
    logits = (q @ k.transpose(-2, -1) / 8 ** 0.5).masked_fill(~visible_band(6, 6, True, (1, 0)), float("-inf"))
    assert_close(out, torch.softmax(logits, -1) @ v, dtype=torch.float64, what="windowed self-attention")
    assert "window_size=(1, 0)" in repr(layer)


def test_repr_names_the_shared_heads_and_the_window():
    layer = MultiHeadAttention(24, 6, num_kv_heads=2, window_size=[4, 0], is_causal=True)
    assert layer.window_size == (4, 0)
    assert "num_kv_heads=2" in repr(layer) and "window_size=(4, 0)" in repr(layer)
