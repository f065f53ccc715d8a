"""attn_lib/flash/triton/backward.py: the backward kernels (preprocess, dK/dV, dQ), through their launcher, the
public ``flash_attention_triton_backward`` and ``flash_attention(..., backend="triton")``'s autograd, against the
float64 reference's gradients.

Answers: ``torch.autograd`` through ``attn_lib.attention`` in float64 (``attn_paths.reference_grads``), and for
grouped-query attention, sliding windows and the alignment autograd through a plain float64 formula written here
(K and V repeated over the group with ``repeat_interleave``, so the group's dK, dV are summed by the repeat's
backward; the kernels sum them on chip) with the band from flash-attn's definition (tests/attn_paths.visible_band: query i sees
key j iff ``i + offset - left <= j <= i + offset + right``, -1 = unbounded, ``is_causal`` hides j > i + offset;
offset 0 top-left, S - L bottom-right, another offset through the launcher with a hand-made ``Band``). float32
meets the gradient tolerance of ``attn_lib.tolerances``; float16 and bfloat16 follow flash-attn's rule against a
naive backward computed in that precision. Without a GPU this runs under Triton's interpreter: small sizes.
"""
import importlib.util
import os

import pytest
import torch

from attn_lib.costs.io_model import largest_tensor
from attn_lib.flash.autograd import flash_attention
from attn_lib.flash.naive import naive_attention
from attn_lib.flash.triton import configs
from attn_lib.flash.triton.entry import flash_attention_triton, flash_attention_triton_backward, load_kernels
from attn_lib.rules.band import Band
from attn_lib.rules.settings import AttentionSettings
from attn_lib.tolerances import assert_close, assert_flash_rule

from attn_paths import TRITON_GQA_CASES, flash_inputs, reference_grads, visible_band

# Do not `import triton` here: attn_lib.device decides the process's Triton mode first.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

DEVICE = torch.device(os.environ.get("ATTN_LIB_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu"))
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
TL, BR = "top-left", "bottom-right"
NAMES = ("dq", "dk", "dv")


def bwd():
    return load_kernels("backward")


def settings_for(L, S, D, *, causal=False, window=(-1, -1), offset=0, key_mask=None, blocks=(None, None)):
    """AttentionSettings made by hand for the launchers: the band for any offset, float32 work."""
    return AttentionSettings(band=Band.resolve(L, S, is_causal=causal, window_size=window, offset=offset),
                             scale=D ** -0.5, work_dtype=F32, key_mask=key_mask, backend="triton",
                             block_m=blocks[0], block_n=blocks[1])


def naive_grads(q, k, v, dout, kpm, causal, dtype):
    """A naive backward in ``dtype``: autograd through the plain formula, every step in dtype."""
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    B, H, L, D = q.shape
    S = k.shape[2]
    visible = torch.ones(B, 1, L, S, dtype=torch.bool)  # (B,1,L,S)
    if causal:
        visible = visible & torch.ones(L, S, dtype=torch.bool).tril()
    if kpm is not None:
        visible = visible & kpm[:, None, None, :]
    seen = visible.any(-1, keepdim=True)  # (B,1,L,1) rows with at least one key
    s = (q @ k.transpose(-2, -1)) * D**-0.5  # (B,H,L,D) @ (B,H,D,S) -> (B,H,L,S)
    s = s.masked_fill(~visible, float("-inf")).masked_fill(~seen, 0.0)
    p = torch.softmax(s, dim=-1).masked_fill(~seen, 0.0)  # (B,H,L,S)
    out = p @ v  # (B,H,L,S) @ (B,H,S,Dv) -> (B,H,L,Dv)
    out.backward(dout.to(dtype))
    return q.grad, k.grad, v.grad


def check_grads(got, ref, naive, dtype, what):
    """float32: the gradient tolerance; float16 / bfloat16: flash-attn's gradient rule against the naive backward."""
    for name, g, r, n in zip(NAMES, got, ref, naive):
        assert torch.isfinite(g).all(), f"{what} {name} has nan/inf"
        if dtype == F32:
            assert_close(g, r, what=f"{what} {name}", kind="gradient")
        else:
            assert_flash_rule(g, n, r, what=f"{what} {name} {dtype}", kind="gradient")


# --- key masks and causal, through flash_attention_triton_backward -----------------------------------------------

