"""attn_lib.checks.heads: a layer's constructor arguments and its ``kv_cache`` argument.

Each refusal is compared with its whole message; the sizes a check sets on the layer with the ones asked for.
"""
import pytest
import torch

from attn_lib import KVCache, MultiHeadAttention, SelfAttention


@pytest.mark.parametrize("sizes,name", [((4, None, 0), "d_v"), ((4, 0, None), "d_k"), ((0, None, None), "d_model")])
def test_self_attention_names_the_size_it_refuses(sizes, name):
    with pytest.raises(ValueError) as info:
        SelfAttention(*sizes)
    assert str(info.value) == f"{name} must be a positive int, got 0"


def test_self_attention_sizes_default_to_the_ones_before_them():
    layer = SelfAttention(6, 3)
    assert (layer.d_model, layer.d_k, layer.d_v) == (6, 3, 3)
    assert (SelfAttention(6).d_k, SelfAttention(6).d_v, SelfAttention(6, 2, 5).d_v) == (6, 6, 5)


def test_a_cache_is_checked_against_the_shared_key_value_heads():
    """A GQA layer stores its H_kv heads, not its H: a cache of 2 heads of D = 2 (filled by hand) fits a layer
    of 4 query heads sharing 2 key/value heads, and is refused, by name, by one with 4 key/value heads."""
    x = torch.randn(1, 1, 8, generator=torch.Generator().manual_seed(0))
    cache = KVCache()
    cache.append(torch.zeros(1, 2, 3, 2), torch.zeros(1, 2, 3, 2))  # (B,H_kv,S,D), (B,H_kv,S,Dv)
    with torch.no_grad():
        MultiHeadAttention(8, 4, num_kv_heads=2, is_causal=True)(x, kv_cache=cache)
        assert cache.keys.shape == (1, 2, 4, 2)
        again = KVCache()
        again.append(torch.zeros(1, 2, 3, 2), torch.zeros(1, 2, 3, 2))
        with pytest.raises(ValueError) as info:
            MultiHeadAttention(8, 4, num_kv_heads=4, is_causal=True)(x, kv_cache=again)
    assert str(info.value) == ("the cache holds H=2 heads of D=2 (values Dv=2) but the new keys/values have H=4, D=2, "
                               "Dv=2; one cache serves one attention layer")
