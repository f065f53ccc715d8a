"""attn_lib/flash/triton/decode.py: the FlashDecoding kernels (split + merge), through their launchers and
through ``flash_decoding(..., backend="triton")``, against the float64 reference.

Answers: ``attn_lib.attention`` in float64 with a bool mask built here by a loop from the decode rule: query i
of entry b sees key j iff ``j < n_b`` and, with ``is_causal``, ``j <= n_b - L + i`` (the L queries are the last
L positions, bottom-right); over ragged cache lengths (0, 1 and S_max among them), split counts 1, 2, 3, 8 and
more than there are key blocks, GQA 6/2, MQA 8/1 and H_kv = H. float32 meets the float32 tolerance of
``attn_lib.tolerances``; float16 and bfloat16 follow flash-attn's rule against the same formula computed in that
precision. The split kernel's partials are checked split by split, the merge kernel on numbers made here.
Without a GPU this runs under Triton's interpreter (attn_lib.device sets it once per process), so the sizes are
small; the default key block (32 under the interpreter) and 16 do not divide S.
"""
import importlib.util
import math
import os
import re
import sys
import types

import pytest
import torch

import attn_lib
from attn_lib import flash_decoding
from attn_lib.costs.io_model import largest_tensor
from attn_lib.flash import splits
from attn_lib.flash.triton import configs
from attn_lib.flash.triton.entry import load_kernels
from attn_lib.rules.numerics import OVERFLOW_MESSAGE
from attn_lib.rules.settings import DecodeSettings
from attn_lib.tolerances import assert_close, assert_flash_rule, lse_atol, max_abs_error

from attn_paths import DISTINGUISHABLE

# Do not `import triton` here: attn_lib.device decides the process's Triton mode first.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

DEVICE = torch.device(os.environ.get("ATTN_LIB_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu"))
D, DV = 12, 10  # not powers of two, D != Dv
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def dec():
    return load_kernels("decode")


def step(seqlens, num_splits, scale, causal=True, dtype=F32):
    """The DecodeSettings a launcher takes: int32 lengths on DEVICE, a resolved split count."""
    return DecodeSettings(scale=scale, work_dtype=F32, seqlens=torch.tensor(seqlens, dtype=torch.int32, device=DEVICE),
                          is_causal=causal, num_splits=num_splits, backend="triton")


def visible_by_loop(seqlens, L, S, causal=True):
    """(B, 1, L, S) bool: query i of entry b sees key j iff j < n_b (and j <= n_b - L + i if causal); not from attn_lib."""
    vis = torch.zeros(len(seqlens), 1, L, S, dtype=torch.bool)
    for b, n in enumerate(seqlens):
        for i in range(L):
            for j in range(S):
                vis[b, 0, i, j] = j < n and (not causal or j <= n - L + i)
    return vis


def make_case(B, H, H_kv, L, S, seed, d=D, dv=DV):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, d, generator=gen, dtype=torch.float64)  # (B,H,L,D)
    k = torch.randn(B, H_kv, S, d, generator=gen, dtype=torch.float64)  # (B,H_kv,S,D)
    v = torch.randn(B, H_kv, S, dv, generator=gen, dtype=torch.float64)  # (B,H_kv,S,Dv)
    return q, k, v


def plain(q, k, v, visible, scale):
    """The plain formula in q's dtype, K and V repeated over the group (in this test only)."""
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)  # (B,H_kv,S,*) -> (B,H,S,*)
    s = ((q @ k.transpose(-2, -1)) * scale).masked_fill(~visible, float("-inf"))  # (B,H,L,S)
    seen = visible.any(-1, keepdim=True)  # (B,1,L,1)
    return torch.softmax(s.masked_fill(~seen, 0.0), dim=-1).masked_fill(~seen, 0.0) @ v  # (B,H,L,Dv)


def reference(q, k, v, seqlens, scale, causal=True):
    visible = visible_by_loop(seqlens, q.shape[2], k.shape[2], causal)  # (B,1,L,S)
    return attn_lib.attention(q, k, v, mask=visible, enable_gqa=True, scale=scale)[0], visible  # (B,H,L,Dv) float64


