"""flash_decoding (chapter 13, ``attn_lib.flash.decoding``): the split-KV decode step on the torch backend.

The oracle is the float64 reference ``attn_lib.attention`` run entry by entry on the cache sliced to the
keys that entry attends (its ``cache_seqlens[b]`` keys, then the new keys appended after them), with
``is_causal`` aligned bottom-right (the L queries are the last L positions) or without a causal rule;
an entry with no key gives zeros. Nothing of the oracle comes from the code under test.

Cases: L in {1, 3}; S_max in {1, 17, 1000, 4099}; ragged ``cache_seqlens`` holding 0, 1 and S_max;
num_splits in {0 (auto), 1, 2, 3, 8, more than there are key blocks}; GQA (6/2), MQA (8/1) and H_kv = H;
float64, float32, float16 / bfloat16 within the 2x rule; new keys and values written in place at
``cache_seqlens`` (which is not advanced) and attended; nan in the unused tail changes nothing, nan in
the part the step reads is refused; every bad input with its exception type and key words; what the
Triton backend receives (a stand-in records it; the kernels are tested in tests/flash/triton).
"""
from __future__ import annotations

import math
import re

import pytest
import torch

import attn_lib
import attn_lib.flash.decoding as decoding
from attn_lib import flash_decoding
from attn_lib.checks.decoding import check_decode_call
from attn_lib.costs.io_model import largest_tensor
from attn_lib.device import triton_interprets
from attn_lib.flash.splits import DECODE_BLOCK_N
from attn_lib.rules.numerics import OVERFLOW_MESSAGE
from attn_lib.rules.settings import Options
from attn_lib.tolerances import assert_close, assert_flash_rule, max_abs_error

from attn_paths import DISTINGUISHABLE

D, DV = 8, 5


