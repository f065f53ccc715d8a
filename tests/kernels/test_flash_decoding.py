"""flash_decoding (chapter 13, attn_lib.flash.decoding): the split-KV decode step against the float64 reference.

The answer key is ``attn_lib.core.reference.attention`` (float64) given a bool mask built here row by row
from the rule written out (entry b, query i sees keys 0 .. n_b - L + i), not from the code under test.
Cases: L in {1, 3}; S in {1, 17, 1000, 4099}; ragged cache_seqlens holding 0, 1 and S_max; num_splits
in {1, 2, 3, 8, more than there are key blocks}; GQA (6/2), MQA (8/1) and H_kv = H; float16 / bfloat16
within the 2x rule; merge_partials on numbers against one softmax; choose_num_splits' rule; every bad
input with its exception type and key words; the Triton backend's side of the interface (a stand-in
module records the call) and, once attn_lib.flash.triton.decode exists, the kernels themselves (interpreter).
"""
from __future__ import annotations

import importlib.util
import math
import re
import sys
import types

import pytest
import torch

import attn_lib
from attn_lib import flash_decoding, merge_partials
from attn_lib.rules.numerics import OVERFLOW_MESSAGE
from attn_lib.flash.decoding import DECODE_BLOCK_N, choose_num_splits, split_bounds
from attn_lib.costs.io_model import largest_tensor
from attn_lib.core.reference import attention
from attn_lib.tolerances import assert_close, assert_flash_rule

HAS_TRITON_DECODE = importlib.util.find_spec("triton") is not None and \
    importlib.util.find_spec("attn_lib.flash.triton.decode") is not None
D, DV = 8, 5


def _inputs(B, H, H_kv, L, S, *, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)  # (B,H,L,D)
    k = torch.randn(B, H_kv, S, D, generator=g, dtype=torch.float64)  # (B,H_kv,S,D)
    v = torch.randn(B, H_kv, S, DV, generator=g, dtype=torch.float64)  # (B,H_kv,S,Dv)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _answer_key(q, k, v, lengths):
    """float64 reference with the visible keys written out: entry b, query i sees keys 0 .. n_b - L + i."""
    B, H, L, _ = q.shape
    S = k.shape[2]
    mask = torch.zeros(B, 1, L, S, dtype=torch.bool)  # (B,1,L,S)
    for b, n in enumerate(lengths):
        for i in range(L):
            mask[b, 0, i, : max(n - L + i + 1, 0)] = True  # the last L of n positions, bottom-right
    out, _ = attention(q.double(), k.double(), v.double(), mask=mask, enable_gqa=True)
    return out  # (B,H,L,Dv); a row that sees no key: zeros


