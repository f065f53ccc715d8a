"""Defects found by trying to break the layers, the KV cache, the masks, the positions and the tiny
model as a hostile user would; each test failed before its fix."""
import pytest
import torch

from attn_lib import KVCache, MultiHeadAttention, SelfAttention, causal_mask, padding_mask, sinusoidal_positions
from attn_lib import it_data, tiny_model
from attn_lib.tolerances import assert_close, tolerance

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


# --- the layers -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("Layer", [SelfAttention, MultiHeadAttention])
def test_fp16_without_weights_adds_a_float32_mask_in_float32_as_the_weights_path(Layer):
    torch.manual_seed(0)
    layer = (Layer(8) if Layer is SelfAttention else Layer(8, 2)).half()
    x = torch.randn(2, 4, 8).half()
    for fill in (-1e9, 7e4):
        mask = torch.zeros(2, 1, 4, dtype=torch.float32)  # (B,1,S) key padding, additive, float32
        mask[1] = fill  # sentence 1: every key gets the same big bias (-1e9: "fully padded")
        fast = layer(x, mask=mask)
        weights_path = layer(x, mask=mask, need_weights=True)[0]
        assert_close(fast, weights_path, dtype=torch.float16, what=f"mask {fill}")
        assert fast[1].abs().max() > 0.01  # the uniform average, not zeros


@pytest.mark.parametrize("backend", ["auto", "reference", "sdpa", "torch"])
def test_an_empty_batch_gives_an_empty_output(backend):
    layer = MultiHeadAttention(8, 2, backend=backend)
    assert layer(torch.zeros(0, 3, 8)).shape == (0, 3, 8)
    if backend in ("auto", "reference"):
        out, scores = layer(torch.zeros(0, 3, 8), need_weights=True)
        assert out.shape == (0, 3, 8) and scores.shape == (0, 2, 3, 3)


def test_rotary_layer_keeps_no_state_between_calls():
    torch.manual_seed(3)
    layer = tiny_model.RotaryMultiHeadAttention(8, 2, is_causal=True).double()
    before = dict(vars(layer))
    cache = KVCache()
    layer(_x(1, 2), kv_cache=cache)
    layer(_x(1, 1), kv_cache=cache)
    assert vars(layer).keys() == before.keys() and not hasattr(type(layer), "_offset")
    assert all(vars(layer)[k] is v for k, v in before.items() if not isinstance(v, dict))


# --- the tiny model ----------------------------------------------------------------------------------

def test_tiny_model_trains_zero_steps():
    data = it_data.encode(it_data.make_split("train", 8))
    assert tiny_model.train(tiny_model.build_model("rope"), data, steps=0) == []


# --- masks and positions: one wording per mistake ----------------------------------------------------

def test_padding_mask_takes_an_explicit_zero_length():
    assert padding_mask([0, 0], 0).shape == (2, 1, 1, 0)


def test_sizes_are_checked_alike():
    assert sinusoidal_positions(torch.tensor(3), 4).shape == (3, 4)  # a 0-d int tensor, as elsewhere
    messages = []
    for call in (lambda: causal_mask(2.0), lambda: sinusoidal_positions(2.0, 4)):
        with pytest.raises(TypeError) as info:
            call()
        messages.append(str(info.value))
    assert messages[0] == messages[1] == "L must be an int >= 0, got 2.0 (float); use int(2.0)"