def inputs(B, H, H_kv, L, S, *, seed=0, dtype=torch.float64, S_new=0):
    """q (B,H,L,D), the caches (B,H_kv,S,·) and, when S_new, new keys and values (B,H_kv,S_new,·)."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, H, L, D), (B, H_kv, S, D), (B, H_kv, S, DV)] + ([(B, H_kv, S_new, D), (B, H_kv, S_new, DV)]
                                                                 if S_new else [])
    return tuple(torch.randn(*s, generator=g, dtype=torch.float64).to(dtype) for s in shapes)


def oracle(q, k_cache, v_cache, lengths, is_causal, k=None, v=None, scale=None):
    """float64, entry by entry: attention over keys 0 .. n_b - 1 of the cache followed by the new keys."""
    B, H, L, _ = q.shape
    outs = []
    for b, n in enumerate(lengths):
        keys, values = k_cache[b:b + 1, :, :n].double(), v_cache[b:b + 1, :, :n].double()  # (1,H_kv,n,·)
        if k is not None:
            keys, values = torch.cat([keys, k[b:b + 1].double()], 2), torch.cat([values, v[b:b + 1].double()], 2)
        if keys.shape[2] == 0:
            outs.append(torch.zeros(1, H, L, v_cache.shape[3], dtype=torch.float64))
            continue
        out, _ = attn_lib.attention(q[b:b + 1].double(), keys, values, is_causal=is_causal, align="bottom-right",
                                    enable_gqa=True, scale=scale)
        outs.append(out)
    return torch.cat(outs)  # (B,H,L,Dv)


def ragged(B, S):
    """Ragged lengths with 0, 1 and S_max (and one in between)."""
    return [0, 1, S, S // 2 + 1][:B]


def more_than_blocks(S):
    return -(-S // DECODE_BLOCK_N) + 3


# --- against the oracle -----------------------------------------------------------------------------------

@pytest.mark.parametrize("L,S", [(1, 1), (1, 17), (3, 17), (1, 1000), (3, 1000), (1, 4099), (3, 4099)])
@pytest.mark.parametrize("splits", [0, 1, 2, 3, 8, "more"])
@pytest.mark.parametrize("is_causal", [True, False], ids=["causal", "all-keys"])
def test_float64_gqa_ragged_equals_the_oracle(L, S, splits, is_causal):
    B = 4 if S > 1 else 3
    q, k, v = inputs(B, 6, 2, L, S, seed=S + L)
    lengths = ragged(B, S)
    num_splits = more_than_blocks(S) if splits == "more" else splits
    out = flash_decoding(q, k, v, cache_seqlens=torch.tensor(lengths), num_splits=num_splits, enable_gqa=True,
                         is_causal=is_causal, backend="torch")
    assert out.shape == (B, 6, L, DV) and out.dtype == torch.float64
    assert_close(out, oracle(q, k, v, lengths, is_causal), what=f"L={L} S={S} splits={num_splits}")
    assert not bool(out[0].any())  # n = 0: zeros
    if L == 3 and is_causal:  # n = 1: only the last query sees the key
        assert not bool(out[1, :, :2].any()) and bool(out[1, :, 2].abs().sum() > 0)
    if L == 3 and not is_causal:  # n = 1: every query sees the key, with weight 1
        assert_close(out[1], v[1, :, :1].repeat_interleave(3, 0).expand(6, 3, DV), dtype="float64")


@pytest.mark.parametrize("H,H_kv", [(8, 1), (4, 4)], ids=["mqa", "mha"])
@pytest.mark.parametrize("L,S", [(1, 17), (3, 1000), (1, 4099)])
@pytest.mark.parametrize("splits", [None, 3])
def test_mqa_and_one_kv_head_per_query_head(H, H_kv, L, S, splits):
    q, k, v = inputs(3, H, H_kv, L, S, seed=7)
    lengths = ragged(3, S)
    out = flash_decoding(q, k, v, cache_seqlens=torch.tensor(lengths, dtype=torch.int32), num_splits=splits,
                         enable_gqa=H_kv != H, is_causal=True, backend="torch")
    assert_close(out, oracle(q, k, v, lengths, True), what=f"H={H} H_kv={H_kv}")


def test_is_causal_matters_only_for_several_queries():
    q, k, v = inputs(2, 6, 2, 3, 40, seed=5)
    lengths = torch.tensor([40, 9])
    causal = flash_decoding(q, k, v, cache_seqlens=lengths, enable_gqa=True, is_causal=True)
    every_key = flash_decoding(q, k, v, cache_seqlens=lengths, enable_gqa=True)  # the default: is_causal=False
    assert_close(every_key, oracle(q, k, v, [40, 9], False))
    assert max_abs_error(causal, every_key) > DISTINGUISHABLE
    one = flash_decoding(q[:, :, -1:], k, v, cache_seqlens=lengths, enable_gqa=True, is_causal=True)
    assert torch.equal(one, flash_decoding(q[:, :, -1:], k, v, cache_seqlens=lengths, enable_gqa=True))


def test_no_cache_seqlens_means_every_key_and_auto_is_torch_on_cpu():
    q, k, v = inputs(2, 6, 2, 3, 300, seed=1)
    assert check_decode_call(q, (k, v), (None, None), Options(enable_gqa=True), triton_interprets).backend == "torch"
    full = flash_decoding(q, k, v, enable_gqa=True, num_splits=2, is_causal=True)  # backend="auto"
    assert_close(full, oracle(q, k, v, [300, 300], True))
    same = flash_decoding(q, k, v, cache_seqlens=torch.tensor([300, 300]), enable_gqa=True, num_splits=2,
                          is_causal=True, backend="torch")
    assert torch.equal(full, same)
    one_pass = flash_decoding(q, k, v, enable_gqa=True, num_splits=1, is_causal=True)
    assert_close(full, one_pass, dtype="float64", what="splits 2 vs 1")


def test_num_splits_0_and_none_both_choose_for_the_device():
    q, k, v = inputs(1, 4, 1, 1, 2000, seed=3)
    for splits in (0, None):
        options = Options(enable_gqa=True, num_splits=splits)
        assert check_decode_call(q, (k, v), (None, None), options, triton_interprets).num_splits is None
    assert torch.equal(flash_decoding(q, k, v, enable_gqa=True, num_splits=0),
                       flash_decoding(q, k, v, enable_gqa=True))


def test_a_cache_in_another_memory_layout():
    """flash-attn's cache layout (B, S_max, H_kv, D), seen as (B, H_kv, S_max, D): strided, read as it is."""
    q, k, v = inputs(2, 6, 2, 3, 300, seed=9)
    ks, vs = k.transpose(1, 2).contiguous().transpose(1, 2), v.transpose(1, 2).contiguous().transpose(1, 2)
    assert not ks.is_contiguous()
    out = flash_decoding(q, ks, vs, cache_seqlens=torch.tensor([300, 129]), num_splits=3, enable_gqa=True,
                         is_causal=True)
    assert_close(out, oracle(q, k, v, [300, 129], True))


