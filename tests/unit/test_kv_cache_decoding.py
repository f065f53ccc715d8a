"""A layer's KV-cache decode steps go through flash_decoding's core (chapter 13, attn_lib.flash.decoding) exactly
when it computes what the layer asks for, and the decoded sequence equals one forward over the whole of it.

A spy on ``attn_lib.flash.decoding._decode_unchecked`` counts the steps that took the split-KV path: every
causal step of at most 16 queries without mask or scores, one-query steps of a non-causal layer, and a
windowed layer's one-query steps while its rolling cache holds only keys inside the window. Not: the
reference backend, a mask, need_weights, a windowed chunk, a cache longer than the window, a long
prefill, a step autograd must follow. The overflow rule (check_finite) holds on the decode path.
"""
import importlib.util
import re

import pytest
import torch

import attn_lib.flash.decoding as decoding
from attn_lib import KVCache, MultiHeadAttention
from attn_lib.rules.numerics import OVERFLOW_MESSAGE
from attn_lib.models.tiny_model import RotaryMultiHeadAttention
from attn_lib.tolerances import assert_close

HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_TRITON_DECODE = HAS_TRITON and importlib.util.find_spec("attn_lib.flash.triton.decode") is not None


@pytest.fixture
def steps(monkeypatch):
    """The calls that reached flash_decoding's core: (L, keys attended, backend)."""
    calls = []
    real = decoding._decode_unchecked

    def spy(q, k, v, **kw):
        calls.append((q.shape[2], k.shape[2], kw["backend"]))
        return real(q, k, v, **kw)

    monkeypatch.setattr(decoding, "_decode_unchecked", spy)
    return calls


def _layer(backend, *, Layer=MultiHeadAttention, H=6, H_kv=2, window=None, is_causal=True, dtype=torch.float64):
    torch.manual_seed(0)
    return Layer(24, H, num_kv_heads=H_kv, window_size=window, is_causal=is_causal, backend=backend).to(dtype)


def _x(L=9, B=2, dtype=torch.float64):
    return torch.randn(B, L, 24, generator=torch.Generator().manual_seed(1), dtype=dtype)  # (B,L,C)


def _decode(layer, x, chunks, cache=None):
    cache = KVCache() if cache is None else cache
    with torch.no_grad():
        return torch.cat([layer(x[:, a:b], kv_cache=cache) for a, b in chunks], dim=1)  # (B,N,C)


CHUNKS = [(0, 4), (4, 5), (5, 7), (7, 8), (8, 9)]  # a prefill of 4, one token, a chunk of 2, two tokens


@pytest.mark.parametrize("backend", ["auto", "sdpa", "torch"])
@pytest.mark.parametrize("Layer,H,H_kv", [(MultiHeadAttention, 6, 2), (MultiHeadAttention, 8, 1),
                                          (MultiHeadAttention, 4, 4), (RotaryMultiHeadAttention, 4, 2)],
                         ids=["gqa", "mqa", "mha", "rope-gqa"])
def test_decode_steps_go_through_flash_decoding_and_equal_one_forward(steps, backend, Layer, H, H_kv):
    layer = _layer(backend, Layer=Layer, H=H, H_kv=H_kv)
    x = _x()
    decoded = _decode(layer, x, CHUNKS)
    with torch.no_grad():
        whole = _layer("reference", Layer=Layer, H=H, H_kv=H_kv)(x)  # (B,N,C): one causal forward, no cache
    assert_close(decoded, whole, dtype="float64", what=f"{Layer.__name__} {backend}")
    assert steps == [(4, 4, "torch"), (1, 5, "torch"), (2, 7, "torch"), (1, 8, "torch"), (1, 9, "torch")]


def test_float32_steps_equal_one_forward(steps):
    layer = _layer("auto", dtype=torch.float32)
    x = _x(dtype=torch.float32)
    decoded = _decode(layer, x, CHUNKS)
    with torch.no_grad():
        assert_close(decoded, _layer("reference", dtype=torch.float32)(x), dtype=torch.float32)
    assert len(steps) == len(CHUNKS)


def test_what_flash_decoding_cannot_honour_keeps_the_layer_path(steps):
    x = _x()
    _decode(_layer("reference"), x, CHUNKS)  # the reference stays the reference
    assert steps == []
    layer, cache, x = _layer("auto"), KVCache(), _x(L=20)
    with torch.no_grad():
        layer(x[:, :17], kv_cache=cache)  # a prefill of 17 queries: a forward path
        assert steps == []
        layer(x[:, 17:18], kv_cache=cache, mask=torch.ones(18, dtype=torch.bool))  # a mask
        layer(x[:, 18:19], kv_cache=cache, need_weights=True)  # the scores
        assert steps == []
        layer(x[:, 19:20], kv_cache=cache)
    assert steps == [(1, 20, "torch")]
    train, cache = _layer("auto"), KVCache()
    train(x[:, :3], kv_cache=cache).sum().backward()  # autograd follows it: not the forward-only path
    assert steps == [(1, 20, "torch")] and train.qkv.weight.grad is not None


