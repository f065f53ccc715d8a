"""The Triton kernel (attn_lib/flash_triton.py) against the float64 reference.

Without a GPU these run the kernel under Triton's interpreter (``TRITON_INTERPRET=1``, set by
attn_lib.flash itself); on a CUDA machine set ATTN_LIB_DEVICE=cuda to run the real kernel.
Sizes are small: the interpreter executes every program instance in numpy.
"""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import attn_lib
from attn_lib.flash import flash_attention, flash_attention_triton, load_kernel
from attn_lib.flash_torch import naive_attention
from attn_lib.tolerances import assert_close, assert_flash_rule, lse_atol

from flash_cases import make_inputs, reference

# Triton is pinned in requirements.txt, so this always runs. Do not `import triton` here: the
# first import decides whether Triton interprets, and attn_lib.flash must make that choice.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

DEVICE = torch.device(os.environ.get("ATTN_LIB_DEVICE", "cpu"))


def run_and_check(shape, dtype, causal, padding, *, block_m=None, block_n=None, seed=0):
    B, H, L, S, D, Dv = shape
    q, k, v, kpm = make_inputs(B, H, L, S, D, Dv, seed=seed, padding=padding)
    ref, lse_ref = reference(q, k, v, kpm, causal)
    ql, kl, vl = (t.to(dtype).to(DEVICE) for t in (q, k, v))
    kpm_dev = None if kpm is None else kpm.to(DEVICE)
    out, lse = flash_attention_triton(ql, kl, vl, causal=causal, key_padding_mask=kpm_dev,
                                      block_m=block_m, block_n=block_n)
    assert out.shape == (B, H, L, Dv) and out.dtype == dtype and lse.shape == (B, H, L)
    out, lse = out.cpu(), lse.cpu()
    naive = naive_attention(ql, kl, vl, causal=causal, key_padding_mask=kpm_dev).cpu()
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
                                      causal=True, key_padding_mask=kpm.to(DEVICE))
    out, lse = out.cpu(), lse.cpu()
    assert torch.all(out[1] == 0) and torch.all(torch.isneginf(lse[1]))
    assert torch.all(out[0, :, 0] == 0) and torch.isfinite(out).all()


def test_empty_keys_and_empty_queries():
    q = torch.randn(1, 2, 5, 16, device=DEVICE)
    none = torch.randn(1, 2, 0, 16, device=DEVICE)
    out, lse = flash_attention_triton(q, none, none)
    assert torch.all(out.cpu() == 0) and torch.all(torch.isneginf(lse.cpu()))
    out, lse = flash_attention_triton(none, q, q, causal=True)
    assert out.shape == (1, 2, 0, 16) and lse.shape == (1, 2, 0)


def test_dispatcher_runs_the_interpreter_on_cpu_tensors():
    before = os.environ.get("TRITON_INTERPRET")
    q, k, v, kpm = make_inputs(1, 2, 17, 33, 16, padding=True)
    ref, _ = reference(q, k, v, kpm, True)
    out = flash_attention(q.float(), k.float(), v.float(), causal=True, key_padding_mask=kpm, backend="triton")
    assert_close(out, ref)
    assert os.environ.get("TRITON_INTERPRET") == before  # the switch is restored after the call
    assert load_kernel(True) is load_kernel(True)  # imported once
    assert type(load_kernel(True)._attn_fwd).__name__ == "InterpretedFunction"


