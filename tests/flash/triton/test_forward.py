"""attn_lib/flash/triton/forward.py: the forward kernel, through its launcher and through the public
``flash_attention_triton``, against the float64 reference.

Answers: ``attn_lib.attention`` in float64 (``attn_paths.flash_reference``) for key masks and causal, and for
grouped-query attention, sliding windows and the alignment a plain float64 formula written here (K and V repeated
over the group with ``repeat_interleave``, in this test only; the kernel reads the shared head in place) with the
visible band from flash-attn's definition (tests/attn_paths.visible_band): query i sees key j iff
``i + offset - left <= j <= i + offset + right`` (-1 = unbounded; ``is_causal`` hides j > i + offset), offset 0
top-left, S - L bottom-right, any other offset through the launcher with a hand-made ``Band``. float32 meets the
float32 tolerance of ``attn_lib.tolerances``; float16 and bfloat16 follow flash-attn's rule against the same
formula computed in that precision. Without a GPU this runs under Triton's interpreter (attn_lib.device sets it
once per process): the sizes are small, and block sizes 16 and 32 do not divide the odd lengths.
"""
import importlib.util
import os

import pytest
import torch

from attn_lib.costs.io_model import largest_tensor
from attn_lib.flash.naive import naive_attention
from attn_lib.flash.triton import configs
from attn_lib.flash.triton.entry import flash_attention_triton, load_kernels
from attn_lib.rules.band import Band
from attn_lib.rules.settings import AttentionSettings
from attn_lib.tolerances import assert_close, assert_flash_rule, lse_atol, max_abs_error

from attn_paths import DISTINGUISHABLE, TRITON_GQA_CASES, flash_inputs, flash_reference, visible_band

# Do not `import triton` here: attn_lib.device decides the process's Triton mode first.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

DEVICE = torch.device(os.environ.get("ATTN_LIB_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu"))
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
TL, BR = "top-left", "bottom-right"


def fwd():
    return load_kernels("forward")


def settings_for(L, S, D, *, causal=False, window=(-1, -1), offset=0, scale=None, key_mask=None, blocks=(None, None)):
    """AttentionSettings made by hand for the launcher: the band for any offset, float32 work."""
    return AttentionSettings(band=Band.resolve(L, S, is_causal=causal, window_size=window, offset=offset),
                             scale=D ** -0.5 if scale is None else scale, work_dtype=F32, key_mask=key_mask,
                             backend="triton", block_m=blocks[0], block_n=blocks[1])


def check_lse(lse, lse_ref, dtype):
    assert torch.equal(torch.isneginf(lse), torch.isneginf(lse_ref))  # the rows that see no key
    fin = torch.isfinite(lse_ref)
    assert max_abs_error(lse[fin], lse_ref[fin]) <= lse_atol(dtype)


# --- key masks and causal, through flash_attention_triton -----------------------------------------------------

def run_and_check(shape, dtype, causal, padding, *, block_m=None, block_n=None, seed=0):
    B, H, L, S, D, Dv = shape
    q, k, v, kpm = flash_inputs(B, H, L, S, D, Dv, seed=seed, padding=padding)
    ref, lse_ref = flash_reference(q, k, v, kpm, causal)
    ql, kl, vl = (t.to(dtype).to(DEVICE) for t in (q, k, v))
    kpm_dev = None if kpm is None else kpm.to(DEVICE)
    out, lse = flash_attention_triton(ql, kl, vl, is_causal=causal, key_mask=kpm_dev, block_m=block_m, block_n=block_n)
    assert out.shape == (B, H, L, Dv) and out.dtype == dtype and lse.shape == (B, H, L) and lse.dtype == F32
    out, lse = out.cpu(), lse.cpu()
    naive = naive_attention(ql, kl, vl, is_causal=causal, key_mask=kpm_dev).cpu()
    assert_flash_rule(out, naive, ref, what=f"triton {dtype}")
    if dtype == F32:
        assert_close(out, ref, what="triton float32")
    check_lse(lse, lse_ref, dtype)
    return out