def _lengths(B, S):
    """Ragged lengths with 0, 1 and S_max (and one in between)."""
    return [0, 1, S, S // 2 + 1][:B]


def _more_than_blocks(S):
    return -(-S // DECODE_BLOCK_N) + 3


@pytest.mark.parametrize("L,S", [(1, 1), (1, 17), (3, 17), (1, 1000), (3, 1000), (1, 4099), (3, 4099)])
@pytest.mark.parametrize("splits", [1, 2, 3, 8, "more"])
def test_float64_gqa_ragged_equals_the_reference(L, S, splits):
    """(L = 3, S = 1) is refused: the L queries are the last L positions of the cache (a bad-input row)."""
    B = 4 if S > 1 else 3
    q, k, v = _inputs(B, 6, 2, L, S, seed=S + L)
    lengths = _lengths(B, S)
    num_splits = _more_than_blocks(S) if splits == "more" else splits
    out = flash_decoding(q, k, v, cache_seqlens=torch.tensor(lengths), num_splits=num_splits, enable_gqa=True,
                         backend="torch")
    assert out.shape == (B, 6, L, DV) and out.dtype == torch.float64
    assert_close(out, _answer_key(q, k, v, lengths), what=f"L={L} S={S} splits={num_splits}")
    assert bool((out[0] == 0).all())  # n = 0: zeros
    if L == 3:
        assert bool((out[1, :, :2] == 0).all()) and bool(out[1, :, 2].abs().sum() > 0)  # n = 1: only the last row sees


@pytest.mark.parametrize("H,H_kv", [(8, 1), (4, 4)], ids=["mqa", "mha"])
@pytest.mark.parametrize("L,S", [(1, 17), (3, 1000), (1, 4099)])
@pytest.mark.parametrize("splits", [None, 3])
def test_mqa_and_one_kv_head_per_query_head(H, H_kv, L, S, splits):
    q, k, v = _inputs(3, H, H_kv, L, S, seed=7)
    lengths = _lengths(3, S)
    out = flash_decoding(q, k, v, cache_seqlens=torch.tensor(lengths, dtype=torch.int32), num_splits=splits,
                         enable_gqa=H_kv != H, backend="torch")
    assert_close(out, _answer_key(q, k, v, lengths), what=f"H={H} H_kv={H_kv}")


def test_no_cache_seqlens_means_every_key_and_auto_is_torch_on_cpu():
    q, k, v = _inputs(2, 6, 2, 3, 300, seed=1)
    full = flash_decoding(q, k, v, enable_gqa=True, num_splits=2)  # backend="auto": CPU tensors -> torch
    assert_close(full, _answer_key(q, k, v, [300, 300]))
    same = flash_decoding(q, k, v, cache_seqlens=torch.tensor([300, 300]), enable_gqa=True, num_splits=2,
                          backend="torch")
    assert torch.equal(full, same)
    one_pass = flash_decoding(q, k, v, enable_gqa=True, num_splits=1)
    assert_close(full, one_pass, dtype="float64", what="splits 2 vs 1")


def test_a_cache_in_another_memory_layout():
    """flash-attn's cache layout (B, S_max, H_kv, D), seen as (B, H_kv, S_max, D): strided, read as it is."""
    q, k, v = _inputs(2, 6, 2, 3, 300, seed=9)
    ks, vs = k.transpose(1, 2).contiguous().transpose(1, 2), v.transpose(1, 2).contiguous().transpose(1, 2)
    assert not ks.is_contiguous()
    lengths = [300, 129]
    out = flash_decoding(q, ks, vs, cache_seqlens=torch.tensor(lengths), num_splits=3, enable_gqa=True)
    assert_close(out, _answer_key(q, k, v, lengths))


def test_float32_and_a_scale():
    q, k, v = _inputs(2, 6, 3, 2, 1000, seed=2, dtype=torch.float32)
    out = flash_decoding(q, k, v, cache_seqlens=torch.tensor([1000, 513]), num_splits=3, enable_gqa=True,
                         scale=0.3, backend="torch")
    mask = torch.zeros(2, 1, 2, 1000, dtype=torch.bool)
    mask[0, 0, 0, :999], mask[0, 0, 1, :], mask[1, 0, 0, :512], mask[1, 0, 1, :513] = True, True, True, True
    ref, _ = attention(q.double(), k.double(), v.double(), mask=mask, enable_gqa=True, scale=0.3)
    assert out.dtype == torch.float32
    assert_close(out, ref, dtype=torch.float32)


def _naive_low(q, k, v, lengths):
    """The naive path in the inputs' own low precision (K, V repeated: an oracle only)."""
    B, H, L, _ = q.shape
    G = H // k.shape[1]
    kr, vr = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)  # (B,H,S,D)
    s = (q @ kr.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]))  # (B,H,L,S) in the low precision
    j = torch.arange(k.shape[2])
    for b, n in enumerate(lengths):
        for i in range(L):
            s[b, :, i, j > n - L + i] = float("-inf")
    p = torch.softmax(s, -1).nan_to_num(0.0)  # rows that see no key: zeros
    return p @ vr  # (B,H,L,Dv)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("L,S,splits", [(1, 1000, 8), (3, 4099, 3), (3, 17, 2)])
def test_low_precision_within_twice_the_naive_error(dtype, L, S, splits):
    q, k, v = _inputs(4, 6, 2, L, S, seed=11)
    lengths = _lengths(4, S)
    ql, kl, vl = q.to(dtype), k.to(dtype), v.to(dtype)
    out = flash_decoding(ql, kl, vl, cache_seqlens=torch.tensor(lengths), num_splits=splits, enable_gqa=True,
                         backend="torch")
    assert out.dtype == dtype
    assert_flash_rule(out, _naive_low(ql, kl, vl, lengths), _answer_key(q, k, v, lengths), what=str(dtype))