def run_backward(q, k, v, dout, kpm, causal, dtype, **blocks):
    """Forward and backward with the Triton kernels on DEVICE; results back on the CPU."""
    ql, kl, vl, dol = (t.to(DEVICE, dtype) for t in (q, k, v, dout))
    kpm_dev = None if kpm is None else kpm.to(DEVICE)
    out, lse = flash_attention_triton(ql, kl, vl, is_causal=causal, key_mask=kpm_dev, **blocks)
    grads = flash_attention_triton_backward(ql, kl, vl, out, lse, dol, is_causal=causal, key_mask=kpm_dev, **blocks)
    for g, t in zip(grads, (ql, kl, vl)):
        assert g.shape == t.shape and g.dtype == dtype and g.device == t.device
    return [g.cpu() for g in grads]


def check_case(shape, dtype, causal, padding, *, seed=0, **blocks):
    B, H, L, S, D, Dv = shape
    q, k, v, kpm = flash_inputs(B, H, L, S, D, Dv, seed=seed, padding=padding)
    dout = torch.randn(B, H, L, Dv, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    ref = reference_grads(q, k, v, dout, kpm, causal)
    got = run_backward(q, k, v, dout, kpm, causal, dtype, **blocks)
    naive = naive_grads(q, k, v, dout, kpm, causal, dtype) if dtype != F32 else ref
    check_grads(got, ref, naive, dtype, f"triton {shape}")
    return got, ref


CASES = [  # (B, H, L, S, D, Dv), dtype, causal, padding
    ((1, 1, 1, 1, 16, 16), F32, False, False),
    ((1, 1, 1, 113, 16, 16), F32, True, True),  # one query: causal sees key 0 only
    ((1, 2, 17, 97, 32, 32), F32, True, True),  # L < S, causal: keys past L get no gradient
    ((2, 1, 97, 17, 20, 24), F32, True, False),  # L > S, D != Dv, neither a power of two
    ((1, 1, 113, 113, 64, 64), F32, True, False),
    ((2, 2, 113, 97, 16, 40), F32, False, True),  # batch entry 1 fully padded
    ((1, 1, 97, 1, 8, 8), F32, False, False),  # one key, D < 16 padded to 16
    ((2, 1, 97, 113, 40, 24), F16, False, True),
    ((1, 2, 113, 97, 64, 64), F16, True, False),
    ((1, 1, 17, 1, 16, 16), F16, True, False),
    ((2, 1, 113, 113, 32, 32), BF16, True, True),
    ((1, 1, 17, 97, 128, 64), BF16, False, False),
    ((2, 1, 1, 17, 16, 16), BF16, True, True),
]


def _ids(c):
    return "x".join(map(str, c)) if isinstance(c, tuple) else str(c).replace("torch.", "")


@pytest.mark.parametrize("shape,dtype,causal,padding", CASES, ids=_ids)
def test_backward_matches_the_reference_autograd(shape, dtype, causal, padding):
    check_case(shape, dtype, causal, padding)


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (16, 64), (64, 16)])
def test_blocks_smaller_than_and_not_dividing_the_lengths(block_m, block_n):
    # several query and key blocks: causal skipping in both kernels, ragged ends of L and S
    check_case((1, 2, 97, 113, 16, 16), F32, True, True, block_m=block_m, block_n=block_n)
    check_case((1, 1, 113, 50, 24, 16), F32, True, False, block_m=block_m, block_n=block_n)


