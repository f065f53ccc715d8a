"""``causal_offset`` of the FlashAttention core (``attn_lib.flash.autograd._flash_unchecked``): with
``is_causal``, query i sees key j iff ``j <= i + causal_offset``; ``S - L`` is the bottom-right
alignment of KV-cache decoding (``attn_lib.causal_mask(L, S, align="bottom-right")``).

Checked against the float64 reference ``attn_lib.attention`` given the same bool mask, forward
and backward, on the tiled torch path (with small blocks, so that block skipping and the
diagonal tiles are exercised) and on the Triton kernels (under the interpreter without a GPU,
in float32): odd L and S, L < S and L > S, offsets that hide whole rows and whole key blocks.
"""
import importlib.util
import os

import pytest
import torch

import attn_lib
from attn_lib.flash.autograd import _flash_unchecked
from attn_lib.flash.tiled_forward import _forward_tiles
from attn_lib.flash.tiled_backward import _backward_tiles
from attn_lib.tolerances import assert_close

from attn_paths import flash_inputs

DEVICE = torch.device(os.environ.get("ATTN_LIB_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu"))
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

# (L, S, causal_offset): bottom-right for L < S, L > S and L = S, plus offsets past either end.
SHAPES = [(5, 11, 6), (11, 5, -6), (7, 7, 0), (9, 13, 3), (13, 9, -2), (6, 9, 20), (9, 6, -20), (1, 17, 16)]


def offset_mask(L, S, offset):
    """(L, S) bool, True = query i may see key j, i.e. j <= i + offset."""
    return torch.ones(L, S, dtype=torch.bool).tril(diagonal=offset)