def test_the_cache_is_read_in_place_never_repeated():
    """Nothing made is larger than K itself (its views count): the grouped layout, no repeat (4x K here)."""
    q, k, v = _inputs(1, 8, 2, 1, 1000, dtype=torch.float32)
    _, largest = largest_tensor(flash_decoding, q, k, v, enable_gqa=True, num_splits=1, backend="torch")
    assert largest <= k.numel()
    _, largest = largest_tensor(torch.nn.functional.scaled_dot_product_attention, q, k.repeat_interleave(4, 1),
                                v.repeat_interleave(4, 1))
    assert largest >= 4 * k.numel()  # the spy does see a repeated cache (here made outside, as an oracle)


# --- the merge -----------------------------------------------------------------------------------------

def test_merge_partials_equals_one_softmax_on_numbers():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 12, generator=g, dtype=torch.float64) * 3  # (R,S) scores
    V = torch.randn(12, 5, generator=g, dtype=torch.float64)  # (S,Dv)
    x[3] = float("-inf")  # a row that sees no key at all
    x[2, 5:9] = float("-inf")  # a row that sees nothing in the middle piece
    cuts = [(0, 5), (5, 9), (9, 9), (9, 12)]  # the third piece is empty
    outs, lses = [], []
    for a, b in cuts:
        piece = x[:, a:b]  # (R,n)
        lse = torch.logsumexp(piece, -1) if b > a else torch.full((4,), float("-inf"), dtype=torch.float64)
        w = torch.exp(piece - lse[:, None]).nan_to_num(0.0)  # (R,n) softmax within the piece, 0 where it sees nothing
        outs.append(w @ V[a:b])  # (R,Dv)
        lses.append(lse)
    out, lse = merge_partials(torch.stack(outs, -2), torch.stack(lses, -1))  # (R,P,Dv), (R,P) -> (R,Dv), (R,)
    want = torch.softmax(x[:3], -1) @ V  # (3,Dv): one pass over the whole row
    assert_close(out[:3], want, dtype="float64")
    assert_close(lse[:3], torch.logsumexp(x[:3], -1), dtype="float64")
    assert bool((out[3] == 0).all()) and bool(torch.isneginf(lse[3]))
    half, lse32 = merge_partials(torch.stack(outs, -2).half(), torch.stack(lses, -1).float())
    assert (half.dtype, lse32.dtype) == (torch.float16, torch.float32)
    assert_close(half[:3], want, dtype=torch.float16)


def test_merge_partials_is_differentiable():
    g = torch.Generator().manual_seed(5)
    outs = torch.randn(3, 4, 2, generator=g, dtype=torch.float64, requires_grad=True)  # (R,P,Dv)
    lses = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)  # (R,P)
    out, _ = merge_partials(outs, lses)
    direct = (torch.softmax(lses, -1)[..., None] * outs).sum(-2)  # (R,Dv): the weights are a softmax of the lses
    assert_close(out, direct, dtype="float64")
    torch.autograd.gradcheck(lambda o, l: merge_partials(o, l)[0], (outs, lses))


# --- the split count ---------------------------------------------------------------------------------------

def test_choose_num_splits_fills_the_device_with_whole_blocks():
    assert choose_num_splits(8, 16384, workers=132) == 17  # ceil(132 / 8) work items per pair
    assert choose_num_splits(256, 16384, workers=132) == 1  # enough pairs already
    assert choose_num_splits(8, 1024, workers=132) == 4  # 8 blocks, at least 2 per split
    assert choose_num_splits(8, 16384, workers=2) == 1  # a 2-thread CPU: one pass
    assert choose_num_splits(1, 300, workers=1000, min_blocks=1) == 3  # never more splits than blocks
    assert choose_num_splits(4, 100, workers=64) == choose_num_splits(4, 0, workers=64) == 1
    assert choose_num_splits(0, 4096, workers=8) == 1


