"""The FlashDecoding Triton kernels (attn_lib/flash/triton/decode.py): split kernel + merge kernel.

``decode_attention(q, k, v, seqlens, num_splits, scale)`` against the float64 reference
``attn_lib.attention`` with a bool mask built here by a loop from the decode rule (query i of
entry b sees key j iff ``j < n_b`` and ``j <= n_b - L + i``), over ragged cache lengths (0, 1 and
S_max among them), split counts 1, 2, 3, 8 and more than there are key blocks, GQA 6/2, MQA 8/1 and
H_kv = H. float32 meets the float32 tolerance of ``attn_lib.tolerances``; float16 and bfloat16
follow flash-attn's 2x rule against the same formula computed in that precision. The partials of
the split kernel are checked split by split, the merge kernel on numbers made here.
Without a GPU this runs under Triton's interpreter (attn_lib.device sets it once per process),
so the sizes are small; the default key block (32 under the interpreter) and 16 do not divide S.
"""
import importlib
import importlib.util
import os

import pytest
import torch

import attn_lib
from attn_lib import device as attn_device
from attn_lib.tolerances import FLASH_ERROR_FLOOR, FLASH_ERROR_RATIO, assert_close, lse_atol, max_abs_error

# Do not `import triton` here: attn_lib.device decides the process's Triton mode first.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

DEVICE = torch.device(os.environ.get("ATTN_LIB_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu"))
D, DV = 12, 10  # not powers of two, D != Dv
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def kernels():
    attn_device.triton_interprets()  # fixes TRITON_INTERPRET before the module imports triton
    return importlib.import_module("attn_lib.flash.triton.decode")


def visible_by_loop(seqlens, L, S):
    """(B, 1, L, S) bool: query i of entry b sees key j iff j < n_b and j <= n_b - L + i (not from attn_lib)."""
    vis = torch.zeros(len(seqlens), 1, L, S, dtype=torch.bool)
    for b, n in enumerate(seqlens):
        for i in range(L):
            for j in range(S):
                vis[b, 0, i, j] = j < n and j <= n - L + i
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


def assert_rule(fast, naive, ref, dtype, what):
    """flash-attn's rule: error <= 2 x the same formula's error in dtype + one rounding step of dtype."""
    r = ref.to(dtype)
    atol = max(FLASH_ERROR_FLOOR, 2 * float(((r + 0.3 - 0.3) - r).abs().max()))
    fast_err, naive_err = max_abs_error(fast, ref), max_abs_error(naive, ref)
    assert fast_err <= FLASH_ERROR_RATIO * naive_err + atol, (
        f"{what}: error {fast_err:.3e} > {FLASH_ERROR_RATIO} x naive error {naive_err:.3e} + atol {atol:.2e}")


def run_case(shape, seqlens, num_splits, dtype, block_n=None, block_m=None, scale=None, seed=0, d=D, dv=DV):
    B, H, H_kv, L, S = shape
    q, k, v = make_case(B, H, H_kv, L, S, seed, d, dv)
    scale = d ** -0.5 if scale is None else scale
    visible = visible_by_loop(seqlens, L, S)  # (B,1,L,S)
    ref, _ = attn_lib.attention(q, k, v, mask=visible, enable_gqa=True, scale=scale)  # (B,H,L,Dv) float64
    ql, kl, vl = (t.to(DEVICE, dtype) for t in (q, k, v))
    lens = torch.tensor(seqlens, dtype=torch.int32, device=DEVICE)
    out = kernels().decode_attention(ql, kl, vl, lens, num_splits, scale, block_m=block_m, block_n=block_n)
    assert out.shape == (B, H, L, dv) and out.dtype == dtype and out.device == ql.device
    out = out.cpu()
    empty = ~visible.any(-1)[:, 0]  # (B,L) rows that see no key
    assert torch.equal(out.permute(0, 2, 1, 3)[empty], torch.zeros(int(empty.sum()), H, dv, dtype=dtype))
    if dtype == F32:
        assert_close(out, ref, what=f"decode {shape} {seqlens} P={num_splits}")
    else:
        naive = plain(*(t.to(dtype) for t in (q, k, v)), visible, scale)
        assert_rule(out, naive, ref, dtype, f"decode {dtype} {shape} {seqlens} P={num_splits}")
    return out, ref


