"""One door per public entry: each call enters attn_lib.checks exactly once (however many checks run
behind that door, and however much work follows it), and the door returns the call's frozen settings.

The entries are counted with ``package_graph.check_entries`` (sys.setprofile: a call into attn_lib.checks
from outside it is one entry). The doors' settings are compared with flash-attn's documented rule,
written out here: query i sees key j iff ``i + offset - left <= j <= i + offset + right`` (-1: unbounded;
``is_causal`` sets right = 0), with offset 0 top-left, S - L bottom-right or with a KV cache.
"""
from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

import attn_lib
from attn_lib import BACKENDS, KVCache, LoopedMultiHeadAttention, MultiHeadAttention, SelfAttention
from attn_lib.checks import doors
from attn_lib.checks.decoding import check_decode_call
from attn_lib.checks.layers import check_layer_call, check_self_attention_call
from attn_lib.core import numpy_ref
from attn_lib.device import triton_interprets
from attn_lib.models import it_data, lm_data, tiny_lm, tiny_model
from attn_lib.rules.band import Band
from attn_lib.rules.settings import AttentionSettings, DecodeSettings, Options

from package_graph import check_entries

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="the optional triton package is not installed")


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


Q, K, V = _randn(1, 2, 3, 16), _randn(1, 2, 5, 16, seed=1), _randn(1, 2, 5, 16, seed=2)  # D = 16: Triton's tile
KEYS = torch.tensor([[True, True, False, True, True]])  # (B,S) key mask
with torch.no_grad():
    OUT_T, LSE_T = attn_lib.flash_attention_torch(Q, K, V, is_causal=True, align="bottom-right")
    OUT_TR, LSE_TR = attn_lib.flash_attention_triton(Q, K, V) if HAS_TRITON else (None, None)


def _decode_with_new_keys():
    k_cache, v_cache = K.clone(), V.clone()  # written in place: a fresh copy per call
    return attn_lib.flash_decoding(Q[:, :, :1], k_cache, v_cache, K[:, :, :2], V[:, :, :2],
                                   cache_seqlens=torch.tensor([3]), is_causal=True)


def _two_appends():
    cache = KVCache()
    cache.append(K, V)
    return lambda: cache.append(K[:, :, :1], V[:, :, :1])


FUNCTIONS = {
    "attention": lambda: attn_lib.attention(Q, K, V, is_causal=True, window_size=(1, 0), mask=KEYS[:, None, None]),
    "naive_attention": lambda: attn_lib.naive_attention(Q, K, V, is_causal=True, key_mask=KEYS),
    "flash_attention torch": lambda: attn_lib.flash_attention(Q, K, V, is_causal=True, key_mask=KEYS, backend="torch"),
    "flash_attention_torch": lambda: attn_lib.flash_attention_torch(Q, K, V, window_size=(2, 0), is_causal=True),
    "flash_attention_torch_backward": lambda: attn_lib.flash_attention_torch_backward(
        Q, K, V, OUT_T, LSE_T, torch.ones_like(OUT_T), is_causal=True, align="bottom-right"),
    "flash_decoding": lambda: attn_lib.flash_decoding(Q[:, :, :1], K, V, cache_seqlens=torch.tensor([4])),
    "flash_decoding with new keys": _decode_with_new_keys,
    "softmax": lambda: attn_lib.softmax(_randn(3, 5)),
    "naive_softmax": lambda: attn_lib.naive_softmax(_randn(3, 5)),
    "numpy_ref.softmax": lambda: numpy_ref.softmax(_randn(3, 5).numpy()),
    "online_softmax": lambda: attn_lib.online_softmax(_randn(3, 7), 3),
    "online_logsumexp": lambda: attn_lib.online_logsumexp(_randn(3, 7), [2, 5]),
    "online_max_and_sum": lambda: attn_lib.online_max_and_sum(_randn(3, 7), 2),
    "online_weighted_sum": lambda: attn_lib.online_weighted_sum(_randn(3, 7), _randn(3, 7, 2), 3),
    "online_softmax_update": lambda: attn_lib.online_softmax_update(torch.zeros(3), torch.ones(3), _randn(3, 4)),
    "merge_partials": lambda: attn_lib.merge_partials(_randn(2, 3, 4), _randn(2, 3)),
    "causal_mask": lambda: attn_lib.causal_mask(3, 5, align="bottom-right"),
    "sliding_window_mask": lambda: attn_lib.sliding_window_mask(3, 5, window_size=(1, 0), is_causal=True),
    "padding_mask": lambda: attn_lib.padding_mask([2, 3]),
    "bool_to_additive": lambda: attn_lib.bool_to_additive(KEYS),
    "additive_to_bool": lambda: attn_lib.additive_to_bool(torch.tensor([0.0, float("-inf"), 0.0])),
    "apply_rotary": lambda: attn_lib.apply_rotary(Q, [4, 5, 6]),
    "sinusoidal_positions": lambda: attn_lib.sinusoidal_positions(4, 8),
    "split_heads": lambda: attn_lib.split_heads(_randn(1, 3, 8), 2),
    "merge_heads": lambda: attn_lib.merge_heads(Q),
    "KVCache.append to an empty cache": lambda: KVCache().append(K, V),
    "KVCache.append to a full cache": _two_appends(),
}
TRITON_FUNCTIONS = {  # the kernels run under Triton's interpreter on CPU tensors
    "flash_attention triton": lambda: attn_lib.flash_attention(Q, K, V, key_mask=KEYS, backend="triton"),
    "flash_attention_triton": lambda: attn_lib.flash_attention_triton(Q, K, V, is_causal=True),
    "flash_attention_triton_backward": lambda: attn_lib.flash_attention_triton_backward(
        Q, K, V, OUT_TR, LSE_TR, torch.ones_like(OUT_TR)),
    "flash_decoding triton": lambda: attn_lib.flash_decoding(Q[:, :, :1], K, V, backend="triton"),
}