def _run_without_interpret_env(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter whose environment has no TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_interpreter_works_whatever_imported_triton_first():
    # torch itself imports triton in GPU mode in some code paths (e.g. TorchDispatchMode);
    # attn_lib's interpreted kernel has its own copy of Triton and still runs, and the
    # process's triton stays in GPU mode for everyone else.
    code = (
        "import os, sys; os.environ.pop('TRITON_INTERPRET', None)\n"
        "import triton, triton.language, torch, attn_lib\n"
        "q = torch.randn(1, 2, 20, 16); k = torch.randn(1, 2, 30, 16)\n"
        "out = attn_lib.flash_attention(q, k, k, causal=True, backend='triton')\n"
        "ref, _ = attn_lib.attention(q, k, k, is_causal=True)\n"
        "print(bool((out - ref).abs().max() < 1e-5))\n"
        "print(type(sys.modules['triton.language.standard'].zeros).__name__)\n"
        "print(sys.modules['triton'] is triton, 'TRITON_INTERPRET' in os.environ)\n"
    )
    res = _run_without_interpret_env(code)
    assert res.stdout.split() == ["True", "JITFunction", "True", "False"], res.stdout + res.stderr


def test_interpreter_does_not_leak_into_later_triton_imports():
    code = (
        "import os, sys; os.environ.pop('TRITON_INTERPRET', None)\n"
        "import torch, attn_lib\n"
        "q = torch.randn(1, 1, 8, 16)\n"
        "attn_lib.flash_attention(q, q, q, backend='triton')\n"
        "print('triton' in sys.modules, 'TRITON_INTERPRET' in os.environ)\n"
        "import triton.language\n"
        "print(type(triton.language.standard.zeros).__name__)\n"
    )
    res = _run_without_interpret_env(code)
    assert res.stdout.split() == ["False", "False", "JITFunction"], res.stdout + res.stderr


def test_gpu_configurations_fit_shared_memory():
    module = load_kernel(DEVICE.type != "cuda")
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        elem = 4 if dtype == torch.float32 else 2
        for D in (16, 20, 64, 96, 128, 256):
            configs = module.candidate_configs(D, D, dtype, interpret=False)
            assert configs
            for cfg in configs:
                smem = elem * (cfg["BLOCK_M"] * cfg["BLOCK_D"] + cfg["num_stages"] * cfg["BLOCK_N"] * 2 * cfg["BLOCK_D"])
                assert smem <= module.SMEM_BUDGET, (dtype, D, cfg)
                assert cfg["BLOCK_D"] >= D and cfg["BLOCK_D"] & (cfg["BLOCK_D"] - 1) == 0
                assert min(cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_D"]) >= 16
    # the benchmark's cases get the tutorial's large tiles
    cfg = module.default_config(64, 64, torch.float16, interpret=False)
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_stages"]) == (128, 64, 3)
    assert module.default_config(128, 128, torch.bfloat16, interpret=False)["BLOCK_M"] == 128


def test_clear_errors():
    q, k, v, _ = make_inputs(1, 1, 4, 4, 16)
    with pytest.raises(TypeError, match="float64 use backend='torch'"):
        flash_attention_triton(q, k, v)
    q, k, v = q.float(), k.float(), v.float()
    with pytest.raises(ValueError, match="power of two >= 16"):
        flash_attention_triton(q, k, v, block_m=24)
    with pytest.raises(ValueError, match="up to 256"):
        big = torch.randn(1, 1, 4, 264)
        flash_attention_triton(big, big, big)
    with pytest.raises(ValueError, match=r"\(B, S\)"):
        flash_attention_triton(q, k, v, key_padding_mask=torch.ones(1, 5, dtype=torch.bool))


def test_gpu_benchmark_without_gpu():
    import importlib.util as iu
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "gpu.py"
    spec = iu.spec_from_file_location("bench_gpu", path)
    bench = iu.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.attention_flops(1, 8, 4096, 4096, 64) == 4 * 8 * 4096 * 4096 * 64
    assert bench.attention_flops(1, 8, 4096, 4096, 64, causal=True) == 2 * 8 * 4096 * 4096 * 64
    assert bench.shape_for(1024, 64, None, None) == (16, 32)
    assert bench.shape_for(16384, 128, None, None) == (1, 16)
    assert bench.shape_for(4096, 64, 1, 8) == (1, 8)
    args = bench.parse_args(["--quick"])
    assert args.sizes == [1024, 4096] and args.dtypes == ["float16"]
    rows = [dict(impl=i, dtype="float16", D=64, N=1024, causal=False, ms=1.0, tflops=t, peak_extra_mib=1.0)
            for i, t in (("sdpa_flash", 200.0), ("triton", 190.0))]
    rows.append(dict(impl="naive", dtype="float16", D=64, N=1024, causal=False, error="OOM"))
    table = bench.format_table(rows)
    assert "0.95" in table and "OOM" in table
    if not torch.cuda.is_available():
        res = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and "needs a CUDA GPU" in res.stderr