def test_a_non_causal_layer_decodes_one_query_at_a_time(steps):
    layer = _layer("torch", is_causal=False)
    ref = _layer("reference", is_causal=False)
    x, cache = _x(), KVCache()
    with torch.no_grad():
        for a, b in CHUNKS:
            got = layer(x[:, a:b], kv_cache=cache)
            assert_close(got, ref(x[:, :b])[:, a:b], dtype="float64", what=f"positions {a}..{b - 1}")
    assert [s[0] for s in steps] == [1, 1, 1]  # a chunk of several non-causal queries sees its later keys too


@pytest.mark.parametrize("window", [(2, 0), (3, -1), (0, 0), (20, 0)])
def test_a_windowed_layer_decodes_single_tokens_over_its_rolling_cache(steps, window):
    layer = _layer("auto", window=window)
    x = _x(L=12)
    chunks = [(0, 3)] + [(t, t + 1) for t in range(3, 12)]
    decoded = _decode(layer, x, chunks)
    with torch.no_grad():
        whole = _layer("reference", window=window)(x)
    assert_close(decoded, whole, dtype="float64", what=f"window {window}")
    left = window[0]
    # the prefill of 3 is a windowed chunk (not decoded); each single token sees exactly the cache and itself
    assert steps == [(1, min(t, left) + 1, "torch") for t in range(3, 12)]


def test_a_cache_longer_than_the_window_is_not_decoded(steps):
    """A cache filled by hand (KVCache.append keeps everything) holds keys outside the window: the band decides."""
    layer = _layer("torch", window=(2, 0))
    cache = KVCache()
    x = _x(L=6)
    with torch.no_grad():
        k = torch.randn(2, 2, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))  # (B,H_kv,5,D)
        cache.append(k, k.flip(2))
        got = layer(x[:, :1], kv_cache=cache)
        again = KVCache()
        again.append(k, k.flip(2))
        want = _layer("reference", window=(2, 0))(x[:, :1], kv_cache=again)
    assert steps == []
    assert_close(got, want, dtype="float64")


def test_the_overflow_rule_holds_on_the_decode_path(steps):
    layer = _layer("auto", dtype=torch.float32)
    with torch.no_grad():
        layer.qkv.weight.mul_(1e21)  # q·k ~ 1e42: beyond float32
    x, cache = _x(dtype=torch.float32), KVCache()
    with torch.no_grad():
        with pytest.raises(ValueError, match=re.escape(OVERFLOW_MESSAGE)):
            layer(x[:, :1], kv_cache=cache)
        assert len(cache) == 0 and cache.seen == 0  # the failed call left the cache as it was
        ref = _layer("reference", dtype=torch.float32)
        ref.load_state_dict(layer.state_dict())
        with pytest.raises(ValueError, match=re.escape(OVERFLOW_MESSAGE)):  # as the reference path does
            ref(x[:, :1], kv_cache=KVCache())
        layer.check_finite = False
        layer(x[:, :1], kv_cache=cache)  # unchecked: no reduction, no error
    assert [s[0] for s in steps] == [1, 1] and len(cache) == 1


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_a_triton_layer_decodes_with_the_triton_kernels_once_they_exist(steps):
    layer = _layer("triton", dtype=torch.float32)
    x = _x(L=5, dtype=torch.float32)
    decoded = _decode(layer, x, [(0, 4), (4, 5)])
    with torch.no_grad():
        assert_close(decoded, _layer("reference", dtype=torch.float32)(x), dtype=torch.float32)
    # without attn_lib.flash.triton.decode (branch s18-dtr) the layer keeps its Triton forward kernel
    assert steps == ([(4, 4, "triton"), (1, 5, "triton")] if HAS_TRITON_DECODE else [])


def test_which_path_a_decode_step_takes_on_each_device():
    """decode_backend's rule, CUDA included (fake CUDA tensors: only shapes, dtypes and devices are read)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from attn_lib.layers.dispatch import decode_backend

    q, k = torch.zeros(1, 4, 1, 8), torch.zeros(1, 2, 5, 8)  # one new query, 4 cached keys and its own
    with FakeTensorMode():
        gq, gk = torch.empty(1, 4, 1, 8, device="cuda"), torch.empty(1, 2, 5, 8, device="cuda")
        gq64, gk64 = gq.double(), gk.double()

    def which(q, k, backend, **kw):
        args = dict(is_causal=True, causal_offset=k.shape[2] - q.shape[2], window_size=(-1, -1), need_weights=False)
        return decode_backend(q, k, None, backend=backend, **{**args, **kw})

    assert [which(q, k, b) for b in ("auto", "sdpa", "torch", "reference")] == ["torch", "torch", "torch", None]
    assert which(q, k, "triton") == ("triton" if HAS_TRITON_DECODE else None)
    assert which(gq, gk, "torch") == "torch" and which(gq, gk, "sdpa") is None  # torch's fused CUDA kernel stays
    assert which(gq, gk, "auto") == ("triton" if HAS_TRITON_DECODE else None)
    assert which(gq64, gk64, "auto") is None  # the Triton kernels take no float64
    assert which(q, k, "auto", causal_offset=0) is None  # the queries are not the last L keys
    assert which(torch.zeros(1, 4, 17, 8), torch.zeros(1, 2, 17, 8), "auto") is None  # a prefill
    assert which(q, k, "auto", window_size=(4, 0)) == "torch"  # every stored key inside the window
    assert which(q, k, "auto", window_size=(3, 0)) is None  # key 0 lies outside it
    assert which(q, k, "auto", is_causal=False, window_size=(4, 2)) == "torch"
