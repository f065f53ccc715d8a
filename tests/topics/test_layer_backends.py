"""Every layer on every name of ``attn_lib.BACKENDS``: the reference layer's output and gradients,
the flags honoured, the input scanned for nan / inf once per call, KV-cache decoding equal to one
forward of the whole sequence (the one entry into the check package per call: tests/topics/test_doors.py).

The Triton rows run the kernels under Triton's interpreter without a GPU (float32: the
interpreter's low-precision dots are wrong); tolerances come from ``attn_lib.tolerances``.
"""
import importlib.util
import sys
from contextlib import contextmanager
from unittest import mock

import pytest
import torch

import attn_lib
from attn_lib import BACKENDS, KVCache, LoopedMultiHeadAttention, MultiHeadAttention, SelfAttention, padding_mask
from attn_lib.models.tiny_model import RotaryMultiHeadAttention
from attn_lib.tolerances import assert_close

from attn_paths import DISTINGUISHABLE

HAS_TRITON = importlib.util.find_spec("triton") is not None
LAYERS = [SelfAttention, MultiHeadAttention, LoopedMultiHeadAttention, RotaryMultiHeadAttention]
RUNNABLE = [b for b in BACKENDS if b != "triton" or HAS_TRITON]
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _make(Layer, backend, *, is_causal=False, check_finite=True, C=8, seed=0):
    torch.manual_seed(seed)
    extra = {} if Layer is SelfAttention else {"num_heads": 2}
    return Layer(C, **extra, is_causal=is_causal, backend=backend, check_finite=check_finite).to(DEVICE)


def _pair(Layer, backend, **kw):
    """(layer on `backend`, the same layer on "reference") with the same weights."""
    ref = _make(Layer, "reference", **kw)
    fast = _make(Layer, backend, **kw)
    fast.load_state_dict(ref.state_dict())
    return fast, ref


def _x(B=3, L=6, C=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, L, C, generator=g).to(DEVICE)  # (B,L,C) float32


def test_backends_are_one_public_tuple():
    assert attn_lib.BACKENDS == ("auto", "reference", "sdpa", "torch", "triton")
    assert "BACKENDS" in attn_lib.__all__
    assert not hasattr(attn_lib.layers.self_attention, "BACKENDS")  # one tuple, not two


