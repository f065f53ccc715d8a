"""The Triton kernels with grouped-query attention (GQA/MQA) and sliding windows, forward and backward.

``flash_attention_triton(..., enable_gqa=True, window_size=(left, right))`` and its backward
against a float64 answer computed here by an independent plain-torch formula: K and V repeated
over the group with ``repeat_interleave`` (in this test only; the kernels read the shared head in
place) and the visible band built by a loop from flash-attn's definition (query i sees key j iff
``i + offset - left <= j <= i + offset + right``, -1 = unbounded; ``is_causal`` hides j > i + offset).
float32 must meet the float32 tolerance of ``attn_lib.tolerances``; float16 and bfloat16 follow
flash-attn's 2x rule (error at most twice that of the same formula computed in that precision,
plus a small floor).
Without a GPU this runs under Triton's interpreter (attn_lib.device sets it once per process),
so the sizes are tiny; block sizes 16 and 32 do not divide the odd lengths.
"""
import importlib.util
import os

import pytest
import torch

from attn_lib.flash.autograd import flash_attention_triton, flash_attention_triton_backward
from attn_lib.tolerances import FLASH_ERROR_FLOOR, FLASH_ERROR_RATIO, assert_close, lse_atol, max_abs_error

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

DEVICE = torch.device(os.environ.get("ATTN_LIB_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu"))
D, DV = 12, 10  # not powers of two, D != Dv


def band_by_loop(L, S, window, causal, offset):
    """(L, S) bool, True = query i sees key j, written out from flash-attn's rule (not from attn_lib.rules.band)."""
    left, right = window
    visible = torch.zeros(L, S, dtype=torch.bool)
    for i in range(L):
        for j in range(S):
            ok = not (causal and j > i + offset)
            ok = ok and not (left >= 0 and j < i + offset - left)
            ok = ok and not (right >= 0 and j > i + offset + right)
            visible[i, j] = ok
    return visible


def plain_attention(q, k, v, visible):
    """out (B,H,L,Dv) and lse (B,H,L) of the plain formula in q's dtype; K, V repeated over the group."""
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)  # (B,H_kv,S,*) -> (B,H,S,*)
    s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B,H,L,S)
    s = s.masked_fill(~visible, float("-inf"))
    seen = visible.any(-1, keepdim=True)  # (B,1,L,1): rows with at least one key
    lse = torch.logsumexp(s, dim=-1)  # (B,H,L), -inf for a row that sees nothing
    p = torch.softmax(s.masked_fill(~seen, 0.0), dim=-1).masked_fill(~seen, 0.0)  # (B,H,L,S)
    return p @ v, lse  # (B,H,L,Dv), (B,H,L)


def plain_with_grads(q, k, v, dout, visible, dtype):
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    out, lse = plain_attention(q, k, v, visible)
    grads = torch.autograd.grad(out, (q, k, v), dout.to(dtype))
    return out.detach(), lse.detach(), grads


def make_case(B, H, H_kv, L, S, padding, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=gen, dtype=torch.float64)
    k = torch.randn(B, H_kv, S, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H_kv, S, DV, generator=gen, dtype=torch.float64)
    dout = torch.randn(B, H, L, DV, generator=gen, dtype=torch.float64)
    kpm = None
    if padding:
        kpm = torch.rand(B, S, generator=gen) > 0.3  # True = key present
        kpm[0, :3] = False
        if B > 1:
            kpm[-1] = False  # a sequence with no keys at all: every row fully masked
    return q, k, v, dout, kpm


def assert_rule(fast, naive, ref, dtype, what):
    """flash-attn's rule: error <= 2 x the same formula's error in dtype + atol (atol as test_flash_triton_backward)."""
    r = ref.to(dtype)
    atol = max(FLASH_ERROR_FLOOR, 2 * float(((r + 0.3 - 0.3) - r).abs().max())) if r.numel() else FLASH_ERROR_FLOOR
    fast_err, naive_err = max_abs_error(fast, ref), max_abs_error(naive, ref)
    assert fast_err <= FLASH_ERROR_RATIO * naive_err + atol, (
        f"{what}: error {fast_err:.3e} > {FLASH_ERROR_RATIO} x naive error {naive_err:.3e} + atol {atol:.2e}")


