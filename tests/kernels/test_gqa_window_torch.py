"""Grouped-query attention and sliding windows on the tiled torch path (attn_lib.flash.tiled_forward forward,
attn_lib.flash.tiled_backward backward, attn_lib.flash_attention(backend="torch")): against the float64
reference's autograd, torch SDPA with enable_gqa=True and a band mask built by a loop (independent of
attn_lib.rules.band); gradcheck in float64; block sizes that do not divide the lengths; fully masked rows;
the cost O(N·window) counted in visited blocks; no (B, H, L, S) tensor and no repeated K/V allocated."""
import pytest
import torch
import torch.nn.functional as F

import attn_lib
import attn_lib.flash.tiled_backward as flash_torch_backward
from attn_lib import flash_attention, flash_attention_torch, flash_attention_torch_backward
from attn_lib.flash.autograd import _flash_unchecked
from attn_lib.costs.io_model import IOCounter, largest_tensor
from attn_lib.core.reference import _attention_core
from attn_lib.tolerances import assert_close

HEADS = [(6, 2), (8, 1), (4, 4)]
WINDOWS = [(0, 0), (1, 0), (5, 0), (3, 2), (-1, 4), (50, 50)]  # (50, 50): wider than every sequence here
CASES = [(w, False) for w in WINDOWS] + [(w, True) for w in WINDOWS if w[1] <= 0]
BLOCKS = [(4, 3), (5, 7)]  # do not divide L = 13, S = 11 / 17


def ids(c):
    return "x".join(map(str, c)) if isinstance(c, tuple) else ("causal" if c is True else "full" if c is False else str(c))


def loop_band(L, S, window_size, is_causal=False, offset=0):
    left, right = window_size
    keep = torch.zeros(L, S, dtype=torch.bool)
    for i in range(L):
        for j in range(S):
            p = i + offset
            keep[i, j] = (left < 0 or j >= p - left) and (right < 0 or j <= p + right) and (not is_causal or j <= p)
    return keep