def run_case(shape, seqlens, num_splits, dtype, block_n=None, block_m=None, scale=None, seed=0, d=D, dv=DV,
             causal=True):
    B, H, H_kv, L, S = shape
    q, k, v = make_case(B, H, H_kv, L, S, seed, d, dv)
    scale = d ** -0.5 if scale is None else scale
    ref, visible = reference(q, k, v, seqlens, scale, causal)
    ql, kl, vl = (t.to(DEVICE, dtype) for t in (q, k, v))
    out = dec().launch(ql, kl, vl, step(seqlens, num_splits, scale, causal), block_m=block_m, block_n=block_n)
    assert out.shape == (B, H, L, dv) and out.dtype == dtype and out.device == ql.device
    out = out.cpu()
    empty = ~visible.any(-1)[:, 0]  # (B,L) rows that see no key
    assert torch.equal(out.permute(0, 2, 1, 3)[empty], torch.zeros(int(empty.sum()), H, dv, dtype=dtype))
    what = f"decode {shape} {seqlens} P={num_splits} causal={causal}"
    if dtype == F32:
        assert_close(out, ref, what=what)
    else:
        assert_flash_rule(out, plain(*(t.to(dtype) for t in (q, k, v)), visible, scale), ref, what=f"{what} {dtype}")
    return out, ref


CASES = [  # (B, H, H_kv, L, S), seqlens, num_splits, dtype, block_n
    ((1, 2, 2, 1, 1), [1], 1, F32, None),  # S = 1
    ((1, 2, 2, 3, 1), [1], 2, F32, None),  # L > n_b: causal rows 0 and 1 see no key
    ((3, 6, 2, 1, 17), [0, 1, 17], 2, F32, None),  # GQA 6/2, ragged with 0, 1 and S_max
    ((3, 6, 2, 3, 17), [2, 17, 0], 3, F32, 16),  # n_b < L: the first causal row of entry 0 sees nothing
    ((2, 8, 1, 3, 300), [300, 1], 8, F32, None),  # MQA 8/1
    ((2, 3, 3, 1, 1000), [1000, 513], 8, F32, None),  # H_kv = H
    ((2, 2, 2, 3, 300), [300, 0], 12, F32, None),  # 12 splits > 10 key blocks
    ((2, 6, 2, 3, 1000), [1, 1000], 3, F16, None),
    ((2, 8, 1, 1, 300), [300, 17], 2, BF16, None),  # bf16: every tl.dot in fp32 under the interpreter
    ((2, 6, 2, 3, 300), [0, 300], 1, BF16, 16),
    ((2, 4, 2, 3, 17), [17, 5], 8, F16, 16),  # 8 splits > 2 key blocks
    ((1, 8, 1, 1, 1000), [999], 1, F16, None),
]


def _ids(c):
    return "x".join(map(str, c)) if isinstance(c, (tuple, list)) else str(c).replace("torch.", "")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "every_key"])
@pytest.mark.parametrize("shape,seqlens,num_splits,dtype,block_n", CASES, ids=_ids)
def test_decode_matches_the_reference(shape, seqlens, num_splits, dtype, block_n, causal):
    run_case(shape, seqlens, num_splits, dtype, block_n, causal=causal)


def test_causal_and_not_differ_only_for_several_queries():
    one_q = [run_case((2, 4, 2, 1, 40), [40, 9], 3, F32, block_n=16, causal=c)[0] for c in (True, False)]
    assert torch.equal(one_q[0], one_q[1])  # L = 1: the one query is the last position, it sees every key
    three = [run_case((2, 4, 2, 3, 40), [40, 9], 3, F32, block_n=16, causal=c)[0] for c in (True, False)]
    assert max_abs_error(three[0], three[1]) > DISTINGUISHABLE
    assert torch.equal(three[0][:, :, -1], three[1][:, :, -1])  # the last query sees every key either way


def test_more_rows_than_one_query_block_and_a_given_scale():
    # MQA 8/1 with L = 3: 24 rows of one key/value head, cut into two row blocks of 16; head dims 64.
    run_case((2, 8, 1, 3, 70), [70, 33], 3, F32, block_m=16, block_n=16, scale=0.3, d=64, dv=64)


def test_every_split_count_gives_the_same_output():
    # The merge is exact: 1, 2, 3 and 8 splits (8 > 7 key blocks) agree with each other to float32 rounding.
    outs = [run_case((2, 6, 2, 3, 100), [100, 50], p, F32, block_n=16, seed=4)[0] for p in (1, 2, 3, 8)]
    for out in outs[1:]:
        assert_close(out, outs[0], what="split counts")


