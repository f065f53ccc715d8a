"""attn_lib.costs.io_model: HBM traffic of standard attention and of tiled attention, against the paper's bounds,
against the paper's Algorithm 1 counted loop by loop here, and against counts instrumented from the tiled
implementation itself; the largest tensor a call creates; bytes of the score matrix and the KV cache."""
import math

import pytest
import torch

from attn_lib.costs import io_model
from attn_lib.flash.tiled_forward import flash_attention_torch
from attn_lib.tolerances import ASYMPTOTE_RTOL
from attn_lib.costs.io_model import (IOCounter, block_sizes, flash_attention_io, kv_cache_bytes, largest_tensor,
                                     score_matrix_bytes, standard_attention_io, tiled_attention_io, tiled_block_sizes)


def algorithm1_by_loops(N, d, M):
    """Walk the paper's Algorithm 1 loop by loop and tally every HBM read and write."""
    br, bc = block_sizes(d, M)
    reads = writes = 0
    writes += N * d + N + N  # line 2: O, l, m initialised in HBM
    for j0 in range(0, N, bc):
        cols = min(bc, N - j0)
        reads += 2 * cols * d  # line 6: K_j, V_j
        for i0 in range(0, N, br):
            rows = min(br, N - i0)
            reads += 2 * rows * d + 2 * rows  # line 8: Q_i, O_i, l_i, m_i
            writes += rows * d + 2 * rows  # lines 12-13: O_i, l_i, m_i
    return reads, writes


@pytest.mark.parametrize("N,d,M", [(64, 16, 1024), (100, 16, 1000), (257, 32, 4096), (1000, 64, 20000), (33, 8, 64)])
def test_algorithm1_closed_form_equals_loop_count(N, d, M):
    model = flash_attention_io(N, d, M)
    reads, writes = algorithm1_by_loops(N, d, M)
    assert (model["reads"], model["writes"]) == (reads, writes)
    assert model["Bc"] == math.ceil(M / (4 * d)) and model["Br"] == min(model["Bc"], d)


def test_standard_attention_is_theta_nd_plus_n_squared():
    for d in (16, 64, 128):
        ratios = [standard_attention_io(N, d)["total"] / (N * d + N * N) for N in (2**k for k in range(4, 16))]
        assert all(1 <= r <= 4 for r in ratios)
    assert standard_attention_io(100, 10)["total"] == 4 * 100 * 10 + 4 * 100 * 100


@pytest.mark.parametrize("d,M", [(64, 100_000), (128, 50_000), (32, 8192)])
def test_flash_io_is_theta_n2d2_over_m(d, M):
    Ns = [2**k for k in range(8, 18) if 2**k * d >= M]  # the theorem's range: d <= M <= Nd
    assert len(Ns) >= 5
    ratios = [flash_attention_io(N, d, M)["total"] / (N * N * d * d / M) for N in Ns]
    # bounded above and below, and settling to the constant 12 + 16/d of the leading term
    # (Tc = ceil(N / Bc) ~ 4Nd/M passes over Q, O, l, m): a statement about the formula, not a float tolerance
    assert max(ratios) / min(ratios) < 2
    assert abs(ratios[-1] - ratios[-2]) / ratios[-1] < ASYMPTOTE_RTOL
    assert abs(ratios[-1] / (12 + 16 / d) - 1) < ASYMPTOTE_RTOL  # the constant of the leading term
    # and the same for the loop order of attn_lib's tiled code, with its block sizes for M
    bm, bn = tiled_block_sizes(d, M)
    tiled = [tiled_attention_io(N, N, d, bm, bn)["total"] / (N * N * d * d / M) for N in Ns]
    assert max(tiled) / min(tiled) < 2
    assert abs(tiled[-1] - tiled[-2]) / tiled[-1] < ASYMPTOTE_RTOL


def test_flash_saves_traffic_and_more_sram_saves_more():
    N, d = 4096, 64
    std = standard_attention_io(N, d)["total"]
    totals = [flash_attention_io(N, d, M)["total"] for M in (16_384, 65_536, 262_144)]
    assert totals[0] > totals[1] > totals[2]
    assert std / totals[1] > 1  # with an A100-sized SRAM, far fewer accesses than standard attention


@pytest.mark.parametrize("L,S,D,Dv,bm,bn,causal,padding", [
    (64, 64, 16, 16, 16, 16, False, False),
    (97, 113, 16, 8, 32, 16, True, False),
    (113, 97, 8, 8, 7, 5, True, True),
    (33, 70, 4, 4, 64, 32, False, True),
    (1, 1, 4, 4, 16, 16, True, False),
])
def test_tiled_model_equals_instrumented_counts(L, S, D, Dv, bm, bn, causal, padding):
    B, H = 2, 3
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, n, e, generator=gen) for n, e in ((L, D), (S, D), (S, Dv)))
    kpm = (torch.rand(B, S, generator=gen) > 0.2) if padding else None
    counter = IOCounter()
    flash_attention_torch(q, k, v, is_causal=causal, key_mask=kpm, block_m=bm, block_n=bn, counter=counter)
    model = tiled_attention_io(L, S, D, bm, bn, is_causal=causal, dv=Dv, key_mask=padding)
    assert counter.reads == {name: B * H * n for name, n in model["by_tensor_reads"].items()}
    assert counter.writes == {name: B * H * n for name, n in model["by_tensor_writes"].items()}
    assert counter.total == B * H * model["total"]


def test_causal_reads_about_half_the_keys():
    full = tiled_attention_io(4096, 4096, 64, 128, 64)["by_tensor_reads"]["K"]
    causal = tiled_attention_io(4096, 4096, 64, 128, 64, is_causal=True)["by_tensor_reads"]["K"]
    assert 0.5 < causal / full < 0.52


def test_score_matrix_is_quadratic_and_kv_cache_linear():
    assert score_matrix_bytes(1, 8, 2048, 2048) / score_matrix_bytes(1, 8, 1024, 1024) == 4
    assert kv_cache_bytes(32, 1, 32, 2048, 128) / kv_cache_bytes(32, 1, 32, 1024, 128) == 2
    assert score_matrix_bytes(1, 1, 3, 5, bytes_per_element=2) == 30


def test_largest_tensor_sees_the_score_matrix_of_naive_attention():
    q, k, v = (torch.randn(2, 3, n, 4, generator=torch.Generator().manual_seed(0)) for n in (5, 7, 7))

    def naive(q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v  # (B,H,L,S) scores, then (B,H,L,Dv)

    out, largest = largest_tensor(naive, q, k, v)
    assert largest == 2 * 3 * 5 * 7 and out.shape == (2, 3, 5, 4)
    assert largest_tensor(torch.zeros, 3, 4)[1] == 12


def test_bad_arguments():
    with pytest.raises(ValueError, match="M=8 must hold"):
        block_sizes(16, 8)
    with pytest.raises(ValueError, match="N must be a positive int"):
        flash_attention_io(0, 16, 1024)
    assert set(io_model.__all__) >= {"standard_attention_io", "flash_attention_io", "tiled_attention_io"}
