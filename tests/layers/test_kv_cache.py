"""attn_lib.layers.kv_cache: the KV cache with the layers that fill it.

Decoding a sequence through a ``KVCache`` in any chunks (a prefill, then pieces, then single tokens)
equals one forward over the whole sequence (the layer's reference backend, no cache): with key padding,
shared key/value heads (GQA, MQA), sliding windows (a rolling buffer whose ``seen`` keeps counting) and
RoPE; a failed call leaves the cache as it was; one cache serves one layer; the cache survives pickling
without its owner; ``state`` / ``restore``; the bottom-right mask it builds. (Which decode steps take
flash_decoding: tests/layers/test_dispatch.py; bad input: rows in tests/topics/test_bad_input.py.)
"""
import copy
import gc
import importlib.util
import io
import pickle

import pytest
import torch

import attn_lib
from attn_lib import KVCache, MultiHeadAttention, bool_to_additive, causal_mask, padding_mask
from attn_lib.models.tiny_model import RotaryMultiHeadAttention
from attn_lib.tolerances import assert_close

HAS_TRITON = importlib.util.find_spec("triton") is not None
BACKENDS = ["reference", "sdpa", "torch"] + (["triton"] if HAS_TRITON else [])
N = 9  # sequence length: a prefill of 3, chunks of 2, then single tokens
CHUNKS = [(0, 3), (3, 5), (5, 7), (7, 8), (8, 9)]

# (id, Layer, num_heads, num_kv_heads, window_size): C = 24, so D = 24 / H (4, 3 or 6)
CASES = [
    ("gqa", MultiHeadAttention, 6, 2, None),
    ("mqa", MultiHeadAttention, 8, 1, None),
    ("window-2", MultiHeadAttention, 4, 4, (2, 0)),
    ("gqa-window-1", MultiHeadAttention, 6, 3, (1, 0)),
    ("window-0", MultiHeadAttention, 4, 2, (0, 0)),
    ("window-wider-than-the-sequence", MultiHeadAttention, 6, 2, (20, -1)),
    ("rope-gqa", RotaryMultiHeadAttention, 4, 2, None),
    ("rope-gqa-window-3", RotaryMultiHeadAttention, 4, 1, (3, 0)),
]


def _causal(seed=0, **kw):
    torch.manual_seed(seed)
    return MultiHeadAttention(8, 2, is_causal=True, **kw).double()