def qkv(B, H, Hkv, L, S, D=12, Dv=10, dtype=torch.float64, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    shapes = ((B, H, L, D), (B, Hkv, S, D), (B, Hkv, S, Dv))
    return tuple(torch.randn(*s, generator=g, dtype=dtype).requires_grad_(requires_grad) for s in shapes)


def padding(B, S):
    kpm = torch.ones(B, S, dtype=torch.bool)
    kpm[-1, S // 2:] = False  # the last sequence's second half is padding
    return kpm


def reference(q, k, v, kpm, causal, window, offset=0):
    """Float64 reference (out, dq, dk, dv) by autograd through attn_lib.core.reference._attention_core."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    mask = None if kpm is None else kpm[:, None, None, :]
    out, _ = _attention_core(q, k, v, mask, causal, q.shape[-1] ** -0.5, check_overflow=True, window_size=window,
                             offset=offset)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), dout)), dout


@pytest.mark.parametrize("heads", HEADS, ids=ids)
@pytest.mark.parametrize("window,causal", CASES, ids=ids)
@pytest.mark.parametrize("lengths", [(13, 11), (13, 17)], ids=ids)
def test_tiled_forward_and_backward_match_the_reference(heads, window, causal, lengths):
    (H, Hkv), (L, S) = heads, lengths
    q, k, v = qkv(2, H, Hkv, L, S)
    kpm = padding(2, S)
    (ref_out, *ref_grads), dout = reference(q, k, v, kpm, causal, window)
    for bm, bn in BLOCKS:
        out, lse = flash_attention_torch(q, k, v, is_causal=causal, key_padding_mask=kpm, block_m=bm, block_n=bn,
                                         enable_gqa=True, window_size=window)
        assert_close(out, ref_out, dtype=torch.float64)
        grads = flash_attention_torch_backward(q, k, v, out, lse, dout.to(q.dtype), is_causal=causal,
                                               key_padding_mask=kpm, block_m=bm, block_n=bn, enable_gqa=True,
                                               window_size=window)
        for got, want, name in zip(grads, ref_grads, "qkv"):
            assert got.shape == want.shape  # dk, dv have H_kv heads
            assert_close(got, want, dtype=torch.float64, what=f"d{name} blocks {bm}x{bn}")


@pytest.mark.parametrize("heads", HEADS, ids=ids)
@pytest.mark.parametrize("window", [(0, 0), (3, 2), (-1, 4), (5, 0)], ids=ids)
def test_tiled_path_matches_sdpa_with_gqa_and_a_loop_band(heads, window):
    H, Hkv = heads
    q, k, v = qkv(1, H, Hkv, 15, 9)
    visible = loop_band(15, 9, window)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=H != Hkv)
    seen = visible.any(-1)[:, None]  # (L,1): SDPA gives nan for a row that sees no key, we give 0
    want = torch.where(seen, want, torch.zeros_like(want))
    out, _ = flash_attention_torch(q, k, v, block_m=4, block_n=3, enable_gqa=True, window_size=window)
    assert_close(out, want, dtype=torch.float64)


@pytest.mark.parametrize("config", [(6, 2, (3, 2), False), (8, 1, (2, 0), True), (4, 4, (-1, 1), False)], ids=ids)
def test_gradcheck_float64_on_the_torch_path(config, monkeypatch):
    H, Hkv, window, causal = config
    for name, value in (("DEFAULT_BWD_BLOCK_M", 3), ("DEFAULT_BWD_BLOCK_N", 4)):
        monkeypatch.setattr(flash_torch_backward, name, value)
    monkeypatch.setattr(attn_lib.flash.tiled_forward, "DEFAULT_BLOCK_M", 4)
    monkeypatch.setattr(attn_lib.flash.tiled_forward, "DEFAULT_BLOCK_N", 3)
    q, k, v = qkv(1, H, Hkv, 7, 9, D=3, Dv=2, requires_grad=True)
    kpm = padding(1, 9)
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attention(q, k, v, is_causal=causal, key_padding_mask=kpm, backend="torch",
                                        enable_gqa=True, window_size=window), (q, k, v))


def test_fully_masked_rows_give_zero_outputs_and_zero_gradients():
    q, k, v = qkv(2, 6, 2, 12, 5, requires_grad=True)
    kpm = torch.tensor([[True] * 5, [True, True, False, False, False]])
    out = flash_attention(q, k, v, key_padding_mask=kpm, backend="torch", enable_gqa=True, window_size=(1, 0))
    # window (1, 0): queries >= 6 see no key at all; in sequence 1, queries >= 3 see only padding
    assert bool((out[:, :, 6:] == 0).all()) and bool((out[1, :, 3:] == 0).all())
    assert bool(out[0, :, :6].abs().sum(-1).gt(0).all())
    (out * torch.randn_like(out)).sum().backward()
    assert bool((q.grad[:, :, 6:] == 0).all()) and bool((q.grad[1, :, 3:] == 0).all())
    assert bool((k.grad[1, :, 2:] == 0).all()) and bool((v.grad[1, :, 2:] == 0).all())  # padding keys
    assert bool(q.grad[0, :, 1:5].abs().sum(-1).gt(0).all())


@pytest.mark.parametrize("offset", [0, 6, -4])
def test_causal_offset_aligns_the_window_forward_and_backward(offset):
    L, S = 9, 13
    q, k, v = qkv(1, 6, 3, L, S, requires_grad=True)
    (ref_out, *ref_grads), dout = reference(q, k, v, None, True, (3, 0), offset)
    out = _flash_unchecked(q, k, v, is_causal=True, scale=12 ** -0.5, key_padding_mask=None, backend="torch",
                           check_overflow=True, causal_offset=offset, window_size=(3, 0))
    assert_close(out, ref_out, dtype=torch.float64)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), dout), ref_grads):
        assert_close(got, want, dtype=torch.float64)


def test_float32_gqa_window_matches_the_float64_reference():
    q, k, v = qkv(2, 8, 2, 33, 29, dtype=torch.float32, requires_grad=True)
    (ref_out, *ref_grads), dout = reference(q, k, v, padding(2, 29), True, (7, 0))
    out = flash_attention(q, k, v, is_causal=True, key_padding_mask=padding(2, 29), backend="torch", enable_gqa=True,
                          window_size=(7, 0))
    assert out.dtype == torch.float32
    assert_close(out, ref_out, dtype=torch.float32)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), dout.float()), ref_grads):
        assert_close(got, want, dtype=torch.float32)


def test_a_window_row_that_sees_no_key_is_not_an_overflow_but_a_real_overflow_is():
    q, k, v = qkv(1, 4, 2, 8, 3, dtype=torch.float32)
    out, lse = flash_attention_torch(q, k, v, enable_gqa=True, window_size=(0, 0))  # queries 3..7 see no key
    assert bool(torch.isneginf(lse[..., 3:]).all()) and bool((out[..., 3:, :] == 0).all())
    with pytest.raises(ValueError, match=r"attention scores overflowed to \+inf"):
        flash_attention_torch(q * 1e20, k * 1e20, v, enable_gqa=True, window_size=(0, 0), scale=1e10)


def _key_blocks_forward(N, window, block, causal):
    q, k, v = qkv(1, 2, 1, N, N, D=4, Dv=4, dtype=torch.float32)
    counter = IOCounter()
    flash_attention_torch(q, k, v, is_causal=causal, block_m=block, block_n=block, counter=counter, enable_gqa=True,
                          window_size=window)
    return counter.reads["K"] // (block * 4)  # K elements read / (BLOCK_N · D) with one kv head: blocks visited


def _tiles_backward(N, window, block, causal, monkeypatch):
    calls = []
    real = flash_torch_backward._attn_bwd_dkdv
    monkeypatch.setattr(flash_torch_backward, "_attn_bwd_dkdv", lambda *a: calls.append(1) or real(*a))
    q, k, v = qkv(1, 2, 1, N, N, D=4, Dv=4, dtype=torch.float32)
    out, lse = flash_attention_torch(q, k, v, is_causal=causal, block_m=block, block_n=block, enable_gqa=True,
                                     window_size=window)
    flash_attention_torch_backward(q, k, v, out, lse, torch.ones_like(out), is_causal=causal, block_m=block,
                                   block_n=block, enable_gqa=True, window_size=window)
    monkeypatch.undo()
    return len(calls)


def test_the_cost_is_linear_in_the_window_not_quadratic(monkeypatch):
    """N = 1024, window 64 back, blocks of 64: each query block visits at most 2 key blocks (its own and the
    one before), forward and backward, i.e. 2·N/64 tiles, where full causal visits (N/64)(N/64 + 1)/2."""
    N, b = 1024, 64
    n = N // b
    assert _key_blocks_forward(N, (64, 0), b, True) == 2 * n - 1  # the first query block has no block before
    assert _key_blocks_forward(N, (-1, -1), b, True) == n * (n + 1) // 2
    assert _key_blocks_forward(N, (64, 64), b, False) == 3 * n - 2  # a window on both sides: 3 blocks
    assert _tiles_backward(N, (64, 0), b, True, monkeypatch) == 2 * n - 1
    assert _tiles_backward(N, (-1, -1), b, True, monkeypatch) == n * (n + 1) // 2


def test_no_score_matrix_and_no_repeated_k_v_are_allocated():
    """What it measures: the largest tensor any aten op returns during the call, forward and backward
    (attn_lib.costs.io_model.largest_tensor, independent of the allocator). L is small and S large, so K, V
    repeated to H heads (B·H·S·D) or the scores (B·H·L·S) would be the largest tensors; the tiled path stays
    at its inputs, its O(L·D) accumulators and one (B·H_kv, G·BLOCK_M, BLOCK_N) tile."""
    B, H, Hkv, L, S, D = 1, 8, 1, 16, 512, 16
    q, k, v = qkv(B, H, Hkv, L, S, D=D, Dv=D, dtype=torch.float32, requires_grad=True)
    tile = B * Hkv * (H // Hkv) * L * 256  # the backward's default BLOCK_N = 256, the forward's 256 too
    bound = max(q.numel(), k.numel(), v.numel(), tile)

    def train_step():
        out = flash_attention(q, k, v, backend="torch", enable_gqa=True, window_size=(100, 0), is_causal=True)
        out.sum().backward()

    _, largest = largest_tensor(train_step)
    assert largest <= bound < B * H * S * D == B * H * L * S  # 2x below the repeated K and the scores
    _, naive = largest_tensor(attn_lib.attention, q.detach(), k.detach(), v.detach(), enable_gqa=True)
    assert naive >= B * H * L * S  # the spy does see a (B, H, L, S) tensor where one is made


@pytest.mark.parametrize("sizes", [(2, 0, 5), (2, 5, 0), (0, 4, 4), (2, 0, 0)], ids=ids)
def test_empty_sizes_keep_the_query_heads(sizes):
    """No query, no key or no batch: shapes still follow q's H heads and k's H_kv heads (no crash in the views)."""
    B, L, S = sizes
    q, k, v = qkv(B, 6, 2, L, S, requires_grad=True)
    out = flash_attention(q, k, v, backend="torch", enable_gqa=True, window_size=(2, 0))
    ref, _ = attn_lib.attention(q, k, v, enable_gqa=True, window_size=(2, 0))
    assert out.shape == ref.shape == (B, 6, L, 10) and torch.equal(out, ref)
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


# The default query block 512 // G and the ceil(L / block) query blocks it makes for L = 1100, by hand.
DEFAULT_QUERY_BLOCKS = [((8, 8), 512, 3), ((8, 2), 128, 9), ((32, 8), 128, 9), ((6, 1), 85, 13)]


@pytest.mark.parametrize("heads, block_m, blocks", DEFAULT_QUERY_BLOCKS,
                         ids=[f"{h}x{kv}" for (h, kv), _, _ in DEFAULT_QUERY_BLOCKS])
def test_the_default_query_block_keeps_a_tile_of_512_rows_under_gqa(heads, block_m, blocks, monkeypatch):
    """G = H / H_kv query heads share a key/value head: the default block is 512 // G queries, a tile of
    at most 512 rows as without sharing; flash_attention(backend="torch") uses the same default."""
    (H, Hkv), (L, S, D) = heads, (1100, 40, 2)
    q, k, v = qkv(1, H, Hkv, L, S, D=D, Dv=D, dtype=torch.float32)
    counter = IOCounter()
    flash_attention_torch(q, k, v, enable_gqa=True, counter=counter)
    assert counter.reads["K"] == blocks * Hkv * S * D  # every query block reads every key once
    used = []
    tiles = attn_lib.flash.tiled_forward._forward_tiles
    monkeypatch.setattr(attn_lib.flash.tiled_forward, "_forward_tiles",
                        lambda *a, **kw: used.append(kw["block_m"]) or tiles(*a, **kw))
    flash_attention(q, k, v, backend="torch", enable_gqa=True)
    assert used == [block_m]


@pytest.mark.parametrize("window, causal", [((-1, -1), True), ((1, 0), False), ((0, 1), False)], ids=ids)
def test_a_score_that_overflows_outside_the_band_stays_hidden(window, causal):
    """A hidden pair whose float32 score overflows to +inf changes nothing (as in the reference), forward and
    backward: the tiled path hides band positions by min(score, -inf), which also holds for +inf."""
    q, k, v = qkv(1, 4, 2, 5, 5, D=4, Dv=3, dtype=torch.float32, requires_grad=False)
    q, k = q.clone(), k.clone()
    q[:, :, 0], k[:, :, 4] = 1e20, 1e20  # query 0 never sees key 4 in these bands; scale·q·k = inf in float32
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = flash_attention(q, k, v, is_causal=causal, window_size=window, backend="torch", enable_gqa=True)
    want, _ = attn_lib.attention(*(t.detach().double() for t in (q, k, v)), is_causal=causal, window_size=window,
                                 enable_gqa=True)
    assert_close(out.double(), want, dtype=torch.float32)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