CASES = [  # (B, H, H_kv, L, S), seqlens, num_splits, dtype, block_n
    ((1, 2, 2, 1, 1), [1], 1, F32, None),  # S = 1
    ((1, 2, 2, 3, 1), [1], 2, F32, None),  # L > n_b: rows 0 and 1 see no key
    ((3, 6, 2, 1, 17), [0, 1, 17], 2, F32, None),  # GQA 6/2, ragged with 0, 1 and S_max
    ((3, 6, 2, 3, 17), [2, 17, 0], 3, F32, 16),  # n_b < L: the first row of entry 0 sees nothing
    ((2, 8, 1, 3, 300), [300, 1], 8, F32, None),  # MQA 8/1
    ((2, 3, 3, 1, 1000), [1000, 513], 8, F32, None),  # H_kv = H
    ((2, 2, 2, 3, 300), [300, 0], 12, F32, None),  # 12 splits > 10 key blocks
    ((2, 6, 2, 3, 1000), [1, 1000], 3, F16, None),
    ((2, 8, 1, 1, 300), [300, 17], 2, BF16, None),  # bf16: every tl.dot in fp32 under the interpreter
    ((2, 6, 2, 3, 300), [0, 300], 1, BF16, 16),
    ((2, 4, 2, 3, 17), [17, 5], 8, F16, 16),  # 8 splits > 2 key blocks
    ((1, 8, 1, 1, 1000), [999], 1, F16, None),
]


@pytest.mark.parametrize("shape,seqlens,num_splits,dtype,block_n", CASES,
                         ids=lambda c: "x".join(map(str, c)) if isinstance(c, (tuple, list)) else str(c).replace(
                             "torch.", ""))
def test_decode_matches_the_reference(shape, seqlens, num_splits, dtype, block_n):
    run_case(shape, seqlens, num_splits, dtype, block_n)


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
    dec = kernels()
    B, H, H_kv, L, S, seqlens = 2, 6, 2, 3, 100, [100, 40]
    q, k, v = make_case(B, H, H_kv, L, S, seed=2)
    visible = visible_by_loop(seqlens, L, S)
    lens = torch.tensor(seqlens, dtype=torch.int32, device=DEVICE)
    for P, per_split, empty_in_1 in ((3, 48, [1, 2]), (5, 32, [2, 3, 4])):
        o_part, lse_part = dec.decode_split(*(t.to(DEVICE, F32) for t in (q, k, v)), lens, P, 0.25, block_n=16)
        assert o_part.shape == (B, H, L, P, DV) and lse_part.shape == (B, H, L, P)
        assert o_part.dtype == lse_part.dtype == F32
        o_ref, lse_ref = split_reference(q, k, v, visible, 0.25, per_split, P)
        lse_part, o_part = lse_part.cpu(), o_part.cpu()
        assert torch.equal(torch.isneginf(lse_part), torch.isneginf(lse_ref))
        assert torch.isneginf(lse_part[1, :, :, empty_in_1]).all()  # entry 1 has 40 keys: later splits empty
        for p in range(P):  # entry 0 has 100 keys: only split 4 of 5 (keys 128 ..) is empty
            assert bool(torch.isneginf(lse_part[0, :, :, p]).all()) == (p == 4)
        fin = torch.isfinite(lse_ref)
        assert torch.allclose(lse_part[fin].double(), lse_ref[fin], atol=lse_atol(F32))
        assert_close(o_part, o_ref, what=f"partials P={P}")
        assert torch.equal(o_part[torch.isneginf(lse_part)], torch.zeros(int(torch.isneginf(lse_part).sum()), DV))
        ref, _ = attn_lib.attention(q, k, v, mask=visible, enable_gqa=True, scale=0.25)
        assert_close(dec.decode_merge(o_part.to(DEVICE), lse_part.to(DEVICE), F32).cpu(), ref, what="merged")


def test_merge_kernel_on_numbers_made_here():
    # The rule: m = max lse_p, w_p = exp(lse_p - m), out = sum w_p o_p / sum w_p; rows with every lse -inf give 0.
    # 37 splits: more than the kernel reads at once (MERGE_BLOCK_P = 16), so its loop runs three times.
    dec = kernels()
    gen = torch.Generator().manual_seed(1)
    for P in (1, 2, 37):
        o_part = torch.randn(3, 4, P, 5, generator=gen, dtype=torch.float64)  # (R1,R2,P,Dv)
        lse = torch.randn(3, 4, P, generator=gen, dtype=torch.float64) * 30  # (R1,R2,P), far apart
        lse[0, 0] = float("-inf")  # a row that sees no key
        lse[1, :, 0] = float("-inf")  # an empty split
        o_part[1, :, 0] = 0.0
        m = lse.max(-1, keepdim=True).values
        w = torch.exp(lse - m.masked_fill(torch.isneginf(m), 0.0))  # (R1,R2,P)
        expected = (w[..., None] * o_part).sum(-2) / w.sum(-1, keepdim=True).clamp_min(1e-300)  # (R1,R2,Dv)
        for dtype in (F32, F16):
            out = dec.decode_merge(o_part.to(DEVICE, F32), lse.to(DEVICE, F32), dtype).cpu()
            assert out.shape == (3, 4, 5) and out.dtype == dtype
            assert torch.equal(out[0, 0], torch.zeros(5, dtype=dtype))
            assert_close(out, expected, what=f"merge P={P} {dtype}")