def _x8(B, L, C=8, seed=1):
    return torch.randn(B, L, C, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _layer(Layer, H, H_kv, window, backend, *, is_causal=True, seed=0):
    torch.manual_seed(seed)
    return Layer(24, H, num_kv_heads=H_kv, window_size=window, is_causal=is_causal, backend=backend)


def _x(B=2, L=N, seed=1):
    return torch.randn(B, L, 24, generator=torch.Generator().manual_seed(seed))  # (B,L,C) float32


def _decode(layer, x, cache, chunks=CHUNKS):
    """Run x through the layer chunk by chunk; return the outputs and the cache length after each call."""
    outs, stored = [], []
    for a, b in chunks:
        outs.append(layer(x[:, a:b], kv_cache=cache))  # (B,b-a,C)
        stored.append(len(cache))
    return torch.cat(outs, dim=1), stored  # (B,N,C)


# --- decoding equals one forward ----------------------------------------------------------------------------

@pytest.mark.parametrize("B,N,block", [(1, 7, 1), (3, 9, 1), (2, 11, 3), (4, 5, 5)])
def test_cache_decoding_equals_full_causal_forward(rng, B, N, block):
    torch.manual_seed(0)
    layer = MultiHeadAttention(12, 3, is_causal=True).double()
    x = torch.randn(B, N, 12, generator=rng, dtype=torch.float64)
    full = layer(x)  # one causal forward over the whole sequence, top-left = bottom-right when L = S
    cache = KVCache()
    pieces = [layer(x[:, t:t + block], kv_cache=cache) for t in range(0, N, block)]  # first block is a prefill
    assert_close(torch.cat(pieces, dim=1), full, dtype=torch.float64)
    assert len(cache) == N and cache.numel() == 2 * B * N * 12


def test_cache_decoding_with_key_padding(rng):
    """Right-padded sentences of lengths 7, 3, 5: real positions match the padded full forward."""
    torch.manual_seed(1)
    layer = MultiHeadAttention(12, 3, is_causal=True).double()
    lengths = [7, 3, 5]
    N = max(lengths)
    x = torch.randn(3, N, 12, generator=rng, dtype=torch.float64)
    pad = padding_mask(lengths, N)  # (B,1,1,N)
    full = layer(x, mask=pad)
    for mask in (pad, bool_to_additive(pad, torch.float64)):  # an additive float mask gives the same
        cache = KVCache()
        got = torch.cat([layer(x[:, t:t + 1], mask=mask[..., : t + 1], kv_cache=cache) for t in range(N)], dim=1)
        for b, n in enumerate(lengths):
            assert_close(got[b, :n], full[b, :n], dtype=torch.float64, what=f"sentence {b}, {mask.dtype}")


def test_cache_scores_count_grows_linearly(rng):
    torch.manual_seed(0)
    layer = MultiHeadAttention(12, 3, is_causal=True).double()
    cache = KVCache()
    counts = []
    for t in range(6):
        _, scores = layer(torch.randn(1, 1, 12, generator=rng, dtype=torch.float64), kv_cache=cache,
                          need_weights=True)
        counts.append(scores.numel())
    assert counts == [3 * (t + 1) for t in range(6)]  # H = 3 heads, one query, t + 1 keys


def test_a_non_causal_layer_with_a_cache_gives_the_rows_of_a_forward_over_the_sequence_so_far():
    """Defined, not refused: each call's queries see every cached key and their own block."""
    torch.manual_seed(2)
    layer = MultiHeadAttention(8, 2).double()
    x = _x8(2, 7)
    for chunks in ([3, 4], [1, 2, 4], [1] * 7):
        cache, start = KVCache(), 0
        for n in chunks:
            got = layer(x[:, start:start + n], kv_cache=cache)
            assert_close(got, layer(x[:, :start + n])[:, start:], dtype=torch.float64, what=f"chunks {chunks}")
            start += n


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_decoding_equals_one_causal_forward(case, backend):
    _, Layer, H, H_kv, window = case
    layer = _layer(Layer, H, H_kv, window, backend)
    ref = _layer(Layer, H, H_kv, window, "reference")
    x = _x()
    cache = KVCache()
    with torch.no_grad():
        decoded, stored = _decode(layer, x, cache)
        whole = ref(x)  # (B,N,C): one causal forward, no cache
    assert_close(decoded, whole, dtype=torch.float32, what=f"{case[0]} on {backend}")
    assert cache.keys.shape[1] == H_kv and cache.values.shape[1] == H_kv  # the cache stores the shared heads
    assert cache.seen == N
    left = -1 if window is None else window[0]
    expected = [b if left < 0 else min(b, left) for _, b in CHUNKS]  # a rolling buffer of the last `left`
    assert stored == expected
    assert cache.start == N - len(cache)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "torch"])
def test_a_large_chunk_after_a_rolling_cache(backend):
    """A chunk longer than the window after a trimmed cache: each query still sees exactly its window."""
    layer = _layer(MultiHeadAttention, 6, 2, (2, 0), backend)
    x = _x(L=12)
    with torch.no_grad():
        decoded, stored = _decode(layer, x, KVCache(), chunks=[(0, 4), (4, 5), (5, 11), (11, 12)])
        whole = _layer(MultiHeadAttention, 6, 2, (2, 0), "reference")(x)
    assert stored == [2, 2, 2, 2]
    assert_close(decoded, whole, dtype=torch.float32, what=backend)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "torch"])
def test_non_causal_window_decoding_gives_the_rows_of_a_forward_over_the_sequence_so_far(backend):
    """Without is_causal each call's queries see the window over what has come so far (bottom-right)."""
    window = (2, 1)
    layer = _layer(MultiHeadAttention, 6, 2, window, backend, is_causal=False)
    ref = _layer(MultiHeadAttention, 6, 2, window, "reference", is_causal=False)
    x = _x()
    cache = KVCache()
    with torch.no_grad():
        for a, b in CHUNKS:
            step = layer(x[:, a:b], kv_cache=cache)  # (B,b-a,C)
            so_far = ref(x[:, :b])[:, a:b]  # the last rows of one forward over positions 0 .. b-1
            assert_close(step, so_far, dtype=torch.float32, what=f"{backend}, positions {a}..{b - 1}")
            assert len(cache) == min(b, window[0])


