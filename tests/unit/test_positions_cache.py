"""Positions (attn_lib.layers.positions: the sinusoidal table, RoPE) and the KV cache (attn_lib.layers.kv_cache).

Every check compares against an answer computed independently: the sinusoidal formula with
Python's math module, RoPE as a multiplication of complex numbers, and one causal forward
pass over the whole sequence for the cache. (Bottom-right causal masks: test_masks.py; the
「它」 data set and the tiny model: test_tiny_model.py; bad input: tests/contracts/test_bad_input.py.)
"""
from __future__ import annotations

import math

import pytest
import torch

import attn_lib
from attn_lib import KVCache, MultiHeadAttention, apply_rotary, padding_mask, sinusoidal_positions
from attn_lib.models import tiny_model
from attn_lib.tolerances import assert_close, tolerance

from attn_paths import DISTINGUISHABLE

# The exports for positions, the cache and the tiny model (each callable has rows in
# tests/contracts/test_bad_input.py).
NEW_EXPORTS = ["sinusoidal_positions", "apply_rotary", "KVCache", "it_data", "tiny_model"]
F64 = tolerance("float64")  # rtol / atol of float64 results against an exact float64 answer


def test_new_exports_are_exported():
    assert all(name in attn_lib.__all__ and hasattr(attn_lib, name) for name in NEW_EXPORTS)


# --- sinusoidal_positions -------------------------------------------------------------------

@pytest.mark.parametrize("L,d", [(1, 1), (7, 4), (50, 16), (9, 7)])
def test_sinusoidal_positions_match_the_formula(L, d):
    got = sinusoidal_positions(L, d, dtype=torch.float64)
    assert got.shape == (L, d)
    for pos in range(L):
        for col in range(d):
            i2 = col - col % 2  # 2i
            angle = pos / 10000.0 ** (i2 / d)
            want = math.sin(angle) if col % 2 == 0 else math.cos(angle)
            assert abs(float(got[pos, col]) - want) <= F64["atol"] + F64["rtol"] * abs(want), (pos, col)


def test_sinusoidal_positions_base_and_dtype():
    assert sinusoidal_positions(3, 4).dtype == torch.float32
    got = sinusoidal_positions(5, 2, base=100.0, dtype=torch.float64)
    assert_close(got[3, 0], torch.tensor(math.sin(3.0), dtype=torch.float64), dtype="float64")  # column 0: frequency 1 whatever the base
    assert sinusoidal_positions(0, 4).shape == (0, 4)


# --- apply_rotary -----------------------------------------------------------------------------

def _rope_complex(x, positions, base=10000.0):
    """Independent RoPE: pairs (2i, 2i+1) as complex numbers times e^{i m theta_i}."""
    B, H, L, D = x.shape
    z = torch.view_as_complex(x.double().reshape(B, H, L, D // 2, 2).contiguous())  # (B,H,L,D/2)
    theta = torch.tensor([base ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)  # (D/2,)
    pos = torch.as_tensor(positions, dtype=torch.float64)
    rot = torch.exp(1j * (pos[..., None] * theta).to(torch.complex128))  # (L,D/2) or (B,L,D/2)
    if rot.ndim == 3:
        rot = rot[:, None]  # (B,1,L,D/2)
    return torch.view_as_real(z * rot).reshape(B, H, L, D)


def test_apply_rotary_matches_complex_multiplication(rng):
    x = torch.randn(2, 3, 5, 8, generator=rng, dtype=torch.float64)
    assert_close(apply_rotary(x), _rope_complex(x, torch.arange(5)))
    pos = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    assert_close(apply_rotary(x, pos, base=500.0), _rope_complex(x, pos, base=500.0))


def test_apply_rotary_preserves_norms(rng):
    x = torch.randn(2, 2, 7, 6, generator=rng, dtype=torch.float64)
    y = apply_rotary(x, torch.arange(10, 17))
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), **F64)
    assert not torch.allclose(y, x)  # it did rotate


def test_apply_rotary_explicit_positions_equal_default(rng):
    x = torch.randn(1, 2, 6, 4, generator=rng)
    assert torch.equal(apply_rotary(x, list(range(6))), apply_rotary(x))
    assert torch.equal(apply_rotary(x, torch.arange(6)), apply_rotary(x))
    x64 = x.double()
    assert torch.equal(apply_rotary(x64, [0] * 6), x64)  # position 0: no rotation


@pytest.mark.parametrize("shift", [1, 5, 100])
def test_rotary_scores_depend_only_on_the_offset(rng, shift):
    q = torch.randn(1, 1, 1, 16, generator=rng, dtype=torch.float64)
    k = torch.randn(1, 1, 1, 16, generator=rng, dtype=torch.float64)
    for m, n in [(0, 0), (3, 1), (2, 7), (10, 4)]:
        s = (apply_rotary(q, [m]) * apply_rotary(k, [n])).sum()
        s_shifted = (apply_rotary(q, [m + shift]) * apply_rotary(k, [n + shift])).sum()
        assert_close(s_shifted, s, dtype="float64", what=f"score at ({m}, {n}) shifted by {shift}")
    # and it does depend on the offset
    s1 = (apply_rotary(q, [3]) * apply_rotary(k, [1])).sum()
    s2 = (apply_rotary(q, [3]) * apply_rotary(k, [2])).sum()
    assert abs(float(s1 - s2)) > DISTINGUISHABLE


# --- KV cache -----------------------------------------------------------------------------------

def _layer(C=12, H=3, seed=0):
    torch.manual_seed(seed)
    return MultiHeadAttention(C, H, is_causal=True).double()


@pytest.mark.parametrize("B,N,block", [(1, 7, 1), (3, 9, 1), (2, 11, 3), (4, 5, 5)])
def test_cache_decoding_equals_full_causal_forward(rng, B, N, block):
    layer = _layer()
    x = torch.randn(B, N, 12, generator=rng, dtype=torch.float64)
    full = layer(x)  # one causal forward over the whole sequence, top-left = bottom-right when L = S
    cache = KVCache()
    pieces = [layer(x[:, t:t + block], kv_cache=cache) for t in range(0, N, block)]  # first block is a prefill
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, **F64)
    assert len(cache) == N and cache.numel() == 2 * B * N * 12