@pytest.mark.parametrize("backend", RUNNABLE)
@pytest.mark.parametrize("Layer", LAYERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("is_causal", [False, True])
def test_every_layer_gives_the_reference_output_on_every_backend(Layer, backend, is_causal):
    fast, ref = _pair(Layer, backend, is_causal=is_causal)
    x = _x()
    pad = padding_mask([6, 4, 1]).to(DEVICE)  # (B,1,1,S)
    with torch.no_grad():
        assert_close(fast(x), ref(x), dtype=torch.float32, what=f"{backend}, no mask")
        assert_close(fast(x, mask=pad), ref(x, mask=pad), dtype=torch.float32, what=f"{backend}, key padding")


@pytest.mark.parametrize("backend", [b for b in RUNNABLE if b != "triton"])
@pytest.mark.parametrize("Layer", LAYERS, ids=lambda c: c.__name__)
def test_gradients_match_the_reference_on_every_backend(Layer, backend):
    fast, ref = _pair(Layer, backend, is_causal=True)
    x = _x(2, 5)
    grads = {}
    for name, layer in (("fast", fast), ("ref", ref)):
        xi = x.clone().requires_grad_()
        (layer(xi) * torch.arange(8.0, device=DEVICE)).sum().backward()
        grads[name] = [xi.grad] + [p.grad for p in layer.parameters()]
    for a, b in zip(grads["fast"], grads["ref"]):
        assert_close(a, b, dtype=torch.float32, kind="gradient", what=f"gradient on {backend}")
    assert grads["ref"][0].abs().max() > DISTINGUISHABLE  # not a comparison of zeros


@pytest.mark.parametrize("backend", RUNNABLE)
def test_need_weights_only_where_scores_exist(backend):
    layer = _make(MultiHeadAttention, backend)
    x = _x()
    if backend in ("auto", "reference"):
        out, scores = layer(x, need_weights=True)
        assert scores.shape == (3, 2, 6, 6)
        assert_close(scores.sum(-1), torch.ones(3, 2, 6, dtype=torch.float64), dtype=torch.float32,
                     what="each row of weights sums to 1")
    else:
        with pytest.raises(ValueError, match=rf"need_weights=True needs the attention scores, which "
                                             rf"backend='{backend}' never stores; build the layer with "
                                             rf"backend='reference' or 'auto'"):
            layer(x, need_weights=True)


@pytest.mark.parametrize("backend", ["torch", "triton"] if HAS_TRITON else ["torch"])
@pytest.mark.parametrize("Layer", LAYERS, ids=lambda c: c.__name__)
def test_tiled_backends_refuse_other_masks_at_the_door(Layer, backend):
    layer = _make(Layer, backend)
    causal = torch.ones(6, 6, dtype=torch.bool, device=DEVICE).tril()
    with pytest.raises(ValueError, match=rf"mask must be a bool key padding mask \(B, 1, 1, S\) or \(B, 1, S\) "
                                         rf"for backend='{backend}'.*got torch.bool of shape \(6, 6\).*'sdpa'"):
        layer(_x(), mask=causal)


# --- check_finite and the one scan at the door ----------------------------------------------------------

@contextmanager
def count_scans(numel: int):
    """Count the nan / inf scans: calls of all_finite (wherever it was imported) and torch.isfinite on
    any tensor at least as large as the input (``numel`` elements)."""
    from attn_lib import checks

    real_all_finite, real_isfinite = checks.all_finite, torch.isfinite
    calls = []

    def counted_all_finite(t):
        calls.append(("all_finite", tuple(t.shape)))
        return real_all_finite(t)

    def counted_isfinite(t, *a, **k):
        if isinstance(t, torch.Tensor) and t.numel() >= numel:
            calls.append(("isfinite", tuple(t.shape)))
        return real_isfinite(t, *a, **k)

    patches = [mock.patch.object(torch, "isfinite", counted_isfinite)]
    for name, module in list(sys.modules.items()):
        if name.startswith("attn_lib") and getattr(module, "all_finite", None) is real_all_finite:
            patches.append(mock.patch.object(module, "all_finite", counted_all_finite))
    for p in patches:
        p.start()
    try:
        yield calls
    finally:
        for p in patches:
            p.stop()


@pytest.mark.parametrize("backend", RUNNABLE)
@pytest.mark.parametrize("Layer", LAYERS, ids=lambda c: c.__name__)
def test_a_layer_call_scans_its_input_at_most_once(Layer, backend):
    layer = _make(Layer, backend, is_causal=True)
    x = _x()
    need = backend in ("auto", "reference")
    with torch.no_grad(), count_scans(x.numel()) as calls:
        layer(x, mask=padding_mask([6, 4, 1]).to(DEVICE), need_weights=need)
    assert calls == [("all_finite", tuple(x.shape))], calls
    lax = _make(Layer, backend, is_causal=True, check_finite=False)
    with torch.no_grad(), count_scans(x.numel()) as calls:
        lax(x)
    assert calls == [], calls


@pytest.mark.parametrize("backend", RUNNABLE)
@pytest.mark.parametrize("Layer", LAYERS, ids=lambda c: c.__name__)
def test_check_finite_false_is_honoured_on_every_backend(Layer, backend):
    x = _x()
    x[0, 2, 3] = float("nan")
    with pytest.raises(ValueError, match=r"contains nan or inf"):
        _make(Layer, backend)(x)
    with torch.no_grad():
        out = _make(Layer, backend, check_finite=False)(x)  # the caller turned the checks off: no error
    assert torch.isnan(out[0]).any() and not torch.isnan(out[1:]).any()


def test_the_issue_example_no_longer_raises():
    x = torch.randn(1, 3, 8)
    x[0, 0, 0] = float("nan")
    out = MultiHeadAttention(8, 2, backend="torch", check_finite=False)(x)
    assert torch.isnan(out).any()


# --- KV cache on every backend ----------------------------------------------------------------------------

CACHE_LAYERS = [MultiHeadAttention, RotaryMultiHeadAttention]


@pytest.mark.parametrize("backend", RUNNABLE)
@pytest.mark.parametrize("Layer", CACHE_LAYERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("first", [1, 4, 7], ids=["token by token", "prefill 4", "prefill all"])
def test_cache_decoding_equals_one_causal_forward_on_every_backend(Layer, backend, first):
    fast, ref = _pair(Layer, backend, is_causal=True)
    x = _x(2, 7)
    need = backend in ("auto", "reference")
    with torch.no_grad():
        full = ref(x)  # (B,N,C): one causal forward of the whole sequence on the reference path
        cache = KVCache()
        pieces = [fast(x[:, :first], kv_cache=cache)]  # a prefill of `first` tokens
        pieces += [fast(x[:, t:t + 2], kv_cache=cache, need_weights=need)[0] if need else
                   fast(x[:, t:t + 2], kv_cache=cache) for t in range(first, 7, 2)]  # chunks of 2 (the last may be 1)
    assert_close(torch.cat(pieces, dim=1), full, dtype=torch.float32, what=f"decoding on {backend}")
    assert len(cache) == 7


@pytest.mark.parametrize("backend", RUNNABLE)
def test_cache_decoding_with_key_padding_on_every_backend(backend):
    fast, ref = _pair(MultiHeadAttention, backend, is_causal=True)
    lengths = [5, 2, 4]
    x = _x(3, 5)
    pad = padding_mask(lengths).to(DEVICE)  # (B,1,1,5)
    with torch.no_grad():
        full = ref(x, mask=pad)
        cache = KVCache()
        got = torch.cat([fast(x[:, :2], mask=pad[..., :2], kv_cache=cache)]
                        + [fast(x[:, t:t + 1], mask=pad[..., :t + 1], kv_cache=cache) for t in range(2, 5)], dim=1)
    for b, n in enumerate(lengths):
        assert_close(got[b, :n], full[b, :n], dtype=torch.float32, what=f"sentence {b} on {backend}")


@pytest.mark.parametrize("backend", ["torch", "triton"] if HAS_TRITON else ["torch"])
def test_a_causal_tiled_layer_prefills_a_prompt_with_a_cache(backend):
    """Used to raise "takes only a key padding mask ... got (1, 1, 3, 3)", naming a mask nobody passed."""
    fast, ref = _pair(MultiHeadAttention, backend, is_causal=True)
    x = _x(1, 3)
    with torch.no_grad():
        assert_close(fast(x, kv_cache=KVCache()), ref(x), dtype=torch.float32, what="prefill")


# (one entry into the check package per call, on every backend, with and without a cache: tests/topics/test_doors.py)


# --- a float mask in a 16-bit layer, an empty batch ---------------------------------------------------------

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
        assert fast[1].abs().max() > DISTINGUISHABLE  # the uniform average, not zeros


@pytest.mark.parametrize("backend", ["auto", "reference", "sdpa", "torch"])
def test_an_empty_batch_gives_an_empty_output(backend):
    layer = MultiHeadAttention(8, 2, backend=backend)
    assert layer(torch.zeros(0, 3, 8)).shape == (0, 3, 8)
    if backend in ("auto", "reference"):
        out, scores = layer(torch.zeros(0, 3, 8), need_weights=True)
        assert out.shape == (0, 3, 8) and scores.shape == (0, 2, 3, 3)