def test_rows_and_keys_that_see_nothing_get_exact_zero_gradients():
    q, k, v, _ = flash_inputs(2, 1, 9, 6, 16)
    dout = torch.randn(2, 1, 9, 16, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    kpm = torch.ones(2, 6, dtype=torch.bool)
    kpm[1] = False  # sequence 1: no key at all
    kpm[0, 0] = False  # causal: query 0 of sequence 0 sees nothing; key 0 is padding
    dq, dk, dv = run_backward(q, k, v, dout, kpm, True, F32)
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()
    for g in (dq[1], dk[1], dv[1], dq[0, :, 0], dk[0, :, 0], dv[0, :, 0]):  # sequence 1, row 0, padded key 0
        assert torch.equal(g, torch.zeros_like(g))
    rq, rk, rv = reference_grads(q, k, v, dout, kpm, True)
    assert (rq[0, :, 1:] != 0).any()  # the other rows do get gradients, and they agree
    for name, g, r in zip(NAMES, (dq, dk, dv), (rq, rk, rv)):
        assert_close(g[0], torch.nan_to_num(r[0]), what=f"sequence 0 {name}", kind="gradient")


def test_strided_inputs_and_scale():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 33, 3, 16, generator=gen, dtype=torch.float64).transpose(1, 2)  # (B,H,L,D) view
    k = torch.randn(2, 40, 3, 16, generator=gen, dtype=torch.float64).transpose(1, 2)  # (B,H,S,D) view
    v = torch.randn(2, 3, 24, 40, generator=gen, dtype=torch.float64).transpose(2, 3)  # (B,H,S,Dv) view
    dout = torch.randn(2, 3, 24, 33, generator=gen, dtype=torch.float64).transpose(2, 3)  # (B,H,L,Dv) view
    ref = reference_grads(q, k, v, dout, None, True, scale=0.3)
    ql, kl, vl, dol = (t.float().to(DEVICE) for t in (q, k, v, dout))
    assert not ql.is_contiguous() and not dol.is_contiguous()
    out, lse = flash_attention_triton(ql, kl, vl, is_causal=True, scale=0.3)
    got = flash_attention_triton_backward(ql, kl, vl, out, lse, dol, is_causal=True, scale=0.3)
    for name, g, r in zip(NAMES, got, ref):
        assert_close(g.cpu(), r, what=name, kind="gradient")


def test_dout_with_zero_strides():
    # loss = out.sum() hands the backward an expanded tensor of ones (every stride 0)
    q, k, v, kpm = flash_inputs(2, 2, 21, 30, 16, padding=True)
    ql, kl, vl = (t.float().to(DEVICE) for t in (q, k, v))
    out, lse = flash_attention_triton(ql, kl, vl, key_mask=kpm.to(DEVICE))
    ones = torch.ones(1, 1, 1, 1, device=DEVICE).expand_as(out)  # (B,H,L,Dv), strides 0
    assert ones.stride() == (0, 0, 0, 0)
    got = flash_attention_triton_backward(ql, kl, vl, out, lse, ones, key_mask=kpm.to(DEVICE))
    want = flash_attention_triton_backward(ql, kl, vl, out, lse, ones.contiguous(), key_mask=kpm.to(DEVICE))
    ref = reference_grads(q, k, v, torch.ones(2, 2, 21, 16, dtype=torch.float64), kpm, False)
    for name, g, w, r in zip(NAMES, got, want, ref):
        assert torch.equal(g, w)
        assert_close(g.cpu(), r, what=name, kind="gradient")


def test_empty_queries_or_keys_give_zero_gradients():
    q = torch.randn(1, 2, 5, 16, device=DEVICE)
    none = torch.randn(1, 2, 0, 16, device=DEVICE)
    out, lse = flash_attention_triton(q, none, none)
    dq, dk, dv = flash_attention_triton_backward(q, none, none, out, lse, torch.ones_like(out))
    assert torch.equal(dq, torch.zeros_like(q)) and dk.shape == (1, 2, 0, 16) and dv.shape == (1, 2, 0, 16)
    out, lse = flash_attention_triton(none, q, q)
    dq, dk, dv = flash_attention_triton_backward(none, q, q, out, lse, out)
    assert dq.shape == (1, 2, 0, 16) and torch.equal(dk, torch.zeros_like(q)) and torch.equal(dv, torch.zeros_like(q))


# --- the launcher: grids, chunks, int64 offsets, the GPU's fp16 path ------------------------------------------

def record_launches(monkeypatch, module, names):
    """Replace kernels by stand-ins that record (kernel, grid, last positional argument, keywords), then run them."""
    launches = []

    def recorder(name, real):
        class Recorder:
            def __getitem__(self, grid):
                def run(*args, **kwargs):
                    launches.append((name, tuple(grid), args[-1], kwargs))
                    return real[grid](*args, **kwargs)
                return run
        return Recorder()

    for name in names:
        monkeypatch.setattr(module, name, recorder(name, getattr(module, name)))
    return launches