CASES = [  # (B, H, L, S, D, Dv), dtype, causal, padding
    ((1, 1, 1, 1, 16, 16), F32, False, False),
    ((1, 1, 1, 1, 4, 4), F32, True, False),  # D < 16: padded to 16
    ((2, 3, 17, 17, 16, 16), F32, True, True),
    ((1, 2, 17, 97, 32, 32), F32, False, True),
    ((1, 1, 97, 17, 20, 20), F32, True, False),  # L > S, D not a power of two
    ((1, 2, 113, 113, 64, 64), F32, True, False),
    ((2, 1, 97, 113, 40, 24), F16, False, True),  # D != Dv, neither a power of two
    ((1, 2, 113, 97, 64, 64), F16, True, False),
    ((2, 1, 113, 113, 32, 32), BF16, True, True),
    ((1, 1, 17, 65, 128, 128), BF16, False, False),
    ((2, 2, 33, 97, 96, 96), F16, True, True),  # causal with L < S
    ((1, 3, 64, 64, 64, 64), BF16, False, True),  # lengths that are whole blocks
]


def _ids(c):
    return "x".join(map(str, c)) if isinstance(c, tuple) else str(c).replace("torch.", "")


@pytest.mark.parametrize("shape,dtype,causal,padding", CASES, ids=_ids)
def test_kernel_matches_the_reference(shape, dtype, causal, padding):
    run_and_check(shape, dtype, causal, padding)


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (32, 16), (16, 64)])
def test_many_small_blocks_causal_diagonal(block_m, block_n):
    # the unmasked middle stage and the masked diagonal with the ragged end both run for several query blocks
    run_and_check((1, 2, 97, 113, 16, 16), F32, True, True, block_m=block_m, block_n=block_n)
    run_and_check((1, 1, 113, 50, 16, 16), F32, True, False, block_m=block_m, block_n=block_n)


def test_head_dim_256_and_length_1025():
    run_and_check((1, 1, 5, 23, 256, 256), F16, True, False)
    run_and_check((1, 1, 1025, 1025, 16, 16), F32, True, False, block_m=64, block_n=64)


def test_strided_inputs_and_scale():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 33, 3, 16, generator=gen, dtype=torch.float64).transpose(1, 2)  # (B,H,L,D) view
    k = torch.randn(2, 40, 3, 16, generator=gen, dtype=torch.float64).transpose(1, 2)
    v = torch.randn(2, 3, 16, 40, generator=gen, dtype=torch.float64).transpose(2, 3)  # (B,H,S,Dv) view
    ref, _ = flash_reference(q, k, v, None, False, scale=0.5)
    ql, kl, vl = (t.float().to(DEVICE) for t in (q, k, v))
    assert not ql.is_contiguous() and not vl.is_contiguous()
    out, _ = flash_attention_triton(ql, kl, vl, scale=0.5)
    assert_close(out.cpu(), ref)


def test_rows_that_see_no_key_give_zeros():
    q, k, v, _ = flash_inputs(2, 1, 9, 6, 16)
    kpm = torch.ones(2, 6, dtype=torch.bool)
    kpm[1] = False
    kpm[0, 0] = False
    out, lse = flash_attention_triton(q.float().to(DEVICE), k.float().to(DEVICE), v.float().to(DEVICE),
                                      is_causal=True, key_mask=kpm.to(DEVICE))
    out, lse = out.cpu(), lse.cpu()
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.isneginf(lse[1]).all()
    assert torch.equal(out[0, :, 0], torch.zeros_like(out[0, :, 0])) and torch.isfinite(out).all()
    assert torch.isfinite(lse[0, :, 1:]).all()


def test_empty_keys_and_empty_queries():
    q = torch.randn(1, 2, 5, 16, device=DEVICE)
    none = torch.randn(1, 2, 0, 16, device=DEVICE)
    out, lse = flash_attention_triton(q, none, none)
    assert torch.equal(out.cpu(), torch.zeros(1, 2, 5, 16)) and torch.isneginf(lse.cpu()).all()
    out, lse = flash_attention_triton(none, q, q, is_causal=True)
    assert out.shape == (1, 2, 0, 16) and lse.shape == (1, 2, 0)