def test_float32_and_a_scale():
    q, k, v = inputs(2, 6, 3, 2, 1000, seed=2, dtype=torch.float32)
    out = flash_decoding(q, k, v, cache_seqlens=torch.tensor([1000, 513]), num_splits=3, enable_gqa=True,
                         scale=0.3, is_causal=True, backend="torch")
    assert out.dtype == torch.float32
    assert_close(out, oracle(q, k, v, [1000, 513], True, scale=0.3), dtype=torch.float32)


def naive_low(q, k, v, lengths):
    """The naive path in the inputs' own low precision, causal bottom-right (K, V repeated: an oracle only)."""
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
    q, k, v = inputs(4, 6, 2, L, S, seed=11)
    lengths = ragged(4, S)
    ql, kl, vl = q.to(dtype), k.to(dtype), v.to(dtype)
    out = flash_decoding(ql, kl, vl, cache_seqlens=torch.tensor(lengths), num_splits=splits, enable_gqa=True,
                         is_causal=True, backend="torch")
    assert out.dtype == dtype
    assert_flash_rule(out, naive_low(ql, kl, vl, lengths), oracle(q, k, v, lengths, True), what=str(dtype))


def test_the_cache_is_read_in_place_never_repeated():
    """Nothing made is larger than K itself (its views count): the grouped layout, no repeat (4x K here)."""
    q, k, v = inputs(1, 8, 2, 1, 1000, dtype=torch.float32)
    _, largest = largest_tensor(flash_decoding, q, k, v, enable_gqa=True, num_splits=1, backend="torch")
    assert largest <= k.numel()
    _, largest = largest_tensor(torch.nn.functional.scaled_dot_product_attention, q, k.repeat_interleave(4, 1),
                                v.repeat_interleave(4, 1))
    assert largest >= 4 * k.numel()  # the spy does see a repeated cache (here made outside, as an oracle)


# --- new keys and values appended to the cache -----------------------------------------------------------------

@pytest.mark.parametrize("is_causal", [True, False], ids=["causal", "all-keys"])
@pytest.mark.parametrize("L,S_new,splits", [(1, 1, None), (3, 3, 2), (2, 4, 8), (3, 1, 1)])
def test_new_keys_are_written_at_cache_seqlens_and_attended(is_causal, L, S_new, splits):
    S = 300
    q, k_cache, v_cache, k, v = inputs(3, 6, 2, L, S, seed=L + S_new, S_new=S_new)
    lengths = [0, 7, S - S_new]  # an empty cache, a short one, one filled to the last free position
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    kc, vc = k_cache.clone(), v_cache.clone()
    out = flash_decoding(q, kc, vc, k, v, cache_seqlens=seqlens, is_causal=is_causal, enable_gqa=True,
                         num_splits=splits, backend="torch")
    assert seqlens.tolist() == lengths  # not advanced (as flash-attn): the caller adds S_new
    for b, n in enumerate(lengths):  # written in place at n .. n + S_new - 1, nothing else touched
        for cache, before, new in ((kc, k_cache, k), (vc, v_cache, v)):
            assert torch.equal(cache[b, :, n:n + S_new], new[b])
            assert torch.equal(cache[b, :, :n], before[b, :, :n]) and torch.equal(cache[b, :, n + S_new:],
                                                                                 before[b, :, n + S_new:])
    assert_close(out, oracle(q, k_cache, v_cache, lengths, is_causal, k, v))
    again = flash_decoding(q, kc, vc, cache_seqlens=seqlens + S_new, is_causal=is_causal, enable_gqa=True,
                           num_splits=splits, backend="torch")
    assert torch.equal(again, out)  # the next step reads what was written


