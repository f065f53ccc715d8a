"""Causal and padding masks, bool <-> additive conversion, alignment against torch (top-left and
bottom-right)."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

import attn_lib
from attn_lib.core.masks import additive_to_bool, bool_to_additive, causal_mask, padding_mask
from attn_lib.tolerances import assert_close, tolerance

F64 = tolerance("float64")  # rtol / atol of float64 results against an exact float64 answer


@pytest.mark.parametrize("L,S", [(1, 1), (3, 3), (2, 4), (4, 2), (5, 1)])
def test_causal_mask_is_top_left_lower_triangle(L, S):
    m = causal_mask(L, S)
    assert m.dtype == torch.bool and m.shape == (L, S)
    for i in range(L):
        for j in range(S):
            assert bool(m[i, j]) == (j <= i), (i, j)


@pytest.mark.parametrize("L,S", [(3, 3), (2, 5), (5, 2), (6, 6)])
def test_causal_mask_matches_torch_is_causal_alignment(L, S, rng):
    q = torch.randn(1, 2, L, 4, generator=rng, dtype=torch.float64)
    k = torch.randn(1, 2, S, 4, generator=rng, dtype=torch.float64)
    v = torch.randn(1, 2, S, 3, generator=rng, dtype=torch.float64)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with_mask = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(L, S))
    assert_close(with_mask, expected, dtype=torch.float64, what="causal_mask vs torch is_causal")
    ours, _ = attn_lib.attention(q, k, v, mask=causal_mask(L, S))
    assert_close(ours, expected, dtype=torch.float64)


def test_causal_mask_default_square_and_bottom_rows_for_cache():
    assert torch.equal(causal_mask(4), causal_mask(4, 4))
    last_two = causal_mask(5)[-2:]  # queries 3 and 4 of a length-5 sequence
    assert last_two.tolist() == [[True] * 4 + [False], [True] * 5]


def test_padding_mask_values_and_shape():
    m = padding_mask([3, 1], 4)
    assert m.shape == (2, 1, 1, 4) and m.dtype == torch.bool
    assert m[:, 0, 0].tolist() == [[True, True, True, False], [True, False, False, False]]
    assert padding_mask(torch.tensor([2, 2])).shape == (2, 1, 1, 2)  # S defaults to max length


def test_padding_mask_hides_padded_keys_in_attention(rng):
    B, H, L, S, D = 2, 2, 3, 5, 4
    q = torch.randn(B, H, L, D, generator=rng, dtype=torch.float64)
    k = torch.randn(B, H, S, D, generator=rng, dtype=torch.float64)
    v = torch.randn(B, H, S, D, generator=rng, dtype=torch.float64)
    lengths = [5, 2]
    _, scores = attn_lib.attention(q, k, v, mask=padding_mask(lengths, S))
    assert torch.all(scores[1, :, :, 2:] == 0)
    # the short sentence's result equals attention on its unpadded keys alone
    out, _ = attn_lib.attention(q, k, v, mask=padding_mask(lengths, S))
    alone, _ = attn_lib.attention(q[1:], k[1:, :, :2], v[1:, :, :2])
    assert_close(out[1:], alone, dtype=torch.float64)


def test_bool_additive_round_trip_and_values():
    m = causal_mask(3, 4)
    add = bool_to_additive(m, torch.float64)
    assert add.dtype == torch.float64 and add.shape == (3, 4)
    assert torch.all(add[m] == 0) and torch.all(torch.isneginf(add[~m]))
    assert torch.equal(additive_to_bool(add), m)
    # the source's construction: triu of a -inf matrix above the diagonal
    source_style = torch.triu(torch.full((3, 4), float("-inf"), dtype=torch.float64), diagonal=1)
    assert torch.equal(source_style, add)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bool_and_additive_give_same_attention(dtype, rng):
    q = torch.randn(2, 2, 4, 8, generator=rng, dtype=dtype)
    keep = causal_mask(4) & padding_mask([4, 3], 4)  # (L,L) & (B,1,1,S) -> (B,1,L,S)
    a, sa = attn_lib.attention(q, q, q, mask=keep)
    b, sb = attn_lib.attention(q, q, q, mask=bool_to_additive(keep, dtype))
    assert_close(a, b, dtype=dtype)
    assert_close(sa, sb, dtype=dtype)


# --- every mask is made on the requested device ------------------------------------------------
META = torch.device("meta")  # a device other than the CPU that every machine has


def test_masks_stay_on_the_requested_device():
    assert attn_lib.padding_mask([2, 1], 3, device=META).device == META
    assert attn_lib.padding_mask(torch.tensor([2, 1]), device=META).device == META
    assert attn_lib.bool_to_additive(torch.ones(2, 3, dtype=torch.bool, device=META)).device == META
    assert attn_lib.causal_mask(3, device=META).device == META


# --- bottom-right causal masks (a query block at the end of the keys, as with a KV cache) --------
@pytest.mark.filterwarnings("ignore:Lower right causal bias")  # torch warns for L > S (rows with no key)
@pytest.mark.parametrize("L,S", [(1, 1), (1, 5), (2, 4), (3, 7), (5, 5), (6, 3)])
def test_bottom_right_mask_equals_torch_lower_right(L, S):
    want = torch.tensor([[j <= i + (S - L) for j in range(S)] for i in range(L)], dtype=torch.bool)
    assert torch.equal(causal_mask(L, S, align="bottom-right"), want)
    assert torch.equal(causal_mask(L, S, align="bottom-right"), causal_lower_right(L, S)._materialize())
    assert torch.equal(causal_mask(L, S), causal_mask(L, S, align="top-left"))  # the default


@pytest.mark.parametrize("L,S", [(1, 6), (3, 7), (4, 4)])
def test_bottom_right_attention_equals_torch_sdpa(rng, L, S):
    q = torch.randn(2, 3, L, 8, generator=rng, dtype=torch.float64)
    k = torch.randn(2, 3, S, 8, generator=rng, dtype=torch.float64)
    v = torch.randn(2, 3, S, 5, generator=rng, dtype=torch.float64)
    ours, _ = attn_lib.attention(q, k, v, mask=causal_mask(L, S, align="bottom-right"))
    explicit = torch.ones(L, S, dtype=torch.bool).tril(S - L)  # (L,S) written out for torch
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, attn_mask=explicit), **F64)
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(L, S)),
                               **F64)


def test_padding_mask_takes_an_explicit_zero_length():
    assert padding_mask([0, 0], 0).shape == (2, 1, 1, 0)
