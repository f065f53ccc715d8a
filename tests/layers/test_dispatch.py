"""attn_lib.layers.dispatch: ``attend``, the one place a layer's attention is dispatched, and ``decode_backend``,
which KV-cache decode steps go through flash_decoding's core (chapter 13, attn_lib.flash.decoding).

``attend`` on every backend against attn_lib.attention given the same explicit mask (float64), and against
plain torch written here (K/V repeated with ``repeat_interleave`` in this file only, the band from its
definition) for shared key/value heads and windows; bottom-right alignments, bool and additive masks, rows
that see no key, overflow. Settings come from ``attn_lib.rules.settings.layer_settings``, as a layer's door
builds them. A spy on the dispatch's ``decode_core`` counts the decode steps that took the split-KV path;
the decoded sequence equals one forward over the whole of it (also under bfloat16 autocast).
"""
import contextlib
import importlib.util
import re
from types import SimpleNamespace

import pytest
import torch

import attn_lib
import attn_lib.flash.autograd as flash_autograd
import attn_lib.layers.dispatch as dispatch
from attn_lib import KVCache, MultiHeadAttention
from attn_lib.layers.dispatch import attend, decode_backend, layer_mask
from attn_lib.models.tiny_model import RotaryMultiHeadAttention
from attn_lib.rules.names import NO_WINDOW
from attn_lib.rules.numerics import OVERFLOW_MESSAGE
from attn_lib.rules.settings import DecodeSettings, layer_settings
from attn_lib.tolerances import assert_close

from attn_paths import DISTINGUISHABLE, visible_band

HAS_TRITON = importlib.util.find_spec("triton") is not None
GQA_BACKENDS = ["reference", "sdpa", "torch"] + (["triton"] if HAS_TRITON else [])


def _settings(L, S, D, dtype=torch.float64, *, is_causal=False, window=None, align="top-left", backend="reference",
              check_finite=True, scale=None, cached=False):
    """The settings a layer with these options builds for L queries and S keys of head dim D."""
    layer = SimpleNamespace(is_causal=is_causal, window_size=NO_WINDOW if window is None else tuple(window),
                            align=align, check_finite=check_finite, backend=backend)
    settings = layer_settings(layer, L, S, D, dtype, cached=cached)
    return settings if scale is None else settings.replace(scale=scale)


def _qkv(B=2, H=2, L=5, S=7, D=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g, dtype=torch.float64) for n in (L, S, S)]


def _explicit(mask, L, S, is_causal, offset):
    keep = torch.ones(L, S, dtype=torch.bool).tril(offset) if is_causal else torch.ones(L, S, dtype=torch.bool)
    if mask is None:
        return keep
    return mask & keep if mask.dtype == torch.bool else mask.masked_fill(~keep, float("-inf"))


# --- attend against the reference ---------------------------------------------------------------------------

# The tiled path takes bool key padding masks only (other masks are refused at the layer's door,
# tests/topics/test_layer_backends.py): its cases are the ones it accepts, nothing is skipped.
_MASK_CASES = [(b, kind) for b in ("auto", "reference", "sdpa", "torch")
               for kind in ("none", "padding", "additive padding", "pattern")
               if not (b == "torch" and kind in ("additive padding", "pattern"))]
# (is_causal, align, L, S): the offset is 0 top-left, S - L bottom-right (2 and -2 here)
_ALIGNED = [(False, "top-left", 5, 7), (True, "top-left", 5, 7), (True, "bottom-right", 5, 7),
            (True, "bottom-right", 7, 5)]