def split_reference(q, k, v, visible, scale, keys_per_split, num_splits):
    """Per split p (keys p*c .. (p+1)*c - 1): its lse (-inf when empty) and its output normalised within it."""
    G = q.shape[1] // k.shape[1]
    s = (q @ k.repeat_interleave(G, 1).transpose(-2, -1)) * scale  # (B,H,L,S)
    s = s.masked_fill(~visible, float("-inf"))
    outs, lses = [], []
    for p in range(num_splits):
        part = s[..., p * keys_per_split:(p + 1) * keys_per_split]  # (B,H,L,c)
        lse = torch.logsumexp(part, -1) if part.shape[-1] else torch.full(s.shape[:-1], float("-inf"),
                                                                           dtype=s.dtype)  # (B,H,L)
        w = torch.exp(part - lse.masked_fill(torch.isneginf(lse), 0.0)[..., None])  # (B,H,L,c), 0 where hidden
        vp = v.repeat_interleave(G, 1)[:, :, p * keys_per_split:(p + 1) * keys_per_split]  # (B,H,c,Dv)
        outs.append(w @ vp)  # (B,H,L,Dv)
        lses.append(lse)
    return torch.stack(outs, 3), torch.stack(lses, 3)  # (B,H,L,P,Dv), (B,H,L,P)


def test_split_partials_split_by_split_and_their_merge():
    # block_n 16, S 100: 7 key blocks; 3 splits of 3, 3 and 1 blocks (48, 48, 4 keys); 5 of 2 blocks (the last empty).
    B, H, H_kv, L, S, seqlens = 2, 6, 2, 3, 100, [100, 40]
    q, k, v = make_case(B, H, H_kv, L, S, seed=2)
    visible = visible_by_loop(seqlens, L, S)
    for P, per_split, empty_in_1 in ((3, 48, [1, 2]), (5, 32, [2, 3, 4])):
        o_part, lse_part = dec().launch_split(*(t.to(DEVICE, F32) for t in (q, k, v)), step(seqlens, P, 0.25),
                                              block_n=16)
        assert o_part.shape == (B, H, L, P, DV) and lse_part.shape == (B, H, L, P)
        assert o_part.dtype == lse_part.dtype == F32
        o_ref, lse_ref = split_reference(q, k, v, visible, 0.25, per_split, P)
        lse_part, o_part = lse_part.cpu(), o_part.cpu()
        assert torch.equal(torch.isneginf(lse_part), torch.isneginf(lse_ref))
        assert torch.isneginf(lse_part[1, :, :, empty_in_1]).all()  # entry 1 has 40 keys: later splits empty
        for p in range(P):  # entry 0 has 100 keys: only split 4 of 5 (keys 128 ..) is empty
            assert bool(torch.isneginf(lse_part[0, :, :, p]).all()) == (p == 4)
        fin = torch.isfinite(lse_ref)
        assert max_abs_error(lse_part[fin], lse_ref[fin]) <= lse_atol(F32)
        assert_close(o_part, o_ref, what=f"partials P={P}")
        assert torch.equal(o_part[torch.isneginf(lse_part)], torch.zeros(int(torch.isneginf(lse_part).sum()), DV))
        ref, _ = attn_lib.attention(q, k, v, mask=visible, enable_gqa=True, scale=0.25)
        assert_close(dec().launch_merge(o_part.to(DEVICE), lse_part.to(DEVICE), F32).cpu(), ref, what="merged")


def test_merge_kernel_on_numbers_made_here():
    # The rule: m = max lse_p, w_p = exp(lse_p - m), out = sum w_p o_p / sum w_p; rows with every lse -inf give 0.
    # 37 splits: more than the kernel reads at once (MERGE_BLOCK_P = 16), so its loop runs three times.
    gen = torch.Generator().manual_seed(1)
    for P in (1, 2, 37):
        o_part = torch.randn(3, 4, P, 5, generator=gen, dtype=torch.float64)  # (R1,R2,P,Dv)
        lse = torch.randn(3, 4, P, generator=gen, dtype=torch.float64) * 30  # (R1,R2,P), far apart
        lse[0, 0] = float("-inf")  # a row that sees no key
        lse[1, :, 0] = float("-inf")  # an empty split
        o_part[1, :, 0] = 0.0
        w = torch.softmax(lse, -1).nan_to_num(0.0)  # (R1,R2,P) the weights; a row with every lse -inf: 0
        expected = (w[..., None] * o_part).sum(-2)  # (R1,R2,Dv)
        for dtype in (F32, F16):
            out = dec().launch_merge(o_part.to(DEVICE, F32), lse.to(DEVICE, F32), dtype).cpu()
            assert out.shape == (3, 4, 5) and out.dtype == dtype
            assert torch.equal(out[0, 0], torch.zeros(5, dtype=dtype))
            assert_close(out, expected, what=f"merge P={P} {dtype}")


