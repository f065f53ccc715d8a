"""The Triton forward kernel (attn_lib/flash/triton/forward.py) against the float64 reference, and the rule that decides how Triton runs.

Without a GPU these run the kernel under Triton's interpreter (``TRITON_INTERPRET=1``, set
once per process by attn_lib.device before Triton is imported); on a CUDA machine they run the
compiled kernel on CUDA tensors (ATTN_LIB_DEVICE overrides the device). Sizes are small: the
interpreter executes every program instance in numpy.
"""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import attn_lib
from attn_lib import device as attn_device
from attn_lib.flash.autograd import OVERFLOW_MESSAGE, flash_attention, flash_attention_triton, kernel_flags, load_kernel
from attn_lib.flash.naive import naive_attention
from attn_lib.tolerances import assert_close, assert_flash_rule, lse_atol

from attn_paths import flash_inputs as make_inputs, flash_reference as reference

# Triton is pinned in requirements.txt, so this always runs. Do not `import triton` here: the
# first import decides whether Triton interprets, and attn_lib.flash.autograd must make that choice.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

DEVICE = torch.device(os.environ.get("ATTN_LIB_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu"))


def run_and_check(shape, dtype, causal, padding, *, block_m=None, block_n=None, seed=0):
    B, H, L, S, D, Dv = shape
    q, k, v, kpm = make_inputs(B, H, L, S, D, Dv, seed=seed, padding=padding)
    ref, lse_ref = reference(q, k, v, kpm, causal)
    ql, kl, vl = (t.to(dtype).to(DEVICE) for t in (q, k, v))
    kpm_dev = None if kpm is None else kpm.to(DEVICE)
    out, lse = flash_attention_triton(ql, kl, vl, is_causal=causal, key_padding_mask=kpm_dev,
                                      block_m=block_m, block_n=block_n)
    assert out.shape == (B, H, L, Dv) and out.dtype == dtype and lse.shape == (B, H, L)
    out, lse = out.cpu(), lse.cpu()
    naive = naive_attention(ql, kl, vl, is_causal=causal, key_padding_mask=kpm_dev).cpu()
    assert_flash_rule(out, naive, ref, what=f"triton {dtype}")
    if dtype == torch.float32:
        assert_close(out, ref, what="triton float32")
    assert torch.equal(torch.isneginf(lse), torch.isneginf(lse_ref))
    fin = torch.isfinite(lse_ref)
    assert torch.allclose(lse[fin].double(), lse_ref[fin], atol=lse_atol(dtype))
    return out


CASES = [  # (B, H, L, S, D, Dv), dtype, causal, padding
    ((1, 1, 1, 1, 16, 16), torch.float32, False, False),
    ((1, 1, 1, 1, 4, 4), torch.float32, True, False),  # D < 16: padded to 16
    ((2, 3, 17, 17, 16, 16), torch.float32, True, True),
    ((1, 2, 17, 97, 32, 32), torch.float32, False, True),
    ((1, 1, 97, 17, 20, 20), torch.float32, True, False),  # L > S, D not a power of two
    ((1, 2, 113, 113, 64, 64), torch.float32, True, False),
    ((2, 1, 97, 113, 40, 24), torch.float16, False, True),  # D != Dv, neither a power of two
    ((1, 2, 113, 97, 64, 64), torch.float16, True, False),
    ((2, 1, 113, 113, 32, 32), torch.bfloat16, True, True),
    ((1, 1, 17, 65, 128, 128), torch.bfloat16, False, False),
    ((2, 2, 33, 97, 96, 96), torch.float16, True, True),  # causal with L < S
    ((1, 3, 64, 64, 64, 64), torch.bfloat16, False, True),  # lengths that are whole blocks
]


@pytest.mark.parametrize("shape,dtype,causal,padding", CASES,
                         ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple) else str(c).replace("torch.", ""))
def test_kernel_matches_reference(shape, dtype, causal, padding):
    run_and_check(shape, dtype, causal, padding)


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (32, 16), (16, 64)])
def test_many_small_blocks_causal_diagonal(block_m, block_n):
    # stage 1 (unmasked) and stage 2 (diagonal, ragged end) both run for several query blocks
    run_and_check((1, 2, 97, 113, 16, 16), torch.float32, True, True, block_m=block_m, block_n=block_n)
    run_and_check((1, 1, 113, 50, 16, 16), torch.float32, True, False, block_m=block_m, block_n=block_n)