@pytest.mark.parametrize("call", [pytest.param(f, id=name) for name, f in FUNCTIONS.items()]
                         + [pytest.param(f, id=name, marks=needs_triton) for name, f in TRITON_FUNCTIONS.items()])
def test_every_functional_entry_enters_the_check_package_once(call):
    with torch.no_grad():
        call()  # warm up: lazy imports, Triton's first launch
        assert check_entries(call) == 1


def test_the_numpy_twin_enters_the_check_package_once():
    q, k, v = Q.numpy(), K.numpy(), V.numpy()
    numpy_ref.attention(q, k, v, is_causal=True)
    assert check_entries(lambda: numpy_ref.attention(q, k, v, is_causal=True)) == 1


def test_a_differentiable_call_is_checked_once_forward_and_not_again_backward():
    """flash_attention's backward reuses the settings its forward's door resolved: no second visit."""
    q = Q.clone().requires_grad_()
    out = attn_lib.flash_attention(q, K, V, is_causal=True, backend="torch")
    out.sum().backward()  # warm up
    q.grad = None
    box = {}
    assert check_entries(lambda: box.update(out=attn_lib.flash_attention(q, K, V, is_causal=True,
                                                                         backend="torch"))) == 1
    assert check_entries(lambda: box["out"].sum().backward()) == 0
    assert q.grad is not None and bool(torch.isfinite(q.grad).all())


# --- layers, every backend name, with and without need_weights and a KV cache --------------------------------

LAYERS = [SelfAttention, MultiHeadAttention, LoopedMultiHeadAttention, tiny_model.RotaryMultiHeadAttention]
CACHED = (MultiHeadAttention, tiny_model.RotaryMultiHeadAttention)  # the layers that take kv_cache=
RUNNABLE = [pytest.param(b, marks=needs_triton) if b == "triton" else b for b in BACKENDS]


def _layer(Layer, backend):
    torch.manual_seed(0)
    extra = {} if Layer is SelfAttention else {"num_heads": 2}
    return Layer(16 if Layer is SelfAttention else 32, **extra, is_causal=True, backend=backend)


@pytest.mark.parametrize("backend", RUNNABLE)
@pytest.mark.parametrize("Layer", LAYERS, ids=lambda c: c.__name__)
def test_a_layer_call_enters_the_check_package_once(Layer, backend):
    layer = _layer(Layer, backend)
    x = _randn(2, 4, layer.d_model)
    pad = attn_lib.padding_mask([4, 2])  # (B,1,1,S), made before the count
    calls = {"plain": lambda: layer(x), "key padding": lambda: layer(x, mask=pad)}
    if backend in ("auto", "reference"):
        calls["need_weights"] = lambda: layer(x, need_weights=True)
    with torch.no_grad():
        for what, call in calls.items():
            call()  # warm up
            assert check_entries(call) == 1, what