@pytest.mark.parametrize("causal", [True, False])
def test_keys_past_the_cache_length_are_never_read(causal):
    # NaN in K and V at every j >= n_b: a kernel that loaded them (0 * NaN = NaN in a dot) would return NaN.
    B, H, H_kv, L, S, seqlens = 2, 6, 2, 3, 90, [50, 1]
    q, k, v = make_case(B, H, H_kv, L, S, seed=5)
    ref, _ = reference(q, k, v, seqlens, 0.25, causal)
    for b, n in enumerate(seqlens):
        k[b, :, n:] = float("nan")
        v[b, :, n:] = float("nan")
    for P in (1, 4):
        out = dec().launch(*(t.to(DEVICE, F32) for t in (q, k, v)), step(seqlens, P, 0.25, causal), block_n=16)
        assert_close(out.cpu(), ref, what=f"poisoned cache P={P}")
    # through flash_decoding: its door scans only the positions the step reads, the kernels read no more
    out = flash_decoding(*(t.to(DEVICE, F32) for t in (q, k, v)), cache_seqlens=torch.tensor(seqlens, device=DEVICE),
                         is_causal=causal, scale=0.25, enable_gqa=True, num_splits=2, backend="triton")
    assert_close(out.cpu(), ref, what="flash_decoding, poisoned cache")


def test_strided_cache_and_query():
    # A cache kept as (B, S_max, H_kv, D) and read through a transposed view; q transposed too.
    B, H, H_kv, L, S, seqlens = 2, 4, 2, 3, 45, [45, 20]
    q, k, v = make_case(B, H, H_kv, L, S, seed=6)
    ref, _ = reference(q, k, v, seqlens, 0.25)
    qs = q.transpose(1, 2).contiguous().transpose(1, 2).to(DEVICE, F32)  # (B,H,L,D), strides of (B,L,H,D)
    ks, vs = (t.transpose(1, 2).contiguous().transpose(1, 2).to(DEVICE, F32) for t in (k, v))  # (B,H_kv,S,*)
    assert not ks.is_contiguous() and not qs.is_contiguous()
    out = dec().launch(qs, ks, vs, step(seqlens, 3, 0.25), block_n=16)
    assert_close(out.cpu(), ref, what="strided")


def record_grids(monkeypatch, module):
    """Replace the split kernel by a stand-in that records each launch's grid and runs the kernel."""
    grids = []
    real = module.decode_split

    class Recorder:
        def __getitem__(self, grid):
            grids.append(tuple(grid))
            return real[grid]

    monkeypatch.setattr(module, "decode_split", Recorder())
    return grids


def test_one_program_per_key_value_head_and_split(monkeypatch):
    # The split kernel's grid is (splits, B * H_kv, row blocks): one program per key/value head and split reads
    # each K/V block once for all G query heads of the group (B * H programs would read it G times).
    module = dec()
    grids = record_grids(monkeypatch, module)
    run_case((2, 8, 2, 1, 40), [40, 7], 3, F32, block_n=16)
    run_case((3, 8, 1, 3, 20), [20, 3, 0], 2, F32, block_n=16, block_m=16)  # MQA: 24 rows in 2 row blocks
    assert grids == [(3, 2 * 2, 1), (2, 3 * 1, 2)]
    assert module.grid_split(3, 4, 24, {"BLOCK_M": 16}) == (3, 4, 2) and module.grid_merge(7) == (7,)