def test_appending_twice_is_one_append_of_both():
    q, k_cache, v_cache, k, v = inputs(2, 4, 2, 1, 64, seed=4, S_new=4)
    seqlens = torch.tensor([3, 20])
    kc, vc = k_cache.clone(), v_cache.clone()
    flash_decoding(q, kc, vc, k[:, :, :2], v[:, :, :2], cache_seqlens=seqlens, enable_gqa=True)
    out = flash_decoding(q, kc, vc, k[:, :, 2:], v[:, :, 2:], cache_seqlens=seqlens + 2, enable_gqa=True)
    assert_close(out, oracle(q, k_cache, v_cache, [3, 20], False, k, v))


# --- nan and inf: only what the step reads -------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["k_cache", "v_cache", "both"])
@pytest.mark.parametrize("appended", [False, True], ids=["cache", "with-new-keys"])
def test_nan_in_the_unused_tail_changes_nothing(where, appended):
    q, k_cache, v_cache, k, v = inputs(3, 6, 2, 3, 300, seed=8, S_new=2)
    lengths = [0, 5, 290]
    clean = [t.clone() for t in (k_cache, v_cache)]
    dirty = [t.clone() for t in (k_cache, v_cache)]
    for name, cache in zip(("k_cache", "v_cache"), dirty):
        if where in (name, "both"):
            for b, n in enumerate(lengths):
                cache[b, :, n + (2 if appended else 0):] = float("nan")  # after everything the step reads
    new = (k, v) if appended else (None, None)
    kw = dict(cache_seqlens=torch.tensor(lengths), is_causal=True, enable_gqa=True, num_splits=3, backend="torch")
    want = flash_decoding(q, *clean, *new, **kw)
    got = flash_decoding(q, *dirty, *new, **kw)
    assert bool(torch.isfinite(got).all()) and torch.equal(got, want)
    assert_close(got, oracle(q, k_cache, v_cache, lengths, True, *(new if appended else ())))


@pytest.mark.parametrize("name", ["k_cache", "v_cache"])
def test_nan_in_the_part_the_step_reads_is_refused_naming_those_positions(name):
    q, k_cache, v_cache = inputs(2, 4, 2, 1, 10, seed=2)
    caches = {"k_cache": k_cache, "v_cache": v_cache}
    caches[name][1, 0, 4] = float("nan")  # entry 1 reads keys 0 .. 4
    with pytest.raises(ValueError, match=rf"^{name} contains nan or inf in the positions the step reads "
                                         r"\(keys 0 \.\. cache_seqlens\[b\] - 1; the tail after them is never read\)"):
        flash_decoding(q, k_cache, v_cache, cache_seqlens=torch.tensor([3, 5]), enable_gqa=True)
    out = flash_decoding(q, k_cache, v_cache, cache_seqlens=torch.tensor([3, 4]), enable_gqa=True)  # now in the tail
    assert bool(torch.isfinite(out).all())
    with pytest.raises(ValueError, match=rf"^{name} contains nan or inf"):  # no lengths: the whole cache is read
        flash_decoding(q, k_cache, v_cache, enable_gqa=True)


