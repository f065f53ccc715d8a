"""Grouped-query attention (``enable_gqa``) and sliding windows (``window_size``) on the float64 reference
``attn_lib.attention`` / ``_attention_core`` and the mask builder ``attn_lib.sliding_window_mask``, against
independent oracles: torch SDPA with ``enable_gqa=True`` and an explicit band mask built by a loop here
(not from ``attn_lib.rules.band``), and the reference itself with K, V repeated by hand."""
import pytest
import torch
import torch.nn.functional as F

import attn_lib
from attn_lib.costs.io_model import largest_tensor
from attn_lib.core.reference import _attention_core
from attn_lib.tolerances import assert_close

HEADS = [(6, 2), (8, 1), (4, 4)]  # (H, H_kv): GQA, MQA, plain multi-head
WINDOWS = [(0, 0), (1, 0), (5, 0), (3, 2), (-1, 4), (40, 40), (-1, -1)]  # (40, 40): wider than every sequence here
LENGTHS = [(7, 7), (9, 13), (13, 5)]  # odd, L < S, L > S
# every window without is_causal, and with it those whose right side is 0 or -1 (right > 0 is refused)
WINDOW_CASES = [(w, False) for w in WINDOWS] + [(w, True) for w in WINDOWS if w[1] <= 0]


def loop_band(L, S, window_size, is_causal=False, offset=0):
    """The visibility rule written out with loops: query i sees key j iff i+o-left <= j <= i+o+right."""
    left, right = window_size
    keep = torch.zeros(L, S, dtype=torch.bool)
    for i in range(L):
        for j in range(S):
            p = i + offset  # the query's position among the keys
            ok = (left < 0 or j >= p - left) and (right < 0 or j <= p + right)
            if is_causal:
                ok = ok and j <= p
            keep[i, j] = ok
    return keep


def qkv(B, H, Hkv, L, S, D=12, Dv=10, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, L, D, generator=g, dtype=dtype), torch.randn(B, Hkv, S, D, generator=g, dtype=dtype),
            torch.randn(B, Hkv, S, Dv, generator=g, dtype=dtype))