def test_keys_past_the_cache_length_are_never_read():
    # NaN in K and V at every j >= n_b: a kernel that loaded them (0 * NaN = NaN in a dot) would return NaN.
    B, H, H_kv, L, S, seqlens = 2, 6, 2, 3, 90, [50, 1]
    q, k, v = make_case(B, H, H_kv, L, S, seed=5)
    visible = visible_by_loop(seqlens, L, S)
    ref, _ = attn_lib.attention(q, k, v, mask=visible, enable_gqa=True, scale=0.25)
    for b, n in enumerate(seqlens):
        k[b, :, n:] = float("nan")
        v[b, :, n:] = float("nan")
    lens = torch.tensor(seqlens, dtype=torch.int32, device=DEVICE)
    for P in (1, 4):
        out = kernels().decode_attention(*(t.to(DEVICE, F32) for t in (q, k, v)), lens, P, 0.25, block_n=16)
        assert_close(out.cpu(), ref, what=f"poisoned cache P={P}")


def test_strided_cache_and_query():
    # A cache kept as (B, S_max, H_kv, D) and read through a transposed view; q transposed too.
    B, H, H_kv, L, S, seqlens = 2, 4, 2, 3, 45, [45, 20]
    q, k, v = make_case(B, H, H_kv, L, S, seed=6)
    visible = visible_by_loop(seqlens, L, S)
    ref, _ = attn_lib.attention(q, k, v, mask=visible, enable_gqa=True, scale=0.25)
    qs = q.transpose(1, 2).contiguous().transpose(1, 2).to(DEVICE, F32)  # (B,H,L,D), strides of (B,L,H,D)
    ks, vs = (t.transpose(1, 2).contiguous().transpose(1, 2).to(DEVICE, F32) for t in (k, v))  # (B,H_kv,S,*)
    assert not ks.is_contiguous() and not qs.is_contiguous()
    lens = torch.tensor(seqlens, dtype=torch.int32, device=DEVICE)
    out = kernels().decode_attention(qs, ks, vs, lens, 3, 0.25, block_n=16)
    assert_close(out.cpu(), ref, what="strided")


def record_grids(monkeypatch, dec):
    """Replace the split kernel by a stand-in that records each launch's grid and runs the kernel."""
    grids = []
    real = dec._decode_split

    class Recorder:
        def __getitem__(self, grid):
            grids.append(tuple(grid))
            return real[grid]

    monkeypatch.setattr(dec, "_decode_split", Recorder())
    return grids


def test_one_program_per_key_value_head_and_split(monkeypatch):
    # The split kernel's grid is (splits, B * H_kv, row blocks): one program per key/value head and split reads
    # each K/V block once for all G query heads of the group (B * H programs would read it G times).
    grids = record_grids(monkeypatch, kernels())
    run_case((2, 8, 2, 1, 40), [40, 7], 3, F32, block_n=16)
    run_case((3, 8, 1, 3, 20), [20, 3, 0], 2, F32, block_n=16, block_m=16)  # MQA: 24 rows in 2 row blocks
    assert grids == [(3, 2 * 2, 1), (2, 3 * 1, 2)]


def test_heads_in_chunks_and_int64_offsets_give_the_same_output(monkeypatch):
    dec = kernels()
    base = run_case((3, 4, 2, 3, 40), [40, 9, 0], 3, F32, block_n=16, seed=8)[0]
    monkeypatch.setattr("attn_lib.flash.triton.configs.MAX_GRID_Y", 4)  # 6 key/value heads: launches of 4 and 2
    monkeypatch.setattr(dec, "INT32_LIMIT", 1)  # every offset in int64
    assert dec._needs_int64([(1, 1)]) and not dec._needs_int64([(0, 0)])
    grids = record_grids(monkeypatch, dec)
    assert torch.equal(run_case((3, 4, 2, 3, 40), [40, 9, 0], 3, F32, block_n=16, seed=8)[0], base)
    assert grids == [(3, 4, 1), (3, 2, 1)]