@pytest.mark.parametrize("backend", [pytest.param(b, marks=[needs_triton]) if b == "triton" else b
                                     for b in BACKENDS])
@pytest.mark.parametrize("Layer", CACHED, ids=lambda c: c.__name__)
def test_a_cached_layer_call_enters_the_check_package_once(Layer, backend):
    """A prefill, then one decode step per call (on CPU the step is flash_decoding's tiled path, behind the
    layer's own door: flash_decoding's door is not entered again)."""
    layer = _layer(Layer, backend)
    x = _randn(2, 6, layer.d_model)
    cache = KVCache()
    with torch.no_grad():
        layer(x[:, :3], kv_cache=cache)  # warm up, and a prefill
        assert check_entries(lambda: layer(x[:, 3:4], kv_cache=cache)) == 1
        assert check_entries(lambda: layer(x[:, 4:6], kv_cache=cache)) == 1
    assert len(cache) == 6


def test_a_model_call_enters_the_check_package_once():
    lm = tiny_lm.build_lm()
    ids = torch.tensor([lm_data.encode_tokens(["<bos>", "桌上", "有"])])  # (1,3)
    caches = [KVCache() for _ in lm.blocks]
    it_model = tiny_model.build_model()
    batch = it_data.encode(it_data.make_split("train", 4, seed=0))
    calls = {
        "TinyLM.forward": lambda: lm(ids),
        "TinyLM.forward with need_weights": lambda: lm(ids, need_weights=True),
        "TinyLM.forward with caches": lambda: lm(ids[:, :1], caches),
        "TinyItModel.forward": lambda: it_model(batch["ids"], batch["lengths"], batch["it_index"]),
        "generate, 5 tokens, cached": lambda: attn_lib.generate(lm, ids, 5),
        "generate, 5 tokens, no cache": lambda: attn_lib.generate(lm, ids, 5, kv_cache=False),
        "generate, sampled": lambda: attn_lib.generate(lm, ids, 3, temperature=1.0,
                                                       generator=torch.Generator().manual_seed(0)),
    }
    with torch.no_grad():
        for what, call in calls.items():
            call()  # warm up
            assert check_entries(call) == 1, what


# --- what the doors return: frozen settings, with the band of flash-attn's rule -----------------------------------

def rule_mask(L, S, *, is_causal=False, window=(-1, -1), offset=0):
    """(L, S) bool from the documented rule, one (i, j) at a time."""
    left, right = window
    right = 0 if is_causal else right
    return torch.tensor([[(left < 0 or j >= i + offset - left) and (right < 0 or j <= i + offset + right)
                          for j in range(S)] for i in range(L)], dtype=torch.bool)


def _frozen(settings):
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.scale = 1.0
    return settings


BAND_CASES = [  # (L, S, options, offset the rule uses, the band expected once normalised)
    (3, 5, dict(is_causal=True), 0, Band(None, 0)),
    (3, 5, dict(is_causal=True, align="bottom-right"), 2, Band(None, 2)),
    (5, 5, dict(is_causal=True, window_size=(1, 0)), 0, Band(-1, 0)),
    (2, 6, dict(is_causal=True, window_size=(1, 0), align="bottom-right"), 4, Band(3, 4)),
    (4, 6, dict(window_size=(1, 2)), 0, Band(-1, 2)),
    (4, 6, dict(is_causal=True, window_size=(2**64, 0)), 0, Band(None, 0)),
    (4, 6, dict(window_size=None), 0, Band(None, None)),
]


