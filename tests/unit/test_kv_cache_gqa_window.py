"""KV-cache decoding with shared key/value heads (GQA, MQA) and sliding windows.

Decoding a sequence through a ``KVCache`` in any chunks (a prefill, then pieces of 2, then single
tokens) equals one forward over the whole sequence, on every backend (Triton under its
interpreter, float32, tiny sizes), for GQA, MQA, windows and RoPE; the cache stores H_kv heads
and a windowed layer's cache stays bounded (a rolling buffer) while ``seen`` keeps counting.
"""
import importlib.util

import pytest
import torch

from attn_lib import KVCache, MultiHeadAttention
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


def test_append_counts_positions_seen():
    cache = KVCache()
    cache.append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    cache.append(torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 4))
    assert (len(cache), cache.seen, cache.start) == (5, 5, 0)
    assert repr(cache) == "KVCache(length=5, keys=(1, 2, 5, 4))"


@pytest.mark.parametrize("backend", BACKENDS)
def test_key_padding_in_a_rolling_cache_covers_the_stored_and_the_new_keys(backend):
    """The mask of a call covers the keys it attends: absolute positions cache.start .. cache.seen + L - 1."""
    from attn_lib import padding_mask

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
