"""attn_lib.layers.multihead: MultiHeadAttention against torch.nn.MultiheadAttention, plain torch written here
(shared key/value heads repeated with ``repeat_interleave`` in this file only, the band from its definition),
attn_lib.attention for the bottom-right alignment and, for every query/key/value combination, the float64
recomputation from its weights (attn_paths.mha_reference64), and itself (causal parallel == sequential).

The per-head teaching version is tests/layers/test_multihead_looped.py; RoPE (RotaryMultiHeadAttention)
is tests/models/test_tiny_model.py.
"""
import importlib.util

import pytest
import torch
from torch import nn

import attn_lib
import attn_lib.layers.dispatch as dispatch
from attn_lib import MultiHeadAttention, count_parameters
from attn_lib.checks.layers import check_layer_call
from attn_lib.core.masks import causal_mask, padding_mask
from attn_lib.tolerances import assert_close

from attn_paths import DISTINGUISHABLE, mha_reference64, randn64, seed_weights, visible_band

HAS_TRITON = importlib.util.find_spec("triton") is not None
FAST = ["sdpa", "torch"] + (["triton"] if HAS_TRITON else [])
HEADS = [(6, 2), (8, 1), (4, 4)]  # (H, H_kv): GQA, MQA, none shared
WINDOWS = [None, (0, 0), (1, 0), (5, 0), (3, 2), (-1, 4), (30, 30)]


def _pair(C, H, dtype, seed=0):
    """Our layer and torch's, with torch's weights copied into ours."""
    torch.manual_seed(seed)
    theirs = nn.MultiheadAttention(C, H, batch_first=True, dtype=dtype).eval()
    ours = MultiHeadAttention(C, H).to(dtype)
    with torch.no_grad():
        ours.qkv.weight.copy_(theirs.in_proj_weight)  # (3C,C): [W_q; W_k; W_v] in both
        ours.qkv.bias.copy_(theirs.in_proj_bias)
        ours.out_proj.weight.copy_(theirs.out_proj.weight)
        ours.out_proj.bias.copy_(theirs.out_proj.bias)
    return ours, theirs


def _project(layer, query, key, value):
    """The layer's own projections, written out: (B,H,L,D), (B,H_kv,S,D), (B,H_kv,S,D)."""
    C, H, H_kv, D = layer.d_model, layer.num_heads, layer.num_kv_heads, layer.head_dim
    W, b = layer.qkv.weight, layer.qkv.bias
    q = (query @ W[:C].T + b[:C]).unflatten(-1, (H, D)).transpose(1, 2)  # (B,H,L,D)
    k = (key @ W[C:C + H_kv * D].T + b[C:C + H_kv * D]).unflatten(-1, (H_kv, D)).transpose(1, 2)  # (B,H_kv,S,D)
    v = (value @ W[C + H_kv * D:].T + b[C + H_kv * D:]).unflatten(-1, (H_kv, D)).transpose(1, 2)  # (B,H_kv,S,D)
    return q, k, v


def _oracle(layer, query, key, value, *, is_causal, window, pad=None):
    """Plain torch: project, split, repeat K/V per query head, softmax over the visible keys, merge, project."""
    H, H_kv, D = layer.num_heads, layer.num_kv_heads, layer.head_dim
    q, k, v = _project(layer, query, key, value)
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


def _layer(H, H_kv, window, *, is_causal, backend="reference", C=24, seed=0, dtype=torch.float64, **kw):
    torch.manual_seed(seed)
    return MultiHeadAttention(C, H, num_kv_heads=H_kv, window_size=window, is_causal=is_causal, backend=backend,
                              **kw).to(dtype)