def test_rope_in_a_rolling_cache_rotates_by_the_absolute_position():
    """The new tokens are rotated by cache.seen.., not by len(cache): a trimmed cache keeps the positions."""
    layer = _layer(RotaryMultiHeadAttention, 4, 2, (1, 0), "reference")
    x = _x(B=1)
    cache = KVCache()
    with torch.no_grad():
        _decode(layer, x, cache, chunks=[(0, 6)])
        assert len(cache) == 1 and cache.seen == 6 and cache.start == 5
        step = layer(x[:, 6:7], kv_cache=cache)  # (1,1,C) at absolute position 6
        whole = layer(x[:, :7])[:, 6:7]
    assert_close(step, whole, dtype=torch.float32, what="position 6")


@pytest.mark.parametrize("backend", BACKENDS)
def test_key_padding_in_a_rolling_cache_covers_the_stored_and_the_new_keys(backend):
    """The mask of a call covers the keys it attends: absolute positions cache.start .. cache.seen + L - 1."""
    layer = _layer(MultiHeadAttention, 6, 2, (2, 0), backend)
    ref = _layer(MultiHeadAttention, 6, 2, (2, 0), "reference")
    lengths = [N, 4, 6]
    x = _x(B=3)
    pad = padding_mask(lengths)  # (B,1,1,N)
    cache = KVCache()
    with torch.no_grad():
        full = ref(x, mask=pad)
        outs = []
        for a, b in CHUNKS:
            outs.append(layer(x[:, a:b], mask=pad[..., cache.start:b], kv_cache=cache))  # (B,b-a,C)
        got = torch.cat(outs, dim=1)  # (B,N,C)
    for s, n in enumerate(lengths):
        assert_close(got[s, :n], full[s, :n], dtype=torch.float32, what=f"sentence {s} on {backend}")


# --- what the cache holds -----------------------------------------------------------------------------------

def test_a_windowed_cache_stays_bounded_however_long_the_decoding():
    left = 3
    layer = _layer(MultiHeadAttention, 4, 2, (left, 0), "reference")
    x = _x(B=1, L=40)
    cache = KVCache()
    with torch.no_grad():
        for t in range(40):
            layer(x[:, t:t + 1], kv_cache=cache)
            assert len(cache) == min(t + 1, left) and cache.seen == t + 1
            assert cache.numel() == 2 * 1 * 2 * len(cache) * 6  # 2·B·H_kv·stored·D
            # the cache keeps the last `left` keys, in position order (what the band's offset assumes)
            assert cache.keys.is_contiguous()
    assert repr(cache) == f"KVCache(length={left}, seen=40, keys=(1, 2, {left}, 6))"


def test_a_gqa_cache_holds_h_over_h_kv_times_fewer_numbers():
    x = _x(B=1, L=5)
    sizes = {}
    for H_kv in (4, 2, 1):
        cache = KVCache()
        with torch.no_grad():
            _layer(MultiHeadAttention, 4, H_kv, None, "reference")(x, kv_cache=cache)
        sizes[H_kv] = cache.numel()
    assert sizes[4] == 2 * sizes[2] == 4 * sizes[1] == 2 * 1 * 4 * 5 * 6


def test_append_counts_positions_seen():
    cache = KVCache()
    k1, k2 = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 2, 4)
    keys, values = cache.append(k1, k1 + 1)
    assert torch.equal(keys, k1) and torch.equal(values, k1 + 1)
    keys, values = cache.append(k2, k2 + 1)
    assert torch.equal(keys, torch.cat((k1, k2), dim=2)) and torch.equal(values, torch.cat((k1, k2), dim=2) + 1)
    assert (len(cache), cache.length, cache.seen, cache.start) == (5, 5, 5, 0)
    assert repr(cache) == "KVCache(length=5, keys=(1, 2, 5, 4))"


def _cache(S, device="cpu"):
    cache = KVCache()
    cache.append(torch.zeros(1, 1, S, 2, device=device), torch.zeros(1, 1, S, 3, device=device))
    return cache


