"""The split-KV rules of chapter 13 (``attn_lib.flash.splits``): how many splits ``choose_num_splits``
picks (its rule worked by hand), the splits ``split_bounds`` cuts (contiguous whole blocks, shared out
evenly) and ``merge_partials`` (the log-sum-exp rule) against one softmax over the whole row; their
bad arguments."""
import math

import pytest
import torch

from attn_lib import merge_partials
from attn_lib.flash.splits import DECODE_BLOCK_N, choose_num_splits, device_workers, split_bounds
from attn_lib.tolerances import assert_close


# --- the split count ---------------------------------------------------------------------------------------

def test_choose_num_splits_fills_the_device_with_whole_blocks():
    assert choose_num_splits(8, 16384, workers=132) == 17  # ceil(132 / 8) work items per pair
    assert choose_num_splits(256, 16384, workers=132) == 1  # enough pairs already
    assert choose_num_splits(8, 1024, workers=132) == 4  # 8 blocks, at least 2 per split
    assert choose_num_splits(8, 16384, workers=2) == 1  # a 2-thread CPU: one pass
    assert choose_num_splits(1, 300, workers=1000, min_blocks=1) == 3  # never more splits than blocks
    assert choose_num_splits(4, 100, workers=64) == choose_num_splits(4, 0, workers=64) == 1
    assert choose_num_splits(0, 4096, workers=8) == 1
    assert choose_num_splits(2, 1000, workers=64, block_n=100, min_blocks=3) == 3  # 10 blocks, >= 3 per split


def test_workers_default_to_the_thread_count_on_a_cpu():
    threads = torch.get_num_threads()
    assert device_workers("cpu") == threads
    assert choose_num_splits(1, 64 * DECODE_BLOCK_N, min_blocks=1) == min(threads, 64)


@pytest.mark.parametrize("S,P", [(1, 1), (17, 8), (1000, 3), (4099, 8), (4099, 100), (256, 2), (0, 3)])
def test_splits_are_contiguous_whole_blocks_shared_out_evenly(S, P):
    bounds = split_bounds(S, P)
    n_blocks = -(-S // DECODE_BLOCK_N)
    assert len(bounds) == max(min(P, n_blocks), 1)
    assert bounds[0][0] == 0 and bounds[-1][1] == S
    assert all(a1 == b0 for (_, a1), (b0, _) in zip(bounds, bounds[1:]))
    if S:
        assert all(s1 > s0 and s0 % DECODE_BLOCK_N == 0 for s0, s1 in bounds)
        sizes = [-(-(s1 - s0) // DECODE_BLOCK_N) for s0, s1 in bounds]
        assert max(sizes) - min(sizes) <= 1  # blocks shared out evenly


def test_split_bounds_with_another_block_size():
    assert split_bounds(10, 3, block_n=4) == [(0, 4), (4, 8), (8, 10)]
    assert split_bounds(10, 2, block_n=4) == [(0, 4), (4, 10)]


BAD = [
    ("split_bounds: no split", lambda: split_bounds(10, 0), ValueError, r"^num_splits must be a positive int, got 0"),
    ("split_bounds: S < 0", lambda: split_bounds(-1, 2), ValueError, r"^S must be an int >= 0, got -1$"),
    ("split_bounds: block_n 0", lambda: split_bounds(10, 2, block_n=0), ValueError,
     r"^block_n must be a positive int, got 0"),
    ("choose_num_splits: S < 0", lambda: choose_num_splits(8, -1), ValueError, r"^S must be an int >= 0, got -1$"),
    ("choose_num_splits: workers 0", lambda: choose_num_splits(8, 10, workers=0), ValueError,
     r"^workers must be a positive int, got 0$"),
    ("choose_num_splits: batch_heads a float", lambda: choose_num_splits(2.0, 10), TypeError, r"^batch_heads must be"),
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
]


@pytest.mark.parametrize("row", BAD, ids=[r[0] for r in BAD])
def test_bad_arguments_give_the_one_error(row):
    _, call, exc, pattern = row
    with pytest.raises(exc, match=pattern):
        call()


# --- the merge -----------------------------------------------------------------------------------------------

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
    assert not bool(out[3].any()) and bool(torch.isneginf(lse[3]))
    half, lse32 = merge_partials(torch.stack(outs, -2).half(), torch.stack(lses, -1).float())
    assert (half.dtype, lse32.dtype) == (torch.float16, torch.float32)
    assert_close(half[:3], want, dtype=torch.float16)


def test_merge_partials_keeps_large_log_sum_exps_finite():
    """lse of thousands: exp(lse) would overflow even float64; the rule subtracts the largest first."""
    outs = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]], dtype=torch.float64)  # (1,P=2,Dv=2)
    lses = torch.tensor([[3000.0, 3000.0 + math.log(3.0)]], dtype=torch.float64)  # weights 1 : 3
    out, lse = merge_partials(outs, lses)
    assert_close(out, torch.tensor([[0.25, 0.75]], dtype=torch.float64), dtype="float64")
    assert_close(lse, torch.tensor([3000.0 + math.log(4.0)], dtype=torch.float64),
                 dtype="float64")


def test_merge_partials_is_differentiable():
    g = torch.Generator().manual_seed(5)
    outs = torch.randn(3, 4, 2, generator=g, dtype=torch.float64, requires_grad=True)  # (R,P,Dv)
    lses = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)  # (R,P)
    out, _ = merge_partials(outs, lses)
    direct = (torch.softmax(lses, -1)[..., None] * outs).sum(-2)  # (R,Dv): the weights are a softmax of the lses
    assert_close(out, direct, dtype="float64")
    assert torch.autograd.gradcheck(lambda o, l: merge_partials(o, l)[0], (outs, lses))