def test_heads_in_chunks_and_int64_offsets_give_the_same_output(monkeypatch):
    module = dec()
    base = run_case((3, 4, 2, 3, 40), [40, 9, 0], 3, F32, block_n=16, seed=8)[0]
    monkeypatch.setattr(configs, "MAX_GRID_Y", 4)  # 6 key/value heads: launches of 4 and 2
    monkeypatch.setattr(module, "INT32_LIMIT", 1)  # every offset in int64
    assert module._needs_int64([(1, 1)]) and not module._needs_int64([(0, 0)])
    grids = record_grids(monkeypatch, module)
    assert torch.equal(run_case((3, 4, 2, 3, 40), [40, 9, 0], 3, F32, block_n=16, seed=8)[0], base)
    assert grids == [(3, 4, 1), (3, 2, 1)]


def test_no_repeated_keys_or_values_are_allocated():
    # Every tensor torch creates during the call (the interpreter's copies included) is smaller than K or V
    # repeated to H heads, (B, H, S, D): the split kernel reads the shared head in place.
    B, H, H_kv, L, S = 1, 8, 1, 1, 300
    q, k, v = (t.to(DEVICE, F32) for t in make_case(B, H, H_kv, L, S, seed=7))
    settings = step([S], 4, 0.25)
    out, largest = largest_tensor(dec().launch, q, k, v, settings)
    assert out.shape == (B, H, L, DV)
    if DEVICE.type == "cpu":  # the recorder sees the interpreter's copies of K (a GPU kernel copies nothing)
        assert largest >= k.numel()
    assert largest < B * H * S * min(D, DV), largest


def test_no_keys_at_all_and_empty_batches():
    q = torch.randn(2, 4, 3, D, device=DEVICE)
    k0, v0 = torch.zeros(2, 2, 0, D, device=DEVICE), torch.zeros(2, 2, 0, DV, device=DEVICE)
    for P in (1, 3):
        assert torch.equal(dec().launch(q, k0, v0, step([0, 0], P, 0.5)).cpu(), torch.zeros(2, 4, 3, DV))
    o_part, lse_part = dec().launch_split(q, k0, v0, step([0, 0], 3, 0.5))
    assert torch.isneginf(lse_part).all() and not o_part.any()
    empty = dec().launch(q[:0], k0[:0], v0[:0], step([], 2, 0.5))
    assert empty.shape == (0, 4, 3, DV)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_an_overflowed_score_gives_nan_in_its_row():
    # scale 3e38: the scores overflow float32 to +-inf. A row that sees a key comes out NaN (never a silent number),
    # so that attn_lib.flash.decoding's overflow check after the kernel reports it; a row that sees no key stays 0.
    # Entry 1 (one key): row 2 of head 3 has one negative score, -inf after the overflow, and is NaN too.
    B, H, H_kv, L, S, seqlens = 2, 4, 2, 3, 40, [40, 1]
    q, k, v = (t.to(DEVICE, F32) for t in make_case(B, H, H_kv, L, S, seed=9))
    sees = visible_by_loop(seqlens, L, S).any(-1)[:, 0]  # (B,L)
    for P in (1, 3):
        out = dec().launch(q, k, v, step(seqlens, P, 3e38), block_n=16).cpu().permute(0, 2, 1, 3)  # (B,L,H,Dv)
        assert torch.isnan(out[sees]).all() and torch.equal(out[~sees], torch.zeros(int((~sees).sum()), H, DV))
    assert float(q[1, 3, 2] @ k[1, 1, 0]) < 0  # the row whose only score is -inf


# --- flash_decoding(..., backend="triton") ---------------------------------------------------------------------

