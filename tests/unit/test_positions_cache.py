"""Issue 11: positions (sinusoidal table, RoPE), bottom-right causal masks, the KV cache,
the 「它」 data set and the tiny model; with this issue's bad-input rows.

Every check compares against an answer computed independently: the sinusoidal formula with
Python's math module, RoPE as a multiplication of complex numbers, torch's own
``causal_lower_right`` bias inside ``scaled_dot_product_attention``, and one causal forward
pass over the whole sequence for the cache.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

import attn_lib
from attn_lib import KVCache, MultiHeadAttention, apply_rotary, causal_mask, it_data, padding_mask, sinusoidal_positions
from attn_lib import tiny_model
from attn_lib.tolerances import assert_close

# The exports issue 11 adds to attn_lib (callables need a row in BAD_INPUT_ROWS below).
NEW_EXPORTS = ["sinusoidal_positions", "apply_rotary", "KVCache", "it_data", "tiny_model"]
F64 = dict(rtol=1e-10, atol=1e-12)


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
            assert abs(float(got[pos, col]) - want) < 1e-12, (pos, col)


def test_sinusoidal_positions_base_and_dtype():
    assert sinusoidal_positions(3, 4).dtype == torch.float32
    got = sinusoidal_positions(5, 2, base=100.0, dtype=torch.float64)
    assert abs(float(got[3, 0]) - math.sin(3.0)) < 1e-12  # column 0: frequency 1 whatever the base
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
    torch.testing.assert_close(apply_rotary(x, list(range(6))), apply_rotary(x), rtol=0, atol=0)
    torch.testing.assert_close(apply_rotary(x, torch.arange(6)), apply_rotary(x), rtol=0, atol=0)
    x64 = x.double()
    assert torch.equal(apply_rotary(x64, [0] * 6), x64)  # position 0: no rotation


@pytest.mark.parametrize("shift", [1, 5, 100])
def test_rotary_scores_depend_only_on_the_offset(rng, shift):
    q = torch.randn(1, 1, 1, 16, generator=rng, dtype=torch.float64)
    k = torch.randn(1, 1, 1, 16, generator=rng, dtype=torch.float64)
    for m, n in [(0, 0), (3, 1), (2, 7), (10, 4)]:
        s = (apply_rotary(q, [m]) * apply_rotary(k, [n])).sum()
        s_shifted = (apply_rotary(q, [m + shift]) * apply_rotary(k, [n + shift])).sum()
        assert abs(float(s - s_shifted)) < 1e-10
    # and it does depend on the offset
    s1 = (apply_rotary(q, [3]) * apply_rotary(k, [1])).sum()
    s2 = (apply_rotary(q, [3]) * apply_rotary(k, [2])).sum()
    assert abs(float(s1 - s2)) > 1e-3


# --- bottom-right causal masks -----------------------------------------------------------------

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


# --- the 「它」 data set and the tiny model ---------------------------------------------------

def test_data_splits_are_disjoint_and_deterministic():
    train, test = it_data.make_split("train", 3000), it_data.make_split("test", 1000)
    assert len(train) == 3000 and len(test) == 1000
    assert {ex.frame for ex in train}.isdisjoint({ex.frame for ex in test})
    assert {ex.tokens for ex in train}.isdisjoint({ex.tokens for ex in test})
    assert {ex.frame for ex in test} == set(it_data.HELD_OUT_FRAMES)
    assert it_data.make_split("test", 50) == test[:50]  # same seed, same sentences
    train_words = {t for ex in train for t in ex.tokens}
    assert {t for ex in test for t in ex.tokens} <= train_words  # held-out frames recombine seen words


def test_data_labels_are_right_and_position_alone_fails():
    test = it_data.make_split("test", 1000)
    for ex in test:
        assert ex.tokens[ex.it_index] == "它"
        verb = ex.tokens[ex.it_index + (2 if ex.form == "被" else 1)]
        assert it_data.VERB_CLASS[verb] == it_data.CLASS_OF[ex.target] != it_data.CLASS_OF[ex.other]
        objects = [t for t in ex.tokens if t in it_data.CLASS_OF]
        assert ex.target in objects[:2] and ex.other in objects[:2]
    first = sum(ex.tokens[2] == ex.target for ex in test) / len(test)
    nearest = sum([t for t in ex.tokens[: ex.it_index] if t in it_data.CLASS_OF][-1] == ex.target
                  for ex in test) / len(test)
    assert 0.4 < first < 0.6 and nearest < 0.6  # "the first object", "the nearest noun": near chance


def test_tiny_model_learns_and_is_reproducible():
    data = it_data.encode(it_data.make_split("train", 3000))
    test = it_data.encode(it_data.make_split("test", 1000))
    runs, before = [], torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            model = tiny_model.build_model("rope", seed=0)
            losses = tiny_model.train(model, data)
            runs.append((losses, [p.detach().clone() for p in model.parameters()]))
    finally:
        torch.set_num_threads(before)
    assert runs[0][0] == runs[1][0]  # bit-identical losses with 1 and 2 threads
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
    assert tiny_model.accuracy(model, test) > 0.9
    assert tiny_model.accuracy(tiny_model.without_head(model, 0), test) < 0.8