def test_no_repeated_keys_or_values_are_allocated():
    # Every tensor torch creates during the call (the interpreter's copies included) is smaller than K or V
    # repeated to H heads, (B, H, S, D): the split kernel reads the shared head in place.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Sizes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.numels = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.numels += [t.numel() for t in (out if isinstance(out, (tuple, list)) else [out])
                            if isinstance(t, torch.Tensor)]
            return out

    dec = kernels()
    B, H, H_kv, L, S = 1, 8, 1, 1, 300
    q, k, v = (t.to(DEVICE, F32) for t in make_case(B, H, H_kv, L, S, seed=7))
    lens = torch.tensor([S], dtype=torch.int32, device=DEVICE)
    with Sizes() as sizes:
        out = dec.decode_attention(q, k, v, lens, 4, 0.25)
    assert out.shape == (B, H, L, DV)
    if DEVICE.type == "cpu":  # the recorder sees the interpreter's copies of K (a GPU kernel copies nothing)
        assert max(sizes.numels) >= k.numel()
    assert max(sizes.numels) < B * H * S * min(D, DV), max(sizes.numels)


def test_no_keys_at_all_and_empty_batches():
    dec = kernels()
    q = torch.randn(2, 4, 3, D, device=DEVICE)
    k0, v0 = torch.zeros(2, 2, 0, D, device=DEVICE), torch.zeros(2, 2, 0, DV, device=DEVICE)
    lens = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    for P in (1, 3):
        assert torch.equal(dec.decode_attention(q, k0, v0, lens, P, 0.5).cpu(), torch.zeros(2, 4, 3, DV))
    o_part, lse_part = dec.decode_split(q, k0, v0, lens, 3, 0.5)
    assert torch.isneginf(lse_part).all() and not o_part.any()
    empty = dec.decode_attention(q[:0], k0[:0], v0[:0], lens[:0], 2, 0.5)
    assert empty.shape == (0, 4, 3, DV)


def test_configurations():
    from attn_lib.flash.triton import configs as cfg  # pure Python: readable without Triton

    interp = cfg.decode_configs(4, 128, 128, F16, True)
    assert [(c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_D"]) for c in interp] == [(16, 32, 128)]
    gpu = cfg.decode_configs(4, 128, 128, F16, False)
    assert [c["BLOCK_N"] for c in gpu] == [128, 64, 32, 16]  # 128 keys first, as flash-attn's split-KV kernel
    assert cfg.decode_configs(4, 128, 128, F32, False)[0]["BLOCK_N"] == 64  # fp32: twice the bytes per key
    for rows, d, dtype in ((4, 128, F16), (4, 128, F32), (4, 256, F16), (128, 128, F16), (512, 256, F32)):
        for c in cfg.decode_configs(rows, d, d, dtype, False):
            assert cfg._smem_bytes(dtype.itemsize, c["BLOCK_M"], c["BLOCK_N"], 1, d, d) <= cfg.SMEM_BUDGET
        for c in cfg.decode_configs(rows, d, d, dtype, False, capability=(7, 5)):
            assert c["num_stages"] == 1 and cfg._smem_bytes_pre_sm80(
                dtype, "fwd", c["BLOCK_M"], c["BLOCK_N"], d, d) <= cfg.SMEM_BUDGET_PRE_SM80
    assert cfg.decode_configs(24, 12, 10, F32, True)[0]["BLOCK_M"] == 32  # G·L = 24 rows, padded to 32
    assert cfg.decode_configs(512, 64, 64, F32, True)[0]["BLOCK_M"] == cfg.DECODE_MAX_ROWS  # more: row blocks
    assert cfg.decode_configs(512, 128, 128, F16, False, capability=(7, 5))[0]["BLOCK_M"] == 64  # T4: 64 KB
    assert [(c["BLOCK_M"], c["BLOCK_N"]) for c in cfg.decode_configs(4, 64, 64, F16, False, block_m=32, block_n=16)
            ] == [(32, 16)]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_an_overflowed_score_gives_nan_in_its_row():
    # scale 3e38: the scores overflow float32 to +-inf. A row that sees a key comes out NaN (never a silent number),
    # so that attn_lib.flash.decoding's overflow check after the kernel reports it; a row that sees no key stays 0.
    # Entry 1 (one key): row 2 of head 3 has one negative score, -inf after the overflow, and is NaN too.
    dec = kernels()
    B, H, H_kv, L, S, seqlens = 2, 4, 2, 3, 40, [40, 1]
    q, k, v = (t.to(DEVICE, F32) for t in make_case(B, H, H_kv, L, S, seed=9))
    lens = torch.tensor(seqlens, dtype=torch.int32, device=DEVICE)
    sees = visible_by_loop(seqlens, L, S).any(-1)[:, 0]  # (B,L)
    for P in (1, 3):
        out = dec.decode_attention(q, k, v, lens, P, 3e38, block_n=16).cpu().permute(0, 2, 1, 3)  # (B,L,H,Dv)
        assert torch.isnan(out[sees]).all() and torch.equal(out[~sees], torch.zeros(int((~sees).sum()), H, DV))
    assert float(q[1, 3, 2] @ k[1, 1, 0]) < 0  # the row whose only score is -inf
