"""attn_lib.layers.kv_cache with the layers: a failed call leaves the cache as it was, one cache serves one
layer, a non-causal layer's calls are the rows of a forward over the sequence so far, the bottom-right
mask on an empty cache. (Decoding on every backend: tests/contracts/test_layer_backends.py; bad
input: rows in tests/contracts/test_bad_input.py.)"""
import pytest
import torch

from attn_lib import KVCache, MultiHeadAttention, causal_mask, padding_mask
from attn_lib.tolerances import tolerance

F64 = tolerance(torch.float64)


def _causal(seed=0, **kw):
    torch.manual_seed(seed)
    return MultiHeadAttention(8, 2, is_causal=True, **kw).double()


def _x(B, L, C=8, seed=1):
    return torch.randn(B, L, C, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# --- the KV cache --------------------------------------------------------------------------------------

def test_a_failed_call_leaves_the_cache_as_it_was():
    layer, x = _causal(), _x(2, 3)
    pad = padding_mask([3, 2])  # (B,1,1,3): the full length, wrong for a one-token step
    cache = KVCache()
    first = layer(x[:, :1], mask=pad[..., :1], kv_cache=cache)
    with pytest.raises(ValueError, match=r"mask has shape \(2, 1, 1, 3\), which does not broadcast to the scores' "
                                         r"shape \(B, H, L, S\) = \(2, 2, 1, 2\)"):
        layer(x[:, 1:2], mask=pad, kv_cache=cache)
    assert len(cache) == 1  # nothing was appended
    second = layer(x[:, 1:2], mask=pad[..., :2], kv_cache=cache)  # the retry with the right mask
    full = layer(x[:, :2], mask=pad[..., :2])
    torch.testing.assert_close(torch.cat([first, second], dim=1), full, **F64)
    assert len(cache) == 2


def test_a_call_that_fails_after_the_checks_leaves_the_cache_as_it_was():
    layer = _causal()
    cache = KVCache()
    layer(_x(1, 2), kv_cache=cache)
    keys = cache.keys
    huge = torch.full((1, 1, 8), 1e200, dtype=torch.float64) * torch.arange(1, 9, dtype=torch.float64)
    with pytest.raises(ValueError, match="attention scores overflowed"):
        layer(huge, kv_cache=cache)
    assert len(cache) == 2 and cache.keys is keys


def test_a_cache_refused_by_another_layer_is_unchanged_and_reset_frees_it():
    a, b, x = _causal(0), _causal(1), _x(1, 4)
    cache = KVCache()
    a(x[:, :1], kv_cache=cache)
    with pytest.raises(ValueError, match=r"kv_cache already serves another layer"):
        b(x[:, 1:2], kv_cache=cache)
    assert len(cache) == 1
    cache.reset()  # emptied: free for another layer
    torch.testing.assert_close(b(x[:, :1], kv_cache=cache), b(x[:, :1]), **F64)


def test_a_non_causal_layer_with_a_cache_gives_the_rows_of_a_forward_over_the_sequence_so_far():
    """Defined, not refused: each call's queries see every cached key and their own block.
    (Bad-input rows of these fixes, e.g. one cache for two layers, live in tests/contracts/test_bad_input.py.)"""
    torch.manual_seed(2)
    layer = MultiHeadAttention(8, 2).double()
    x = _x(2, 7)
    for chunks in ([3, 4], [1, 2, 4], [1] * 7):
        cache, start = KVCache(), 0
        for n in chunks:
            got = layer(x[:, start:start + n], kv_cache=cache)
            torch.testing.assert_close(got, layer(x[:, :start + n])[:, start:], **F64)
            start += n


def test_attention_mask_on_an_empty_cache():
    cache = KVCache()
    assert cache.attention_mask(None, 0, True).shape == (0, 0)
    assert cache.attention_mask(None, 0, False) is None
    cache.append(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))
    torch.testing.assert_close(cache.attention_mask(None, 2, True), causal_mask(2, 3, align="bottom-right"))


def _cache(S, device="cpu"):
    cache = KVCache()
    cache.append(torch.zeros(1, 1, S, 2, device=device), torch.zeros(1, 1, S, 3, device=device))
    return cache


def test_an_empty_cache_holds_nothing_and_says_so():
    cache = KVCache()
    assert cache.keys is None and cache.values is None  # the documented "None while empty"
    assert cache.numel() == 0 and len(cache) == 0
    assert repr(cache) == "KVCache(length=0, keys=None)"
    cache = _cache(4)
    assert cache.numel() == 1 * 1 * 4 * 2 + 1 * 1 * 4 * 3  # keys B·H·S·D plus values B·H·S·Dv
    assert repr(cache) == "KVCache(length=4, keys=(1, 1, 4, 2))"


def test_attention_mask_combines_a_bool_mask_with_the_bottom_right_causal_mask():
    cache = _cache(3)
    keep = torch.tensor([True, False, True])  # (S,) key padding: key 1 is hidden
    # two new queries are positions 1 and 2 of 3: query 1 sees keys 0..1, query 2 sees 0..2
    expected = torch.tensor([[True, False, False], [True, False, True]])
    got = cache.attention_mask(keep, 2, True)
    assert got.dtype == torch.bool
    assert torch.equal(got, expected)
    assert cache.attention_mask(keep, 2, False) is keep  # not causal: the mask unchanged


def test_attention_mask_puts_minus_inf_above_the_diagonal_of_a_float_mask():
    cache = _cache(3)
    bias = torch.tensor([[0.5, -1.0, 2.0], [0.25, 0.0, -3.0]])  # (L,S) additive
    inf = float("-inf")
    expected = torch.tensor([[0.5, -1.0, inf], [0.25, 0.0, -3.0]])
    got = cache.attention_mask(bias, 2, True)
    assert torch.equal(got, expected)
    assert torch.equal(bias, torch.tensor([[0.5, -1.0, 2.0], [0.25, 0.0, -3.0]]))  # the caller's mask untouched


def test_attention_mask_is_built_on_the_device_of_the_cache_or_of_the_mask():
    meta = torch.device("meta")  # a device other than the CPU that every machine has
    assert _cache(3, device=meta).attention_mask(None, 2, True).device == meta
    for mask in (torch.ones(1, 1, 1, 0, dtype=torch.bool, device=meta), torch.zeros(1, 1, 1, 0, device=meta)):
        got = KVCache().attention_mask(mask, 0, True)  # an empty cache: the mask's device
        assert got.device == meta and got.shape == (1, 1, 0, 0)


def test_attention_mask_hands_a_mask_it_cannot_combine_to_attention_unchanged():
    cache = _cache(3)
    for mask in ([[True, False, True]], torch.tensor([1, 0, 1])):  # neither bool nor float tensor
        assert cache.attention_mask(mask, 2, True) is mask  # attention() then names the mistake