def run_case(shape, window, causal, offset, padding, dtype, blocks, seed=0, check_finite=True):
    B, H, H_kv, L, S = shape
    q, k, v, dout, kpm = make_case(B, H, H_kv, L, S, padding, seed)
    visible = band_by_loop(L, S, window, causal, offset)[None, None]  # (1,1,L,S)
    if kpm is not None:
        visible = visible & kpm[:, None, None, :]  # (B,1,L,S)
    ref_out, ref_lse, ref_grads = plain_with_grads(q, k, v, dout, visible, torch.float64)
    ql, kl, vl, dol = (t.to(DEVICE, dtype) for t in (q, k, v, dout))
    kw = dict(is_causal=causal, causal_offset=offset, window_size=window, enable_gqa=H != H_kv,
              key_padding_mask=None if kpm is None else kpm.to(DEVICE), check_finite=check_finite,
              block_m=blocks[0], block_n=blocks[1])
    out, lse = flash_attention_triton(ql, kl, vl, **kw)
    grads = flash_attention_triton_backward(ql, kl, vl, out, lse, dol, **kw)
    out, lse, grads = out.cpu(), lse.cpu(), [g.cpu() for g in grads]
    assert out.shape == (B, H, L, DV) and out.dtype == dtype
    assert [tuple(g.shape) for g in grads] == [(B, H, L, D), (B, H_kv, S, D), (B, H_kv, S, DV)]
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))  # the rows that see no key
    fin = torch.isfinite(ref_lse)
    assert torch.allclose(lse[fin].double(), ref_lse[fin], atol=lse_atol(dtype))
    names = ("out", "dq", "dk", "dv")
    if dtype == torch.float32:
        for name, got, ref in zip(names, [out, *grads], [ref_out, *ref_grads]):
            assert_close(got, ref, what=f"{name} {shape} window={window}")
    else:
        naive_out, _, naive_grads = plain_with_grads(q, k, v, dout, visible, dtype)
        for name, got, naive, ref in zip(names, [out, *grads], [naive_out, *naive_grads], [ref_out, *ref_grads]):
            assert torch.isfinite(got).all(), name
            assert_rule(got, naive, ref, dtype, f"{name} {dtype} {shape} window={window}")
    return ref_out, ref_lse


F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
CASES = [  # (B, H, H_kv, L, S), window, is_causal, causal_offset, padding, dtype, (block_m, block_n)
    ((1, 6, 2, 37, 29), (3, 2), False, 0, False, F32, (16, 16)),
    ((1, 8, 1, 19, 41), (5, 0), True, 0, True, F32, (16, 16)),  # MQA, L < S
    ((1, 4, 4, 33, 21), (-1, 4), False, 0, False, F32, (16, 32)),  # no GQA, L > S
    ((2, 6, 2, 23, 23), (0, 0), False, 0, True, F32, (16, 16)),  # a key sees only itself; padded keys hide rows
    ((1, 6, 2, 41, 23), (1, 0), True, 0, False, F32, (32, 16)),  # rows past S see one or no key
    ((1, 4, 2, 17, 45), (1, 0), True, 28, True, F32, (16, 16)),  # bottom-right (KV-cache decoding)
    ((1, 8, 1, 21, 35), (100, 100), False, 0, False, F32, (16, 16)),  # wider than the sequence
    ((1, 4, 4, 29, 19), (2, 3), False, -12, False, F32, (16, 16)),  # offset hides the first rows entirely
    ((1, 6, 2, 37, 29), (3, 2), False, 0, True, F16, (16, 16)),
    ((1, 8, 1, 19, 41), (-1, 4), False, 0, False, F16, (32, 16)),
    ((1, 4, 4, 33, 33), (5, 0), True, 0, True, F16, (16, 32)),
    ((1, 6, 2, 23, 19), (1, 0), True, 0, True, BF16, (16, 16)),  # bf16: every tl.dot in fp32 under the interpreter
]


@pytest.mark.parametrize("shape,window,causal,offset,padding,dtype,blocks", CASES,
                         ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple) else str(c).replace("torch.", ""))
