"""attn_lib.layers.dispatch.attend, the one place a layer's attention is dispatched: every backend against
attn_lib.attention given the same explicit mask (float64), with causal offsets, bool and additive
masks, rows that see no key, and overflow."""
import contextlib
import math

import pytest
import torch

import attn_lib
import attn_paths
from attn_lib.layers.dispatch import BACKENDS, attend, layer_mask

F64 = attn_lib.tolerance(torch.float64)


def _qkv(B=2, H=2, L=5, S=7, D=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g, dtype=torch.float64) for n in (L, S, S)]


def _explicit(mask, L, S, is_causal, offset):
    keep = torch.ones(L, S, dtype=torch.bool).tril(offset) if is_causal else torch.ones(L, S, dtype=torch.bool)
    if mask is None:
        return keep
    return mask & keep if mask.dtype == torch.bool else mask.masked_fill(~keep, float("-inf"))


# The tiled path takes bool key padding masks only (other masks are refused at the layer's door,
# tests/contracts/test_layer_backends.py): its cases are the ones it accepts, nothing is skipped.
_MASK_CASES = [(b, kind) for b in ("auto", "reference", "sdpa", "torch")
               for kind in ("none", "padding", "additive padding", "pattern")
               if not (b == "torch" and kind in ("additive padding", "pattern"))]


@pytest.mark.parametrize("backend,kind", _MASK_CASES)
@pytest.mark.parametrize("is_causal,offset", [(False, 0), (True, 0), (True, 2), (True, -2)])
def test_attend_equals_the_reference_with_the_explicit_mask(backend, is_causal, offset, kind):
    q, k, v = _qkv()
    L, S = q.shape[2], k.shape[2]
    pad = attn_lib.padding_mask([7, 3], S)  # (B,1,1,S)
    g = torch.Generator().manual_seed(1)
    mask = {"none": None, "padding": pad, "additive padding": attn_lib.bool_to_additive(pad, torch.float64),
            "pattern": torch.rand(2, 1, L, S, generator=g) > 0.4}[kind]
    scale = 1 / math.sqrt(q.shape[-1])
    out, scores = attend(q, k, v, mask, is_causal=is_causal, causal_offset=offset, scale=scale,
                         need_weights=backend in ("auto", "reference"), backend=backend, check_finite=True)
    want, want_scores = attn_lib.attention(q, k, v, mask=_explicit(mask, L, S, is_causal, offset))
    torch.testing.assert_close(out, want, **F64)
    if backend in ("auto", "reference"):
        torch.testing.assert_close(scores, want_scores, **F64)
    else:
        assert scores is None


@pytest.mark.parametrize("backend", ["reference", "sdpa", "torch"])
def test_rows_that_see_no_key_give_zeros(backend):
    q, k, v = _qkv(L=6, S=3)
    out, _ = attend(q, k, v, None, is_causal=True, causal_offset=-3, scale=0.5, need_weights=False,
                    backend=backend, check_finite=True)  # queries 0..2 see no key
    assert (out[:, :, :3] == 0).all() and out[:, :, 3:].abs().max() > 0.01


@pytest.mark.parametrize("backend", ["reference", "sdpa", "torch"])
def test_overflow_raises_on_every_backend_unless_checks_are_off(backend):
    q, k, v = _qkv(B=1, H=1, L=2, S=2, D=2)
    q = q * 1e200
    with pytest.raises(ValueError, match="attention scores overflowed"):
        attend(q, k * 1e200, v, None, is_causal=False, scale=1.0, need_weights=False, backend=backend,
               check_finite=True)
    out, _ = attend(q, k * 1e200, v, None, is_causal=False, scale=1.0, need_weights=False, backend=backend,
                    check_finite=False)
    assert out.shape == (1, 1, 2, 2)  # no error: the caller turned the checks off


def test_auto_means_reference_with_scores_and_sdpa_without(monkeypatch):
    import attn_lib.layers.dispatch as d

    seen = []
    real_ref, real_sdpa = d._reference, d._sdpa
    monkeypatch.setattr(d, "_reference", lambda *a: seen.append("reference") or real_ref(*a))
    monkeypatch.setattr(d, "_sdpa", lambda *a: seen.append("sdpa") or real_sdpa(*a))
    q, k, v = _qkv()
    attend(q, k, v, None, is_causal=False, scale=0.5, need_weights=True, backend="auto", check_finite=True)
    attend(q, k, v, None, is_causal=False, scale=0.5, need_weights=False, backend="auto", check_finite=True)
    attend(q, k, v, None, is_causal=False, scale=0.5, need_weights=False, backend="reference", check_finite=True)
    assert seen == ["reference", "sdpa", "reference"]
    assert BACKENDS == attn_lib.BACKENDS


def test_layer_mask_gives_every_layout_its_meaning():
    B, L, S = 2, 3, 4
    assert layer_mask(None) is None
    assert layer_mask(torch.ones(S, dtype=torch.bool)).shape == (1, 1, 1, S)
    assert layer_mask(torch.ones(L, S, dtype=torch.bool)).shape == (1, 1, L, S)
    assert layer_mask(torch.ones(B, L, S, dtype=torch.bool)).shape == (B, 1, L, S)  # (B, L, S), not (H, L, S)
    assert layer_mask(torch.ones(B, 2, L, S, dtype=torch.bool)).shape == (B, 2, L, S)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "torch"])