@pytest.mark.parametrize("backend,kind", _MASK_CASES)
@pytest.mark.parametrize("is_causal,align,L,S", _ALIGNED)
def test_attend_equals_the_reference_with_the_explicit_mask(backend, is_causal, align, L, S, kind):
    q, k, v = _qkv(L=L, S=S)
    pad = attn_lib.padding_mask([S, 3], S)  # (B,1,1,S)
    g = torch.Generator().manual_seed(1)
    mask = {"none": None, "padding": pad, "additive padding": attn_lib.bool_to_additive(pad, torch.float64),
            "pattern": torch.rand(2, 1, L, S, generator=g) > 0.4}[kind]
    need = backend in ("auto", "reference")
    settings = _settings(L, S, 4, is_causal=is_causal, align=align, backend=backend)
    out, scores = attend(q, k, v, mask, settings, need_weights=need)
    offset = S - L if align == "bottom-right" else 0
    want, want_scores = attn_lib.attention(q, k, v, mask=_explicit(mask, L, S, is_causal, offset))
    assert_close(out, want, dtype=torch.float64)
    if need:
        assert_close(scores, want_scores, dtype=torch.float64, what="scores")
    else:
        assert scores is None


@pytest.mark.parametrize("backend", ["reference", "sdpa", "torch"])
def test_rows_that_see_no_key_give_zeros(backend):
    q, k, v = _qkv(L=6, S=3)
    settings = _settings(6, 3, 4, is_causal=True, align="bottom-right", backend=backend, scale=0.5)  # offset -3
    out, _ = attend(q, k, v, None, settings)  # queries 0..2 see no key
    assert (out[:, :, :3] == 0).all() and out[:, :, 3:].abs().max() > DISTINGUISHABLE
    want, _ = attn_lib.attention(q, k, v, mask=_explicit(None, 6, 3, True, -3), scale=0.5)
    assert_close(out, want, dtype=torch.float64)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "torch"])
def test_overflow_raises_on_every_backend_unless_checks_are_off(backend):
    q, k, v = _qkv(B=1, H=1, L=2, S=2, D=2)
    q = q * 1e200
    with pytest.raises(ValueError, match="attention scores overflowed"):
        attend(q, k * 1e200, v, None, _settings(2, 2, 2, backend=backend, scale=1.0))
    out, _ = attend(q, k * 1e200, v, None, _settings(2, 2, 2, backend=backend, scale=1.0, check_finite=False))
    assert out.shape == (1, 1, 2, 2)  # no error: the caller turned the checks off


def test_auto_means_reference_with_scores_and_sdpa_without(monkeypatch):
    seen = []
    real_ref, real_sdpa = dispatch.attention_core, dispatch._sdpa
    monkeypatch.setattr(dispatch, "attention_core", lambda *a: seen.append("reference") or real_ref(*a))
    monkeypatch.setattr(dispatch, "_sdpa", lambda *a: seen.append("sdpa") or real_sdpa(*a))
    q, k, v = _qkv()
    attend(q, k, v, None, _settings(5, 7, 4, backend="auto"), need_weights=True)
    attend(q, k, v, None, _settings(5, 7, 4, backend="auto"))
    attend(q, k, v, None, _settings(5, 7, 4, backend="reference"))
    assert seen == ["reference", "sdpa", "reference"]


def test_layer_mask_gives_every_layout_its_meaning():
    B, L, S = 2, 3, 4
    assert layer_mask(None) is None
    assert layer_mask(torch.ones(S, dtype=torch.bool)).shape == (1, 1, 1, S)
    assert layer_mask(torch.ones(L, S, dtype=torch.bool)).shape == (1, 1, L, S)
    assert layer_mask(torch.ones(B, L, S, dtype=torch.bool)).shape == (B, 1, L, S)  # (B, L, S), not (H, L, S)
    assert layer_mask(torch.ones(B, 2, L, S, dtype=torch.bool)).shape == (B, 2, L, S)
    pattern = torch.rand(B, L, S, generator=torch.Generator().manual_seed(0)) > 0.5
    assert torch.equal(layer_mask(pattern)[:, 0], pattern)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "torch"])
def test_attend_honours_a_scale_that_is_not_the_default(backend):
    q, k, v = _qkv(D=4)  # default scale 0.5
    out, _ = attend(q, k, v, None, _settings(5, 7, 4, is_causal=True, backend=backend, scale=0.3))
    want, _ = attn_lib.attention(q, k, v, is_causal=True, scale=0.3)
    assert_close(out, want, dtype=torch.float64)
    assert (out - attn_lib.attention(q, k, v, is_causal=True)[0]).abs().max() > DISTINGUISHABLE