def test_head_dim_256_and_length_1025():
    run_and_check((1, 1, 5, 23, 256, 256), torch.float16, True, False)
    run_and_check((1, 1, 1025, 1025, 16, 16), torch.float32, True, False, block_m=64, block_n=64)


def test_strided_inputs_and_scale():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 33, 3, 16, generator=gen, dtype=torch.float64).transpose(1, 2)  # (B,H,L,D) view
    k = torch.randn(2, 40, 3, 16, generator=gen, dtype=torch.float64).transpose(1, 2)
    v = torch.randn(2, 3, 16, 40, generator=gen, dtype=torch.float64).transpose(2, 3)  # (B,H,S,Dv) view
    ref, _ = reference(q, k, v, None, False, scale=0.5)
    out, _ = flash_attention_triton(q.float().to(DEVICE), k.float().to(DEVICE), v.float().to(DEVICE), scale=0.5)
    assert not q.float().is_contiguous()
    assert_close(out.cpu(), ref)


def test_rows_that_see_no_key_give_zeros():
    q, k, v, _ = make_inputs(2, 1, 9, 6, 16)
    kpm = torch.ones(2, 6, dtype=torch.bool)
    kpm[1] = False
    kpm[0, 0] = False
    out, lse = flash_attention_triton(q.float().to(DEVICE), k.float().to(DEVICE), v.float().to(DEVICE),
                                      is_causal=True, key_padding_mask=kpm.to(DEVICE))
    out, lse = out.cpu(), lse.cpu()
    assert torch.all(out[1] == 0) and torch.all(torch.isneginf(lse[1]))
    assert torch.all(out[0, :, 0] == 0) and torch.isfinite(out).all()


def test_empty_keys_and_empty_queries():
    q = torch.randn(1, 2, 5, 16, device=DEVICE)
    none = torch.randn(1, 2, 0, 16, device=DEVICE)
    out, lse = flash_attention_triton(q, none, none)
    assert torch.all(out.cpu() == 0) and torch.all(torch.isneginf(lse.cpu()))
    out, lse = flash_attention_triton(none, q, q, is_causal=True)
    assert out.shape == (1, 2, 0, 16) and lse.shape == (1, 2, 0)


def test_dispatcher_runs_the_kernel_in_the_process_mode():
    q, k, v, kpm = make_inputs(1, 2, 17, 33, 16, padding=True)
    ref, _ = reference(q, k, v, kpm, True)
    ql, kl, vl = (t.float().to(DEVICE) for t in (q, k, v))
    out = flash_attention(ql, kl, vl, is_causal=True, key_padding_mask=kpm.to(DEVICE), backend="triton")
    assert_close(out.cpu(), ref)
    module = load_kernel()
    assert module is load_kernel()  # imported once
    interpret = attn_device.triton_interprets()
    assert interpret is attn_device.triton_interprets()  # decided once
    assert interpret == (not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1")
    kind = type(module._attn_fwd).__name__
    assert kind == ("InterpretedFunction" if interpret else "JITFunction")
    if interpret:  # the process mode is an environment variable, kept for the whole process
        assert os.environ.get("TRITON_INTERPRET") == "1"


def test_cpu_tensors_in_a_compiled_process_get_a_clear_error(monkeypatch):
    # On a GPU machine Triton compiles; CPU tensors then name the remedies instead of crashing.
    monkeypatch.setitem(attn_device._triton_mode, "interpret", False)
    q = torch.zeros(1, 1, 4, 16)
    with pytest.raises(ValueError, match=r"got tensors on cpu, but Triton in this process compiles GPU kernels.*"
                                         r"expected CUDA tensors.*backend='torch'.*TRITON_INTERPRET=1"):
        flash_attention_triton(q, q, q)


def _run_clean(code: str, **env_extra) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter without TRITON_INTERPRET (plus ``env_extra``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "ATTN_LIB_DEVICE")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180)