def test_nan_in_the_new_keys_is_refused_and_the_cache_left_untouched():
    q, k_cache, v_cache, k, v = inputs(1, 2, 2, 1, 8, seed=6, S_new=1)
    k[..., 0] = float("inf")
    kc = k_cache.clone()
    with pytest.raises(ValueError, match=r"^k contains nan or inf"):
        flash_decoding(q, kc, v_cache.clone(), k, v, cache_seqlens=torch.tensor([2]))
    assert torch.equal(kc, k_cache)


# --- the Triton backend's side of the interface ---------------------------------------------------------------------

class StandInKernels:
    """Stands in for attn_lib/flash/triton/decode.py: records what decode_core launches with."""

    def __init__(self):
        self.calls = []

    def launch(self, q, k, v, settings):
        self.calls.append((q, k, v, settings))
        return torch.zeros(q.shape[0], q.shape[1], q.shape[2], v.shape[3], dtype=q.dtype, device=q.device)


def test_the_triton_backend_gets_int32_lengths_and_a_resolved_split_count(monkeypatch):
    kernels = StandInKernels()
    monkeypatch.setattr(decoding, "load_kernels", lambda name: kernels if name == "decode" else None)
    q, k, v = inputs(2, 6, 2, 1, 300, dtype=torch.float32)
    for seqlens, splits in ((None, 2), (torch.tensor([3, 0]), None)):
        options = Options(enable_gqa=True, cache_seqlens=seqlens, num_splits=splits, backend="torch")
        settings = check_decode_call(q, (k, v), (None, None), options, triton_interprets)
        decoding.decode_core(q, k, v, settings.__class__(**{**settings.__dict__, "backend": "triton"}))
    (q1, k1, _, first), (_, _, _, second) = kernels.calls
    assert q1 is q and k1 is k and first.scale == pytest.approx(1 / math.sqrt(D)) and isinstance(first.scale, float)
    assert first.seqlens.dtype == torch.int32 and first.seqlens.tolist() == [300, 300] and first.num_splits == 2
    assert second.seqlens.dtype == torch.int32 and second.seqlens.tolist() == [3, 0]
    assert isinstance(second.num_splits, int) and second.num_splits >= 1 and second.backend == "triton"


# --- bad input: every check, its exception type and its key words ------------------------------------------------------

Q, K = torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 5, 4)


def fd(q=Q, k_cache=K, v_cache=K, k=None, v=None, **kw):
    return lambda: flash_decoding(q, k_cache, v_cache, k, v, **kw)