@pytest.mark.parametrize("L,S,options,offset,band", BAND_CASES)
def test_the_functional_doors_return_frozen_settings_with_the_rule_s_band(L, S, options, offset, band):
    q, k = _randn(1, 2, L, 16), _randn(1, 2, S, 16, seed=1)
    opts = Options(**options)
    results = {"attention": doors.check_attention_call(q, k, k, None, opts),
               "flash torch": doors.check_flash_call(q, k, k, dataclasses.replace(opts, backend="torch"),
                                                     triton_interprets),
               "tiled": doors.check_tiled_call(q, k, k, opts, None)}
    if HAS_TRITON:
        results["triton"] = doors.check_triton_call(q, k, k, opts, triton_interprets)
    if options.get("window_size") in (None, (-1, -1)):
        results["naive"] = doors.check_naive_call(q, k, k, opts)
    window = options.get("window_size") or (-1, -1)
    expected = rule_mask(L, S, is_causal=options.get("is_causal", False), window=window, offset=offset)
    for name, settings in results.items():
        assert isinstance(_frozen(settings), AttentionSettings), name
        assert settings.band == band, (name, settings.band)
        assert torch.equal(settings.band.mask(L, S), expected), name
        assert settings.scale == 16 ** -0.5 and settings.work_dtype == torch.float32, name
    assert results["flash torch"].backend == "torch" and results["attention"].backend == "reference"


def test_the_layer_door_aligns_a_cached_call_bottom_right():
    """Two new queries after the cached positions: offset len(cache), whatever the layer's align. The window
    (3, 0) keeps a rolling cache of the last 3 positions: S = 3 + 2 keys, offset 3."""
    layer = MultiHeadAttention(32, 2, is_causal=True, window_size=(3, 0))
    cache = KVCache()
    with torch.no_grad():
        layer(_randn(1, 4, 32), kv_cache=cache)
    assert len(cache) == 3 and cache.seen == 4
    x = _randn(1, 2, 32, seed=3)
    key, value, settings = check_layer_call(layer, x, None, None, None, False, cache, triton_interprets)
    assert key is x and value is x
    assert isinstance(_frozen(settings), AttentionSettings)
    assert torch.equal(settings.band.mask(2, 5), rule_mask(2, 5, is_causal=True, window=(3, 0), offset=3))
    assert settings.band == Band(0, 3)
    unwindowed = MultiHeadAttention(32, 2, is_causal=True, align="top-left")
    full = KVCache()
    with torch.no_grad():
        unwindowed(_randn(1, 4, 32), kv_cache=full)
    _, _, settings = check_layer_call(unwindowed, x, None, None, None, False, full, triton_interprets)
    assert torch.equal(settings.band.mask(2, 6), rule_mask(2, 6, is_causal=True, offset=4))  # not top-left
    _, _, uncached = check_layer_call(layer, x, None, None, None, False, None, triton_interprets)
    assert torch.equal(uncached.band.mask(2, 2), rule_mask(2, 2, is_causal=True, window=(3, 0)))


def test_the_layer_door_aligns_cross_attention_as_the_layer_says():
    x, memory = _randn(1, 2, 32), _randn(1, 5, 32, seed=1)
    for align, offset in (("top-left", 0), ("bottom-right", 3)):
        layer = MultiHeadAttention(32, 2, is_causal=True, align=align)
        _, _, settings = check_layer_call(layer, x, memory, None, None, False, None, triton_interprets)
        assert torch.equal(settings.band.mask(2, 5), rule_mask(2, 5, is_causal=True, offset=offset)), align
    one_head = SelfAttention(16, is_causal=True, window_size=(1, 0))
    settings = _frozen(check_self_attention_call(one_head, _randn(1, 4, 16), None, False, triton_interprets))
    assert torch.equal(settings.band.mask(4, 4), rule_mask(4, 4, is_causal=True, window=(1, 0)))


def test_the_decode_door_returns_frozen_decode_settings():
    q, k_cache = _randn(2, 2, 1, 16), _randn(2, 2, 6, 16, seed=1)
    settings = check_decode_call(q, (k_cache, k_cache), (None, None), Options(cache_seqlens=torch.tensor([3, 6])),
                                 triton_interprets)
    assert isinstance(_frozen(settings), DecodeSettings)
    assert torch.equal(settings.seqlens, torch.tensor([3, 6])) and settings.is_causal is False
    assert settings.num_splits is None and settings.backend == "torch" and settings.scale == 16 ** -0.5
    new = _randn(2, 2, 2, 16, seed=2)  # two new keys after 1 and 4 cached ones: the step reads 3 and 6
    settings = check_decode_call(q, (k_cache, k_cache), (new, new),
                                 Options(cache_seqlens=torch.tensor([1, 4]), is_causal=True, num_splits=0),
                                 triton_interprets)
    assert torch.equal(settings.seqlens, torch.tensor([3, 6])) and settings.is_causal is True
    assert settings.num_splits is None  # 0 means "choose", as None