def sdpa_oracle(q, k, v, visible):
    """torch SDPA with enable_gqa=True and a bool mask; rows that see no key are set to 0 (SDPA gives nan there)."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=k.shape[1] != q.shape[1])
    seen = visible.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2]).any(-1, keepdim=True)  # (B,H,L,1)
    return torch.where(seen, out, torch.zeros_like(out)), seen


def case_ids(value):
    return "x".join(str(x) for x in value) if isinstance(value, tuple) else str(value)


@pytest.mark.parametrize("heads", HEADS, ids=case_ids)
@pytest.mark.parametrize("lengths", LENGTHS, ids=case_ids)
@pytest.mark.parametrize("window,causal", WINDOW_CASES, ids=lambda c: case_ids(c) if isinstance(c, tuple) else
                         ("causal" if c else "full"))
def test_reference_matches_sdpa_with_gqa_and_a_loop_band(heads, lengths, window, causal):
    (H, Hkv), (L, S) = heads, lengths
    q, k, v = qkv(2, H, Hkv, L, S)
    kpm = torch.ones(2, S, dtype=torch.bool)
    kpm[1, S // 2:] = False  # the second sequence's last keys are padding
    out, scores = attn_lib.attention(q, k, v, mask=kpm[:, None, None, :], is_causal=causal, enable_gqa=True,
                                     window_size=window)
    visible = loop_band(L, S, window, causal)[None, None] & kpm[:, None, None, :]  # (B,1,L,S)
    want, seen = sdpa_oracle(q, k, v, visible)
    assert_close(out, want, dtype=torch.float64)
    assert scores.shape == (2, H, L, S)
    assert bool((scores[~visible.expand_as(scores)] == 0).all())  # nothing outside the band and the padding
    assert_close(scores.sum(-1), seen.squeeze(-1).to(scores.dtype).expand(2, H, L), dtype=torch.float64)


@pytest.mark.parametrize("heads", HEADS, ids=case_ids)
def test_gqa_equals_attention_with_k_v_repeated_by_hand(heads):
    H, Hkv = heads
    q, k, v = qkv(1, H, Hkv, 9, 11)
    G = H // Hkv
    out, scores = attn_lib.attention(q, k, v, enable_gqa=True, window_size=(3, 2))
    rep_out, rep_scores = attn_lib.attention(q, k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1),
                                             window_size=(3, 2))
    assert_close(out, rep_out, dtype=torch.float64)
    assert_close(scores, rep_scores, dtype=torch.float64)
    # query head h uses key/value head h // G: moving kv head 0 changes query heads 0..G-1 only
    k2 = k.clone()
    k2[:, 0] += 1.0
    out2, _ = attn_lib.attention(q, k2, v, enable_gqa=True, window_size=(3, 2))
    changed = (out2 - out).abs().amax(dim=(0, 2, 3)) > 0  # (H,)
    assert changed.tolist() == [h < G for h in range(H)]


def test_gqa_gradients_match_sdpa():
    q, k, v = (t.requires_grad_() for t in qkv(2, 6, 2, 7, 9))
    out, _ = attn_lib.attention(q, k, v, enable_gqa=True, is_causal=True)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    dout = torch.randn_like(out)
    mine = torch.autograd.grad(out, (q, k, v), dout)
    theirs = torch.autograd.grad(ref, (q, k, v), dout)
    for a, b, name in zip(mine, theirs, "qkv"):
        assert a.shape == b.shape
        assert_close(a, b, dtype=torch.float64, what=f"d{name}")


def test_window_and_an_additive_mask_combine():
    q, k, v = qkv(1, 4, 2, 8, 8)
    bias = torch.randn(8, 8, dtype=torch.float64)
    out, _ = attn_lib.attention(q, k, v, mask=bias, enable_gqa=True, window_size=(2, 1))
    visible = loop_band(8, 8, (2, 1))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.masked_fill(~visible, float("-inf")),
                                          enable_gqa=True)
    assert_close(out, want, dtype=torch.float64)


@pytest.mark.parametrize("offset", [0, 4, -3])
def test_core_offset_aligns_the_window(offset):
    q, k, v = qkv(1, 6, 3, 5, 9)
    out, scores = _attention_core(q, k, v, None, True, 12 ** -0.5, check_overflow=True, window_size=(2, 0),
                                  offset=offset)
    visible = loop_band(5, 9, (2, 0), True, offset)
    want, _ = sdpa_oracle(q, k, v, visible)
    assert_close(out, want, dtype=torch.float64)
    assert bool((scores[..., ~visible] == 0).all())


def test_fully_hidden_rows_give_zeros_and_zero_gradients():
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, 2, 9, 4))
    out, scores = attn_lib.attention(q, k, v, enable_gqa=True, window_size=(0, 0))  # queries 4..8 see no key
    assert bool((out[:, :, 4:] == 0).all()) and bool((scores[:, :, 4:] == 0).all())
    assert bool(out[:, :, :4].abs().sum(-1).gt(0).all())
    (out * torch.randn_like(out)).sum().backward()
    assert bool((q.grad[:, :, 4:] == 0).all())  # (window (0, 0): one key per row, so dq = 0 everywhere)
    assert bool(v.grad.abs().sum(-1).gt(0).all())  # each of the 4 keys is seen by its own query


def test_reference_never_repeats_k_and_v():
    """What it measures: the largest tensor any aten op returns during the call (attn_lib.costs.io_model.largest_tensor).
    Here L is small and D large, so K, V repeated to H heads (B·H·S·D) would be the largest tensor by far; the
    call stays at the (B, H, L, S) scores or the inputs."""
    B, H, Hkv, L, S, D = 1, 8, 1, 2, 16, 32
    q, k, v = qkv(B, H, Hkv, L, S, D=D, Dv=D)
    _, largest = largest_tensor(attn_lib.attention, q, k, v, enable_gqa=True, window_size=(4, 0))
    assert largest <= max(B * H * L * S, k.numel(), q.numel())
    assert largest < B * H * S * D // 2  # 8x below repeated K


@pytest.mark.parametrize("lengths", [(5, 5), (4, 7), (7, 4)], ids=case_ids)
@pytest.mark.parametrize("window", [(0, 0), (1, 0), (3, 2), (-1, 4), (9, 9), (-1, -1)], ids=case_ids)
@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
def test_sliding_window_mask_matches_the_loop(lengths, window, align):
    L, S = lengths
    offset = 0 if align == "top-left" else S - L
    got = attn_lib.sliding_window_mask(L, S, window_size=window, align=align)
    assert got.dtype == torch.bool and got.shape == (L, S)
    assert torch.equal(got, loop_band(L, S, window, False, offset))
    if window[1] in (-1, 0):
        causal = attn_lib.sliding_window_mask(L, S, window_size=list(window), is_causal=True, align=align)
        assert torch.equal(causal, loop_band(L, S, window, True, offset))


def test_sliding_window_mask_without_limits_is_causal_mask():
    for align in ("top-left", "bottom-right"):
        assert torch.equal(attn_lib.sliding_window_mask(4, 6, window_size=(-1, 0), align=align),
                           attn_lib.causal_mask(4, 6, align=align))
    assert bool(attn_lib.sliding_window_mask(3, window_size=(-1, -1)).all())
    assert attn_lib.sliding_window_mask(0, 3, window_size=(1, 0)).shape == (0, 3)


def test_window_as_mask_equals_window_size():
    q, k, v = qkv(2, 6, 2, 9, 9)
    a, sa = attn_lib.attention(q, k, v, enable_gqa=True, window_size=(3, 1))
    b, sb = attn_lib.attention(q, k, v, enable_gqa=True, mask=attn_lib.sliding_window_mask(9, window_size=(3, 1)))
    assert torch.equal(a, b) and torch.equal(sa, sb)


def test_float32_gqa_window_matches_float64_reference():
    q, k, v = qkv(1, 8, 2, 11, 13, dtype=torch.float32)
    out, _ = attn_lib.attention(q, k, v, enable_gqa=True, window_size=(4, 0), is_causal=True)
    ref, _ = attn_lib.attention(q.double(), k.double(), v.double(), enable_gqa=True, window_size=(4, 0), is_causal=True)
    assert out.dtype == torch.float32
    assert_close(out, ref, dtype=torch.float32)