def test_grids_and_heads_launched_in_chunks(monkeypatch):
    # CUDA's grid axis 1 holds at most 65535 programs; with the limit set to 2, B·H = 6 query heads (and
    # B·H_kv = 6 key/value heads) need three launches of every kernel, each from its own HZ_START.
    module = bwd()
    launches = record_launches(monkeypatch, module, ("attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq"))
    monkeypatch.setattr(configs, "MAX_GRID_Y", 2)
    check_case((2, 3, 17, 33, 16, 16), F32, True, True)
    by_kernel = {}
    for name, grid, start, kw in launches:
        by_kernel.setdefault(name, []).append((grid, start, kw))
    assert [start for _, start, _ in by_kernel["attn_bwd_preprocess"]] == [0, 2, 4]
    for name, rows in (("attn_bwd_dkdv", "BLOCK_N"), ("attn_bwd_dq", "BLOCK_M")):
        (grid, _, kw), *_ = by_kernel[name]
        length = 33 if name == "attn_bwd_dkdv" else 17  # dK/dV: one program per key block; dQ: per query block
        assert [(g, s) for g, s, _ in by_kernel[name]] == [((-(-length // kw[rows]), 2), s) for s in (0, 2, 4)]
    assert module.grid_preprocess(97, 3, 32) == (4, 3)
    assert module.grid_dkdv(97, 3, {"BLOCK_N": 16}) == (7, 3)
    assert module.grid_dq(97, 3, {"BLOCK_M": 64}) == (2, 3)


def test_one_dkdv_program_per_key_value_head(monkeypatch):
    # GQA: the dK/dV grid has B·H_kv heads on axis 1 (one program sums its group's query heads on chip);
    # the dQ grid has B·H.
    module = bwd()
    launches = record_launches(monkeypatch, module, ("attn_bwd_dkdv", "attn_bwd_dq"))
    run_gqa_case((2, 6, 2, 23, 23), (0, 0), False, TL, True, F32, (16, 16))
    assert [(name, grid[1]) for name, grid, _, _ in launches] == [("attn_bwd_dkdv", 2 * 2), ("attn_bwd_dq", 2 * 6)]


def test_int64_offsets_give_the_same_gradients(monkeypatch):
    module = bwd()
    base, _ = check_case((1, 2, 33, 20, 16, 16), F32, True, True)
    launches = record_launches(monkeypatch, module, ("attn_bwd_dkdv", "attn_bwd_dq"))
    monkeypatch.setattr(module, "needs_int64", lambda spans, max_block=256: True)
    got, _ = check_case((1, 2, 33, 20, 16, 16), F32, True, True)
    assert [kw["INT64"] for _, _, _, kw in launches] == [True, True]
    for g, b in zip(got, base):
        assert torch.equal(g, b)


def test_fp16_dots_without_the_fp32_fallback():
    # The GPU's code path (DOT_FP32 off: P and dS rounded to fp16 and fed to fp16 dots), built by the launchers
    # for target = (compiled, sm_80), runs under the interpreter too for fp16 (only its bf16 tl.dot is wrong).
    q, k, v, kpm = flash_inputs(2, 1, 97, 113, 40, 24, padding=True)
    dout = torch.randn(2, 1, 97, 24, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ref = reference_grads(q, k, v, dout, kpm, True)
    naive = naive_grads(q, k, v, dout, kpm, True, F16)
    ql, kl, vl, dl = (t.to(DEVICE, F16) for t in (q, k, v, dout))
    settings = settings_for(97, 113, 40, causal=True, key_mask=kpm.to(DEVICE))
    target = (False, (8, 0))
    out, lse = load_kernels("forward").launch(ql, kl, vl, settings, target=target)
    grads = bwd().launch(ql, kl, vl, (out, lse, dl), settings, target=target)
    check_grads([g.cpu() for g in grads], ref, naive, F16, "fp16 dots")


def largest_float_tensor(fn, *args, **kwargs):
    """Like attn_lib.costs.io_model.largest_tensor (every aten output is inspected), floating tensors only:
    Triton's interpreter copies the inputs' storage as raw bytes (uint8), which are not attention tensors."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Spy(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    self.largest = max(self.largest, t.numel())
            return out

    with Spy() as spy:
        result = fn(*args, **kwargs)
    return result, spy.largest


def test_backward_never_creates_an_l_by_s_tensor():
    # Forward and backward make only O(L·D + S·D) tensors, never the (B, H, L, S) matrix the naive backward
    # needs (on a GPU the kernels allocate nothing else at all).
    B, H, L, S, D = 1, 2, 97, 113, 16
    q, k, v, kpm = flash_inputs(B, H, L, S, D, padding=True)
    q, k, v, kpm = q.float().to(DEVICE), k.float().to(DEVICE), v.float().to(DEVICE), kpm.to(DEVICE)
    dout = torch.randn(B, H, L, D, device=DEVICE)
    (out, lse), fwd_largest = largest_float_tensor(flash_attention_triton, q, k, v, is_causal=True, key_mask=kpm)
    _, bwd_largest = largest_float_tensor(flash_attention_triton_backward, q, k, v, out, lse, dout, is_causal=True,
                                          key_mask=kpm)
    linear = B * H * max(L, S) * D  # the largest of q, k, v, out and their gradients
    assert 0 < fwd_largest <= linear and 0 < bwd_largest <= linear, (fwd_largest, bwd_largest)
    assert linear * 6 < B * H * L * S  # an (L, S) tensor would have been seen
    _, naive_largest = largest_float_tensor(naive_grads, q.cpu(), k.cpu(), v.cpu(), dout.cpu(), kpm.cpu(), True, F32)
    assert naive_largest >= B * H * L * S  # the spy does see the naive backward's score matrix


# --- grouped-query attention, sliding windows, the alignment ----------------------------------------------------

D, DV = 12, 10  # not powers of two, D != Dv


def plain_with_grads(q, k, v, dout, visible, dtype):
    """dq, dk, dv by autograd through the plain formula in ``dtype``; K, V repeated over the group (its backward
    sums the group's gradients)."""
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    G = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)  # (B,H_kv,S,*) -> (B,H,S,*)
    s = (q @ kr.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B,H,L,S)
    s = s.masked_fill(~visible, float("-inf"))
    seen = visible.any(-1, keepdim=True)  # (B,1,L,1): rows with at least one key
    p = torch.softmax(s.masked_fill(~seen, 0.0), dim=-1).masked_fill(~seen, 0.0)  # (B,H,L,S)
    return torch.autograd.grad(p @ vr, (q, k, v), dout.to(dtype))


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


def forward_backward(tensors, kpm, window, causal, align, blocks, check_finite=True):
    """The public doors for "top-left" / "bottom-right"; the launchers with a hand-made band for an int offset."""
    ql, kl, vl, dol = tensors
    L, S, G = ql.shape[2], kl.shape[2], ql.shape[1] // kl.shape[1]
    if isinstance(align, int):
        settings = settings_for(L, S, D, causal=causal, window=window, offset=align, key_mask=kpm, blocks=blocks)
        out, lse = load_kernels("forward").launch(ql, kl, vl, settings)
        return bwd().launch(ql, kl, vl, (out, lse, dol), settings)
    kw = dict(is_causal=causal, window_size=window, align=align, enable_gqa=G > 1, key_mask=kpm,
              check_finite=check_finite, block_m=blocks[0], block_n=blocks[1])
    out, lse = flash_attention_triton(ql, kl, vl, **kw)
    return flash_attention_triton_backward(ql, kl, vl, out, lse, dol, **kw)


def offset_of(align, L, S):
    return align if isinstance(align, int) else (S - L if align == "bottom-right" else 0)


def run_gqa_case(shape, window, causal, align, padding, dtype, blocks, seed=0):
    B, H, H_kv, L, S = shape
    q, k, v, dout, kpm = make_case(B, H, H_kv, L, S, padding, seed)
    visible = visible_band(L, S, causal, window, offset_of(align, L, S))[None, None]  # (1,1,L,S)
    if kpm is not None:
        visible = visible & kpm[:, None, None, :]  # (B,1,L,S)
    ref = plain_with_grads(q, k, v, dout, visible, torch.float64)
    tensors = [t.to(DEVICE, dtype) for t in (q, k, v, dout)]
    grads = forward_backward(tensors, None if kpm is None else kpm.to(DEVICE), window, causal, align, blocks)
    grads = [g.cpu() for g in grads]
    assert [tuple(g.shape) for g in grads] == [(B, H, L, D), (B, H_kv, S, D), (B, H_kv, S, DV)]
    naive = plain_with_grads(q, k, v, dout, visible, dtype) if dtype != F32 else ref
    check_grads(grads, ref, naive, dtype, f"{shape} window={window} align={align}")
    return grads, ref




@pytest.mark.parametrize("shape,window,causal,align,padding,dtype,blocks", TRITON_GQA_CASES, ids=_ids)
def test_gqa_and_windows_match_the_plain_formula(shape, window, causal, align, padding, dtype, blocks):
    run_gqa_case(shape, window, causal, align, padding, dtype, blocks)


def test_gqa_dk_dv_are_the_sums_over_the_group():
    # dK, dV of a key/value head shared by G query heads = the sum of the dK, dV each query head would get from
    # its own copy of K, V (H_kv = H, K and V repeated here): the kernels' on-chip sum, checked by another route.
    B, H, H_kv, L, S = 1, 6, 2, 19, 27
    q, k, v, dout, _ = make_case(B, H, H_kv, L, S, False, seed=4)
    grouped = forward_backward([t.to(DEVICE, F32) for t in (q, k, v, dout)], None, (4, 1), False, TL, (16, 16))
    kr, vr = (t.repeat_interleave(H // H_kv, dim=1) for t in (k, v))  # (B,H,S,*)
    per_head = forward_backward([t.to(DEVICE, F32) for t in (q, kr, vr, dout)], None, (4, 1), False, TL, (16, 16))
    summed = [g.cpu().view(B, H_kv, H // H_kv, S, -1).sum(2) for g in per_head[1:]]  # (B,H,S,*) -> (B,H_kv,S,*)
    assert_close(grouped[0].cpu(), per_head[0].cpu(), what="dq", kind="gradient")
    for name, g, s in zip(("dk", "dv"), grouped[1:], summed):
        assert_close(g.cpu(), s, what=name, kind="gradient")


def test_fully_masked_rows_get_zero_gradients():
    # window (0, 0) with L > S: queries i >= S see no key; offset -3 hides queries 0..2 as well.
    B, H, H_kv, L, S = 1, 4, 2, 21, 13
    q, k, v, dout, _ = make_case(B, H, H_kv, L, S, False, seed=3)
    dq, dk, dv = (g.cpu() for g in forward_backward([t.to(DEVICE, F32) for t in (q, k, v, dout)], None, (0, 0),
                                                     False, -3, (16, 16)))
    empty = torch.tensor([i < 3 or i - 3 >= S for i in range(L)])  # (L,) rows that see no key
    assert torch.equal(dq[:, :, empty], torch.zeros(B, H, int(empty.sum()), D))
    assert (dq[:, :, ~empty] != 0).any() and torch.isfinite(dk).all() and torch.isfinite(dv).all()


def test_blocks_outside_the_band_are_never_read():
    # NaN in K, V and Q where no block's band reaches: a kernel that loaded those blocks (even masked: 0 · NaN =
    # NaN in the dot) would return NaN. One query block sees keys 35..55 (window (5, 0), offset 40), so key
    # blocks 0-1 and 4 are skipped by the dQ kernel (and by the forward); in the second call one key block is
    # seen only by queries 40..57, so query blocks 0-1 are skipped by the dK/dV kernel.
    for L, S, offset, poison_keys, poison_queries in ((16, 80, 40, list(range(32)) + list(range(64, 80)), []),
                                                      (64, 16, -40, [], list(range(32)))):
        q, k, v, dout, _ = make_case(1, 4, 2, L, S, False, seed=5)
        ref = plain_with_grads(q, k, v, dout, visible_band(L, S, True, (5, 0), offset)[None, None], torch.float64)
        k[:, :, poison_keys] = float("nan")
        v[:, :, poison_keys] = float("nan")
        q[:, :, poison_queries] = float("nan")
        grads = forward_backward([t.to(DEVICE, F32) for t in (q, k, v, dout)], None, (5, 0), True, offset, (16, 16))
        keep_k = [j for j in range(S) if j not in poison_keys]
        keep_q = [i for i in range(L) if i not in poison_queries]
        assert_close(grads[0].cpu()[:, :, keep_q], ref[0][:, :, keep_q], what="dq", kind="gradient")
        for got, r, name in ((grads[1], ref[1], "dk"), (grads[2], ref[2], "dv")):
            assert_close(got.cpu()[:, :, keep_k], r[:, :, keep_k], what=name, kind="gradient")


def test_no_repeated_keys_or_values_are_allocated():
    # Every tensor torch creates during the backward call (the interpreter's storage copies included, counted in
    # bytes) is smaller than one repeated K or V, (B, H, S, D) or (B, H, S, Dv), or an unsummed per-query-head
    # dK, dV: the kernels read the shared head in place and sum dK, dV on chip.
    B, H, H_kv, L, S = 1, 8, 1, 5, 37
    q, k, v, dout, _ = make_case(B, H, H_kv, L, S, False, seed=7)
    ql, kl, vl, dol = (t.to(DEVICE, F32) for t in (q, k, v, dout))
    out, lse = flash_attention_triton(ql, kl, vl, enable_gqa=True, window_size=(3, 0))
    (_, dk, dv), largest = largest_tensor(flash_attention_triton_backward, ql, kl, vl, out, lse, dol, enable_gqa=True,
                                          window_size=(3, 0))
    assert dk.shape == (B, H_kv, S, D) and dv.shape == (B, H_kv, S, DV)
    if DEVICE.type == "cpu":  # the recorder sees the interpreter's copies of K (a GPU kernel copies nothing)
        assert largest >= kl.numel()
    assert largest < B * H * S * min(D, DV), largest


# --- end to end: flash_attention(..., backend="triton") trains ----------------------------------------------------
# Its backward (these kernels, through FlashAttentionFunction) gives dq, dk, dv within the flash-attn rule of the
# float64 reference's autograd, and within the float32 gradient tolerance in float32.

END_TO_END_SHAPES = [(1, 2, 17, 33, 16, 16), (2, 1, 33, 17, 16, 32)]  # (B, H, L, S, D, Dv): not multiples of 16


def grads_of(fn, q, k, v, dout):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(dout)
    return out, (q.grad, k.grad, v.grad)


@pytest.mark.parametrize("shape", END_TO_END_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [F32, F16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("causal,padding", [(False, False), (True, True)], ids=["full", "causal_pad"])
def test_flash_attention_with_the_triton_backend_gives_the_reference_gradients(shape, dtype, causal, padding):
    B, H, L, S, D_, Dv = shape
    q, k, v, kpm = flash_inputs(B, H, L, S, D_, Dv, padding=padding, seed=11)
    dout = torch.randn(B, H, L, Dv, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    ql, kl, vl, dl = (t.to(dtype) for t in (q, k, v, dout))
    expected = reference_grads(ql, kl, vl, dl, kpm, causal)  # float64 on the same (rounded) inputs
    # Naive backward in the same precision: the flash-attn rule's yardstick.
    _, naive = grads_of(lambda q, k, v: naive_attention(q, k, v, is_causal=causal, key_mask=kpm), ql, kl, vl, dl)
    kpm_dev = None if kpm is None else kpm.to(DEVICE)
    out, got = grads_of(lambda q, k, v: flash_attention(q, k, v, is_causal=causal, key_mask=kpm_dev, backend="triton"),
                        *(t.to(DEVICE) for t in (ql, kl, vl, dl)))
    assert type(out.grad_fn).__name__ == "FlashAttentionFunctionBackward"
    for name, g, n, e in zip(NAMES, got, naive, expected):
        g = g.cpu()
        assert g.dtype == dtype and torch.isfinite(g).all(), name
        assert_flash_rule(g, n, e, what=f"triton {dtype} {name}")
        if dtype == F32:
            assert_close(g, e, what=f"triton float32 {name}", kind="gradient")
    if padding and B > 1:  # batch entry B-1 has no key at all: zero gradients
        assert all(torch.equal(g.cpu()[-1], torch.zeros_like(g.cpu()[-1])) for g in got)


@pytest.mark.parametrize("align", [TL, BR])
def test_flash_attention_with_the_triton_backend_gqa_window_and_align(align):
    # flash_attention(backend="triton", enable_gqa, window_size, align) end to end against the plain formula
    B, H, H_kv, L, S = 1, 4, 2, 13, 29
    q, k, v, dout, _ = make_case(B, H, H_kv, L, S, False, seed=9)
    ref = plain_with_grads(q, k, v, dout, visible_band(L, S, True, (4, 0), offset_of(align, L, S))[None, None],
                           torch.float64)
    _, got = grads_of(lambda q, k, v: flash_attention(q, k, v, is_causal=True, window_size=(4, 0), align=align,
                                                      enable_gqa=True, backend="triton"),
                      *(t.to(DEVICE, F32) for t in (q, k, v, dout)))
    for name, g, r in zip(NAMES, got, ref):
        assert g.shape == r.shape
        assert_close(g.cpu(), r, what=f"{name} {align}", kind="gradient")
