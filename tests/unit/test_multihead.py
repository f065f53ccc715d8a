"""MultiHeadAttention against torch.nn.MultiheadAttention, the per-head loop, and itself."""
import pytest
import torch
from torch import nn

import attn_lib
from attn_lib import LoopedMultiHeadAttention, MultiHeadAttention, count_parameters
from attn_lib.masks import causal_mask, padding_mask
from attn_lib.tolerances import assert_close


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