def test_gqa_window_forward_backward_match_the_plain_formula(shape, window, causal, offset, padding, dtype, blocks):
    ref_out, ref_lse = run_case(shape, window, causal, offset, padding, dtype, blocks)
    assert torch.isfinite(ref_out).all()
    if padding and shape[0] > 1:  # the fully padded sequence: every row sees nothing, output exactly 0
        assert torch.isneginf(ref_lse[-1]).all()


def test_fully_masked_rows_get_zero_output_and_gradients():
    # window (0, 0) with L > S: queries i >= S see no key; causal_offset -3 hides queries 0..2 as well.
    B, H, H_kv, L, S = 1, 4, 2, 21, 13
    q, k, v, dout, _ = make_case(B, H, H_kv, L, S, False, seed=3)
    ql, kl, vl, dol = (t.to(DEVICE, torch.float32) for t in (q, k, v, dout))
    kw = dict(window_size=(0, 0), causal_offset=-3, enable_gqa=True, block_m=16, block_n=16)
    out, lse = flash_attention_triton(ql, kl, vl, **kw)
    dq, dk, dv = (g.cpu() for g in flash_attention_triton_backward(ql, kl, vl, out, lse, dol, **kw))
    empty = torch.tensor([i < 3 or i - 3 >= S for i in range(L)])  # (L,) rows that see no key
    assert int(empty.sum()) == 3 + (L - (S + 3))
    assert torch.isneginf(lse.cpu()[:, :, empty]).all() and torch.isfinite(lse.cpu()[:, :, ~empty]).all()
    assert torch.equal(out.cpu()[:, :, empty], torch.zeros(B, H, int(empty.sum()), DV))
    assert torch.equal(dq[:, :, empty], torch.zeros(B, H, int(empty.sum()), D))
    assert (dq[:, :, ~empty] != 0).any() and torch.isfinite(dk).all() and torch.isfinite(dv).all()


def test_blocks_outside_the_band_are_never_read():
    # NaN in K, V and Q where no query block's band reaches: a kernel that loaded those blocks
    # (even masked: 0 · NaN = NaN in the dot) would return NaN. One query block sees keys 35..55
    # (window (5, 0), offset 40), so key blocks 0-1 and 4 are skipped by the forward and dq kernels;
    # in the second call one key block is seen only by queries 40..57, so query blocks 0-1 are
    # skipped by the dK/dV kernel.
    for L, S, offset, poison_keys, poison_queries in ((16, 80, 40, list(range(32)) + list(range(64, 80)), []),
                                                      (64, 16, -40, [], list(range(32)))):
        q, k, v, dout, _ = make_case(1, 4, 2, L, S, False, seed=5)
        visible = band_by_loop(L, S, (5, 0), True, offset)[None, None]  # (1,1,L,S)
        ref_out, _, ref_grads = plain_with_grads(q, k, v, dout, visible, torch.float64)
        k[:, :, poison_keys] = float("nan")
        v[:, :, poison_keys] = float("nan")
        q[:, :, poison_queries] = float("nan")
        ql, kl, vl, dol = (t.to(DEVICE, torch.float32) for t in (q, k, v, dout))
        kw = dict(is_causal=True, causal_offset=offset, window_size=(5, 0), enable_gqa=True, check_finite=False,
                  block_m=16, block_n=16)
        out, lse = flash_attention_triton(ql, kl, vl, **kw)
        grads = flash_attention_triton_backward(ql, kl, vl, out, lse, dol, **kw)
        keep_k = [j for j in range(S) if j not in poison_keys]
        keep_q = [i for i in range(L) if i not in poison_queries]
        assert_close(out.cpu(), ref_out, what="out")
        assert_close(grads[0].cpu()[:, :, keep_q], ref_grads[0][:, :, keep_q], what="dq")
        for got, ref, name in ((grads[1], ref_grads[1], "dk"), (grads[2], ref_grads[2], "dv")):
            assert_close(got.cpu()[:, :, keep_k], ref[:, :, keep_k], what=name)