def _one_hot_qkv():
    """float32 scores near the range's edge: each query's output is the value of its best visible key."""
    q = torch.zeros(1, 1, 2, 4)
    q[..., 0] = 1.5e19
    k = torch.zeros(1, 1, 3, 4)
    k[0, 0, :, 0] = torch.tensor([1.5e19, 0.5e19, 1e19])  # q.k = 2.25e38, 0.75e38, 1.5e38: finite in float32
    v = torch.eye(3, 4)[None, None]  # (1,1,3,4): value j is the j-th unit vector
    return q, k, v


@pytest.mark.parametrize("backend", ["sdpa", "auto"])
def test_sdpa_near_the_overflow_bound_keeps_the_mask_and_the_causal_rule(backend):
    # |q.k| may reach scale * D * max|q| * max|k| = 4.5e38 > float32's max: this call takes the reference core
    q, k, v = _one_hot_qkv()
    mask = torch.tensor([[True, True, True], [False, True, True]])[None, None]  # query 1 may not see key 0
    out, _ = attend(q, k, v, mask, _settings(2, 3, 4, torch.float32, is_causal=True, backend=backend, scale=0.5))
    # query 0 sees key 0 only; query 1 sees key 1 (key 0 masked, key 2 in its future)
    assert torch.equal(out[0, 0], v[0, 0, [0, 1]])


@pytest.mark.parametrize("kernel", ["default", "math"])
def test_sdpa_raises_where_the_reference_raises(kernel):
    # q.k = 4e38 overflows float32 before the scale 0.5 brings it back in range: attention raises, and so
    # must the fused path, whichever kernel torch picks. Torch's math kernel folds the scale into q and k
    # first and would return a finite answer (1, 0, 0, 0); its default CPU kernel gives nan.
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q = torch.zeros(1, 1, 1, 4)
    q[..., 0] = 2e19
    k = torch.zeros(1, 1, 2, 4)
    k[0, 0, 0, 0] = 2e19
    v = torch.eye(2, 4)[None, None]
    with pytest.raises(ValueError, match="attention scores overflowed"):
        attn_lib.attention(q, k, v, scale=0.5)
    with pytest.raises(ValueError, match="attention scores overflowed"):
        with sdpa_kernel(SDPBackend.MATH) if kernel == "math" else contextlib.nullcontext():
            attend(q, k, v, None, _settings(1, 2, 4, torch.float32, backend="sdpa", scale=0.5))


def test_a_float_mask_is_added_in_the_working_dtype_whatever_its_dtype():
    q, k, v = _qkv(B=1, L=3, S=4)
    huge = torch.full((1, 1, 3, 4), -1e300, dtype=torch.float64)  # finite in float64, -inf in float32
    huge[..., 1, :2] = 0.0  # row 1 sees keys 0 and 1; rows 0 and 2 see every key equally (-1e300 each)
    out, _ = attend(q, k, v, huge, _settings(3, 4, 4, backend="sdpa", scale=0.5))
    want, _ = attn_lib.attention(q, k, v, mask=huge)
    assert_close(out, want, dtype=torch.float64)
    assert_close(out[:, :, 0], v.mean(2), dtype=torch.float64, what="a uniform average, not a dead row's zeros")
    q32, k32, v32 = q.float(), k.float(), v.float()
    mask64 = torch.zeros(1, 1, 3, 4, dtype=torch.float64)
    mask64[..., 0] = float("-inf")
    out32, _ = attend(q32, k32, v32, mask64, _settings(3, 4, 4, torch.float32, backend="sdpa", scale=0.5))
    assert_close(out32, attn_lib.attention(q32, k32, v32, mask=mask64.float())[0], dtype=torch.float32)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "torch"])