@pytest.mark.parametrize("S,P", [(1, 1), (17, 8), (1000, 3), (4099, 8), (4099, 100), (256, 2)])
def test_splits_are_contiguous_whole_blocks(S, P):
    bounds = split_bounds(S, P)
    n_blocks = -(-S // DECODE_BLOCK_N)
    assert len(bounds) == min(P, n_blocks)
    assert bounds[0][0] == 0 and bounds[-1][1] == S
    assert all(a1 == b0 for (_, a1), (b0, _) in zip(bounds, bounds[1:]))
    assert all(s1 > s0 and s0 % DECODE_BLOCK_N == 0 for s0, s1 in bounds)
    sizes = [-(-(s1 - s0) // DECODE_BLOCK_N) for s0, s1 in bounds]
    assert max(sizes) - min(sizes) <= 1  # blocks shared out evenly


# --- the Triton backend ------------------------------------------------------------------------------------

def test_the_triton_backend_calls_decode_attention_with_the_interface(monkeypatch):
    """attn_lib.flash.triton.decode.decode_attention(q, k, v, seqlens, num_splits, scale): seqlens int32 (B,) on
    q's device, always given; num_splits an int; scale a float. A stand-in module records the call."""
    calls = []
    fake = types.ModuleType("attn_lib.flash.triton.decode")
    fake.decode_attention = lambda *args: calls.append(args) or torch.zeros(2, 6, 1, DV)
    monkeypatch.setitem(sys.modules, "attn_lib.flash.triton.decode", fake)
    q, k, v = _inputs(2, 6, 2, 1, 300, dtype=torch.float32)
    flash_decoding(q, k, v, enable_gqa=True, backend="triton", num_splits=2)
    flash_decoding(q, k, v, cache_seqlens=torch.tensor([3, 0]), enable_gqa=True, backend="triton")
    (q1, k1, _, lens1, splits1, scale1), (_, _, _, lens2, splits2, _) = calls
    assert q1 is q and k1 is k and scale1 == pytest.approx(1 / math.sqrt(D)) and isinstance(scale1, float)
    assert lens1.dtype == torch.int32 and lens1.tolist() == [300, 300] and splits1 == 2
    assert lens2.dtype == torch.int32 and lens2.tolist() == [3, 0] and isinstance(splits2, int) and splits2 >= 1


@pytest.mark.skipif(not HAS_TRITON_DECODE, reason="attn_lib.flash.triton.decode (branch s18-dtr) is not merged yet")
@pytest.mark.parametrize("L,S,splits", [(1, 17, 2), (3, 300, 3)])
def test_triton_kernels_equal_the_reference(L, S, splits):
    q, k, v = _inputs(3, 6, 2, L, S, seed=4)
    lengths = _lengths(3, S)
    out = flash_decoding(q.float(), k.float(), v.float(), cache_seqlens=torch.tensor(lengths), num_splits=splits,
                         enable_gqa=True, backend="triton")
    assert out.dtype == torch.float32
    assert_close(out, _answer_key(q.float(), k.float(), v.float(), lengths), dtype=torch.float32)


@pytest.mark.skipif(not HAS_TRITON_DECODE, reason="attn_lib.flash.triton.decode (branch s18-dtr) is not merged yet")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_triton_overflow_raises_the_one_message():
    q, k, v = _inputs(2, 4, 2, 1, 40, seed=9, dtype=torch.float32)
    with pytest.raises(ValueError, match=re.escape(OVERFLOW_MESSAGE)):
        flash_decoding(q, k, v, cache_seqlens=torch.tensor([40, 0]), enable_gqa=True, scale=3e38, backend="triton")


# --- bad input: every check, its exception type and its key words ---------------------------------------------

Q, K = torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 5, 4)


def _fd(q=Q, k=K, v=K, **kw):
    return lambda: flash_decoding(q, k, v, **kw)


BAD = [
    ("q a list", _fd(q=[[0.0]]), TypeError, r"^q must be a torch\.Tensor, got list"),
    ("k int", _fd(k=K.long()), TypeError, r"^k must be a floating-point tensor"),
    ("dtypes differ", _fd(v=K.double()), TypeError, r"^q, k, v must have the same dtype"),
    ("devices differ", _fd(k=K.to("meta")), ValueError, r"^q, k and v must be on one device"),
    ("q 3-D", _fd(q=Q[0]), ValueError, r"^q must be 4-D \(B, H, L, D\)"),
    ("D differs", _fd(k=torch.zeros(1, 2, 5, 3), v=torch.zeros(1, 2, 5, 3)), ValueError, r"same head dim D"),
    ("H not divisible by H_kv", _fd(q=torch.zeros(1, 6, 1, 4), k=torch.zeros(1, 4, 5, 4), v=torch.zeros(1, 4, 5, 4),
                                    enable_gqa=True), ValueError, r"^k must have a number of heads H_kv that divides"),
    ("H_kv != H without enable_gqa", _fd(q=torch.zeros(1, 4, 1, 4)), ValueError, r"pass enable_gqa=True"),
    ("enable_gqa not bool", _fd(enable_gqa=1), TypeError, r"^enable_gqa must be True or False, got 1$"),
    ("L > S_max", _fd(q=torch.zeros(1, 2, 6, 4)), ValueError,
     r"^q must have at most S_max=5 queries .* got L=6; append the new keys"),
    ("cache_seqlens a list", _fd(cache_seqlens=[5]), TypeError, r"^cache_seqlens must be a torch\.Tensor or None, got list"),
    ("cache_seqlens float", _fd(cache_seqlens=torch.tensor([5.0])), TypeError,
     r"^cache_seqlens must be an integer tensor .* got torch\.float32; convert with cache_seqlens\.to\(torch\.int32\)$"),
    ("cache_seqlens bool", _fd(cache_seqlens=torch.tensor([True])), TypeError, r"^cache_seqlens must be an integer tensor"),
    ("cache_seqlens shape", _fd(cache_seqlens=torch.tensor([[5]])), ValueError,
     r"^cache_seqlens must have shape \(B,\) = \(1,\) .* got \(1, 1\)"),
    ("cache_seqlens one per entry", _fd(cache_seqlens=torch.tensor([5, 5])), ValueError, r"got \(2,\)"),
    ("cache_seqlens on another device", _fd(cache_seqlens=torch.tensor([5], device="meta")), ValueError,
     r"^cache_seqlens must be on q's device cpu, got meta; move it with cache_seqlens\.to\(q\.device\)$"),
    ("cache_seqlens < 0", _fd(cache_seqlens=torch.tensor([-1])), ValueError,
     r"^cache_seqlens must hold lengths in 0 \.\. S_max = 5 .* got lengths from -1 to -1; clamp them"),
    ("cache_seqlens > S_max", _fd(cache_seqlens=torch.tensor([6])), ValueError, r"got lengths from 6 to 6"),
    ("num_splits 0", _fd(num_splits=0), ValueError, r"^num_splits must be a positive int, got 0$"),
    ("num_splits -2", _fd(num_splits=-2), ValueError, r"^num_splits must be a positive int, got -2$"),
    ("num_splits float", _fd(num_splits=2.0), TypeError, r"^num_splits must be a positive int, got 2\.0 \(float\)"),
    ("num_splits bool", _fd(num_splits=True), TypeError, r"^num_splits must be a positive int, got True"),
    ("scale 0", _fd(scale=0.0), ValueError, r"^scale must be finite and > 0"),
    ("scale str", _fd(scale="big"), TypeError, r"^scale must be a positive number or None"),
    ("backend unknown", _fd(backend="cuda"), ValueError, r"^backend must be one of \('auto', 'torch', 'triton'\), got 'cuda'$"),
    ("nan in k", _fd(k=torch.full((1, 2, 5, 4), float("nan"))), ValueError, r"^k contains nan or inf"),
    ("requires grad", _fd(q=Q.clone().requires_grad_()), ValueError, r"^flash_decoding is forward-only"),
    ("only v requires grad", _fd(v=K.clone().requires_grad_()), ValueError, r"^flash_decoding is forward-only"),
    ("triton float64", _fd(q=Q.double(), k=K.double(), v=K.double(), backend="triton"), TypeError,
     r"^the Triton kernel takes float16, bfloat16 or float32; for float64 use backend='torch'"),
    ("merge: outs a list", lambda: merge_partials([0.0], torch.zeros(1)), TypeError, r"^outs must be a torch\.Tensor"),
    ("merge: lses int", lambda: merge_partials(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)), TypeError,
     r"^lses must be a floating-point tensor"),
    ("merge: shapes do not fit", lambda: merge_partials(torch.zeros(2, 3, 4), torch.zeros(2, 4)), ValueError,
     r"^outs must have shape \(\.\.\., P, Dv\) with lses of shape \(\.\.\., P\), got outs \(2, 3, 4\) and lses \(2, 4\)"),
    ("merge: no split", lambda: merge_partials(torch.zeros(2, 0, 4), torch.zeros(2, 0)), ValueError,
     r"^outs must hold at least one split \(P >= 1\)"),
    ("merge: devices differ", lambda: merge_partials(torch.zeros(2, 3), torch.zeros(2, device="meta")), ValueError,
     r"^lses must be on outs' device cpu, got meta"),
    ("merge: nan in outs", lambda: merge_partials(torch.full((2, 3), float("nan")), torch.zeros(2)), ValueError,
     r"^outs contains nan or inf"),
    ("merge: +inf in lses", lambda: merge_partials(torch.zeros(2, 3), torch.tensor([0.0, float("inf")])), ValueError,
     r"^lses must be finite or -inf .* got nan or \+inf"),
    ("choose_num_splits: S < 0", lambda: choose_num_splits(8, -1), ValueError, r"^S must be an int >= 0, got -1$"),
    ("choose_num_splits: workers 0", lambda: choose_num_splits(8, 10, workers=0), ValueError,
     r"^workers must be a positive int, got 0$"),
]


@pytest.mark.parametrize("row", BAD, ids=[r[0] for r in BAD])
def test_bad_input_gives_the_one_error(row):
    _, call, exc, pattern = row
    with pytest.raises(exc, match=pattern):
        call()


def test_no_grad_mode_lets_inputs_that_require_grad_through():
    q = Q.clone().requires_grad_()
    with torch.no_grad():
        out = flash_decoding(q, K, K)
    assert out.shape == (1, 2, 1, 4) and not out.requires_grad


@pytest.mark.parametrize("seqlens", [None, torch.tensor([3])])
def test_an_overflow_raises_the_one_message(seqlens):
    q = torch.full((1, 1, 2, 1), 1e20)
    k = torch.full((1, 1, 3, 1), -1e20)  # q·k = -1e40: -inf in float32 for every key, all of them visible
    with pytest.raises(ValueError, match=re.escape(OVERFLOW_MESSAGE)):
        flash_decoding(q, k, torch.ones(1, 1, 3, 1), cache_seqlens=seqlens, scale=1.0, backend="torch")
    with pytest.raises(ValueError, match=re.escape(OVERFLOW_MESSAGE)):
        flash_decoding(q, -k, torch.ones(1, 1, 3, 1), cache_seqlens=seqlens, scale=1.0, backend="torch")  # +inf
    out = flash_decoding(q.double(), k.double(), torch.ones(1, 1, 3, 1).double(), scale=1.0)  # float64 holds it
    assert bool(torch.isfinite(out).all())


def test_empty_inputs_give_empty_or_zero_outputs():
    assert flash_decoding(torch.zeros(0, 2, 1, 4), torch.zeros(0, 2, 5, 4), torch.zeros(0, 2, 5, 3)).shape == (0, 2, 1, 3)
    assert flash_decoding(torch.zeros(1, 2, 0, 4), torch.zeros(1, 2, 0, 4), torch.zeros(1, 2, 0, 3)).shape == (1, 2, 0, 3)
    out = flash_decoding(torch.ones(2, 2, 1, 4), torch.ones(2, 2, 5, 4), torch.ones(2, 2, 5, 3),
                         cache_seqlens=torch.tensor([0, 0]))
    assert out.shape == (2, 2, 1, 3) and bool((out == 0).all())
    assert attn_lib.flash_decoding is flash_decoding