# --- the launcher: grid, chunks, int64 offsets, configurations, precision paths ------------------------------

def record_launches(monkeypatch, module, name):
    """Replace a kernel by a stand-in that records each launch's grid and keywords, then runs the kernel."""
    launches = []
    real = getattr(module, name)

    class Recorder:
        def __getitem__(self, grid):
            def run(*args, **kwargs):
                launches.append((tuple(grid), args, kwargs))
                return real[grid](*args, **kwargs)
            return run

    monkeypatch.setattr(module, name, Recorder())
    return launches


def test_heads_are_launched_in_chunks_from_their_first_head(monkeypatch):
    # CUDA's grid axis 1 holds at most 65535 programs (B·H > 65535 fails on a GPU); with the limit set to 2
    # here, B·H = 6 heads need three launches, each from its own HZ_START (the argument after the band's).
    module = fwd()
    launches = record_launches(monkeypatch, module, "attn_fwd")
    monkeypatch.setattr(configs, "MAX_GRID_Y", 2)
    run_and_check((2, 3, 17, 33, 16, 16), F32, True, True)
    block = launches[0][2]["BLOCK_M"]
    assert [grid for grid, _, _ in launches] == [(-(-17 // block), 2)] * 3
    assert [args[-1] for _, args, _ in launches] == [0, 2, 4]
    launches.clear()
    run_and_check((1, 5, 9, 9, 16, 16), F16, False, False)
    assert [(grid[1], args[-1]) for grid, args, _ in launches] == [(2, 0), (2, 2), (1, 4)]
    assert module.grid(97, 6, {"BLOCK_M": 32}) == (4, 6)


def test_int64_offsets_give_the_same_output(monkeypatch):
    module = fwd()
    q, k, v, kpm = flash_inputs(2, 2, 33, 40, 16, padding=True)
    args = [t.float().to(DEVICE) for t in (q, k, v)]
    launches = record_launches(monkeypatch, module, "attn_fwd")
    out32, lse32 = flash_attention_triton(*args, is_causal=True, key_mask=kpm.to(DEVICE))
    monkeypatch.setattr(module, "needs_int64", lambda spans, max_block=256: True)
    out64, lse64 = flash_attention_triton(*args, is_causal=True, key_mask=kpm.to(DEVICE))
    assert [kw["INT64"] for _, _, kw in launches] == [False, True]
    assert torch.equal(out32, out64) and torch.equal(lse32, lse64)


def test_out_of_resources_falls_back_to_the_next_configuration():
    module = fwd()
    from triton.runtime.errors import OutOfResources  # after attn_lib fixed the Triton mode

    cfgs = configs.candidate_configs(128, 128, F16, interpret=False, kind="dkdv")
    tried = []

    def run(cfg):  # this "GPU" accepts only the third configuration
        tried.append(cfg)
        if len(tried) < 3:
            raise OutOfResources(200000, 101376, "shared memory")

    assert module.run_first_fitting(cfgs, run) is cfgs[2]
    assert tried == cfgs[:3]

    def never(cfg):
        raise OutOfResources(200000, 101376, "shared memory")

    with pytest.raises(OutOfResources):  # the smallest configuration's failure reaches the caller
        module.run_first_fitting(cfgs, never)


@pytest.mark.parametrize("dtype,capability,dot_fp32", [(BF16, (7, 5), True), (F16, (8, 0), False)],
                         ids=["bf16_sm75_fp32_dots", "fp16_sm80_fp16_dots"])
def test_the_gpu_paths_of_the_launcher_run_under_the_interpreter(monkeypatch, dtype, capability, dot_fp32):
    # target = (compiled, capability): the launcher builds that GPU's flags and tiles; the kernel still runs in
    # this process's mode. bf16 before sm_80 (Colab's T4) multiplies in fp32 (DOT_FP32); fp16 on sm_80 feeds
    # fp16 dots (DOT_FP32 off), which the interpreter runs correctly too (only its bf16 tl.dot is wrong).
    module = fwd()
    launches = record_launches(monkeypatch, module, "attn_fwd")
    q, k, v, kpm = flash_inputs(2, 1, 97, 113, 40, 24, padding=True)
    ql, kl, vl = (t.to(DEVICE, dtype) for t in (q, k, v))
    settings = settings_for(97, 113, 40, causal=True, key_mask=kpm.to(DEVICE))
    out, lse = module.launch(ql, kl, vl, settings, target=(False, capability))
    first = configs.candidate_configs(40, 24, dtype, False, capability=capability)[0]
    (_, _, kw), = launches
    assert kw["DOT_FP32"] is dot_fp32 and (kw["BLOCK_M"], kw["BLOCK_N"]) == (first["BLOCK_M"], first["BLOCK_N"])
    ref, lse_ref = flash_reference(q, k, v, kpm, True)
    naive = naive_attention(ql, kl, vl, is_causal=True, key_mask=kpm.to(DEVICE))
    assert_flash_rule(out.cpu(), naive.cpu(), ref, what=f"{dtype} DOT_FP32={dot_fp32}")
    check_lse(lse.cpu(), lse_ref, dtype)


# --- grouped-query attention, sliding windows, the alignment ----------------------------------------------------

D, DV = 12, 10  # not powers of two, D != Dv


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


def make_case(B, H, H_kv, L, S, padding, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=gen, dtype=torch.float64)
    k = torch.randn(B, H_kv, S, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H_kv, S, DV, generator=gen, dtype=torch.float64)
    kpm = None
    if padding:
        kpm = torch.rand(B, S, generator=gen) > 0.3  # True = key present
        kpm[0, :3] = False
        if B > 1:
            kpm[-1] = False  # a sequence with no keys at all: every row fully masked
    return q, k, v, kpm


def forward(ql, kl, vl, kpm, window, causal, align, blocks, check_finite=True):
    """The public door for "top-left" / "bottom-right"; the launcher with a hand-made band for an int offset."""
    L, S, G = ql.shape[2], kl.shape[2], ql.shape[1] // kl.shape[1]
    if isinstance(align, int):
        settings = settings_for(L, S, D, causal=causal, window=window, offset=align, key_mask=kpm, blocks=blocks)
        return fwd().launch(ql, kl, vl, settings)
    return flash_attention_triton(ql, kl, vl, is_causal=causal, window_size=window, align=align, enable_gqa=G > 1,
                                  key_mask=kpm, check_finite=check_finite, block_m=blocks[0], block_n=blocks[1])


def offset_of(align, L, S):
    return align if isinstance(align, int) else (S - L if align == "bottom-right" else 0)


def run_case(shape, window, causal, align, padding, dtype, blocks, seed=0):
    B, H, H_kv, L, S = shape
    q, k, v, kpm = make_case(B, H, H_kv, L, S, padding, seed)
    visible = visible_band(L, S, causal, window, offset_of(align, L, S))[None, None]  # (1,1,L,S)
    if kpm is not None:
        visible = visible & kpm[:, None, None, :]  # (B,1,L,S)
    ref_out, ref_lse = plain_attention(q, k, v, visible)
    ql, kl, vl = (t.to(DEVICE, dtype) for t in (q, k, v))
    out, lse = forward(ql, kl, vl, None if kpm is None else kpm.to(DEVICE), window, causal, align, blocks)
    out, lse = out.cpu(), lse.cpu()
    assert out.shape == (B, H, L, DV) and out.dtype == dtype
    check_lse(lse, ref_lse, dtype)
    if dtype == F32:
        assert_close(out, ref_out, what=f"out {shape} window={window} align={align}")
    else:
        naive, _ = plain_attention(*(t.to(dtype) for t in (q, k, v)), visible)
        assert torch.isfinite(out).all()
        assert_flash_rule(out, naive, ref_out, what=f"out {dtype} {shape} window={window} align={align}")
    return ref_out, ref_lse




@pytest.mark.parametrize("shape,window,causal,align,padding,dtype,blocks", TRITON_GQA_CASES, ids=_ids)
def test_gqa_and_windows_match_the_plain_formula(shape, window, causal, align, padding, dtype, blocks):
    ref_out, ref_lse = run_case(shape, window, causal, align, padding, dtype, blocks)
    assert torch.isfinite(ref_out).all()
    if padding and shape[0] > 1:  # the fully padded sequence: every row sees nothing, output exactly 0
        assert torch.isneginf(ref_lse[-1]).all()


def test_bottom_right_is_the_top_left_band_moved_by_s_minus_l():
    # the public align="bottom-right" and the launcher with offset S - L are the same call
    q, k, v, _ = make_case(1, 4, 2, 13, 40, False, seed=2)
    ql, kl, vl = (t.to(DEVICE, F32) for t in (q, k, v))
    public = forward(ql, kl, vl, None, (6, 0), True, BR, (16, 16))
    by_hand = forward(ql, kl, vl, None, (6, 0), True, 27, (16, 16))
    top_left = forward(ql, kl, vl, None, (6, 0), True, TL, (16, 16))
    assert torch.equal(public[0], by_hand[0]) and torch.equal(public[1], by_hand[1])
    assert max_abs_error(top_left[0], public[0]) > DISTINGUISHABLE  # top-left is another band


def test_fully_masked_rows_get_zero_output():
    # window (0, 0) with L > S: queries i >= S see no key; offset -3 hides queries 0..2 as well.
    B, H, H_kv, L, S = 1, 4, 2, 21, 13
    q, k, v, _ = make_case(B, H, H_kv, L, S, False, seed=3)
    out, lse = forward(*(t.to(DEVICE, F32) for t in (q, k, v)), None, (0, 0), False, -3, (16, 16))
    empty = torch.tensor([i < 3 or i - 3 >= S for i in range(L)])  # (L,) rows that see no key
    assert int(empty.sum()) == 3 + (L - (S + 3))
    assert torch.isneginf(lse.cpu()[:, :, empty]).all() and torch.isfinite(lse.cpu()[:, :, ~empty]).all()
    assert torch.equal(out.cpu()[:, :, empty], torch.zeros(B, H, int(empty.sum()), DV))
    assert (out.cpu()[:, :, ~empty] != 0).any()


def test_blocks_outside_the_band_are_never_read():
    # NaN in K, V and Q where no query block's band reaches: a kernel that loaded those blocks (even masked:
    # 0 · NaN = NaN in the dot) would return NaN. In the first call the one query block sees keys 35..55
    # (window (5, 0), offset 40), so key blocks 0-1 and 4 are skipped; in the second, query blocks 0-1 see no
    # key at all (offset -40), so none of their key blocks is visited and their NaN queries never meet a key.
    for L, S, offset, poison_keys, poison_queries in ((16, 80, 40, list(range(32)) + list(range(64, 80)), []),
                                                      (64, 16, -40, [], list(range(32)))):
        q, k, v, _ = make_case(1, 4, 2, L, S, False, seed=5)
        ref_out, _ = plain_attention(q, k, v, visible_band(L, S, True, (5, 0), offset)[None, None])
        k[:, :, poison_keys] = float("nan")
        v[:, :, poison_keys] = float("nan")
        q[:, :, poison_queries] = float("nan")
        out, _ = forward(*(t.to(DEVICE, F32) for t in (q, k, v)), None, (5, 0), True, offset, (16, 16))
        assert_close(out.cpu(), ref_out, what=f"out, offset {offset}")


def test_no_repeated_keys_or_values_are_allocated():
    # Every tensor that torch creates during the call (the interpreter's storage copies included, counted in
    # bytes) is smaller than one repeated K or V, (B, H, S, D) or (B, H, S, Dv): the kernel reads the shared
    # head in place.
    B, H, H_kv, L, S = 1, 8, 1, 5, 37
    q, k, v, _ = make_case(B, H, H_kv, L, S, False, seed=7)
    ql, kl, vl = (t.to(DEVICE, F32) for t in (q, k, v))
    (out, _), largest = largest_tensor(flash_attention_triton, ql, kl, vl, enable_gqa=True, window_size=(3, 0))
    assert out.shape == (B, H, L, DV)
    if DEVICE.type == "cpu":  # the recorder sees the interpreter's copies of K (a GPU kernel copies nothing)
        assert largest >= kl.numel()
    assert largest < B * H * S * min(D, DV), largest
