"""The settings of one call (attn_lib.rules.settings): frozen objects, a layer's band (top-left, bottom-right,
cached), which rows see a key (against a loop over the band and the key mask), and the overflow rule on a
log-sum-exp."""
import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from attn_lib.rules.band import Band
from attn_lib.rules.names import NO_WINDOW
from attn_lib.rules.numerics import OVERFLOW_MESSAGE
from attn_lib.rules.settings import (AttentionSettings, DecodeSettings, Options, layer_settings, raise_if_overflowed,
                                     rows_with_keys)

INF, NAN = float("inf"), float("nan")


def settings_for(band=Band(), key_mask=None, work=torch.float32, scale=0.25):
    return AttentionSettings(band=band, scale=scale, work_dtype=work, key_mask=key_mask)


def loop_visible(L, S, is_causal, window, offset):
    """flash-attn's rule: query i sees key j iff i + o - left <= j <= i + o + right (-1: unbounded); causal: right = 0."""
    left, right = window
    right = 0 if is_causal else right
    return torch.tensor([[(left < 0 or j >= i + offset - left) and (right < 0 or j <= i + offset + right)
                          for j in range(S)] for i in range(L)], dtype=torch.bool).reshape(L, S)


# --- the objects -----------------------------------------------------------------------------
def test_settings_objects_are_frozen_and_replace_makes_a_copy():
    s = settings_for(band=Band(None, 0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.scale = 1.0
    t = s.replace(scale=0.5, backend="torch")
    assert (t.scale, t.backend, t.band, t.work_dtype) == (0.5, "torch", Band(None, 0), torch.float32)
    assert (s.scale, s.backend) == (0.25, "reference")  # the original is untouched
    with pytest.raises(TypeError):
        s.replace(no_such_field=1)
    for obj, field in ((Options(), "is_causal"), (DecodeSettings(scale=1.0, work_dtype=torch.float32), "seqlens")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field, None)


def test_options_default_to_the_public_defaults():
    o = Options()
    assert (o.is_causal, o.scale, o.window_size, o.align, o.enable_gqa, o.check_finite, o.key_mask, o.backend) == (
        False, None, NO_WINDOW, "top-left", False, True, None, "auto")
    assert (o.block_m, o.block_n, o.cache_seqlens, o.num_splits) == (None, None, None, None)


@pytest.mark.parametrize("scale", [0.125, 3.0, 1e-20])
@pytest.mark.parametrize("work", [torch.float32, torch.float64])
def test_qk_scale_multiplies_to_scale_times_log2e(scale, work):
    a, b = settings_for(scale=scale, work=work).qk_scale
    assert (a, b) == (scale * math.log2(math.e), 1.0)


def test_qk_scale_splits_near_float32_max_only_in_float32():
    big = torch.finfo(torch.float32).max
    assert settings_for(scale=big).qk_scale == (big, math.log2(math.e))
    assert settings_for(scale=big, work=torch.float64).qk_scale == (big * math.log2(math.e), 1.0)


# --- layer_settings --------------------------------------------------------------------------
def fake_layer(is_causal=True, window_size=(2, 0), align="top-left", check_finite=True, backend="torch"):
    return SimpleNamespace(is_causal=is_causal, window_size=window_size, align=align, check_finite=check_finite,
                           backend=backend)


LAYER_CASES = [(True, (2, 0)), (True, NO_WINDOW), (False, (1, 2)), (False, NO_WINDOW), (True, (2**64, 0))]


@pytest.mark.parametrize("L,S", [(3, 7), (7, 3), (5, 5)])
@pytest.mark.parametrize("is_causal,window", LAYER_CASES)
def test_layer_settings_aligns_top_left_bottom_right_and_cached(L, S, is_causal, window):
    for align, cached, offset in (("top-left", False, 0), ("bottom-right", False, S - L),
                                  ("top-left", True, S - L), ("bottom-right", True, S - L)):
        s = layer_settings(fake_layer(is_causal, window, align), L, S, 16, torch.float32, cached=cached)
        assert torch.equal(s.band.mask(L, S), loop_visible(L, S, is_causal, window, offset)), (align, cached)


@pytest.mark.parametrize("dtype,work", [(torch.float64, torch.float64), (torch.float32, torch.float32),
                                        (torch.bfloat16, torch.float32), (torch.float16, torch.float32)])
def test_layer_settings_scale_work_dtype_and_switches(dtype, work):
    s = layer_settings(fake_layer(check_finite=False, backend="sdpa"), 4, 4, 9, dtype)
    assert s.scale == 1 / math.sqrt(9) and s.work_dtype is work
    assert (s.check_overflow, s.backend, s.key_mask, s.block_m, s.block_n) == (False, "sdpa", None, None, None)
    assert layer_settings(fake_layer(check_finite=True), 4, 4, 9, dtype).check_overflow is True


# --- rows_with_keys --------------------------------------------------------------------------
def loop_rows_with_keys(L, S, band_mask, key_mask):
    """(B or 1, 1, L): row i of entry b sees a key iff some j is in the band and present in the key mask."""
    B = 1 if key_mask is None else key_mask.shape[0]
    out = torch.zeros(B, 1, L, dtype=torch.bool)
    for b in range(B):
        for i in range(L):
            out[b, 0, i] = any(bool(band_mask[i, j]) and (key_mask is None or bool(key_mask[b, j])) for j in range(S))
    return out


def key_masks(S):
    g = torch.Generator().manual_seed(S)
    random = torch.rand(4, S, generator=g) < 0.5
    random[0] = False  # an entry with no key at all
    random[1] = True
    if S > 1:
        random[2] = False
        random[2, -1] = True  # only the last key
    return [None, random]


BANDS = [(False, NO_WINDOW, 0), (True, NO_WINDOW, 0), (True, NO_WINDOW, "br"), (False, (1, 1), 0), (True, (0, 0), 0),
         (True, (2, 0), "br"), (False, (0, 0), 40), (True, NO_WINDOW, -40), (False, (-1, 2), -3)]


@pytest.mark.parametrize("L,S", [(5, 8), (8, 5), (6, 6), (1, 1), (3, 0), (0, 3)])
@pytest.mark.parametrize("is_causal,window,offset", BANDS)
def test_rows_with_keys_matches_a_loop_over_the_band_and_the_key_mask(L, S, is_causal, window, offset):
    offset = S - L if offset == "br" else offset
    band = Band.resolve(L, S, is_causal=is_causal, window_size=window, offset=offset)
    visible = loop_visible(L, S, is_causal, window, offset)
    for key_mask in key_masks(S):
        got = rows_with_keys(L, S, settings_for(band=band, key_mask=key_mask), "cpu")
        want = loop_rows_with_keys(L, S, visible, key_mask)
        assert got.dtype == torch.bool and got.shape == want.shape
        assert torch.equal(got, want), (key_mask,)


def test_rows_with_keys_is_built_on_the_requested_device():
    meta = torch.device("meta")  # a device other than the CPU that every machine has
    assert rows_with_keys(3, 4, settings_for(band=Band(None, 0)), meta).device == meta


# --- raise_if_overflowed ---------------------------------------------------------------------
CAUSAL_BR = Band.resolve(3, 2, is_causal=True, offset=2 - 3)  # L = 3, S = 2, bottom-right: query 0 sees no key


def lse_with(row, value, shape=(1, 2, 3)):
    lse = torch.zeros(shape)
    lse[0, 1, row] = value
    return lse


@pytest.mark.parametrize("value", [INF, NAN])
def test_an_lse_of_plus_inf_or_nan_in_a_row_that_sees_keys_overflowed_to_plus_inf(value):
    with pytest.raises(ValueError, match=f"^{OVERFLOW_MESSAGE} to \\+inf .*float32"):
        raise_if_overflowed(lse_with(2, value), 3, 2, settings_for(band=CAUSAL_BR))


def test_an_lse_of_minus_inf_in_a_row_that_sees_keys_overflowed_to_minus_inf():
    with pytest.raises(ValueError, match=f"^{OVERFLOW_MESSAGE} to -inf .*float64"):
        raise_if_overflowed(lse_with(1, -INF), 3, 2, settings_for(band=CAUSAL_BR, work=torch.float64))


def test_plus_inf_wins_when_rows_overflowed_both_ways():
    lse = lse_with(1, -INF)
    lse[0, 0, 2] = INF
    with pytest.raises(ValueError, match="to \\+inf "):
        raise_if_overflowed(lse, 3, 2, settings_for(band=CAUSAL_BR))


@pytest.mark.parametrize("value", [-INF, INF, NAN])
def test_a_row_that_sees_no_key_never_overflowed(value):
    raise_if_overflowed(lse_with(0, value), 3, 2, settings_for(band=CAUSAL_BR))  # query 0: no key in the band
    key_mask = torch.tensor([[False, False]])  # no key present: no row sees one
    lse = torch.full((1, 2, 3), value)
    raise_if_overflowed(lse, 3, 2, settings_for(key_mask=key_mask))
    with pytest.raises(ValueError, match=OVERFLOW_MESSAGE):  # the same lse with the keys present
        raise_if_overflowed(lse, 3, 2, settings_for(key_mask=~key_mask))


def test_finite_and_empty_lse_are_quiet():
    raise_if_overflowed(torch.randn(2, 3, 4), 4, 5, settings_for(band=Band(None, 0)))
    raise_if_overflowed(torch.zeros(2, 3, 0), 0, 5, settings_for())


# --- rows_with_keys with key masks that leave rows, whole sequences or single keys present ---
L5, S6 = 5, 6
KEY_MASKS = {
    "none": None,
    "some": torch.tensor([[True, False, True, True, False, False], [False] * 3 + [True] * 3]),
    "all absent": torch.zeros(2, S6, dtype=torch.bool),
    "one per row": torch.tensor([[False, False, True, False, False, False], [True] + [False] * 5]),
}


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("offset", [-4, -1, 0, 2])
@pytest.mark.parametrize("padding", list(KEY_MASKS))
def test_rows_with_keys_says_which_queries_see_a_present_key(is_causal, offset, padding):
    key_mask = KEY_MASKS[padding]
    settings = AttentionSettings(band=Band.resolve(L5, S6, is_causal=is_causal, offset=offset), scale=1.0,
                                 work_dtype=torch.float32, key_mask=key_mask)
    got = rows_with_keys(L5, S6, settings, "cpu")
    B = 1 if key_mask is None else 2
    want = torch.tensor([[[any((key_mask is None or bool(key_mask[b, j])) and (not is_causal or j <= i + offset)
                           for j in range(S6)) for i in range(L5)]] for b in range(B)])  # (B,1,L), by a loop
    assert got.shape == want.shape and torch.equal(got, want)
    if key_mask is not None:
        empty = AttentionSettings(band=Band.resolve(L5, 0, is_causal=is_causal, offset=offset), scale=1.0,
                                  work_dtype=torch.float32, key_mask=key_mask[:, :0])
        assert torch.equal(rows_with_keys(L5, 0, empty, "cpu"), torch.zeros(B, 1, L5, dtype=torch.bool))
