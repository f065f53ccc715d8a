"""Masks (attn_lib.core.masks): causal (top-left and bottom-right, against torch), sliding window (against
tests/attn_paths.visible_band, written from flash-attn's rule), padding, bool <-> additive conversion, and the device of every mask."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

import attn_lib
from attn_lib.core.masks import additive_to_bool, bool_to_additive, causal_mask, padding_mask, sliding_window_mask
from attn_lib.tolerances import assert_close
from attn_paths import visible_band

HUGE = 2**64  # wider than any sequence


def case_ids(value):
    return "x".join(str(x) for x in value) if isinstance(value, tuple) else str(value)


# --- causal ----------------------------------------------------------------------------------
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
    assert_close(ours, F.scaled_dot_product_attention(q, k, v, attn_mask=explicit), dtype=torch.float64)
    assert_close(ours, F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(L, S)),
                 dtype=torch.float64)


# --- sliding window --------------------------------------------------------------------------
@pytest.mark.parametrize("lengths", [(5, 5), (4, 7), (7, 4)], ids=case_ids)
@pytest.mark.parametrize("window", [(0, 0), (1, 0), (3, 2), (-1, 4), (9, 9), (-1, -1), (HUGE, 0), (0, HUGE),
                                    (HUGE, HUGE), (HUGE, 1)], ids=case_ids)
@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
def test_sliding_window_mask_matches_the_loop(lengths, window, align):
    L, S = lengths
    offset = 0 if align == "top-left" else S - L
    got = sliding_window_mask(L, S, window_size=window, align=align)
    assert got.dtype == torch.bool and got.shape == (L, S)
    assert torch.equal(got, visible_band(L, S, False, window, offset))
    if window[1] in (-1, 0):
        causal = sliding_window_mask(L, S, window_size=list(window), is_causal=True, align=align)
        assert torch.equal(causal, visible_band(L, S, True, window, offset))


def test_sliding_window_mask_without_limits_is_causal_mask():
    for align in ("top-left", "bottom-right"):
        assert torch.equal(sliding_window_mask(4, 6, window_size=(-1, 0), align=align), causal_mask(4, 6, align=align))
        assert torch.equal(sliding_window_mask(4, 6, window_size=(HUGE, 0), align=align),
                           causal_mask(4, 6, align=align))
    assert bool(sliding_window_mask(3, window_size=(-1, -1)).all())
    assert sliding_window_mask(0, 3, window_size=(1, 0)).shape == (0, 3)


@pytest.mark.parametrize("L,S", [(3, 3), (2, 5), (5, 2)])
def test_sliding_window_mask_with_window_size_none_is_no_window(L, S):
    for align in ("top-left", "bottom-right"):
        assert bool(sliding_window_mask(L, S, window_size=None, align=align).all())
        assert sliding_window_mask(L, S, window_size=None, align=align).shape == (L, S)
        assert torch.equal(sliding_window_mask(L, S, window_size=None, is_causal=True, align=align),
                           causal_mask(L, S, align=align))


# --- padding, bool <-> additive ----------------------------------------------------------------
def test_padding_mask_values_and_shape():
    m = padding_mask([3, 1], 4)
    assert m.shape == (2, 1, 1, 4) and m.dtype == torch.bool
    assert m[:, 0, 0].tolist() == [[True, True, True, False], [True, False, False, False]]
    assert padding_mask(torch.tensor([2, 2])).shape == (2, 1, 1, 2)  # S defaults to max length


def test_padding_mask_takes_an_explicit_zero_length():
    assert padding_mask([0, 0], 0).shape == (2, 1, 1, 0)


def test_padding_mask_hides_padded_keys_in_attention(rng):
    B, H, L, S, D = 2, 2, 3, 5, 4
    q = torch.randn(B, H, L, D, generator=rng, dtype=torch.float64)
    k = torch.randn(B, H, S, D, generator=rng, dtype=torch.float64)
    v = torch.randn(B, H, S, D, generator=rng, dtype=torch.float64)
    lengths = [5, 2]
    out, scores = attn_lib.attention(q, k, v, mask=padding_mask(lengths, S))
    assert torch.all(scores[1, :, :, 2:] == 0)
    # the short sentence's result equals attention on its unpadded keys alone (torch's SDPA)
    alone = F.scaled_dot_product_attention(q[1:], k[1:, :, :2], v[1:, :, :2])
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


def test_bool_to_additive_defaults_to_float32_and_additive_to_bool_refuses_a_bias():
    assert bool_to_additive(torch.tensor([True, False])).dtype == torch.float32
    with pytest.raises(ValueError, match="neither 0 nor -inf"):
        additive_to_bool(torch.tensor([0.0, -1.5]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bool_and_additive_give_same_attention(dtype, rng):
    q = torch.randn(2, 2, 4, 8, generator=rng, dtype=dtype)
    keep = causal_mask(4) & padding_mask([4, 3], 4)  # (L,L) & (B,1,1,S) -> (B,1,L,S)
    a, sa = attn_lib.attention(q, q, q, mask=keep)
    b, sb = attn_lib.attention(q, q, q, mask=bool_to_additive(keep, dtype))
    assert_close(a, b, dtype=dtype)
    assert_close(sa, sb, dtype=dtype)
    want = F.scaled_dot_product_attention(q, q, q, attn_mask=keep)
    assert_close(a, want, dtype=dtype)


# --- every mask is made on the requested device ------------------------------------------------
META = torch.device("meta")  # a device other than the CPU that every machine has


def test_masks_stay_on_the_requested_device():
    assert padding_mask([2, 1], 3, device=META).device == META
    assert padding_mask(torch.tensor([2, 1]), device=META).device == META
    assert bool_to_additive(torch.ones(2, 3, dtype=torch.bool, device=META)).device == META
    assert causal_mask(3, device=META).device == META
    assert causal_mask(3, 5, align="bottom-right", device=META).device == META
    assert sliding_window_mask(3, 5, window_size=(1, 0), device=META).device == META