def test_cache_decoding_with_key_padding(rng):
    """Right-padded sentences of lengths 7, 3, 5: real positions match the padded full forward."""
    layer = _layer(seed=1)
    lengths = [7, 3, 5]
    N = max(lengths)
    x = torch.randn(3, N, 12, generator=rng, dtype=torch.float64)
    pad = padding_mask(lengths, N)  # (B,1,1,N)
    full = layer(x, mask=pad)
    cache = KVCache()
    steps = [layer(x[:, t:t + 1], mask=pad[..., : t + 1], kv_cache=cache) for t in range(N)]
    got = torch.cat(steps, dim=1)  # (B,N,C)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(got[b, :n], full[b, :n], **F64)
    # an additive float mask gives the same
    cache.reset()
    add = attn_lib.bool_to_additive(pad, torch.float64)
    steps = [layer(x[:, t:t + 1], mask=add[..., : t + 1], kv_cache=cache) for t in range(N)]
    for b, n in enumerate(lengths):
        torch.testing.assert_close(torch.cat(steps, dim=1)[b, :n], full[b, :n], **F64)


def test_cache_with_a_non_causal_layer_sees_all_cached_keys(rng):
    torch.manual_seed(2)
    layer = MultiHeadAttention(8, 2).double()
    x = torch.randn(2, 6, 8, generator=rng, dtype=torch.float64)
    cache = KVCache()
    layer(x[:, :4], kv_cache=cache)
    last = layer(x[:, 4:], kv_cache=cache)  # 2 queries over 6 keys, no mask
    torch.testing.assert_close(last, layer(x)[:, 4:], **F64)


def test_rotary_layer_with_cache_equals_full_forward(rng):
    torch.manual_seed(3)
    layer = tiny_model.RotaryMultiHeadAttention(8, 2, is_causal=True).double()
    x = torch.randn(2, 9, 8, generator=rng, dtype=torch.float64)
    cache = KVCache()
    steps = [layer(x[:, t:t + 1], kv_cache=cache) for t in range(9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), layer(x), **F64)


def test_cache_scores_count_grows_linearly(rng):
    layer = _layer()
    cache = KVCache()
    counts = []
    for t in range(6):
        _, scores = layer(torch.randn(1, 1, 12, generator=rng, dtype=torch.float64), kv_cache=cache,
                          need_weights=True)
        counts.append(scores.numel())
    assert counts == [3 * (t + 1) for t in range(6)]  # H = 3 heads, one query, t + 1 keys


# --- valid inputs next to the refused ones (the bad-input rows only show what is refused) --------------

def test_sinusoidal_positions_take_any_positive_base():
    got = sinusoidal_positions(3, 4, base=0.5, dtype=torch.float64)  # a base below 1 is finite and > 0
    for pos in range(3):
        angle = pos / 0.5 ** (2 / 4)  # column 2: 2i = 2 of d = 4
        assert abs(float(got[pos, 2]) - math.sin(angle)) <= F64["atol"] + F64["rtol"], pos
        assert abs(float(got[pos, 3]) - math.cos(angle)) <= F64["atol"] + F64["rtol"], pos


def test_apply_rotary_puts_the_positions_on_the_device_of_x():
    meta = torch.device("meta")  # a device other than the CPU that every machine has
    x = torch.zeros(2, 1, 3, 4, device=meta)
    for positions in ([0, 1, 2], torch.tensor([0, 1, 2]), torch.tensor([[0, 1, 2], [5, 6, 7]], dtype=torch.int32)):
        got = apply_rotary(x, positions)  # positions given on the CPU (or as a list)
        assert got.device == meta and got.shape == x.shape


def _tiny(positions, max_len):
    torch.manual_seed(0)
    return tiny_model.TinyItModel(len(attn_lib.models.it_data.VOCAB), len(attn_lib.models.it_data.OBJECTS), positions=positions,
                                  max_len=max_len)


def test_tiny_model_takes_a_sentence_as_long_as_its_position_table():
    model = _tiny("sinusoidal", 5)
    scores, weights = model(torch.zeros(2, 5, dtype=torch.int64), torch.tensor([5, 4]), torch.tensor([0, 1]))
    assert scores.shape == (2, len(attn_lib.models.it_data.OBJECTS)) and weights.shape[-2:] == (5, 5)


def test_a_rope_tiny_model_has_no_position_table_to_outgrow():
    model = _tiny("rope", 4)  # max_len sizes only the sinusoidal table
    scores, weights = model(torch.zeros(2, 6, dtype=torch.int64), torch.tensor([6, 6]), torch.tensor([0, 1]))
    assert scores.shape == (2, len(attn_lib.models.it_data.OBJECTS)) and weights.shape[-2:] == (6, 6)


def test_train_takes_a_learning_rate_below_one_and_returns_one_loss_per_step():
    data = attn_lib.models.it_data.encode(attn_lib.models.it_data.make_split("train", 8))
    losses = tiny_model.train(_tiny("sinusoidal", 64), data, steps=2, batch_size=4, lr=0.5)
    assert len(losses) == 2 and all(isinstance(v, float) and math.isfinite(v) for v in losses)
    assert tiny_model.train(_tiny("sinusoidal", 64), data, steps=0, batch_size=1, lr=3) == []  # an int lr, no step
