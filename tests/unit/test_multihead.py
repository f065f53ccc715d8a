"""MultiHeadAttention against torch.nn.MultiheadAttention, the per-head loop, and itself."""
import pytest
import torch
from torch import nn

import attn_lib
import attn_lib.flash.autograd as flash_module
from attn_lib import LoopedMultiHeadAttention, MultiHeadAttention, count_parameters
from attn_lib.core.masks import causal_mask, padding_mask
from attn_lib.tolerances import assert_close

from attn_paths import randn64, seed_weights


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
        assert_close(a, b, dtype=torch.float64, what="fused vs looped output")
        assert_close(sa, sb, dtype=torch.float64, what="fused vs looped scores")


def test_fused_equals_looped_with_per_head_mask_and_no_bias(rng):
    fused = MultiHeadAttention(8, 2, bias=False).double()
    looped = LoopedMultiHeadAttention.from_fused(fused)
    x = torch.randn(1, 4, 8, generator=rng, dtype=torch.float64)
    per_head = torch.stack([causal_mask(4), torch.ones(4, 4, dtype=torch.bool)])[None]  # (1,H,L,S)
    with torch.no_grad():
        assert_close(fused(x, mask=per_head), looped(x, mask=per_head), dtype=torch.float64)
    assert count_parameters(fused) == count_parameters(looped) == 4 * 8 * 8


@pytest.mark.parametrize("C,H", [(8, 1), (8, 2), (8, 8), (768, 12)])
def test_parameter_count_is_independent_of_heads(C, H):
    expected = 4 * C * C + 4 * C
    single = count_parameters(MultiHeadAttention(C, 1))
    multi = count_parameters(MultiHeadAttention(C, H))
    looped = count_parameters(LoopedMultiHeadAttention(C, H))
    torch_mha = count_parameters(nn.MultiheadAttention(C, H))
    assert single == multi == looped == torch_mha == expected


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
    assert torch.allclose(scores.sum(-1), torch.ones(2, 3, 4))
    assert torch.all(scores.triu(1) == 0)
    assert isinstance(mha(x), torch.Tensor)


def test_split_and_merge_heads_are_inverse(rng):
    x = torch.randn(2, 5, 12, generator=rng)
    heads = attn_lib.split_heads(x, 3)
    assert heads.shape == (2, 3, 5, 4)
    assert torch.equal(heads[:, 1], x[..., 4:8])  # head 1 holds channels 4..7
    assert torch.equal(attn_lib.merge_heads(heads), x)


# --- which projection path each query/key/value combination takes; the looped layer's settings;
# --- the printed form (what chapters 05 and 07 print) ---------------------------------------------
def _fused(**kw):
    return seed_weights(attn_lib.MultiHeadAttention(8, 2, **kw).double())