def _x(B, L, C=24, seed=1, dtype=torch.float64):
    return torch.randn(B, L, C, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --- against torch.nn.MultiheadAttention ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", ["plain", "causal", "padding", "causal+padding"])
def test_self_attention_matches_torch(dtype, case, rng):
    B, L, C, H = 2, 5, 12, 3
    ours, theirs = _pair(C, H, dtype)
    x = torch.randn(B, L, C, generator=rng, dtype=torch.float64).to(dtype)
    keep = torch.ones(B, 1, L, L, dtype=torch.bool)
    kw = {}
    if "causal" in case:
        keep = keep & causal_mask(L)
        kw["attn_mask"] = ~causal_mask(L)  # torch: True = hidden
    if "padding" in case:
        pad = padding_mask([5, 3], L)  # (B,1,1,S), True = real token
        keep = keep & pad
        kw["key_padding_mask"] = ~pad[:, 0, 0]  # torch: (B,S), True = hidden
    with torch.no_grad():
        out, scores = ours(x, mask=keep, need_weights=True)
        expected, expected_scores = theirs(x, x, x, need_weights=True, average_attn_weights=False, **kw)
    assert out.shape == (B, L, C) and scores.shape == (B, H, L, L)
    assert_close(out, expected, dtype=dtype)
    assert_close(scores, expected_scores, dtype=dtype, what="per-head scores")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_is_causal_flag_equals_explicit_mask_and_torch(dtype, rng):
    B, L, C, H = 2, 6, 8, 2
    ours, theirs = _pair(C, H, dtype, seed=1)
    x = torch.randn(B, L, C, generator=rng, dtype=torch.float64).to(dtype)
    with torch.no_grad():
        by_mask = ours(x, mask=causal_mask(L))
        ours.is_causal = True
        by_flag = ours(x)
        expected, _ = theirs(x, x, x, attn_mask=~causal_mask(L), need_weights=False)
    assert_close(by_flag, by_mask, dtype=dtype)
    assert_close(by_flag, expected, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cross_attention_matches_torch(dtype, rng):
    B, L, S, C, H = 2, 3, 7, 8, 4
    ours, theirs = _pair(C, H, dtype, seed=2)
    q = torch.randn(B, L, C, generator=rng, dtype=torch.float64).to(dtype)
    k = torch.randn(B, S, C, generator=rng, dtype=torch.float64).to(dtype)
    v = torch.randn(B, S, C, generator=rng, dtype=torch.float64).to(dtype)
    pad = padding_mask([7, 4], S)
    with torch.no_grad():
        expected, _ = theirs(q, k, v, key_padding_mask=~pad[:, 0, 0])
        expected_kv, _ = theirs(q, k, k, key_padding_mask=~pad[:, 0, 0])
        out, scores = ours(q, k, v, mask=pad, need_weights=True)
        out_kv = ours(q, k, mask=pad)  # value defaults to key
    assert scores.shape == (B, H, L, S)
    assert_close(out, expected, dtype=dtype)
    assert_close(out_kv, expected_kv, dtype=dtype)


@pytest.mark.parametrize("C,H", [(8, 1), (8, 2), (8, 8), (768, 12)])
def test_parameter_count_is_independent_of_heads(C, H):
    expected = 4 * C * C + 4 * C
    single = count_parameters(MultiHeadAttention(C, 1))
    multi = count_parameters(MultiHeadAttention(C, H))
    torch_mha = count_parameters(nn.MultiheadAttention(C, H))
    assert single == multi == torch_mha == expected


# --- itself, the scores, the head split ---------------------------------------------------------------------

def test_causal_parallel_equals_sequential(rng):
    torch.manual_seed(4)
    mha = MultiHeadAttention(8, 2, is_causal=True).double()
    x = torch.randn(2, 7, 8, generator=rng, dtype=torch.float64)
    with torch.no_grad():
        full = mha(x)  # one masked pass over the whole sequence
        for t in range(7):
            step = mha(x[:, : t + 1])  # step t sees only the prefix
            assert_close(full[:, t], step[:, t], dtype=torch.float64, what=f"position {t}")


def test_need_weights_rows_sum_to_one_and_causal_zeros(rng):
    mha = MultiHeadAttention(6, 3, is_causal=True)
    x = torch.randn(2, 4, 6, generator=rng)
    out, scores = mha(x, need_weights=True)
    assert out.shape == (2, 4, 6) and scores.shape == (2, 3, 4, 4)
    assert_close(scores.sum(-1), torch.ones(2, 3, 4), dtype=torch.float32, what="row sums")
    assert torch.all(scores.triu(1) == 0)
    assert isinstance(mha(x), torch.Tensor)


def test_split_and_merge_heads_are_inverse(rng):
    x = torch.randn(2, 5, 12, generator=rng)
    heads = attn_lib.split_heads(x, 3)
    assert heads.shape == (2, 3, 5, 4)
    assert torch.equal(heads[:, 1], x[..., 4:8])  # head 1 holds channels 4..7
    assert torch.equal(attn_lib.merge_heads(heads), x)


# --- which projection path each query/key/value combination takes --------------------------------------------

def _fused(**kw):
    return seed_weights(attn_lib.MultiHeadAttention(8, 2, **kw).double())


@pytest.mark.parametrize("which", ["kv_is_query", "k_is_query", "v_is_query", "kv_shared", "all_differ", "self"])
def test_every_combination_of_query_key_value(which):
    layer = _fused()
    x, y, z = randn64(2, 4, 8, seed=1), randn64(2, 4, 8, seed=2), randn64(2, 4, 8, seed=3)
    xq, xk, xv = {"kv_is_query": (x, x, x), "k_is_query": (x, x, y), "v_is_query": (x, y, x), "kv_shared": (x, y, y),
                  "all_differ": (x, y, z), "self": (x, None, None)}[which]
    with torch.no_grad():
        out = layer(xq, xk, xv)
        expected = mha_reference64(layer, xq, xk, xv)
    assert_close(out, expected, dtype="float64", what=which)


def test_self_attention_projects_with_one_matmul(monkeypatch):
    layer = _fused()
    calls = []
    real = layer.qkv.forward
    monkeypatch.setattr(layer.qkv, "forward", lambda x: calls.append(x.shape) or real(x))
    layer(randn64(2, 4, 8))
    assert calls == [(2, 4, 8)], "self-attention: the fused (3C, C) projection runs once"


def test_cross_attention_without_bias():
    layer = attn_lib.MultiHeadAttention(8, 2, bias=False).double()
    x, y = randn64(2, 4, 8, seed=1), randn64(2, 5, 8, seed=2)
    w_q, w_k, w_v = layer.qkv.weight.split(8)
    with torch.no_grad():
        for xk, xv in ((y, y), (y, randn64(2, 5, 8, seed=3))):
            q, k, v = (t.reshape(2, -1, 2, 4).transpose(1, 2) for t in (x @ w_q.T, xk @ w_k.T, xv @ w_v.T))
            expected = layer.out_proj(torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2)
                                      .reshape(2, 4, 8))
            assert_close(layer(x, xk, xv), expected, dtype="float64", what="no bias, cross-attention")


# --- the checks, the backends, the printed form -------------------------------------------------------------

def test_layer_check_finite_false_reaches_the_mask_check():
    nan_mask = torch.zeros(3, 3)
    nan_mask[0, 1] = float("nan")
    x = torch.ones(1, 3, 8)
    with pytest.raises(ValueError, match="additive float mask"):
        attn_lib.MultiHeadAttention(8, 2)(x, mask=nan_mask)
    assert torch.isnan(attn_lib.MultiHeadAttention(8, 2, check_finite=False)(x, mask=nan_mask)).any()


def test_layer_repr_names_sizes_and_a_non_default_backend():
    mha = repr(attn_lib.MultiHeadAttention(8, 2, is_causal=True))
    assert "d_model=8, num_heads=2, head_dim=4, is_causal=True\n" in mha and "backend" not in mha
    assert "head_dim=4, is_causal=False, backend='torch'\n" in repr(attn_lib.MultiHeadAttention(8, 2, backend="torch"))
    assert "align='bottom-right'" in repr(attn_lib.MultiHeadAttention(8, 2, align="bottom-right"))
    assert "align" not in mha


def test_an_odd_head_dim_is_fine_without_rotary_positions():
    layer = MultiHeadAttention(6, 2)  # D = 3: only RoPE needs an even head dim
    assert layer.head_dim == 3 and layer(torch.zeros(1, 2, 6)).shape == (1, 2, 6)


def test_a_1d_key_padding_mask_works_on_the_tiled_path():
    torch.manual_seed(0)
    layer = MultiHeadAttention(8, 2).double()
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    keys = torch.tensor([True, False, True])  # (S,): the same keys for the whole batch
    tiled = MultiHeadAttention(8, 2, backend="torch").double()
    tiled.load_state_dict(layer.state_dict())
    with torch.no_grad():
        want, _ = _oracle(layer, x, x, x, is_causal=False, window=None, pad=keys)
    assert_close(tiled(x, mask=keys), want, dtype=torch.float64, what="tiled")
    assert_close(layer(x, mask=keys), want, dtype=torch.float64, what="auto")


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_the_triton_door_on_a_cpu():
    layer = MultiHeadAttention(512, 2, backend="triton")  # D = 256, the largest head dim
    x = torch.zeros(1, 3, 512)
    assert attn_lib.device.triton_interprets()  # CPU only: the kernels run under Triton's interpreter
    settings = check_layer_call(layer, x, None, None, None, False, None, attn_lib.device.triton_interprets)[2]
    assert settings.backend == "triton"  # the largest head dim, CPU tensors: accepted
    with pytest.raises(ValueError, match=r"^backend='triton' got tensors on cpu, but Triton in this process compiles"):
        check_layer_call(layer, x, None, None, None, False, None, lambda: False)  # as with a CUDA device present


def test_the_tiled_backend_goes_through_the_tiled_path(monkeypatch):
    calls = []
    real = dispatch.flash_core
    monkeypatch.setattr(dispatch, "flash_core", lambda *a: calls.append(a[3].backend) or real(*a))
    layer = _fused(backend="torch")
    with pytest.raises(ValueError, match="need_weights=True needs the attention scores"):
        layer(randn64(1, 3, 8), need_weights=True)
    with torch.no_grad():
        out = layer(randn64(1, 3, 8))
        want = mha_reference64(layer, *(randn64(1, 3, 8),) * 3)
    assert calls == ["torch"], "backend='torch': the heads go through the tiled path (attn_lib.flash.autograd)"
    assert_close(out, want, dtype=torch.float64)


# --- shared key/value heads (GQA, MQA) and sliding windows ---------------------------------------------------

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
    assert_close(x_fast.grad, x_ref.grad, dtype=torch.float32, kind="gradient", what=f"{backend} d query")
    for (name, p_fast), p_ref in zip(fast.named_parameters(), ref.parameters()):
        assert_close(p_fast.grad, p_ref.grad, dtype=torch.float32, kind="gradient", what=f"{backend} d {name}")


@pytest.mark.parametrize("heads", [(6, 2), (4, 1)], ids=lambda h: f"{h[0]}/{h[1]}")
def test_cross_attention_with_l_not_s_aligns_the_window_top_left_by_default(heads):
    H, H_kv = heads
    layer = _layer(H, H_kv, (2, 1), is_causal=False)
    q, kv = _x(2, 5), _x(2, 9, seed=3)  # L = 5 queries, S = 9 keys
    with torch.no_grad():
        out, scores = layer(q, kv, need_weights=True)
        want, p = _oracle(layer, q, kv, kv, is_causal=False, window=(2, 1))
    assert_close(out, want, dtype=torch.float64, what="cross-attention output")
    assert_close(scores, p, dtype=torch.float64, what="cross-attention scores")
    assert not scores[:, :, 0, 2:].any()  # query 0 sees keys 0 and 1 only


ALIGN_CASES = [(True, None, 4, 9), (True, (2, 0), 4, 9), (False, (1, 2), 5, 8), (True, None, 9, 4),
               (True, (3, 0), 7, 5)]


@pytest.mark.parametrize("backend", ["reference", "sdpa", "torch"])
@pytest.mark.parametrize("is_causal, window, L, S", ALIGN_CASES, ids=str)
def test_bottom_right_cross_attention_equals_attention_with_bottom_right(is_causal, window, L, S, backend):
    """align='bottom-right': the L queries are the last L of S positions (flash-attn's rule), on every backend."""
    layer = _layer(6, 2, window, is_causal=is_causal, backend=backend, align="bottom-right")
    top_left = _layer(6, 2, window, is_causal=is_causal, backend=backend)
    query, kv = _x(2, L), _x(2, S, seed=3)
    with torch.no_grad():
        q, k, v = _project(layer, query, kv, kv)
        o, _ = attn_lib.attention(q, k, v, is_causal=is_causal, window_size=window, align="bottom-right",
                                  enable_gqa=True)  # (B,H,L,D)
        want = layer.out_proj(o.transpose(1, 2).flatten(2))  # (B,H,L,D) -> (B,L,C) -> (B,L,C)
        got = layer(query, kv)
        other = top_left(query, kv)
    assert_close(got, want, dtype=torch.float64, what=f"bottom-right on {backend}")
    assert (other - got).abs().max() > DISTINGUISHABLE  # top-left is another rule when L != S


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


def test_num_kv_heads_equal_to_num_heads_is_todays_layer():
    torch.manual_seed(0)
    today = MultiHeadAttention(24, 4, is_causal=True).double()
    torch.manual_seed(0)
    same = MultiHeadAttention(24, 4, num_kv_heads=4, window_size=None, is_causal=True).double()
    assert {k: v.shape for k, v in same.state_dict().items()} == {k: v.shape for k, v in today.state_dict().items()}
    for (name, a), b in zip(same.state_dict().items(), today.state_dict().values()):
        assert torch.equal(a, b), name  # the same weights from the same seed: the same draws in the same order
    x = _x(2, 5)
    with torch.no_grad():
        assert torch.equal(same(x), today(x))
    assert repr(same) == repr(today)


def test_repr_names_the_shared_heads_and_the_window():
    layer = MultiHeadAttention(24, 6, num_kv_heads=2, window_size=[4, 0], is_causal=True)
    assert layer.window_size == (4, 0)
    assert "num_kv_heads=2" in repr(layer) and "window_size=(4, 0)" in repr(layer)