_RUN_KERNEL = (
    "q = torch.randn(1, 2, 20, 16); k = torch.randn(1, 2, 30, 16)\n"
    "out = attn_lib.flash_attention(q, k, k, is_causal=True, backend='triton')\n"
    "ref, _ = attn_lib.attention(q, k, k, is_causal=True)\n"
    "print(bool((out - ref).abs().max() <= attn_lib.tolerances.FLOAT32_ATOL))\n"
)

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter rule is for machines without a GPU")


@needs_no_gpu
def test_attn_lib_first_sets_interpret_mode_for_the_whole_process():
    code = (
        "import os, sys, torch, attn_lib\n"
        "print('triton' in sys.modules, os.environ.get('TRITON_INTERPRET'))\n"
        "from torch.utils._python_dispatch import TorchDispatchMode\n"
        "class Spy(TorchDispatchMode):\n"
        "    def __torch_dispatch__(self, func, types, args=(), kwargs=None):\n"
        "        return func(*args, **(kwargs or {}))\n"
        "with Spy(): torch.ones(2) + 1\n"  # torch imports triton here (the book's memory spy does this)
        "print('triton' in sys.modules)\n" + _RUN_KERNEL +
        "print(os.environ.get('TRITON_INTERPRET'))\n"
        "import triton.language, torch._dynamo\n"  # later imports see the same mode
        "print(type(triton.language.standard.zeros).__name__)\n"
        "print(attn_lib.flash_attention(q, k, k, backend='triton').shape == (1, 2, 20, 16))\n"
    )
    res = _run_clean(code)
    assert res.stdout.split() == ["False", "1", "True", "True", "1", "InterpretedFunction", "True"], res.stdout + res.stderr


@needs_no_gpu
def test_triton_imported_first_in_compiled_mode_gives_the_remedy():
    # e.g. torch.compile / torch._dynamo imports triton (compiled mode) before attn_lib runs a kernel
    code = (
        "import torch, triton.language, attn_lib\n"
        "q = torch.randn(1, 1, 8, 16)\n"
        "try:\n"
        "    attn_lib.flash_attention(q, q, q, backend='triton')\n"
        "except RuntimeError as e:\n"
        "    print(str(e))\n"
    )
    res = _run_clean(code)
    msg = res.stdout
    assert "Triton is already imported in compiled (GPU) mode" in msg, res.stdout + res.stderr
    assert "no CUDA device" in msg and "expected Triton in interpreter mode" in msg
    assert "TRITON_INTERPRET=1" in msg and "use_triton_interpreter()" in msg and "backend='torch'" in msg


@needs_no_gpu
@pytest.mark.parametrize("setup", ["import attn_lib.device; attn_lib.device.use_triton_interpreter()\n",
                                   "import os; os.environ['TRITON_INTERPRET'] = '1'\n"])
def test_the_remedies_work_when_triton_is_imported_first(setup):
    code = setup + "import torch, triton.language, attn_lib\n" + _RUN_KERNEL
    res = _run_clean(code)
    assert res.stdout.split() == ["True"], res.stdout + res.stderr


def test_no_cuda_device_is_known_without_touching_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: 1 / 0)  # must not be asked
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", None)
    assert attn_device.no_cuda_device_for_sure()  # a CPU-only torch build
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(attn_device.sys, "platform", "linux")
    monkeypatch.setattr(attn_device.glob, "glob", lambda pattern: [])
    assert attn_device.no_cuda_device_for_sure()  # CUDA build, but no /dev/nvidia0 (e.g. Colab's CPU runtime)
    monkeypatch.setattr(attn_device.glob, "glob", lambda pattern: ["/dev/nvidia0"])
    assert not attn_device.no_cuda_device_for_sure()
    monkeypatch.setattr(attn_device.sys, "platform", "win32")
    monkeypatch.setattr(attn_device.glob, "glob", lambda pattern: [])
    assert not attn_device.no_cuda_device_for_sure()  # cannot tell: decided at the first kernel call
    monkeypatch.setattr(torch.version, "hip", "6.2")
    monkeypatch.setattr(attn_device.sys, "platform", "linux")
    assert not attn_device.no_cuda_device_for_sure()