def test_attend_builds_its_masks_on_the_input_device(backend):
    # Under a "meta" default device every tensor created without an explicit device lands on meta:
    # the result then differs (or the call fails). On a GPU the same slip would put a mask on the CPU.
    q, k, v = _qkv(L=6)
    pad = attn_lib.padding_mask([7, 3], 7)  # (B,1,1,S)
    settings = _settings(6, 7, 4, is_causal=True, align="bottom-right", backend=backend, scale=0.5)  # offset 1
    want, _ = attend(q, k, v, pad, settings)
    with torch.device("meta"):
        out, _ = attend(q, k, v, pad, settings)
    assert out.device == q.device
    assert torch.equal(out, want)


# q.k overflows float32 in the reference's order (product, then scale) although scale * q.k fits; under
# torch's math kernel (scale folded in first) torch alone would return a finite answer: the fused path raises.
@pytest.mark.parametrize("q_value,k_value,scale", [(torch.finfo(torch.float32).max, 2.0, 0.5), (4e19, 5e19, 0.1)],
                         ids=["edge of the range", "small scale"])
def test_sdpa_raises_where_the_product_overflows_before_the_scale(q_value, k_value, scale):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.tensor([q_value]).view(1, 1, 1, 1)
    k = torch.tensor([k_value, 0.0]).view(1, 1, 2, 1)
    v = torch.eye(2).view(1, 1, 2, 2)
    with pytest.raises(ValueError, match="attention scores overflowed"):
        attn_lib.attention(q, k, v, scale=scale)
    with pytest.raises(ValueError, match="attention scores overflowed"), sdpa_kernel(SDPBackend.MATH):
        attend(q, k, v, None, _settings(1, 2, 1, torch.float32, backend="sdpa", scale=scale))


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_sdpa_gives_zeros_where_a_kernel_leaves_nan_in_a_row_that_sees_no_key(kind, monkeypatch):
    # torch's recent CPU kernels already give zeros there; other kernels and older releases leave nan
    # (emulated here): the library's rule (zeros) must not depend on which.
    real = torch.nn.functional.scaled_dot_product_attention

    def leaves_nan(q, k, v, attn_mask=None, **kw):
        out = real(q, k, v, attn_mask=attn_mask, **kw)
        blind = ~attn_mask.any(-1, keepdim=True) if attn_mask.dtype == torch.bool else \
            torch.isneginf(attn_mask).all(-1, keepdim=True)
        return out.masked_fill(blind, float("nan"))

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", leaves_nan)
    q, k, v = _qkv(B=1, H=1, L=3, S=4)
    keep = torch.tensor([[True, False, True, False], [False] * 4, [True] * 4])[None, None]  # row 1 sees no key
    mask = keep if kind == "bool" else attn_lib.bool_to_additive(keep, torch.float64)
    out, _ = attend(q, k, v, mask, _settings(3, 4, 4, backend="sdpa", scale=0.5))
    assert (out[:, :, 1] == 0).all()
    assert_close(out, attn_lib.attention(q, k, v, mask=keep)[0], dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sdpa_raises_when_an_additive_mask_pushes_a_score_to_inf(dtype):
    big = torch.finfo(dtype).max * 0.9
    q, k = torch.ones(1, 1, 2, 1, dtype=dtype), torch.ones(1, 1, 3, 1, dtype=dtype)
    v = torch.ones(1, 1, 3, 1, dtype=dtype)  # Dv = 1: the check reads one entry per output row
    mask = torch.zeros(1, 1, 2, 3, dtype=dtype)
    mask[..., 1, 2] = big
    k[..., 2, 0] = big  # score 0.5 * big (within the overflow bound), plus big: +inf, for query 1 only
    name = str(dtype).replace("torch.", "")
    with pytest.raises(ValueError, match=f"attention scores overflowed.*range of {name}"):
        attn_lib.attention(q, k, v, mask=mask, scale=0.5)
    with pytest.raises(ValueError, match=f"attention scores overflowed.*range of {name}"):
        attend(q, k, v, mask, _settings(2, 3, 1, dtype, backend="sdpa", scale=0.5))


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_the_dispatch_hands_the_triton_backend_to_the_kernels(monkeypatch):
    seen = []
    real = flash_autograd.triton_forward
    monkeypatch.setattr(flash_autograd, "triton_forward", lambda q, k, v, s: seen.append(s.backend) or real(q, k, v, s))
    q, k, v = (x.float() for x in _qkv(B=1, H=1, L=3, S=4, D=16))
    out, _ = attend(q, k, v, None, _settings(3, 4, 16, torch.float32, is_causal=True, backend="triton", scale=0.25))
    assert seen == ["triton"]  # the interpreter ran the kernel on CPU
    assert_close(out, attn_lib.attention(q, k, v, is_causal=True, scale=0.25)[0], dtype=torch.float32)


@pytest.mark.parametrize("L", [0, 3])
def test_the_reference_backend_returns_scores_only_when_asked(L):
    q, k, v = _qkv(B=1, H=2, L=L, S=4)
    for need in (False, True):
        _, scores = attend(q, k, v, None, _settings(L, 4, 4, scale=0.5), need_weights=need)
        assert (scores is None) == (not need)
        if need:
            assert scores.shape == (1, 2, L, 4)


def test_sdpa_raises_where_the_product_over_the_head_dim_overflows():
    # q.k = 4 * 1e38 overflows float32 although max|q| * max|k| = 1e38 does not: the bound counts D.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.full((1, 1, 1, 4), 1e19)
    k = torch.stack([torch.full((4,), 1e19), torch.zeros(4)])[None, None]  # (1,1,2,4)
    v = torch.eye(2, 4)[None, None]
    with pytest.raises(ValueError, match="attention scores overflowed"):
        attn_lib.attention(q, k, v, scale=0.5)
    with pytest.raises(ValueError, match="attention scores overflowed"), sdpa_kernel(SDPBackend.MATH):
        attend(q, k, v, None, _settings(1, 2, 4, torch.float32, backend="sdpa", scale=0.5))


# --- shared key/value heads and sliding windows ---------------------------------------------------------------

HEADS = [(6, 2), (8, 1), (4, 4)]
# (is_causal, window, L, S, align): top-left (offset 0) and bottom-right decoding (offset S - L)
BANDS = [
    (False, (0, 0), 7, 7, "top-left"), (True, (1, 0), 7, 7, "top-left"), (True, (5, 0), 9, 9, "top-left"),
    (False, (3, 2), 5, 9, "top-left"), (False, (-1, 4), 9, 5, "top-left"), (True, (40, 0), 7, 7, "top-left"),
    (True, (2, 0), 3, 9, "bottom-right"), (True, (-1, -1), 3, 9, "bottom-right"),
    (False, (1, 1), 2, 7, "bottom-right"),
]


def _oracle(q, k, v, pad, is_causal, window, offset, scale):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # (B,H,S,D), (B,H,S,Dv)
    L, S = q.shape[2], k.shape[2]
    ok = visible_band(L, S, is_causal, window, offset)  # (L,S)
    ok = ok & pad[:, None, None, :]  # (B,1,L,S)
    logits = (q @ k.transpose(-2, -1) * scale).masked_fill(~ok, float("-inf"))  # (B,H,L,S)
    p = torch.softmax(logits, -1).nan_to_num(0.0)  # a row that sees no key: zeros
    return p @ v, p  # (B,H,L,Dv), (B,H,L,S)


def _gqa(H, H_kv, L, S, dtype, D=5, Dv=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, L, D, generator=g, dtype=dtype)  # (B,H,L,D)
    k = torch.randn(2, H_kv, S, D, generator=g, dtype=dtype)  # (B,H_kv,S,D)
    v = torch.randn(2, H_kv, S, Dv, generator=g, dtype=dtype)  # (B,H_kv,S,Dv)
    pad = torch.ones(2, S, dtype=torch.bool)
    pad[1, S // 2:] = False  # the second sequence: the keys from S // 2 on are padding
    return q, k, v, pad


@pytest.mark.parametrize("backend", GQA_BACKENDS)
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}/{h[1]}")
@pytest.mark.parametrize("band", BANDS, ids=str)
def test_attend_with_shared_heads_and_a_window_equals_plain_torch(backend, heads, band):
    is_causal, window, L, S, align = band
    dtype = torch.float32 if backend == "triton" else torch.float64  # the interpreter: float32
    q, k, v, pad = _gqa(*heads, L, S, dtype)
    settings = _settings(L, S, 5, dtype, is_causal=is_causal, window=window, align=align, backend=backend, scale=0.4)
    out, scores = attend(q, k, v, pad[:, None, None, :], settings, need_weights=backend == "reference")
    want, p = _oracle(q, k, v, pad, is_causal, window, S - L if align == "bottom-right" else 0, 0.4)
    assert out.shape == (2, heads[0], L, 3)
    assert_close(out, want, dtype=dtype, what=f"{backend} output")
    if backend == "reference":
        assert scores.shape == (2, heads[0], L, S)
        assert_close(scores, p, dtype=dtype, what="scores")


def test_a_row_outside_every_window_gives_zeros_on_sdpa():
    """Window (0, 0) on a padded key: that query sees nothing, and the sdpa path returns zeros, not nan."""
    q, k, v, pad = _gqa(6, 2, 7, 7, torch.float64)
    out, _ = attend(q, k, v, pad[:, None, None, :], _settings(7, 7, 5, window=(0, 0), backend="sdpa", scale=0.5))
    assert torch.equal(out[1, :, 3:], torch.zeros_like(out[1, :, 3:]))  # keys 3.. of sequence 1 are padding
    assert not torch.isnan(out).any()


def test_sdpa_gets_the_shared_heads_without_a_repeat(monkeypatch):
    """The sdpa path hands k, v with H_kv heads to torch with enable_gqa=True (no repeated K/V here)."""
    import torch.nn.functional as F

    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((q.shape[1], k.shape[1], v.shape[1], kw.get("enable_gqa")))
        return real(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    q, k, v, _ = _gqa(8, 2, 5, 5, torch.float64)
    settings = _settings(5, 5, 5, is_causal=True, backend="sdpa", check_finite=False, scale=0.5)
    attend(q, k, v, None, settings)
    attend(q, q, q, None, settings)
    assert seen == [(8, 2, 2, True), (8, 8, 8, False)]


# --- decode_backend: which path a KV-cache step takes ------------------------------------------------------

def test_which_path_a_decode_step_takes_on_each_device():
    """decode_backend's rule, CUDA included (fake CUDA tensors: only shapes, dtypes and devices are read)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k = torch.zeros(1, 4, 1, 8), torch.zeros(1, 2, 5, 8)  # one new query, 4 cached keys and its own
    q2 = torch.zeros(1, 4, 2, 8)  # two new queries after 3 cached keys
    with FakeTensorMode():
        gq, gk = torch.empty(1, 4, 1, 8, device="cuda"), torch.empty(1, 2, 5, 8, device="cuda")
        gq2 = torch.empty(1, 4, 2, 8, device="cuda")
        gq64, gk64 = gq2.double(), gk.double()

    def which(q, k, backend, *, is_causal=True, window=None, cached=True, mask=None, need_weights=False):
        settings = _settings(q.shape[2], k.shape[2], 8, q.dtype, is_causal=is_causal, window=window, backend=backend,
                             cached=cached)
        return decode_backend(q, k, mask, settings, need_weights)

    # one query after its cache sees every key: no causal rule is left to apply
    assert [which(q, k, b) for b in ("auto", "sdpa", "torch", "reference")] == [("torch", False)] * 3 + [None]
    assert [which(q2, k, b) for b in ("auto", "sdpa", "torch")] == [("torch", True)] * 3
    assert which(q2, k, "triton") == (("triton", True) if HAS_TRITON else None)
    assert which(gq2, gk, "torch") == ("torch", True) and which(gq2, gk, "sdpa") is None  # torch's fused kernel stays
    assert which(gq, gk, "auto") == (("triton", False) if HAS_TRITON else None)
    assert which(gq64, gk64, "auto") is None  # the Triton kernels take no float64
    assert which(q2, k, "auto", cached=False) is None  # top-left: the queries are not the last L keys
    assert which(torch.zeros(1, 4, 17, 8), torch.zeros(1, 2, 17, 8), "auto") is None  # a prefill
    assert which(q, k, "auto", window=(4, 0)) == ("torch", False)  # every stored key inside the window
    assert which(q, k, "auto", window=(3, 0)) is None  # key 0 lies outside it
    assert which(q, k, "auto", is_causal=False, window=(4, 2)) == ("torch", False)
    assert which(q, k, "auto", mask=torch.ones(5, dtype=torch.bool)) is None  # a mask
    assert which(q, k, "auto", need_weights=True) is None  # the scores
    assert which(q.requires_grad_(), k, "auto") is None  # a step autograd must follow
    with torch.no_grad():
        assert which(q, k, "auto") == ("torch", False)  # ... unless grad mode is off


@pytest.fixture
def steps(monkeypatch):
    """The calls that reached flash_decoding's core: (L, keys attended, backend)."""
    calls = []
    real = dispatch.decode_core

    def spy(q, k, v, settings):
        calls.append((q.shape[2], k.shape[2], settings.backend))
        return real(q, k, v, settings)

    monkeypatch.setattr(dispatch, "decode_core", spy)
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


@pytest.mark.parametrize("backend", ["auto", "sdpa", "torch", "reference"])
def test_bfloat16_autocast_decodes_token_by_token_as_one_forward(backend):
    """Under CPU autocast the projections run in bfloat16, the cache holds bfloat16, attention keeps its own
    precision; decoding one token at a time equals the full forward under the same autocast."""
    layer = _layer(backend, dtype=torch.float32)
    x = _x(dtype=torch.float32)
    cache = KVCache()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        whole = layer(x)  # (B,N,C)
        decoded = torch.cat([layer(x[:, t:t + 1], kv_cache=cache) for t in range(x.shape[1])], dim=1)
    assert decoded.dtype == whole.dtype == torch.bfloat16
    assert cache.keys.dtype == cache.values.dtype == torch.bfloat16 and cache.seen == x.shape[1]
    assert_close(decoded, whole, dtype=torch.bfloat16, what=f"autocast decode on {backend}")
    with torch.no_grad():
        exact = _layer("reference", dtype=torch.float32)(x)  # float32, no autocast
    assert_close(decoded, exact, dtype=torch.bfloat16, what="against float32")


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
    # every query of a non-causal chunk sees every key: flash_decoding's rule without is_causal, for any chunk
    assert steps == [(4, 4, "torch"), (1, 5, "torch"), (2, 7, "torch"), (1, 8, "torch"), (1, 9, "torch")]


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
    # the prefill of 3 is decoded only when the window hides none of its earlier keys (left >= 2: the causal
    # rule); each single token sees exactly the rolling cache and itself
    prefill = [(3, 3, "torch")] if left >= 2 else []
    assert steps == prefill + [(1, min(t, left) + 1, "torch") for t in range(3, 12)]


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
def test_a_triton_layer_decodes_with_the_triton_kernels(steps):
    layer = _layer("triton", dtype=torch.float32)
    x = _x(L=5, dtype=torch.float32)
    decoded = _decode(layer, x, [(0, 4), (4, 5)])
    with torch.no_grad():
        assert_close(decoded, _layer("reference", dtype=torch.float32)(x), dtype=torch.float32)
    assert steps == [(4, 4, "triton"), (1, 5, "triton")]



# --- decode_backend at the edges of its rule; what a decode step hands to flash_decoding's core -------------

def _which(q, k, backend="auto", *, is_causal=True):
    settings = _settings(q.shape[2], k.shape[2], q.shape[-1], q.dtype, is_causal=is_causal, backend=backend,
                         cached=True)
    return decode_backend(q, k, None, settings, False)


def test_a_decode_step_with_no_query_entries_keeps_the_layer_path():
    assert _which(torch.zeros(0, 4, 1, 8), torch.zeros(0, 2, 5, 8)) is None  # B = 0: nothing to decode
    assert _which(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 5, 1)) == ("torch", False)  # a single number
    assert _which(torch.zeros(1, 4, 16, 8), torch.zeros(1, 2, 20, 8)) == ("torch", True)  # MAX_DECODE_QUERIES
    assert _which(torch.zeros(1, 4, 17, 8), torch.zeros(1, 2, 20, 8)) is None


def test_the_kernel_backend_without_its_package_keeps_the_layer_path(monkeypatch):
    q, k = torch.zeros(1, 4, 2, 8), torch.zeros(1, 2, 5, 8)
    monkeypatch.setattr(dispatch, "triton_available", lambda: False)
    assert _which(q, k, "triton") is None
    monkeypatch.setattr(dispatch, "triton_available", lambda: True)
    assert _which(q, k, "triton") == ("triton", True)


def test_auto_on_a_gpu_sends_head_dims_up_to_the_kernels_limit_to_them(monkeypatch):
    """Only the head dim is limited (MAX_HEAD_DIM = 256): not the number of heads, nor the cache length."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(dispatch, "triton_available", lambda: True)
    with FakeTensorMode():
        def gpu(B, H, n, D):
            return torch.empty(B, H, n, D, device="cuda")

        cases = {"D = 256": (gpu(1, 4, 1, 256), gpu(1, 2, 5, 256)),
                 "D = 257": (gpu(1, 4, 1, 257), gpu(1, 2, 5, 257)),
                 "300 heads": (gpu(1, 300, 1, 8), gpu(1, 300, 5, 8)),
                 "a cache of 300": (gpu(1, 4, 1, 8), gpu(1, 2, 300, 8))}
    got = {name: _which(q, k) for name, (q, k) in cases.items()}
    assert got == {"D = 256": ("triton", False), "D = 257": None, "300 heads": ("triton", False),
                   "a cache of 300": ("triton", False)}


def test_a_decode_step_hands_the_layer_settings_and_the_chosen_backend_to_the_core(monkeypatch):
    seen = []

    def core(q, k, v, settings):
        seen.append(settings)
        return torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)  # (B,H,L,Dv)

    monkeypatch.setattr(dispatch, "decode_core", core)
    monkeypatch.setattr(dispatch, "triton_available", lambda: True)
    q, k, v = _qkv(B=1, H=2, L=2, S=6)
    for backend, check_finite in (("triton", True), ("torch", False)):
        settings = _settings(2, 6, 4, torch.float32, is_causal=True, backend=backend, check_finite=check_finite,
                             scale=0.3, cached=True)
        out, scores = attend(q, k, v, None, settings, decode=True)
        assert out.shape == (1, 2, 2, 4) and scores is None
    assert seen == [DecodeSettings(scale=0.3, work_dtype=torch.float32, is_causal=True, check_overflow=True,
                                   backend="triton"),
                    DecodeSettings(scale=0.3, work_dtype=torch.float32, is_causal=True, check_overflow=False,
                                   backend="torch")]


def test_the_fused_path_names_the_unknown_direction_of_its_overflow():
    """A nan output row tells that a score overflowed, not in which direction: the message says ±inf."""
    big = torch.finfo(torch.float32).max * 0.9
    q, k, v = torch.ones(1, 1, 2, 1), torch.ones(1, 1, 3, 1), torch.ones(1, 1, 3, 1)
    mask = torch.zeros(1, 1, 2, 3)
    mask[..., 1, 2] = big
    k[..., 2, 0] = big  # score 0.5 * big, plus big: +inf, for query 1 only
    with pytest.raises(ValueError) as info:
        attend(q, k, v, mask, _settings(2, 3, 1, torch.float32, backend="sdpa", scale=0.5))
    assert str(info.value) == ("attention scores overflowed to ±inf (|scale·q·k| exceeds the range of float32); "
                               "compute in float64 or use a smaller scale")