def reference(q, k, v, kpm, offset, dout):
    """float64 output and gradients of attn_lib.attention with the explicit bool mask."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    L, S = q.shape[2], k.shape[2]
    mask = offset_mask(L, S, offset)[None, None]  # (1,1,L,S)
    if kpm is not None:
        mask = mask & kpm[:, None, None, :]  # (B,1,L,S)
    out, _ = attn_lib.attention(q, k, v, mask=mask)  # (B,H,L,Dv)
    out.backward(dout.double())
    return out.detach(), q.grad, k.grad, v.grad


def test_bottom_right_offset_is_the_library_mask():
    # S - L is exactly what causal_mask(..., align="bottom-right") hides.
    for L, S in ((3, 7), (7, 3), (4, 4)):
        assert torch.equal(offset_mask(L, S, S - L), attn_lib.causal_mask(L, S, align="bottom-right"))


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("L,S,offset", SHAPES)
def test_torch_tiles_forward_backward(L, S, offset, padding):
    q, k, v, kpm = flash_inputs(2, 2, L, S, 8, 6, seed=L * 31 + S, padding=padding)
    dout = torch.randn(2, 2, L, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(S))
    ref_out, ref_dq, ref_dk, ref_dv = reference(q, k, v, kpm, offset, dout)
    scale = 8 ** -0.5
    for bm, bn in ((2, 3), (4, 2), (16, 16)):
        out, lse = _forward_tiles(q, k, v, kpm, causal=True, scale=scale, block_m=bm, block_n=bn, counter=None,
                                  causal_offset=offset)
        assert_close(out, ref_out, dtype=torch.float64)
        grads = _backward_tiles(q, k, v, out, lse, dout, kpm, causal=True, scale=scale, block_m=bm, block_n=bn,
                                causal_offset=offset)
        for got, want, name in zip(grads, (ref_dq, ref_dk, ref_dv), ("dq", "dk", "dv")):
            assert_close(got, want, dtype=torch.float64, what=f"{name} (blocks {bm}x{bn})")


@pytest.mark.parametrize("L,S,offset", SHAPES[:4])
def test_core_torch_autograd(L, S, offset):
    q, k, v, kpm = flash_inputs(1, 2, L, S, 8, seed=offset + 50, padding=True)
    dout = torch.randn(1, 2, L, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ref_out, *ref_grads = reference(q, k, v, kpm, offset, dout)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = _flash_unchecked(qg, kg, vg, is_causal=True, scale=8 ** -0.5, key_padding_mask=kpm, backend="torch",
                           check_overflow=True, causal_offset=offset)
    out.backward(dout)
    assert_close(out.detach(), ref_out, dtype=torch.float64)
    for got, want in zip((qg.grad, kg.grad, vg.grad), ref_grads):
        assert_close(got, want, dtype=torch.float64, what="gradient")


# The interpreter's tile is 32: lengths around 32 and 64 make several query and key blocks,
# so that the offset moves which blocks are skipped, fully visible or masked.
TRITON_SHAPES = [(33, 70, 37), (70, 33, -37), (45, 45, 0), (37, 66, 5), (66, 37, -40), (17, 40, 70)]


@needs_triton
@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("L,S,offset", TRITON_SHAPES)
def test_triton_forward_backward(L, S, offset, padding):
    q, k, v, kpm = flash_inputs(1, 2, L, S, 16, seed=L + S, padding=padding)
    dout = torch.randn(1, 2, L, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(L))
    ref_out, *ref_grads = reference(q, k, v, kpm, offset, dout)
    qg, kg, vg = (t.float().to(DEVICE).requires_grad_() for t in (q, k, v))
    kd = None if kpm is None else kpm.to(DEVICE)
    out = _flash_unchecked(qg, kg, vg, is_causal=True, scale=16 ** -0.5, key_padding_mask=kd, backend="triton",
                           check_overflow=True, causal_offset=offset)
    out.backward(dout.float().to(DEVICE))
    assert_close(out.detach().cpu(), ref_out, dtype=torch.float32)
    for got, want, name in zip((qg.grad, kg.grad, vg.grad), ref_grads, ("dq", "dk", "dv")):
        assert_close(got.cpu(), want, dtype=torch.float32, what=name)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("offset", [-4, -1, 0, 2])
@pytest.mark.parametrize("padding", ["none", "some", "all absent", "one per row"])
def test_rows_with_keys_says_which_queries_see_a_present_key(is_causal, offset, padding):
    from attn_lib.rules.numerics import rows_with_keys

    L, S = 5, 6
    kpm = {"none": None, "some": torch.tensor([[True, False, True, True, False, False], [False] * 3 + [True] * 3]),
           "all absent": torch.zeros(2, S, dtype=torch.bool),
           "one per row": torch.tensor([[False, False, True, False, False, False], [True] + [False] * 5])}[padding]
    got = rows_with_keys(L, S, kpm, is_causal, offset, "cpu")
    B = 1 if kpm is None else 2
    want = torch.tensor([[[any((kpm is None or bool(kpm[b, j])) and (not is_causal or j <= i + offset)
                           for j in range(S)) for i in range(L)]] for b in range(B)])  # (B,1,L), by a loop
    assert got.shape == want.shape and torch.equal(got, want)
    if kpm is not None:
        assert torch.equal(rows_with_keys(L, 0, kpm[:, :0], is_causal, offset, "cpu"), torch.zeros(B, 1, L, dtype=torch.bool))


def test_the_tiled_path_counts_what_it_reads_and_writes():
    from attn_lib.costs.io_model import IOCounter

    B, H, L, S, D, Dv, bm, bn = 1, 2, 10, 12, 3, 5, 4, 8
    q, k, v = (torch.randn(B, H, n, d, dtype=torch.float64) for n, d in ((L, D), (S, D), (S, Dv)))
    c = IOCounter()
    attn_lib.flash_attention_torch(q, k, v, block_m=bm, block_n=bn, counter=c)
    query_blocks = -(-L // bm)  # 3; every query block reads every key once (no mask, not causal)
    assert c.reads["Q"] == B * H * L * D and c.writes["O"] == B * H * L * Dv and c.writes["lse"] == B * H * L
    assert c.reads["K"] == query_blocks * B * H * S * D and c.reads["V"] == query_blocks * B * H * S * Dv
