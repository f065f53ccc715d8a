"""attn_lib.layers.multihead_looped: the per-head teaching version computes what the fused MultiHeadAttention
computes (the fused layer is itself tested against torch.nn.MultiheadAttention in test_multihead.py), with
the same parameters, settings, checks and printed form; and against the float64 recomputation from the fused
layer's weights (attn_paths.mha_reference64)."""
import pytest
import torch
from torch import nn

import attn_lib
import attn_lib.layers.dispatch as dispatch
from attn_lib import LoopedMultiHeadAttention, MultiHeadAttention, count_parameters
from attn_lib.core.masks import causal_mask, padding_mask
from attn_lib.tolerances import assert_close

from attn_paths import DISTINGUISHABLE, mha_reference64, randn64, seed_weights

HEADS = [(6, 2), (8, 1), (4, 4)]  # (H, H_kv): GQA, MQA, none shared


def _fused(**kw):
    return seed_weights(attn_lib.MultiHeadAttention(8, 2, **kw).double())


def test_fused_equals_looped_per_head_version(rng):
    C, H = 12, 4
    for is_causal in (False, True):
        torch.manual_seed(3)
        fused = MultiHeadAttention(C, H, is_causal=is_causal).double()
        looped = LoopedMultiHeadAttention.from_fused(fused)
        x = torch.randn(2, 5, C, generator=rng, dtype=torch.float64)
        mask = padding_mask([5, 2], 5)
        with torch.no_grad():
            a, sa = fused(x, mask=mask, need_weights=True)
            b, sb = looped(x, mask=mask, need_weights=True)
        assert_close(b, a, dtype=torch.float64, what="fused vs looped output")
        assert_close(sb, sa, dtype=torch.float64, what="fused vs looped scores")


def test_fused_equals_looped_with_per_head_mask_and_no_bias(rng):
    fused = MultiHeadAttention(8, 2, bias=False).double()
    looped = LoopedMultiHeadAttention.from_fused(fused)
    x = torch.randn(1, 4, 8, generator=rng, dtype=torch.float64)
    per_head = torch.stack([causal_mask(4), torch.ones(4, 4, dtype=torch.bool)])[None]  # (1,H,L,S)
    with torch.no_grad():
        assert_close(looped(x, mask=per_head), fused(x, mask=per_head), dtype=torch.float64)
    assert count_parameters(fused) == count_parameters(looped) == 4 * 8 * 8


@pytest.mark.parametrize("C,H", [(8, 1), (8, 2), (8, 8), (768, 12)])
def test_parameter_count_is_independent_of_heads(C, H):
    assert count_parameters(LoopedMultiHeadAttention(C, H)) == count_parameters(nn.MultiheadAttention(C, H)) \
        == 4 * C * C + 4 * C


@pytest.mark.parametrize("which", ["kv_is_query", "k_is_query", "v_is_query", "kv_shared", "all_differ", "self"])
def test_every_combination_of_query_key_value(which):
    fused = _fused()
    layer = LoopedMultiHeadAttention.from_fused(fused)
    x, y, z = randn64(2, 4, 8, seed=1), randn64(2, 4, 8, seed=2), randn64(2, 4, 8, seed=3)
    xq, xk, xv = {"kv_is_query": (x, x, x), "k_is_query": (x, x, y), "v_is_query": (x, y, x), "kv_shared": (x, y, y),
                  "all_differ": (x, y, z), "self": (x, None, None)}[which]
    with torch.no_grad():
        out = layer(xq, xk, xv)
        expected = mha_reference64(fused, xq, xk, xv)
    assert_close(out, expected, dtype="float64", what=f"looped {which}")


def test_looped_layer_settings_default_and_copy():
    looped = LoopedMultiHeadAttention(8, 2)
    assert looped.check_finite is True and looped.backend == "auto" and looped.align == "top-left"
    fused = _fused(backend="torch", check_finite=False, is_causal=True, align="bottom-right")
    copy = LoopedMultiHeadAttention.from_fused(fused)
    assert (copy.backend, copy.check_finite, copy.is_causal, copy.align) == ("torch", False, True, "bottom-right")