def test_prefer_interpreter_early_only_sets_an_unset_variable(monkeypatch):
    monkeypatch.setattr(attn_device, "no_cuda_device_for_sure", lambda: True)
    monkeypatch.setattr(attn_device, "_triton_mode", {})
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.delitem(sys.modules, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    attn_device.prefer_interpreter_early()
    assert os.environ["TRITON_INTERPRET"] == "0"  # the reader's own setting stands
    monkeypatch.delenv("TRITON_INTERPRET")
    attn_device.prefer_interpreter_early()
    assert os.environ["TRITON_INTERPRET"] == "1"
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(attn_device, "no_cuda_device_for_sure", lambda: False)
    attn_device.prefer_interpreter_early()
    assert "TRITON_INTERPRET" not in os.environ


def test_use_triton_interpreter_too_late_is_an_error(monkeypatch):
    monkeypatch.setitem(attn_device._triton_mode, "interpret", False)
    with pytest.raises(RuntimeError, match=r"came too late.*already imported in compiled mode.*TRITON_INTERPRET=1"):
        attn_device.use_triton_interpreter()


def test_gpu_configurations_fit_shared_memory():
    module = load_kernel()
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        elem = 4 if dtype == torch.float32 else 2
        for D in (16, 20, 64, 96, 128, 256):
            for kind in ("fwd", "dq", "dkdv"):
                configs = module.candidate_configs(D, D, dtype, interpret=False, kind=kind)
                assert configs
                for cfg in configs:
                    bm, bn, bd, st = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_D"], cfg["num_stages"]
                    if kind == "fwd":  # Q_i stays, K_j and V_j stream num_stages deep
                        smem = elem * (bm * bd + st * bn * 2 * bd)
                    elif kind == "dq":  # Q_i and dO_i stay, K_j and V_j stream
                        smem = elem * (bm + st * bn) * 2 * bd
                    else:  # K_j and V_j stay, Q_i and dO_i stream
                        smem = elem * (bn + st * bm) * 2 * bd
                    assert smem <= module.SMEM_BUDGET, (dtype, D, kind, cfg)
                    assert cfg["BLOCK_D"] >= D and cfg["BLOCK_D"] & (cfg["BLOCK_D"] - 1) == 0
                    assert min(bm, bn, bd) >= 16
                # the OutOfResources fallback never retries an identical configuration
                assert len({tuple(sorted(c.items())) for c in configs}) == len(configs)
    # the benchmark's cases get the tutorial's large tiles
    cfg = module.default_config(64, 64, torch.float16, interpret=False)
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_stages"]) == (128, 64, 3)
    assert module.default_config(128, 128, torch.bfloat16, interpret=False)["BLOCK_M"] == 128
    cfg = module.default_config(64, 64, torch.float16, interpret=False, kind="dkdv")
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"]) == (32, 128)
    cfg = module.default_config(64, 64, torch.float16, interpret=False, kind="dq")
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"]) == (128, 32)


def test_user_block_sizes_give_one_configuration():
    module = load_kernel()
    for kind in ("fwd", "dq", "dkdv"):
        configs = module.candidate_configs(64, 64, torch.float16, interpret=False, kind=kind, block_m=16, block_n=32)
        assert len(configs) == 1 and (configs[0]["BLOCK_M"], configs[0]["BLOCK_N"]) == (16, 32)
        only_m = module.candidate_configs(64, 64, torch.float16, interpret=False, kind=kind, block_m=16)
        assert len(only_m) == 1 and only_m[0]["BLOCK_M"] == 16
        assert only_m[0]["BLOCK_N"] == module.default_config(64, 64, torch.float16, False, kind=kind)["BLOCK_N"]
    with pytest.raises(ValueError, match=r"kind must be one of \('fwd', 'dq', 'dkdv'\), got 'bwd'"):
        module.candidate_configs(64, 64, torch.float16, interpret=False, kind="bwd")


def test_out_of_resources_falls_back_to_the_next_configuration():
    from triton.runtime.errors import OutOfResources

    module = load_kernel()
    configs = module.candidate_configs(128, 128, torch.float16, interpret=False, kind="dkdv")
    tried = []

    def run(cfg):  # this "GPU" accepts only the third configuration
        tried.append(cfg)
        if len(tried) < 3:
            raise OutOfResources(200000, 101376, "shared memory")

    assert module._run_first_fitting(configs, run) is configs[2]
    assert tried == configs[:3]

    def never(cfg):
        raise OutOfResources(200000, 101376, "shared memory")

    with pytest.raises(OutOfResources):  # the smallest configuration's failure reaches the caller
        module._run_first_fitting(configs, never)


def test_grid_chunks_respect_cuda_grid_limits():
    module = load_kernel()
    assert module.MAX_GRID_Y == 65535
    assert module.grid_chunks(0) == []
    assert module.grid_chunks(1) == [(0, 1)]
    assert module.grid_chunks(65535) == [(0, 65535)]
    assert module.grid_chunks(65536) == [(0, 65535), (65535, 1)]
    chunks = module.grid_chunks(1_000_000)
    assert all(count <= 65535 for _, count in chunks)
    covered = [h for start, count in chunks for h in range(start, start + count)]
    assert covered == list(range(1_000_000))  # every head exactly once, in order
    assert module.grid_chunks(7, limit=3) == [(0, 3), (3, 3), (6, 1)]


def test_needs_int64_when_an_offset_inside_a_head_may_reach_2_31():
    module = load_kernel()
    assert not module.needs_int64([(4096, 64, 64, 1)])  # (L, D) = (4096, 64), contiguous
    assert not module.needs_int64([(1 << 20, 128, 128, 1)])  # 2**27 elements per head
    assert module.needs_int64([(1 << 24, 128, 128, 1)])  # 2**31 elements in one head
    # (B, L, H, D) memory seen as (B, H, L, D): row stride H*D = 32768, L = 65536 -> 2**31
    assert module.needs_int64([(65536, 32768, 128, 1)])
    assert not module.needs_int64([(65536 - 512, 32768, 128, 1)])
    # masked lanes past L (up to one block) and BLOCK_D columns count too
    assert module.needs_int64([((1 << 31) // 1024 - 100, 1024, 1, 1)])
    assert module.needs_int64([(4, 64, 64, 1), (1 << 26, 64, 64, 1)])  # any tensor decides


def test_heads_launched_in_chunks_forward(monkeypatch):
    # CUDA's grid axis 1 holds at most 65535 programs (B·H > 65535 fails on a GPU); with the
    # limit set to 2 here, B·H = 6 heads need three launches, each from its own HZ_START.
    module = load_kernel()
    monkeypatch.setattr(module, "MAX_GRID_Y", 2)
    run_and_check((2, 3, 17, 33, 16, 16), torch.float32, True, True)
    run_and_check((1, 5, 9, 9, 16, 16), torch.float16, False, False)


def test_int64_offsets_give_the_same_output(monkeypatch):
    module = load_kernel()
    q, k, v, kpm = make_inputs(2, 2, 33, 40, 16, padding=True)
    args = [t.float().to(DEVICE) for t in (q, k, v)]
    out32, lse32 = flash_attention_triton(*args, is_causal=True, key_padding_mask=kpm.to(DEVICE))
    monkeypatch.setattr(module, "needs_int64", lambda spans, max_block=256: True)
    out64, lse64 = flash_attention_triton(*args, is_causal=True, key_padding_mask=kpm.to(DEVICE))
    assert torch.equal(out32, out64) and torch.equal(lse32, lse64)


def test_bf16_dot_in_fp32_before_sm80(monkeypatch):
    # Colab's T4 is sm_75: Triton has no bf16 tl.dot there, so the kernel multiplies in fp32.
    gpu = torch.device("cuda", 0)
    for capability, dtype, dot_fp32 in [((7, 5), torch.bfloat16, True), ((7, 5), torch.float16, False),
                                        ((7, 5), torch.float32, False), ((8, 0), torch.bfloat16, False),
                                        ((9, 0), torch.bfloat16, False), ((8, 6), torch.float16, False)]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        flags = kernel_flags(dtype, gpu, interpret=False)
        assert flags["dot_fp32"] is dot_fp32, (capability, dtype)
        assert flags["capability"] == capability
        assert flags["input_precision"] == ("ieee" if dot_fp32 or dtype == torch.float32 else None)
    # the interpreter always multiplies in fp32 (its bf16 tl.dot is wrong) and never asks the GPU
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: 1 / 0)
    assert kernel_flags(torch.bfloat16, torch.device("cpu"), interpret=True) == {
        "dot_fp32": True, "input_precision": "ieee", "capability": None}


def test_gpus_before_sm80_get_one_stage_tiles_within_64_kb():
    module = load_kernel()
    for kind in ("fwd", "dq", "dkdv"):
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            for D in (16, 64, 128, 256):
                t4 = module.candidate_configs(D, D, dtype, interpret=False, kind=kind, capability=(7, 5))
                assert t4 and all(cfg["num_stages"] == 1 for cfg in t4)
                for cfg in t4:
                    if (cfg["BLOCK_M"], cfg["BLOCK_N"]) != (16, 16):  # the last resort is always offered
                        assert module._smem_bytes_pre_sm80(dtype, kind, cfg["BLOCK_M"], cfg["BLOCK_N"],
                                                           cfg["BLOCK_D"], cfg["BLOCK_DV"]) <= 64 * 1024
                a100 = module.candidate_configs(D, D, dtype, interpret=False, kind=kind, capability=(8, 0))
                assert a100 == module.candidate_configs(D, D, dtype, interpret=False, kind=kind)
    assert module.SMEM_BUDGET_PRE_SM80 == 64 * 1024


# Shared memory (bytes) of the kernels compiled for sm_75 (Colab's T4) with Triton 3.7.1's
# bundled ptxas, no GPU needed: causal, key padding, D = Dv, one stage (measured with
# `bench/gpu.py --compile-only 75 --head-dims 64 128` and the same call for the other tiles).
MEASURED_SM75 = {  # (kind, dtype, D, BLOCK_M, BLOCK_N) -> bytes
    ("fwd", torch.float16, 64, 128, 64): 65536, ("fwd", torch.bfloat16, 64, 128, 64): 81920,
    ("fwd", torch.float16, 128, 64, 32): 49152, ("fwd", torch.float16, 128, 32, 32): 32768,
    ("fwd", torch.bfloat16, 128, 64, 32): 57344, ("fwd", torch.bfloat16, 128, 32, 32): 36864,
    ("dkdv", torch.float16, 64, 32, 128): 81920, ("dkdv", torch.bfloat16, 64, 32, 64): 57344,
    ("dkdv", torch.float16, 128, 32, 64): 81920, ("dkdv", torch.float16, 128, 16, 32): 40960,
    ("dkdv", torch.bfloat16, 128, 32, 64): 106496, ("dkdv", torch.bfloat16, 128, 16, 32): 51200,
    ("dq", torch.float16, 64, 128, 32): 81920, ("dq", torch.bfloat16, 64, 64, 32): 49152,
    ("dq", torch.float16, 128, 64, 32): 81920, ("dq", torch.float16, 128, 32, 16): 40960,
    ("dq", torch.bfloat16, 128, 64, 32): 98304, ("dq", torch.bfloat16, 128, 32, 16): 49152,
    ("fwd", torch.float16, 128, 64, 64): 65536, ("fwd", torch.bfloat16, 64, 64, 64): 49152,
    ("dkdv", torch.float16, 64, 32, 64): 40960, ("dq", torch.float16, 64, 64, 32): 40960,
}


def test_pre_sm80_shared_memory_model_matches_the_sm75_compiler():
    module = load_kernel()
    for (kind, dtype, D, bm, bn), measured in MEASURED_SM75.items():
        model = module._smem_bytes_pre_sm80(dtype, kind, bm, bn, D, D)
        assert measured <= model <= 2 * measured, (kind, dtype, D, bm, bn, model, measured)
    for kind in ("fwd", "dq", "dkdv"):
        for dtype in (torch.float16, torch.bfloat16):
            for D in (64, 128):
                first = module.candidate_configs(D, D, dtype, interpret=False, kind=kind, capability=(7, 5))[0]
                measured = MEASURED_SM75.get((kind, dtype, D, first["BLOCK_M"], first["BLOCK_N"]))
                assert measured is not None and measured <= 64 * 1024, (kind, dtype, D, first)


def test_dot_fp32_matches_the_low_precision_dot_on_bf16():
    # what the T4 fallback runs: bf16 inputs, fp32 dots; still within the flash-attn rule
    module = load_kernel()
    q, k, v, kpm = make_inputs(1, 2, 40, 50, 32, padding=True)
    ql, kl, vl = (t.to(DEVICE, torch.bfloat16) for t in (q, k, v))
    out, _ = module.launch(ql, kl, vl, kpm.to(DEVICE), True, 32**-0.5, interpret=attn_device.triton_interprets(),
                           dot_fp32=True)
    ref, _ = reference(q, k, v, kpm, True)
    naive = naive_attention(ql, kl, vl, is_causal=True, key_padding_mask=kpm.to(DEVICE))
    assert_flash_rule(out.cpu(), naive.cpu(), ref, what="bf16 with fp32 dots")


def test_fp16_dots_without_the_fp32_fallback_forward():
    # the GPU's fp16 code path (DOT_FP32 off) runs under the interpreter too (only bf16 dots are wrong there)
    module = load_kernel()
    q, k, v, kpm = make_inputs(2, 1, 97, 113, 40, 24, padding=True)
    ql, kl, vl = (t.to(DEVICE, torch.float16) for t in (q, k, v))
    out, _ = module.launch(ql, kl, vl, kpm.to(DEVICE), True, 40**-0.5, interpret=attn_device.triton_interprets(),
                           dot_fp32=False)
    ref, _ = reference(q, k, v, kpm, True)
    naive = naive_attention(ql, kl, vl, is_causal=True, key_padding_mask=kpm.to(DEVICE))
    assert_flash_rule(out.cpu(), naive.cpu(), ref, what="fp16 dots")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's overflow warnings inside the interpreter
def test_overflowing_scores_raise_the_agreed_error():
    q = torch.ones(1, 1, 3, 16, device=DEVICE) * 1e20
    k = torch.ones(1, 1, 4, 16, device=DEVICE) * 1e20  # q·k = 1.6e41 > 3.4e38
    v = torch.randn(1, 1, 4, 16, device=DEVICE)
    pattern = (r"^attention scores overflowed to \+inf \(\|scale·q·k\| exceeds the range of float32\); "
               r"compute in float64 or use a smaller scale$")
    assert OVERFLOW_MESSAGE == "attention scores overflowed to +inf"
    with pytest.raises(ValueError, match=pattern):
        flash_attention_triton(q, k, v)
    with pytest.raises(ValueError, match=pattern):  # a huge scale overflows ordinary scores too
        flash_attention_triton(torch.ones_like(q), torch.ones_like(k), v, scale=1e38)
    # one overflowing row is enough, even when the other rows are fine
    q2 = torch.randn(1, 1, 3, 16, device=DEVICE)
    q2[0, 0, 1] = 1e20
    with pytest.raises(ValueError, match=pattern):
        flash_attention_triton(q2, k, v, is_causal=True)
    # a row whose keys are all masked is not an overflow: zeros, lse = -inf
    kpm = torch.zeros(1, 4, dtype=torch.bool, device=DEVICE)
    out, lse = flash_attention_triton(q2, k, v, key_padding_mask=kpm)
    assert torch.all(out == 0) and torch.all(torch.isneginf(lse))


def test_requires_grad_is_refused_with_the_function_to_use():
    q = torch.randn(1, 1, 4, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 1, 4, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"without a gradient, but q, k or v requires grad.*"
                                         r"attn_lib.flash_attention\(q, k, v, backend='triton'\)"):
        flash_attention_triton(q, k, k)
    with torch.no_grad():  # as inside a torch.autograd.Function's forward
        out, _ = flash_attention_triton(q, k, k)
    ref, _ = attn_lib.attention(q.detach().double().cpu(), k.double().cpu(), k.double().cpu())
    assert_close(out.cpu(), ref)


def _load_gpu_bench():
    import importlib.util as iu
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "gpu.py"
    spec = iu.spec_from_file_location("bench_gpu", path)
    bench = iu.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench, path


def test_gpu_benchmark_without_gpu():
    bench, path = _load_gpu_bench()
    assert bench.attention_flops(1, 8, 4096, 4096, 64) == 4 * 8 * 4096 * 4096 * 64
    assert bench.attention_flops(1, 8, 4096, 4096, 64, causal=True) == 2 * 8 * 4096 * 4096 * 64
    # forward + backward: 2 + 5 products of N x N x D, i.e. 3.5 x the forward
    assert bench.attention_flops(1, 8, 4096, 4096, 64, mode="fwd_bwd") == 14 * 8 * 4096 * 4096 * 64
    assert bench.attention_flops(2, 8, 1024, 512, 64, True, "fwd_bwd") == 7 * 2 * 8 * 1024 * 512 * 64
    with pytest.raises(ValueError, match=r"mode must be one of \('fwd', 'fwd_bwd'\), got 'bwd'"):
        bench.attention_flops(1, 1, 1, 1, 1, mode="bwd")
    assert bench.shape_for(1024, 64, None, None) == (16, 32)
    assert bench.shape_for(16384, 128, None, None) == (1, 16)
    assert bench.shape_for(4096, 64, 1, 8) == (1, 8)
    args = bench.parse_args(["--quick"])
    assert args.sizes == [1024, 4096] and args.dtypes == ["float16"] and args.passes == ["fwd", "fwd_bwd"]
    assert bench.parse_args(["--passes", "fwd_bwd"]).passes == ["fwd_bwd"]
    rows = [dict(impl=i, mode=m, dtype="float16", D=64, N=1024, causal=False, ms=1.0, tflops=t, peak_extra_mib=1.0)
            for m in ("fwd", "fwd_bwd") for i, t in (("sdpa_flash", 200.0), ("triton", 190.0 if m == "fwd" else 150.0))]
    rows.append(dict(impl="naive", mode="fwd_bwd", dtype="float16", D=64, N=1024, causal=False, error="OOM"))
    table = bench.format_table(rows).splitlines()
    assert table[0].split()[:2] == ["pass", "dtype"]
    body = [line.split() for line in table[2:]]
    assert [r[0] for r in body] == ["fwd", "fwd", "fwd_bwd", "fwd_bwd", "fwd_bwd"]  # forward rows first
    assert body[1][5] == "triton" and body[1][8] == "0.95"
    assert body[2][5] == "naive" and body[2][6] == "OOM"
    assert body[4][5] == "triton" and body[4][8] == "0.75"
    assert bench.parse_args(["--compile-only", "75"]).compile_only == 75  # the compile itself: test_bench_gpu_compile.py
    res = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "--passes" in res.stdout and "fwd_bwd" in res.stdout
    if not torch.cuda.is_available():
        res = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and "needs a CUDA GPU" in res.stderr


def test_gpu_benchmark_times_the_right_computation():
    # What bench/gpu.py times, run on this machine's device: the Triton forward + backward and
    # SDPA's (through autograd) give the float64 reference's gradients.
    bench, _ = _load_gpu_bench()
    module = load_kernel()
    flags = kernel_flags(torch.float32, DEVICE, attn_device.triton_interprets())
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, 2, 24, 16, generator=gen, dtype=torch.float64) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref, _ = attn_lib.attention(*leaves, is_causal=True)
    ref.backward(dout)
    ql, kl, vl, dl = (t.float().to(DEVICE) for t in (q, k, v, dout))
    out, _ = bench.make_fn(torch, "triton", "fwd", ql, kl, vl, dl, True, module, flags)()
    assert_close(out.cpu(), ref.detach())
    grads = bench.make_fn(torch, "triton", "fwd_bwd", ql, kl, vl, dl, True, module, flags)()
    for g, leaf in zip(grads, leaves):
        assert_close(g.cpu(), leaf.grad)
    # SDPA's flash backend takes fp32 on the CPU only (on CUDA it wants fp16/bf16)
    for impl in ("sdpa_flash", "naive") if DEVICE.type == "cpu" else ("naive",):
        sl = [t.clone().requires_grad_() for t in (ql, kl, vl)]
        assert bench.make_fn(torch, impl, "fwd_bwd", *sl, dl, True, module, flags)() is None
        for g, leaf in zip(sl, leaves):
            assert_close(g.grad.cpu(), leaf.grad, what=impl)