def test_an_empty_cache_holds_nothing_and_says_so():
    assert "KVCache" in attn_lib.__all__ and attn_lib.KVCache is KVCache
    cache = KVCache()
    assert cache.keys is None and cache.values is None  # the documented "None while empty"
    assert cache.numel() == 0 and len(cache) == 0 and cache.owner is None
    assert repr(cache) == "KVCache(length=0, keys=None)"
    cache = _cache(4)
    assert cache.numel() == 1 * 1 * 4 * 2 + 1 * 1 * 4 * 3  # keys B·H·S·D plus values B·H·S·Dv
    assert repr(cache) == "KVCache(length=4, keys=(1, 1, 4, 2))"


def test_joined_leaves_the_cache_unchanged_and_store_keeps_a_copy_of_the_last_positions():
    cache = KVCache()
    k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 5)
    assert cache.joined(k, v) == (k, v)  # empty: the new keys and values themselves
    cache.append(k, v)
    k2, v2 = torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 5)
    keys, values = cache.joined(k2, v2)
    assert torch.equal(keys, torch.cat((k, k2), dim=2)) and torch.equal(values, torch.cat((v, v2), dim=2))
    assert cache.keys is k and cache.seen == 3  # nothing stored yet
    owner = torch.nn.Linear(1, 1)
    cache.store(keys, values, owner, new=2, keep=3)
    assert torch.equal(cache.keys, keys[:, :, 2:]) and torch.equal(cache.values, values[:, :, 2:])
    assert cache.keys.untyped_storage().data_ptr() != keys.untyped_storage().data_ptr()  # a copy frees the rest
    assert (cache.seen, len(cache), cache.start, cache.owner) == (5, 3, 2, owner)
    cache.store(keys, values, torch.nn.Linear(1, 1), new=0)  # keep=-1: everything; the first owner stays
    assert cache.keys is keys and cache.owner is owner


# --- failures, owners, copies -------------------------------------------------------------------------------

def test_a_failed_call_leaves_the_cache_as_it_was():
    layer, x = _causal(), _x8(2, 3)
    pad = padding_mask([3, 2])  # (B,1,1,3): the full length, wrong for a one-token step
    cache = KVCache()
    first = layer(x[:, :1], mask=pad[..., :1], kv_cache=cache)
    with pytest.raises(ValueError, match=r"mask has shape \(2, 1, 1, 3\), which does not broadcast to the scores' "
                                         r"shape \(B, H, L, S\) = \(2, 2, 1, 2\)"):
        layer(x[:, 1:2], mask=pad, kv_cache=cache)
    assert len(cache) == 1  # nothing was appended
    second = layer(x[:, 1:2], mask=pad[..., :2], kv_cache=cache)  # the retry with the right mask
    full = layer(x[:, :2], mask=pad[..., :2])
    assert_close(torch.cat([first, second], dim=1), full, dtype=torch.float64)
    assert len(cache) == 2


def test_a_call_that_fails_after_the_checks_leaves_the_cache_as_it_was():
    layer = _causal()
    cache = KVCache()
    layer(_x8(1, 2), kv_cache=cache)
    keys = cache.keys
    huge = torch.full((1, 1, 8), 1e200, dtype=torch.float64) * torch.arange(1, 9, dtype=torch.float64)
    with pytest.raises(ValueError, match="attention scores overflowed"):
        layer(huge, kv_cache=cache)
    assert len(cache) == 2 and cache.keys is keys


def test_a_failed_call_leaves_a_rolling_cache_and_its_count_as_they_were():
    layer = _layer(MultiHeadAttention, 4, 2, (2, 0), "reference")
    cache = KVCache()
    x = _x(B=1)
    with torch.no_grad():
        layer(x[:, :4], kv_cache=cache)
    keys, seen = cache.keys.clone(), cache.seen
    with pytest.raises(ValueError, match="contains nan or inf"):
        layer(torch.full((1, 1, 24), float("nan")), kv_cache=cache)
    assert cache.seen == seen and torch.equal(cache.keys, keys)
    cache.reset()
    assert (len(cache), cache.seen, cache.start) == (0, 0, 0)