def test_no_repeated_keys_or_values_are_allocated():
    # Every tensor that torch creates during the forward and backward calls (the interpreter's storage copies
    # included, counted in bytes) is smaller than one repeated K or V, (B, H, S, D) or (B, H, S, Dv), or an
    # unsummed per-query-head dK, dV: the kernels read the shared head in place and sum dK, dV on chip.
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

    B, H, H_kv, L, S = 1, 8, 1, 5, 37
    q, k, v, dout, _ = make_case(B, H, H_kv, L, S, False, seed=7)
    ql, kl, vl, dol = (t.to(DEVICE, torch.float32) for t in (q, k, v, dout))
    with Sizes() as sizes:
        out, lse = flash_attention_triton(ql, kl, vl, enable_gqa=True, window_size=(3, 0))
        _, dk, dv = flash_attention_triton_backward(ql, kl, vl, out, lse, dol, enable_gqa=True, window_size=(3, 0))
    assert dk.shape == (B, H_kv, S, D) and dv.shape == (B, H_kv, S, DV)
    assert max(sizes.numels) >= kl.numel()  # the recorder sees the allocations
    assert max(sizes.numels) < B * H * S * min(D, DV), max(sizes.numels)


def test_the_door_refuses_bad_heads_and_windows():
    q = torch.zeros(1, 6, 5, 16, device=DEVICE)
    k2, k4 = torch.zeros(1, 2, 7, 16, device=DEVICE), torch.zeros(1, 4, 7, 16, device=DEVICE)
    cases = [
        (dict(k=k2), ValueError, r"k must have H=6 heads like q, got H_kv=2; pass enable_gqa=True"),
        (dict(k=k4, enable_gqa=True), ValueError,
         r"k must have a number of heads H_kv that divides q's H=6 .*got H_kv=4; use one of \[1, 2, 3, 6\]"),
        (dict(window_size=3), TypeError, r"window_size must be a pair \(left, right\) of ints, as a tuple or list, "
                                         r"got 3 \(int\); e\.g\. window_size=\(256, 0\)"),
        (dict(window_size=(2, -2)), ValueError, r"window_size must be a pair of ints >= -1 .*got \(2, -2\)"),
        (dict(window_size=(2, 1.0)), TypeError, r"window_size must be a pair .*got 1\.0 \(float\)"),
        (dict(window_size=(2, 1), is_causal=True), ValueError,
         r"window_size's right side must be 0 or -1 with is_causal=True.*got \(2, 1\); pass window_size=\(2, 0\)"),
        (dict(causal_offset=1.5), TypeError, r"causal_offset must be an int, got 1\.5 \(float\); pass 0"),
        (dict(enable_gqa=1), TypeError, r"enable_gqa must be True or False, got 1"),
    ]
    for kw, exc, pattern in cases:
        kk = kw.pop("k", q)
        with pytest.raises(exc, match=pattern):
            flash_attention_triton(q, kk, kk, **kw)
        lse = torch.zeros(1, 6, 5, device=DEVICE)
        with pytest.raises(exc, match=pattern):
            flash_attention_triton_backward(q, kk, kk, q, lse, q, **kw)


def test_band_args_normalise_windows_wider_than_the_sequence():
    from attn_lib.flash.triton.configs import band_args

    assert band_args(False, (-1, -1), 0, 7, 9) == {"band_lo": 0, "band_hi": 0, "HAS_LO": False, "HAS_HI": False}
    assert band_args(True, (-1, -1), 2, 7, 9) == {"band_lo": 0, "band_hi": 2, "HAS_LO": False, "HAS_HI": True}
    assert band_args(False, (3, 2), 0, 7, 9) == {"band_lo": -3, "band_hi": 2, "HAS_LO": True, "HAS_HI": True}
    # a side that every (i, j) satisfies is unbounded (no masking work): j - i >= -(L-1), j - i <= S-1
    assert band_args(False, (6, 8), 0, 7, 9) == {"band_lo": 0, "band_hi": 0, "HAS_LO": False, "HAS_HI": False}
    assert band_args(False, (5, 7), 0, 7, 9)["HAS_LO"] and band_args(False, (5, 7), 0, 7, 9)["HAS_HI"]
    # a side that hides everything is clamped to a small int (the kernels get int32 arguments)
    assert band_args(True, (10**12, 0), -10**12, 7, 9)["band_hi"] == -7
    assert band_args(False, (1, -1), 10**12, 7, 9)["band_lo"] == 9
