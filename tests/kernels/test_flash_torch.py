"""Tiled FlashAttention in torch (attn_lib.flash.tiled_forward) and the dispatcher, against the float64 reference."""
import pytest
import torch

import attn_lib
from attn_lib.flash.autograd import choose_backend, flash_attention
from attn_lib import flash_attention_torch, naive_attention
from attn_lib.costs.io_model import largest_tensor
from attn_lib.tolerances import assert_close, assert_flash_rule, lse_atol

from attn_paths import flash_inputs as make_inputs, flash_reference as reference


def check_lse(lse, lse_ref, atol):
    assert torch.equal(torch.isneginf(lse), torch.isneginf(lse_ref)), "rows that see no key must have lse = -inf"
    fin = torch.isfinite(lse_ref)
    assert torch.allclose(lse[fin].double(), lse_ref[fin], rtol=0, atol=atol)


SHAPES = [  # (B, H, L, S, D, Dv)
    (1, 1, 1, 1, 16, 16),
    (1, 1, 17, 17, 16, 16),
    (2, 3, 17, 97, 32, 32),
    (1, 2, 97, 17, 8, 8),
    (2, 2, 113, 113, 64, 64),
    (1, 1, 113, 1, 16, 16),
    (1, 1, 1, 113, 16, 16),
    (2, 1, 97, 113, 20, 12),
]
BLOCKS = [(None, None), (16, 16), (7, 5), (64, 32)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("padding", [False, True], ids=["nopad", "pad"])
def test_float64_matches_reference(shape, causal, padding):
    B, H, L, S, D, Dv = shape
    q, k, v, kpm = make_inputs(B, H, L, S, D, Dv, padding=padding)
    ref, lse_ref = reference(q, k, v, kpm, causal)
    for bm, bn in BLOCKS:
        out, lse = flash_attention_torch(q, k, v, is_causal=causal, key_padding_mask=kpm, block_m=bm, block_n=bn)
        assert out.shape == (B, H, L, Dv) and lse.shape == (B, H, L)
        assert_close(out, ref, what=f"out, blocks {bm}x{bn}")
        check_lse(lse, lse_ref, atol=lse_atol(torch.float64))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_long_sequence_1025(causal):
    q, k, v, kpm = make_inputs(1, 2, 1025, 1025, 16, padding=True)
    ref, lse_ref = reference(q, k, v, kpm, causal)
    q32, k32, v32 = q.float(), k.float(), v.float()
    out, lse = flash_attention_torch(q32, k32, v32, is_causal=causal, key_padding_mask=kpm, block_m=256, block_n=128)
    assert_close(out, ref, what="float32 out")
    naive = naive_attention(q32, k32, v32, is_causal=causal, key_padding_mask=kpm)
    assert_flash_rule(out, naive, ref)
    check_lse(lse, lse_ref, atol=lse_atol(torch.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_low_precision_flash_rule(dtype, causal):
    q, k, v, kpm = make_inputs(2, 2, 97, 113, 32, padding=True, seed=3)
    ref, _ = reference(q, k, v, kpm, causal)
    ql, kl, vl = q.to(dtype), k.to(dtype), v.to(dtype)
    out, lse = flash_attention_torch(ql, kl, vl, is_causal=causal, key_padding_mask=kpm, block_m=32, block_n=16)
    assert out.dtype == dtype and lse.dtype == torch.float32
    naive = naive_attention(ql, kl, vl, is_causal=causal, key_padding_mask=kpm)
    assert_flash_rule(out, naive, ref, what=str(dtype))
    if dtype == torch.float32:
        assert_close(out, ref)


def test_rows_that_see_no_key_give_zeros():
    q, k, v, _ = make_inputs(2, 2, 9, 6, 8)
    kpm = torch.ones(2, 6, dtype=torch.bool)
    kpm[1] = False  # second sequence: every key absent
    kpm[0, 0] = False  # first sequence: with causal, query 0 sees only key 0, which is absent
    for causal in (False, True):
        out, lse = flash_attention_torch(q, k, v, is_causal=causal, key_padding_mask=kpm, block_n=4)
        assert torch.all(out[1] == 0) and torch.all(torch.isneginf(lse[1]))
        assert torch.isfinite(out).all()
    assert torch.all(out[0, :, 0] == 0) and torch.all(torch.isneginf(lse[0, :, 0]))
    assert torch.isfinite(lse[0, :, 1:]).all()


def test_scale_and_strided_inputs():
    gen = torch.Generator().manual_seed(5)
    # (B, L, H, D) storage viewed as (B, H, L, D): non-contiguous, as a model's projections often are
    q = torch.randn(2, 33, 3, 16, generator=gen, dtype=torch.float64).transpose(1, 2)
    k = torch.randn(2, 40, 3, 16, generator=gen, dtype=torch.float64).transpose(1, 2)
    v = torch.randn(2, 40, 3, 8, generator=gen, dtype=torch.float64).transpose(1, 2)
    assert not q.is_contiguous()
    ref, lse_ref = reference(q, k, v, None, True, scale=0.3)
    out, lse = flash_attention_torch(q, k, v, is_causal=True, scale=0.3, block_m=8, block_n=16)
    assert_close(out, ref)
    check_lse(lse, lse_ref, atol=lse_atol(torch.float64))


def test_empty_key_set_and_empty_queries():
    q, k, v, _ = make_inputs(1, 2, 5, 0, 4)
    out, lse = flash_attention_torch(q, k, v)
    assert out.shape == (1, 2, 5, 4) and torch.all(out == 0) and torch.all(torch.isneginf(lse))
    q, k, v, _ = make_inputs(1, 2, 0, 5, 4)
    out, lse = flash_attention_torch(q, k, v, is_causal=True)
    assert out.shape == (1, 2, 0, 4) and lse.shape == (1, 2, 0)


def test_never_materialises_the_score_matrix():
    B, H, L, S, D = 1, 2, 1024, 1024, 16
    q, k, v, kpm = make_inputs(B, H, L, S, D, padding=True)
    q, k, v = q.float(), k.float(), v.float()
    for causal in (False, True):
        _, largest = largest_tensor(flash_attention_torch, q, k, v, is_causal=causal, key_padding_mask=kpm,
                                    block_m=128, block_n=64)
        # the biggest thing ever made is the score tile (B*H*128*64) or a copy of an input (B*H*L*D)
        assert largest <= max(B * H * 128 * 64, B * H * L * D) < B * H * L * S
        _, largest = largest_tensor(naive_attention, q, k, v, is_causal=causal, key_padding_mask=kpm)
        assert largest >= B * H * L * S  # the spy does see a full score matrix when one is made


def test_naive_attention_matches_reference():
    q, k, v, kpm = make_inputs(2, 2, 17, 23, 8, 5, padding=True)
    for causal in (False, True):
        ref, _ = reference(q, k, v, kpm, causal)
        assert_close(naive_attention(q, k, v, is_causal=causal, key_padding_mask=kpm), ref)


def test_dispatcher_picks_torch_on_cpu_and_matches():
    q, k, v, kpm = make_inputs(1, 2, 33, 47, 16, padding=True)
    assert choose_backend(q) == "torch"
    assert choose_backend(q, "triton") == "triton"
    ref, _ = reference(q, k, v, kpm, True)
    out = flash_attention(q, k, v, is_causal=True, key_padding_mask=kpm)
    assert_close(out, ref)
    out2 = attn_lib.flash_attention(q, k, v, is_causal=True, key_padding_mask=kpm, backend="torch")
    assert torch.equal(out, out2)


def _load_bench(name):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_benchmark_cases_run_and_tabulate():
    bench = _load_bench("cpu")
    args = bench.parse_args(["--quick", "--reps", "1", "--heads", "2", "--head-dim", "16"])
    assert args.sizes == list(bench.QUICK_SIZES)
    assert bench.parse_args([]).sizes == [1024, 4096, 8192, 16384]
    results = [bench.run_case(impl, 64, causal, args) for impl in bench.IMPLS for causal in (False, True)]
    for r in results:
        assert r["time_s"] > 0 and r["peak_extra_mib"] >= 0
    table = bench.format_table(results, bench.machine())
    assert table.count("\n") == 2 + 6 and "torch" in table.splitlines()[0]
    sdpa_rows = [line for line in table.splitlines() if " sdpa " in line]
    assert all(" 1.00 " in line for line in sdpa_rows)  # SDPA is the unit of the ratio column


def test_the_counter_tallies_every_key_block_read():
    """IOCounter: each of the ceil(L / block_m) query blocks reads every key block it needs."""
    from attn_lib.costs.io_model import IOCounter

    B, H, L, S, D, Dv = 1, 2, 5, 7, 3, 4
    q, k, v = torch.randn(B, H, L, D), torch.randn(B, H, S, D), torch.randn(B, H, S, Dv)
    blocks = 3  # ceil(5 / 2) query blocks of block_m = 2
    counter = IOCounter()
    flash_attention_torch(q, k, v, block_m=2, block_n=4, counter=counter, key_padding_mask=torch.ones(B, S, dtype=torch.bool))
    assert counter.reads["K"] == blocks * B * H * S * D  # 126
    assert counter.reads["V"] == blocks * B * H * S * Dv  # 168
    assert counter.reads["mask"] == blocks * B * H * S  # one bool per key
    counter = IOCounter()
    flash_attention_torch(q, k, v, block_m=2, block_n=4, counter=counter)
    assert "mask" not in counter.reads
    counter = IOCounter()
    flash_attention_torch(q, k, v, block_m=2, block_n=4, counter=counter, is_causal=True)
    # causal (top-left for L < S here): query rows 0-1 need keys 0..1, rows 2-3 keys 0..3, row 4 keys 0..4
    assert counter.reads["K"] == (2 + 4 + 5) * B * H * D
    assert counter.reads["V"] == (2 + 4 + 5) * B * H * Dv