def _ref_mha(layer, xq, xk, xv):
    C, H = layer.d_model, layer.num_heads
    w_q, w_k, w_v = layer.qkv.weight.split(C)
    b_q, b_k, b_v = layer.qkv.bias.split(C)

    def heads(y):  # (B,L,C) -> (B,H,L,D)
        return y.reshape(y.shape[0], y.shape[1], H, C // H).transpose(1, 2)

    out = torch.nn.functional.scaled_dot_product_attention(heads(xq @ w_q.T + b_q), heads(xk @ w_k.T + b_k),
                                                           heads(xv @ w_v.T + b_v))
    return layer.out_proj(out.transpose(1, 2).reshape(xq.shape))


@pytest.mark.parametrize("Layer", ["fused", "looped"])
@pytest.mark.parametrize("which", ["kv_is_query", "k_is_query", "v_is_query", "kv_shared", "all_differ", "self"])
def test_every_combination_of_query_key_value(Layer, which):
    fused = _fused()
    layer = fused if Layer == "fused" else attn_lib.LoopedMultiHeadAttention.from_fused(fused)
    x, y, z = randn64(2, 4, 8, seed=1), randn64(2, 4, 8, seed=2), randn64(2, 4, 8, seed=3)
    xq, xk, xv = {"kv_is_query": (x, x, x), "k_is_query": (x, x, y), "v_is_query": (x, y, x), "kv_shared": (x, y, y),
                  "all_differ": (x, y, z), "self": (x, None, None)}[which]
    with torch.no_grad():
        out = layer(xq, xk, xv)
        expected = _ref_mha(fused, xq, xq if xk is None else xk, (xq if xk is None else xk) if xv is None else xv)
    assert_close(out, expected, dtype="float64", what=f"{Layer} {which}")


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


def test_looped_layer_settings_default_and_copy():
    looped = attn_lib.LoopedMultiHeadAttention(8, 2)
    assert looped.check_finite is True and looped.backend == "auto"
    fused = _fused(backend="torch", check_finite=False, is_causal=True)
    copy = attn_lib.LoopedMultiHeadAttention.from_fused(fused)
    assert (copy.backend, copy.check_finite, copy.is_causal) == ("torch", False, True)


def test_looped_layer_honours_check_finite_and_backend(monkeypatch):
    bad = randn64(1, 3, 8)
    bad[0, 0, 0] = float("nan")
    nan_mask = torch.zeros(3, 3, dtype=torch.float64)
    nan_mask[0, 0] = float("nan")
    strict = attn_lib.LoopedMultiHeadAttention.from_fused(_fused())
    with pytest.raises(ValueError, match="query contains nan or inf"):
        strict(bad)
    with pytest.raises(ValueError, match="additive float mask may contain -inf"):
        strict(randn64(1, 3, 8), mask=nan_mask)
    with pytest.raises(ValueError, match=r"mask has 3 heads on axis 1, expected 1 or 2"):
        strict(randn64(1, 3, 8), mask=torch.ones(1, 3, 4, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="attention scores overflowed"):
        huge = torch.full((1, 3, 8), 1e200, dtype=torch.float64)
        strict(huge * torch.arange(1, 9, dtype=torch.float64))
    lax = attn_lib.LoopedMultiHeadAttention.from_fused(_fused(check_finite=False))
    assert torch.isnan(lax(bad, mask=nan_mask)).any()  # the caller turned the checks off: no error
    flash = attn_lib.LoopedMultiHeadAttention.from_fused(_fused(backend="torch"))
    with pytest.raises(ValueError, match="need_weights=True needs the attention scores"):
        flash(randn64(1, 3, 8), need_weights=True)
    calls = []
    real = flash_module._flash_unchecked
    monkeypatch.setattr(flash_module, "_flash_unchecked", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad():
        flash(randn64(1, 3, 8))
    assert len(calls) == 2, "backend='torch': every head goes through the tiled path (attn_lib.flash.autograd)"


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
    looped = repr(attn_lib.LoopedMultiHeadAttention(8, 4, backend="torch"))
    assert "d_model=8, num_heads=4, head_dim=2, is_causal=False, backend='torch'\n" in looped
    single = repr(attn_lib.SelfAttention(6, 4, 2, backend="torch"))
    assert "d_model=6, d_k=4, d_v=2, is_causal=False, backend='torch'\n" in single
    assert "backend" not in repr(attn_lib.SelfAttention(6))


def test_default_and_flash_reprs():
    assert "backend" not in repr(attn_lib.LoopedMultiHeadAttention(8, 2))
    assert "head_dim=4, is_causal=False\n" in repr(attn_lib.LoopedMultiHeadAttention(8, 2))
    assert "head_dim=4, is_causal=False, backend='torch'\n" in repr(attn_lib.MultiHeadAttention(8, 2, backend="torch"))


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
    torch.testing.assert_close(tiled(x, mask=keys), layer(x, mask=keys), **attn_lib.tolerance(torch.float64))


def test_the_gpu_kernel_door_on_a_cpu(monkeypatch):
    from attn_lib.checks.layers import check_flash_inputs

    x = torch.zeros(1, 3, 512)
    assert attn_lib.device.triton_interprets()  # CPU only: the kernels run under Triton's interpreter
    assert check_flash_inputs("triton", x, 256, 256) is None  # the largest head dim, CPU tensors: accepted
    monkeypatch.setattr(attn_lib.device, "triton_interprets", lambda: False)  # as with a CUDA device present
    with pytest.raises(ValueError, match=r"^backend='triton' got tensors on cpu, but Triton in this process compiles"):
        check_flash_inputs("triton", x, 4, 4)