def test_a_cache_refused_by_another_layer_is_unchanged_and_reset_frees_it():
    a, b, x = _causal(0), _causal(1), _x8(1, 4)
    cache = KVCache()
    a(x[:, :1], kv_cache=cache)
    assert cache.owner is a
    with pytest.raises(ValueError, match=r"kv_cache already serves another layer"):
        b(x[:, 1:2], kv_cache=cache)
    assert len(cache) == 1 and cache.owner is a
    cache.reset()  # emptied: free for another layer
    assert cache.owner is None
    assert_close(b(x[:, :1], kv_cache=cache), b(x[:, :1]), dtype=torch.float64)
    assert cache.owner is b


def test_the_owner_is_not_kept_alive_by_the_cache():
    layer, cache = _causal(), KVCache()
    layer(_x8(1, 2), kv_cache=cache)
    assert cache.owner is layer
    del layer
    gc.collect()
    assert cache.owner is None and len(cache) == 2  # the keys stay; the layer is gone


def _pickle(cache):
    return pickle.loads(pickle.dumps(cache))


def _torch_save(cache):
    buffer = io.BytesIO()
    torch.save(cache, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize("roundtrip", [_pickle, _torch_save, copy.deepcopy], ids=["pickle", "torch.save", "deepcopy"])
def test_a_used_cache_survives_a_copy_without_its_owner(roundtrip):
    layer = _causal(window_size=(3, 0))  # a rolling cache: seen (5) and len (3) differ
    other = _causal(seed=1, window_size=(3, 0))
    x = _x8(2, 6)
    cache = KVCache()
    layer(x[:, :5], kv_cache=cache)
    loaded = roundtrip(cache)
    assert cache.owner is layer and loaded.owner is None
    assert torch.equal(loaded.keys, cache.keys) and torch.equal(loaded.values, cache.values)
    assert loaded.keys is not cache.keys
    assert cache.keys.grad_fn is not None and not loaded.keys.requires_grad  # filled in grad mode: data only
    assert (loaded.seen, len(loaded), loaded.start) == (cache.seen, len(cache), cache.start) == (5, 3, 2)
    # the copy decodes on as the original does, and, owned by no layer, serves whichever layer uses it first
    assert torch.equal(layer(x[:, 5:6], kv_cache=loaded), layer(x[:, 5:6], kv_cache=cache))
    assert loaded.owner is layer
    again = roundtrip(cache)
    other(x[:, 5:6], kv_cache=again)
    assert again.owner is other
    with pytest.raises(ValueError, match=r"kv_cache already serves another layer"):
        other(x[:, 5:6], kv_cache=cache)


def test_an_empty_cache_survives_pickling():
    loaded = _pickle(KVCache())
    assert (loaded.keys, loaded.values, loaded.seen, loaded.owner) == (None, None, 0, None)


def test_restore_puts_back_what_state_recorded():
    layer = _causal(window_size=(2, 0))
    x = _x8(1, 5)
    cache = KVCache()
    empty = cache.state()
    layer(x[:, :3], kv_cache=cache)
    keys, values = cache.keys, cache.values
    before = cache.state()
    layer(x[:, 3:5], kv_cache=cache)
    assert cache.seen == 5 and not torch.equal(cache.keys, keys)
    cache.restore(before)
    assert cache.keys is keys and cache.values is values and (cache.seen, len(cache), cache.owner) == (3, 2, layer)
    assert torch.equal(layer(x[:, 3:5], kv_cache=cache), layer(x[:, 3:5], kv_cache=_replay(layer, x[:, :3])))
    cache.restore(empty)
    assert (cache.keys, cache.values, cache.seen, cache.owner) == (None, None, 0, None)
    _causal(seed=1)(x[:, :1], kv_cache=cache)  # the restored empty cache is free for another layer


def _replay(layer, prefix):
    cache = KVCache()
    layer(prefix, kv_cache=cache)
    return cache


# --- the bottom-right mask ----------------------------------------------------------------------------------

def test_attention_mask_on_an_empty_cache():
    cache = KVCache()
    assert cache.attention_mask(None, 0, True).shape == (0, 0)
    assert cache.attention_mask(None, 0, False) is None
    cache.append(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))
    assert torch.equal(cache.attention_mask(None, 2, True), causal_mask(2, 3, align="bottom-right"))
    assert torch.equal(cache.attention_mask(None, 2, True), torch.tensor([[True, True, False], [True, True, True]]))


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