NEW = torch.zeros(1, 2, 1, 4)
BAD = [
    ("q a list", fd(q=[[0.0]]), TypeError, r"^q must be a torch\.Tensor, got list"),
    ("k_cache int", fd(k_cache=K.long()), TypeError, r"must be a floating-point tensor"),
    ("dtypes differ", fd(v_cache=K.double()), TypeError, r"must have the same dtype"),
    ("devices differ", fd(k_cache=K.to("meta")), ValueError, r"must be on one device"),
    ("q 3-D", fd(q=Q[0]), ValueError, r"^q must be 4-D \(B, H, L, D\)"),
    ("D differs", fd(k_cache=torch.zeros(1, 2, 5, 3), v_cache=torch.zeros(1, 2, 5, 3)), ValueError, r"same head dim D"),
    ("H not divisible by H_kv", fd(q=torch.zeros(1, 6, 1, 4), k_cache=torch.zeros(1, 4, 5, 4),
                                   v_cache=torch.zeros(1, 4, 5, 4), enable_gqa=True), ValueError,
     r"number of heads H_kv that divides"),
    ("H_kv != H without enable_gqa", fd(q=torch.zeros(1, 4, 1, 4)), ValueError, r"pass enable_gqa=True"),
    ("enable_gqa not bool", fd(enable_gqa=1), TypeError, r"^enable_gqa must be True or False, got 1$"),
    ("enable_gqa None", fd(enable_gqa=None), TypeError, r"^enable_gqa must be True or False, got None$"),
    ("is_causal not bool", fd(is_causal=1), TypeError, r"^is_causal must be True or False, got 1$"),
    ("L > S_max", fd(q=torch.zeros(1, 2, 6, 4)), ValueError,
     r"^q must have at most S_max=5 queries \(the L new queries are the last L positions of k_cache, v_cache\), "
     r"got L=6; use a cache with at least L positions, or split the queries into smaller steps$"),
    ("cache_seqlens a list", fd(cache_seqlens=[5]), TypeError, r"^cache_seqlens must be a torch\.Tensor or None, got list"),
    ("cache_seqlens float", fd(cache_seqlens=torch.tensor([5.0])), TypeError,
     r"^cache_seqlens must be an integer tensor .* got torch\.float32; convert with cache_seqlens\.to\(torch\.int32\)$"),
    ("cache_seqlens bool", fd(cache_seqlens=torch.tensor([True])), TypeError, r"^cache_seqlens must be an integer tensor"),
    ("cache_seqlens shape", fd(cache_seqlens=torch.tensor([[5]])), ValueError,
     r"^cache_seqlens must have shape \(B,\) = \(1,\) .* got \(1, 1\)"),
    ("cache_seqlens one per entry", fd(cache_seqlens=torch.tensor([5, 5])), ValueError, r"got \(2,\)"),
    ("cache_seqlens on another device", fd(cache_seqlens=torch.tensor([5], device="meta")), ValueError,
     r"^cache_seqlens must be on q's device cpu, got meta; move it with cache_seqlens\.to\(q\.device\)$"),
    ("cache_seqlens < 0", fd(cache_seqlens=torch.tensor([-1])), ValueError,
     r"^cache_seqlens must hold lengths in 0 \.\. 5 .* got lengths from -1 to -1; clamp them"),
    ("cache_seqlens > S_max", fd(cache_seqlens=torch.tensor([6])), ValueError, r"got lengths from 6 to 6"),
    ("num_splits -2", fd(num_splits=-2), ValueError, r"^num_splits must be an int >= 0, got -2$"),
    ("num_splits float", fd(num_splits=2.0), TypeError, r"^num_splits must be an int >= 0, got 2\.0 \(float\)"),
    ("num_splits bool", fd(num_splits=True), TypeError, r"^num_splits must be an int >= 0, got True"),
    ("scale 0", fd(scale=0.0), ValueError, r"^scale must be finite and > 0"),
    ("scale str", fd(scale="big"), TypeError, r"^scale must be a positive number or None"),
    ("backend unknown", fd(backend="cuda"), ValueError, r"^backend must be one of \('auto', 'torch', 'triton'\), got 'cuda'$"),
    ("nan in k_cache", fd(k_cache=torch.full((1, 2, 5, 4), float("nan"))), ValueError, r"^k_cache contains nan or inf"),
    ("nan in q", fd(q=torch.full((1, 2, 1, 4), float("nan"))), ValueError, r"^q contains nan or inf"),
    ("requires grad", fd(q=Q.clone().requires_grad_()), ValueError, r"^flash_decoding is forward-only"),
    ("only v_cache requires grad", fd(v_cache=K.clone().requires_grad_()), ValueError, r"^flash_decoding is forward-only"),
    ("new k requires grad", fd(k=NEW.clone().requires_grad_(), v=NEW, cache_seqlens=torch.tensor([2])), ValueError,
     r"^flash_decoding is forward-only"),
    ("triton float64", fd(q=Q.double(), k_cache=K.double(), v_cache=K.double(), backend="triton"), (TypeError, ImportError),
     r"float64 use backend='torch'|needs the triton package"),
    ("k without v", fd(k=NEW, cache_seqlens=torch.tensor([2])), ValueError,
     r"^k and v must be given together .* got only k"),
    ("v without k", fd(v=NEW, cache_seqlens=torch.tensor([2])), ValueError, r"got only v"),
    ("k and v without cache_seqlens", fd(k=NEW, v=NEW), ValueError,
     r"^cache_seqlens must be given with new k and v .* got None"),
    ("no room left for the new keys", fd(k=NEW, v=NEW, cache_seqlens=torch.tensor([5])), ValueError,
     r"^cache_seqlens must hold lengths in 0 \.\. 4 .* got lengths from 5 to 5"),
    ("new k of another head dim", fd(k=torch.zeros(1, 2, 1, 3), v=NEW, cache_seqlens=torch.tensor([2])), ValueError,
     r"^k must have shape \(B, H_kv, S_new, D\) = \(1, 2, 1, 4\) like k_cache's"),
    ("new v of another length", fd(k=NEW, v=torch.zeros(1, 2, 2, 4), cache_seqlens=torch.tensor([2])), ValueError,
     r"^v must have shape \(B, H_kv, S_new, D\) = \(1, 2, 1, 4\)"),
    ("new k 3-D", fd(k=NEW[0], v=NEW, cache_seqlens=torch.tensor([2])), ValueError, r"^k must be 4-D"),
    ("new k a list", fd(k=[0.0], v=NEW, cache_seqlens=torch.tensor([2])), TypeError, r"^k must be a torch\.Tensor"),
    ("new k float64", fd(k=NEW.double(), v=NEW, cache_seqlens=torch.tensor([2])), TypeError,
     r"^k_cache, k, v must have the same dtype"),
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
    with pytest.raises(ValueError, match=re.escape(OVERFLOW_MESSAGE) + " to -inf"):
        flash_decoding(q, k, torch.ones(1, 1, 3, 1), cache_seqlens=seqlens, scale=1.0, backend="torch")
    with pytest.raises(ValueError, match=re.escape(OVERFLOW_MESSAGE) + r" to \+inf"):
        flash_decoding(q, -k, torch.ones(1, 1, 3, 1), cache_seqlens=seqlens, scale=1.0, backend="torch")
    out = flash_decoding(q.double(), k.double(), torch.ones(1, 1, 3, 1).double(), scale=1.0)  # float64 holds it
    assert bool(torch.isfinite(out).all())


def test_empty_inputs_give_empty_or_zero_outputs():
    assert flash_decoding(torch.zeros(0, 2, 1, 4), torch.zeros(0, 2, 5, 4), torch.zeros(0, 2, 5, 3)).shape == (0, 2, 1, 3)
    assert flash_decoding(torch.zeros(1, 2, 0, 4), torch.zeros(1, 2, 0, 4), torch.zeros(1, 2, 0, 3)).shape == (1, 2, 0, 3)
    out = flash_decoding(torch.ones(2, 2, 1, 4), torch.ones(2, 2, 5, 4), torch.ones(2, 2, 5, 3),
                         cache_seqlens=torch.tensor([0, 0]))
    assert out.shape == (2, 2, 1, 3) and not bool(out.any())
    assert attn_lib.flash_decoding is flash_decoding


def test_a_step_that_raises_after_appending_puts_the_cache_slots_back():
    """The new k, v are written before the attention runs; an overflow then must not leave them behind."""
    k_cache = torch.zeros(1, 1, 4, 2)  # (B,H_kv,S_max,D)
    v_cache = torch.zeros(1, 1, 4, 2)
    k_cache[:, :, 2:] = 7.0  # slots past the length: the new keys go to slot 1, slot 2.. keep their 7
    before_k, before_v = k_cache.clone(), v_cache.clone()
    q = torch.full((1, 1, 1, 2), 1e30)  # (B,H,L,D): q·k of the new key overflows float32
    k_new, v_new = torch.full((1, 1, 1, 2), 1e30), torch.ones(1, 1, 1, 2)
    with pytest.raises(ValueError, match=re.escape(OVERFLOW_MESSAGE)):
        attn_lib.flash_decoding(q, k_cache, v_cache, k_new, v_new, cache_seqlens=torch.tensor([1]))
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache, before_v)