def test_looped_layer_honours_check_finite():
    bad = randn64(1, 3, 8)
    bad[0, 0, 0] = float("nan")
    nan_mask = torch.zeros(3, 3, dtype=torch.float64)
    nan_mask[0, 0] = float("nan")
    strict = LoopedMultiHeadAttention.from_fused(_fused())
    with pytest.raises(ValueError, match="query contains nan or inf"):
        strict(bad)
    with pytest.raises(ValueError, match="additive float mask may contain -inf"):
        strict(randn64(1, 3, 8), mask=nan_mask)
    with pytest.raises(ValueError, match=r"mask has 3 heads on axis 1, expected 1 or 2"):
        strict(randn64(1, 3, 8), mask=torch.ones(1, 3, 4, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="attention scores overflowed"):
        huge = torch.full((1, 3, 8), 1e200, dtype=torch.float64)
        strict(huge * torch.arange(1, 9, dtype=torch.float64))
    lax = LoopedMultiHeadAttention.from_fused(_fused(check_finite=False))
    assert torch.isnan(lax(bad, mask=nan_mask)).any()  # the caller turned the checks off: no error


def test_looped_layer_honours_its_backend(monkeypatch):
    flash = LoopedMultiHeadAttention.from_fused(_fused(backend="torch"))
    with pytest.raises(ValueError, match="need_weights=True needs the attention scores"):
        flash(randn64(1, 3, 8), need_weights=True)
    calls = []
    real = dispatch.flash_core
    monkeypatch.setattr(dispatch, "flash_core", lambda *a: calls.append(a[3].backend) or real(*a))
    x = randn64(1, 3, 8)
    with torch.no_grad():
        out = flash(x)
    assert calls == ["torch", "torch"], "backend='torch': every head goes through the tiled path"
    assert_close(out, mha_reference64(_fused(), x, x, x), dtype=torch.float64)


def test_repr_names_sizes_and_a_non_default_backend():
    looped = repr(LoopedMultiHeadAttention(8, 4, backend="torch"))
    assert "d_model=8, num_heads=4, head_dim=2, is_causal=False, backend='torch'\n" in looped
    assert "backend" not in repr(LoopedMultiHeadAttention(8, 2))
    assert "head_dim=4, is_causal=False\n" in repr(LoopedMultiHeadAttention(8, 2))


@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}/{h[1]}")
@pytest.mark.parametrize("window", [None, (2, 0)], ids=str)
def test_the_looped_layer_equals_the_fused_one_with_shared_heads(heads, window):
    H, H_kv = heads
    torch.manual_seed(0)
    fused = MultiHeadAttention(24, H, num_kv_heads=H_kv, window_size=window, is_causal=True,
                               backend="reference").double()
    looped = LoopedMultiHeadAttention.from_fused(fused)
    assert (looped.num_kv_heads, looped.window_size, len(looped.w_k), len(looped.w_q)) == (
        H_kv, fused.window_size, H_kv, H)
    x = randn64(2, 6, 24, seed=1)
    mask = torch.rand(2, 1, 6, 6, generator=torch.Generator().manual_seed(4)) > 0.3  # (B,1,L,S)
    with torch.no_grad():
        a, sa = fused(x, mask=mask, need_weights=True)
        b, sb = looped(x, mask=mask, need_weights=True)
    assert_close(b, a, dtype=torch.float64, what="looped vs fused")
    assert_close(sb, sa, dtype=torch.float64, what="looped vs fused scores")
    assert count_parameters(looped) == count_parameters(fused)


def test_bottom_right_cross_attention_equals_the_fused_layer_and_attention():
    torch.manual_seed(0)
    fused = MultiHeadAttention(24, 6, num_kv_heads=2, is_causal=True, window_size=(2, 0), align="bottom-right").double()
    looped = LoopedMultiHeadAttention.from_fused(fused)
    query, kv = randn64(2, 4, 24, seed=1), randn64(2, 9, 24, seed=2)  # L = 4 queries, S = 9 keys
    C, D = 24, 4
    W, b = fused.qkv.weight, fused.qkv.bias
    with torch.no_grad():
        q = (query @ W[:C].T + b[:C]).unflatten(-1, (6, D)).transpose(1, 2)  # (B,H,L,D)
        k = (kv @ W[C:C + 2 * D].T + b[C:C + 2 * D]).unflatten(-1, (2, D)).transpose(1, 2)  # (B,H_kv,S,D)
        v = (kv @ W[C + 2 * D:].T + b[C + 2 * D:]).unflatten(-1, (2, D)).transpose(1, 2)  # (B,H_kv,S,D)
        o, _ = attn_lib.attention(q, k, v, is_causal=True, window_size=(2, 0), align="bottom-right", enable_gqa=True)
        want = fused.out_proj(o.transpose(1, 2).flatten(2))  # (B,H,L,D) -> (B,L,C)
        got = looped(query, kv)
        top_left = LoopedMultiHeadAttention.from_fused(fused)
        top_left.align = "top-left"
        other = top_left(query, kv)
    assert_close(got, want, dtype=torch.float64, what="looped, bottom-right")
    assert (other - got).abs().max() > DISTINGUISHABLE


def test_num_kv_heads_equal_to_num_heads_is_todays_layer():
    torch.manual_seed(0)
    today = LoopedMultiHeadAttention(24, 4, is_causal=True).double()
    torch.manual_seed(0)
    same = LoopedMultiHeadAttention(24, 4, num_kv_heads=4, window_size=None, is_causal=True).double()
    for (name, a), b in zip(same.state_dict().items(), today.state_dict().values()):
        assert torch.equal(a, b), name  # the same weights from the same seed: the same draws in the same order
    x = randn64(2, 5, 24, seed=1)
    with torch.no_grad():
        assert torch.equal(same(x), today(x))
    assert repr(same) == repr(today)