def _lengths(B, S):
    """Ragged lengths with 0, 1 and S_max (and one in between)."""
    return [0, 1, S, S // 2 + 1][:B]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "every_key"])
@pytest.mark.parametrize("L,S,num_splits", [(1, 17, 2), (3, 300, 3)])
def test_flash_decoding_with_the_triton_backend_equals_the_reference(L, S, num_splits, causal):
    q, k, v = make_case(3, 6, 2, L, S, seed=4, d=8, dv=5)
    lengths = _lengths(3, S)
    ref, _ = reference(q, k, v, lengths, 8 ** -0.5, causal)
    out = flash_decoding(*(t.to(DEVICE, F32) for t in (q, k, v)), cache_seqlens=torch.tensor(lengths, device=DEVICE),
                         is_causal=causal, num_splits=num_splits, enable_gqa=True, backend="triton")
    assert out.dtype == F32
    assert_close(out.cpu(), ref, dtype=F32)


def test_flash_decoding_with_the_triton_backend_appends_the_new_keys_first():
    # k, v of 2 new positions written at cache_seqlens[b] .. and attended: as the reference over the filled cache
    q, k, v = make_case(2, 4, 2, 2, 30, seed=3)
    lengths = [10, 27]
    new_k, new_v = k[:, :, :2].clone() * -1, v[:, :, :2].clone() * -1  # (B,H_kv,2,*)
    filled_k, filled_v = k.clone(), v.clone()
    for b, n in enumerate(lengths):
        filled_k[b, :, n:n + 2], filled_v[b, :, n:n + 2] = new_k[b], new_v[b]
    ref, _ = reference(q, filled_k, filled_v, [n + 2 for n in lengths], D ** -0.5)
    kc, vc = k.to(DEVICE, F32), v.to(DEVICE, F32)
    out = flash_decoding(q.to(DEVICE, F32), kc, vc, new_k.to(DEVICE, F32), new_v.to(DEVICE, F32),
                         cache_seqlens=torch.tensor(lengths, device=DEVICE), is_causal=True, enable_gqa=True,
                         backend="triton")
    assert_close(out.cpu(), ref, what="appended")
    assert_close(kc.cpu(), filled_k, what="the cache holds the new keys")


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_flash_decoding_with_the_triton_backend_raises_the_one_overflow_message():
    q, k, v = (t.to(DEVICE, F32) for t in make_case(2, 4, 2, 1, 40, seed=9))
    with pytest.raises(ValueError, match=re.escape(OVERFLOW_MESSAGE)):
        flash_decoding(q, k, v, cache_seqlens=torch.tensor([40, 0], device=DEVICE), enable_gqa=True, scale=3e38,
                       backend="triton")


def test_flash_decoding_with_the_triton_backend_refuses_float64():
    q, k = torch.zeros(1, 2, 1, 4, dtype=torch.float64), torch.zeros(1, 2, 5, 4, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"^the Triton kernel takes float16, bfloat16 or float32; "
                                        r"for float64 use backend='torch'"):
        flash_decoding(q, k, k, backend="triton")


def test_the_triton_backend_calls_the_launcher_with_resolved_settings(monkeypatch):
    """flash_decoding hands attn_lib.flash.triton.decode.launch(q, k, v, settings) int32 lengths on q's device
    (S_max for every entry when cache_seqlens is None), a resolved split count (at most one split per 128-key
    block), its scale, is_causal and the overflow check. A stand-in module records the call."""
    calls = []
    fake = types.ModuleType("attn_lib.flash.triton.decode")
    fake.launch = lambda q, k, v, settings: calls.append((q, k, v, settings)) or torch.zeros(2, 6, 1, 5)
    monkeypatch.setitem(sys.modules, "attn_lib.flash.triton.decode", fake)
    q, k, v = (t.float() for t in make_case(2, 6, 2, 1, 300, seed=0, d=8, dv=5))
    flash_decoding(q, k, v, enable_gqa=True, backend="triton", num_splits=2)
    flash_decoding(q, k, v, cache_seqlens=torch.tensor([3, 0]), enable_gqa=True, is_causal=True, backend="triton")
    flash_decoding(q, k, v, enable_gqa=True, backend="triton", num_splits=8, scale=0.5)
    (q1, k1, _, s1), (_, _, _, s2), (_, _, _, s3) = calls
    assert q1 is q and k1 is k and isinstance(s1, DecodeSettings) and s1.backend == "triton"
    assert s1.scale == pytest.approx(1 / math.sqrt(8)) and isinstance(s1.scale, float) and s1.check_overflow
    assert s1.seqlens.dtype == torch.int32 and s1.seqlens.tolist() == [300, 300] and s1.num_splits == 2
    assert not s1.is_causal and s2.is_causal
    assert s2.seqlens.dtype == torch.int32 and s2.seqlens.tolist() == [3, 0]
    n_blocks = -(-300 // splits.DECODE_BLOCK_N)
    assert isinstance(s2.num_splits, int) and 1 <= s2.num_splits <= n_blocks
    assert s3.num_splits == n_blocks and s3.scale == 0.5  # 8 splits asked, 3 blocks of 128 keys