def test_attend_honours_a_scale_that_is_not_the_default(backend):
    q, k, v = _qkv(D=4)  # default scale 0.5
    out, _ = attend(q, k, v, None, is_causal=True, scale=0.3, need_weights=False, backend=backend, check_finite=True)
    want, _ = attn_lib.attention(q, k, v, is_causal=True, scale=0.3)
    torch.testing.assert_close(out, want, **F64)
    assert (out - attn_lib.attention(q, k, v, is_causal=True)[0]).abs().max() > attn_paths.DISTINGUISHABLE


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
    out, _ = attend(q, k, v, mask, is_causal=True, scale=0.5, need_weights=False, backend=backend, check_finite=True)
    # query 0 sees key 0 only; query 1 sees key 1 (key 0 masked, key 2 in its future)
    torch.testing.assert_close(out[0, 0], v[0, 0, [0, 1]], rtol=0, atol=0)


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
            attend(q, k, v, None, is_causal=False, scale=0.5, need_weights=False, backend="sdpa", check_finite=True)


def test_a_float_mask_is_added_in_the_working_dtype_whatever_its_dtype():
    q, k, v = _qkv(B=1, L=3, S=4)
    huge = torch.full((1, 1, 3, 4), -1e300, dtype=torch.float64)  # finite in float64, -inf in float32
    huge[..., 1, :2] = 0.0  # row 1 sees keys 0 and 1; rows 0 and 2 see every key equally (-1e300 each)
    out, _ = attend(q, k, v, huge, is_causal=False, scale=0.5, need_weights=False, backend="sdpa", check_finite=True)
    want, _ = attn_lib.attention(q, k, v, mask=huge)
    torch.testing.assert_close(out, want, **F64)
    torch.testing.assert_close(out[:, :, 0], v.mean(2), **F64)  # a uniform average, not a dead row's zeros
    q32, k32, v32 = q.float(), k.float(), v.float()
    mask64 = torch.zeros(1, 1, 3, 4, dtype=torch.float64)
    mask64[..., 0] = float("-inf")
    out32, _ = attend(q32, k32, v32, mask64, is_causal=False, scale=0.5, need_weights=False, backend="sdpa",
                      check_finite=True)
    torch.testing.assert_close(out32, attn_lib.attention(q32, k32, v32, mask=mask64.float())[0],
                               **attn_lib.tolerance(torch.float32))


@pytest.mark.parametrize("backend", ["reference", "sdpa", "torch"])
def test_attend_builds_its_masks_on_the_input_device(backend):
    # Under a "meta" default device every tensor created without an explicit device lands on meta:
    # the result then differs (or the call fails). On a GPU the same slip would put a mask on the CPU.
    q, k, v = _qkv()
    pad = attn_lib.padding_mask([7, 3], 7)  # (B,1,1,S)
    want, _ = attend(q, k, v, pad, is_causal=True, causal_offset=1, scale=0.5, need_weights=False, backend=backend,
                     check_finite=True)
    with torch.device("meta"):
        out, _ = attend(q, k, v, pad, is_causal=True, causal_offset=1, scale=0.5, need_weights=False,
                        backend=backend, check_finite=True)
    assert out.device == q.device
    torch.testing.assert_close(out, want, rtol=0, atol=0)


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
        attend(q, k, v, None, is_causal=False, scale=scale, need_weights=False, backend="sdpa", check_finite=True)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_sdpa_gives_zeros_where_a_kernel_leaves_nan_in_a_row_that_sees_no_key(kind, monkeypatch):
    # torch 2.13's CPU kernels already give zeros there; other kernels and older releases leave nan
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
    out, _ = attend(q, k, v, mask, is_causal=False, scale=0.5, need_weights=False, backend="sdpa", check_finite=True)
    assert (out[:, :, 1] == 0).all()
    torch.testing.assert_close(out, attn_lib.attention(q, k, v, mask=keep)[0], **F64)


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
        attend(q, k, v, mask, is_causal=False, scale=0.5, need_weights=False, backend="sdpa", check_finite=True)


def test_the_dispatch_hands_the_gpu_kernel_name_on(monkeypatch):
    import attn_lib.flash.autograd as flash

    seen = []
    real = flash._forward_core
    monkeypatch.setattr(flash, "_forward_core", lambda backend, *a: seen.append(backend) or real(backend, *a))
    q, k, v = (x.float() for x in _qkv(B=1, H=1, L=3, S=4, D=16))
    out, _ = attend(q, k, v, None, is_causal=True, scale=0.25, need_weights=False, backend="triton", check_finite=True)
    assert seen == ["triton"]  # the interpreter ran the kernel on CPU
    torch.testing.assert_close(out, attn_lib.attention(q, k, v, is_causal=True, scale=0.25)[0],
                               **attn_lib.tolerance(torch.float32))


@pytest.mark.parametrize("L", [0, 3])
def test_the_reference_backend_returns_scores_only_when_asked(L):
    q, k, v = _qkv(B=1, H=2, L=L, S=4)
    for need in (False, True):
        _, scores = attend(q, k, v, None, is_causal=False, scale=0.5, need_weights=need, backend="reference",
                           check_finite=True)
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
        attend(q, k, v, None, is_causal=False, scale=0.5, need_weights=False, backend="sdpa", check_finite=True)
