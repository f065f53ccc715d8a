"""bench/gpu.py without a GPU: its arguments, FLOP and byte counts (against counts by loops or by real tensors),
its tables, the peak bandwidth it cites, that every timed callable computes what its name says (under Triton's
interpreter, against the float64 reference or torch's SDPA with a mask from tests/attn_paths.visible_band), that its
correctness checks pass and catch a wrong kernel, and ``--compile-only SM``: attn_lib's launchers run for a GPU
of compute capability SM with every kernel compiled by Triton instead of launched (each compile in a subprocess,
since this process's Triton is in interpreter mode). Timings are never asserted."""
import importlib.util as iu
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import attn_lib
from attn_lib.flash import splits
from attn_lib.flash.triton.configs import candidate_configs, decode_configs
from attn_lib.tolerances import assert_close
from attn_paths import visible_band

# Do not `import triton` here: attn_lib.device decides the process's Triton mode first.
pytestmark = pytest.mark.skipif(iu.find_spec("triton") is None, reason="triton is not installed")

ROOT = Path(__file__).resolve().parents[2]
GPU_PATH = ROOT / "bench" / "gpu.py"
_spec = iu.spec_from_file_location("bench_gpu", GPU_PATH)
gpu = iu.module_from_spec(_spec)
_spec.loader.exec_module(gpu)

ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")  # the attn_lib beside this bench/gpu.py


def run_script(*args, timeout=300, **env):
    return subprocess.run([sys.executable, str(GPU_PATH), *args], capture_output=True, text=True, timeout=timeout,
                          env={**ENV, **env}, cwd=ROOT)


# --- FLOPs, shapes, arguments, tables ------------------------------------------------------------------------

def test_attention_flops_and_shapes():
    assert gpu.attention_flops(1, 8, 4096, 4096, 64) == 4 * 8 * 4096 * 4096 * 64
    assert gpu.attention_flops(1, 8, 4096, 4096, 64, causal=True) == 2 * 8 * 4096 * 4096 * 64
    # forward + backward: 2 + 5 products of N x N x D, i.e. 3.5 x the forward
    assert gpu.attention_flops(1, 8, 4096, 4096, 64, mode="fwd_bwd") == 14 * 8 * 4096 * 4096 * 64
    assert gpu.attention_flops(2, 8, 1024, 512, 64, True, "fwd_bwd") == 7 * 2 * 8 * 1024 * 512 * 64
    with pytest.raises(ValueError, match=r"mode must be one of \('fwd', 'fwd_bwd'\), got 'bwd'"):
        gpu.attention_flops(1, 1, 1, 1, 1, mode="bwd")
    assert gpu.shape_for(1024, 64, None, None) == (16, 32)
    assert gpu.shape_for(16384, 128, None, None) == (1, 16)
    assert gpu.shape_for(4096, 64, 1, 8) == (1, 8)


@pytest.mark.parametrize("N,window", [(1, None), (7, None), (7, 0), (7, 2), (7, 6), (7, 50), (33, 5)])
def test_band_pairs_counts_the_visible_pairs(N, window):
    assert gpu.band_pairs(N, window) == int(visible_band(N, N, True, None if window is None else (window, 0)).sum())


def test_pair_flops():
    assert gpu.pair_flops(2, 4, 10, 8) == 4 * 2 * 4 * 10 * 8
    assert gpu.pair_flops(2, 4, 10, 8, "fwd_bwd") == 14 * 2 * 4 * 10 * 8  # 3.5 x forward
    with pytest.raises(ValueError, match=r"mode must be one of \('fwd', 'fwd_bwd'\), got 'bwd'"):
        gpu.pair_flops(1, 1, 1, 1, "bwd")
    # 16k tokens, window 256: (256 * 257 / 2 + (16384 - 257) * 257) pairs instead of 16384 * 16385 / 2
    assert gpu.band_pairs(16384, 256) == 257 * 258 // 2 + (16384 - 257) * 257


def test_arguments_of_the_main_suite():
    args = gpu.parse_args(["--quick"])
    assert args.sizes == [1024, 4096] and args.dtypes == ["float16"] and args.passes == ["fwd", "fwd_bwd"]
    assert args.suite is None
    assert gpu.parse_args(["--passes", "fwd_bwd"]).passes == ["fwd_bwd"]
    assert gpu.parse_args([]).sizes == [1024, 2048, 4096, 8192, 16384]
    assert gpu.parse_args(["--compile-only", "75"]).compile_only == 75


def test_arguments_of_the_window_and_gqa_suites():
    a = gpu.parse_args(["--window", "256"])
    assert (a.suite, a.window, a.sizes, a.dtypes, a.head_dims) == ("window", 256, [2048, 4096, 8192, 16384],
                                                                    ["bfloat16"], [128])
    assert a.impls == ["triton_window", "triton_causal", "sdpa_band", "sdpa_causal"]
    g = gpu.parse_args(["--gqa", "--quick"])
    assert (g.suite, g.sizes, g.impls) == ("gqa", [1024, 4096], ["triton_gqa", "sdpa_gqa"])
    assert gpu.parse_args(["--gqa", "--dtypes", "float16"]).dtypes == ["float16"]
    with pytest.raises(SystemExit):
        gpu.parse_args(["--gqa", "--window", "8"])


def test_arguments_of_the_decode_suite():
    a = gpu.parse_args(["--decode"])
    assert (a.suite, a.sizes, a.dtypes) == ("decode", [1024, 2048, 4096, 8192, 16384, 32768], ["float16", "bfloat16"])
    assert a.splits == [1, 2, 4, 8, 16, "auto"]
    assert a.impls == ["flash_fwd", "sdpa_gqa", "split_1", "split_2", "split_4", "split_8", "split_16", "split_auto"]
    q = gpu.parse_args(["--decode", "--quick", "--splits", "3", "auto", "--dtypes", "bfloat16"])
    assert (q.sizes, q.splits, q.dtypes) == ([1024, 16384], [3, "auto"], ["bfloat16"])
    assert q.impls == ["flash_fwd", "sdpa_gqa", "split_3", "split_auto"]
    for bad in (["--decode", "--splits", "0"], ["--decode", "--splits", "two"], ["--decode", "--gqa"],
                ["--decode", "--window", "8"]):
        with pytest.raises(SystemExit):
            gpu.parse_args(bad)
    assert gpu.parse_args(["--gqa"]).suite == "gqa" and gpu.parse_args([]).suite is None  # the others unchanged


def test_main_table():
    rows = [dict(impl=i, mode=m, dtype="float16", D=64, N=1024, causal=False, ms=1.0, tflops=t, peak_extra_mib=1.0)
            for m in ("fwd", "fwd_bwd") for i, t in (("sdpa_flash", 200.0), ("triton", 190.0 if m == "fwd" else 150.0))]
    rows.append(dict(impl="naive", mode="fwd_bwd", dtype="float16", D=64, N=1024, causal=False, error="OOM"))
    table = gpu.format_table(rows).splitlines()
    assert table[0].split()[:2] == ["pass", "dtype"]
    body = [line.split() for line in table[2:]]
    assert [r[0] for r in body] == ["fwd", "fwd", "fwd_bwd", "fwd_bwd", "fwd_bwd"]  # forward rows first
    assert body[1][5] == "triton" and body[1][8] == "0.95"
    assert body[2][5] == "naive" and body[2][6] == "OOM"
    assert body[4][5] == "triton" and body[4][8] == "0.75"


def test_table_of_the_window_and_gqa_suites():
    rows = [dict(suite="window", impl=i, mode="fwd", dtype="bfloat16", D=128, N=n, ms=ms, tflops=1.0,
                 peak_extra_mib=0.0)
            for n, times in ((2048, (1.0, 2.0, 4.0)), (8192, (4.0, 32.0, 64.0)))
            for i, ms in zip(("triton_window", "triton_causal", "sdpa_band"), times)]
    rows.append(dict(suite="window", impl="sdpa_causal", mode="fwd", dtype="bfloat16", D=128, N=8192, error="OOM"))
    body = [line.split() for line in gpu.format_suite_table(rows).splitlines()[2:]]
    assert [r[3] for r in body] == ["triton_window", "triton_causal", "sdpa_band"] * 2 + ["sdpa_causal"]
    assert body[3][6:8] == ["0.06", "4.00"]  # 4 / 64 x SDPA; 4 / 1 the time at N = 2048
    assert body[4][7] == "16.00" and body[6][4] == "OOM"


def test_decode_table():
    rows = [dict(impl=i, dtype="float16", S=s, splits=p, ms=ms, gb_per_s=gbps, peak_fraction=frac)
            for s in (1024, 4096)
            for i, p, ms, gbps, frac in (("split_4", 4, 0.01, 400.0, 0.12), ("flash_fwd", None, 0.04, 100.0, 0.03),
                                         ("split_auto", 8, 0.008, 500.0, 0.15), ("sdpa_gqa", None, 0.05, 80.0, None))]
    rows.append(dict(impl="split_auto", dtype="bfloat16", S=1024, splits=8, error="OOM"))
    body = [line.split() for line in gpu.format_decode_table(rows).splitlines()[2:]]
    assert body[0] == ["bfloat16", "1024", "split_auto", "8", "OOM"]  # sorted by dtype, then S
    assert [r[2] for r in body[1:5]] == ["flash_fwd", "sdpa_gqa", "split_4", "split_auto"]  # baselines first
    assert [r[1] for r in body[1:]] == ["1024"] * 4 + ["4096"] * 4
    f16 = body[1:5]
    assert f16[2] == ["float16", "1024", "split_4", "4", "10.0", "400.0", "12.0", "4.00"]  # 0.04 / 0.01 x no split
    assert f16[3][3] == "8" and f16[3][7] == "5.00"  # auto: the count it chose; 0.04 / 0.008
    assert f16[1][6] == "-" and f16[0][7] == "1.00"  # SDPA: no peak share given; flash_fwd against itself


# --- the decode suite's bytes, bandwidth and split count ----------------------------------------------------

def test_cache_bytes_are_the_bytes_of_k_and_v():
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        k = torch.empty(2, 8, 300, 128, dtype=dtype)  # (B,H_kv,S,D)
        v = torch.empty(2, 8, 300, 64, dtype=dtype)  # (B,H_kv,S,Dv)
        nbytes = k.numel() * k.element_size() + v.numel() * v.element_size()
        assert gpu.cache_bytes(2, 8, 300, 128, 64, k.element_size()) == nbytes
    # The benchmark's largest case, fp16: 8 heads x 32768 keys x (128 + 128) x 2 bytes = 128 MiB, read once.
    assert gpu.cache_bytes(1, 8, 32768, 128, 128, 2) == 128 * 2**20
    assert gpu.kv_loads_bytes("split_4", 1, 32, 8, 1024, 128, 128, 2) == gpu.cache_bytes(1, 8, 1024, 128, 128, 2)
    assert gpu.kv_loads_bytes("flash_fwd", 1, 32, 8, 1024, 128, 128, 2) == 4 * gpu.cache_bytes(1, 8, 1024, 128, 128, 2)
    assert gpu.kv_loads_bytes("sdpa_gqa", 1, 32, 8, 1024, 128, 128, 2) is None


@pytest.mark.parametrize("name,peak", [("NVIDIA H200", 4.8e12), ("NVIDIA H100 80GB HBM3", 3.35e12),
                                       ("NVIDIA H100 PCIe", 2.0e12), ("NVIDIA H100 NVL", 3.9e12),
                                       ("NVIDIA A100-SXM4-80GB", 2.039e12), ("NVIDIA A100 80GB PCIe", 1.935e12),
                                       ("NVIDIA A100-SXM4-40GB", 1.555e12), ("NVIDIA A10G", 0.6e12),
                                       ("NVIDIA L4", 0.3e12), ("NVIDIA L40S", 0.864e12), ("Tesla T4", 0.32e12),
                                       ("Tesla V100-SXM2-32GB", 0.9e12)])
def test_peak_bandwidth_of_known_gpus_cites_its_datasheet(name, peak):
    got, source = gpu.peak_bandwidth(name, 5120, 1)
    assert got == peak and "datasheet" in source


def test_peak_bandwidth_of_other_gpus_from_the_device_properties():
    # 2 (double data rate) x 5120-bit bus / 8 x 2619 MHz = 3.352 TB/s; "RTX A1000" is not an A10.
    got, source = gpu.peak_bandwidth("NVIDIA RTX A1000", 5120, 2_619_000)
    assert got == pytest.approx(2 * 640 * 2.619e9) and "5120-bit" in source and "2619 MHz" in source
    assert gpu.peak_bandwidth("Some GPU") == (None, "unknown")


def test_auto_splits_is_the_library_choice_for_the_device(monkeypatch):
    seen = []
    monkeypatch.setattr(splits, "choose_num_splits", lambda bh, S, workers: seen.append((bh, S, workers)) or 7)
    monkeypatch.setattr(splits, "device_workers", lambda device: {"cuda": 132}[device])  # the SMs of the GPU
    assert gpu.auto_splits(8, 16384) == 7 and seen == [(8, 16384, 132)]
    monkeypatch.undo()
    # the real rule on this CPU: min(ceil(threads / (B*H_kv)), blocks // 2, blocks) with 128 keys a block
    threads = torch.get_num_threads()
    assert gpu.auto_splits(1, 16384, "cpu") == max(1, min(threads, 128 // 2))


# --- what is timed computes what its name says ----------------------------------------------------------------

def _leaves(ts, grad):
    return [t.detach().clone().requires_grad_(grad) for t in ts]


def test_main_suite_callables_compute_attention_and_its_gradients():
    # What bench/gpu.py times, run here under the interpreter: the Triton forward and forward + backward,
    # SDPA's flash backend and the naive path give the float64 reference's output and gradients.
    attn_lib.device.triton_interprets()
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, 2, 24, 16, generator=gen, dtype=torch.float64) for _ in range(4))
    leaves = _leaves((q, k, v), True)
    ref, _ = attn_lib.attention(*leaves, is_causal=True)
    ref.backward(dout)
    ql, kl, vl, dl = (t.float() for t in (q, k, v, dout))
    # SDPA's flash backend takes fp32 on the CPU only (on CUDA it wants fp16/bf16)
    for impl in ("triton", "sdpa_flash", "naive"):
        out = gpu.make_fn(torch, impl, "fwd", ql, kl, vl, dl, True)()  # (B,H,L,D)
        assert_close(out, ref.detach(), what=f"{impl} forward")
        sl = _leaves((ql, kl, vl), True)
        assert gpu.make_fn(torch, impl, "fwd_bwd", *sl, dl, True)() is None
        for g, leaf in zip(sl, leaves):
            assert_close(g.grad, leaf.grad, what=f"{impl} backward", kind="gradient")
    unmasked = gpu.make_fn(torch, "triton", "fwd", ql, kl, vl, dl, False)()  # causal=False is passed on
    assert_close(unmasked, attn_lib.attention(q, k, v)[0], what="triton, not causal")


def _sdpa_band(q, k, v, window):
    """SDPA with the causal (window) band as a bool mask from the definition, K and V repeated over the group."""
    G = q.shape[1] // k.shape[1]
    kr, vr = (t.detach().repeat_interleave(G, dim=1) for t in (k, v))  # (B,H,N,D): the oracle only
    return F.scaled_dot_product_attention(q.detach(), kr, vr, attn_mask=visible_band(q.shape[2], q.shape[2], True, None if window is None else (window, 0)))


@pytest.mark.parametrize("impl,H_kv,window", [("triton_window", 2, 5), ("triton_causal", 4, None),
                                              ("triton_gqa", 1, None), ("sdpa_band", 4, 5), ("sdpa_causal", 4, None),
                                              ("sdpa_gqa", 1, None)])
@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_window_and_gqa_suite_callables_compute_what_they_say(impl, H_kv, window, mode):
    attn_lib.device.triton_interprets()
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 40, 16, generator=gen)  # (B,H,N,D)
    k, v = (torch.randn(1, H_kv, 40, 16, generator=gen) for _ in range(2))  # (B,H_kv,N,D)
    dout = torch.randn(1, 4, 40, 16, generator=gen)  # (B,H,N,D)
    want = _sdpa_band(q, k, v, window)  # (B,H,N,D)
    q, k, v = _leaves((q, k, v), mode == "fwd_bwd")
    out = gpu.suite_fn(torch, impl, mode, q, k, v, dout, window)()
    if mode == "fwd":
        assert_close(out, want, what=impl)
        return
    assert out is None
    leaves = _leaves((q, k, v), True)
    G = 4 // H_kv
    want = F.scaled_dot_product_attention(leaves[0], *(t.repeat_interleave(G, dim=1) for t in leaves[1:]),
                                          attn_mask=visible_band(40, 40, True, None if window is None else (window, 0)))  # (B,H,N,D), K, V repeated
    want.backward(dout)  # the repeat's backward sums the group's gradients
    for got, ref in zip((q, k, v), leaves):
        assert_close(got.grad, ref.grad, what=f"{impl} gradient", kind="gradient")


def test_main_suite_check_passes_and_catches_a_wrong_kernel(monkeypatch):
    attn_lib.device.triton_interprets()
    gpu.check_kernel(torch, device="cpu", dims=(1, 2, 40, 16))
    real = gpu.make_fn

    def no_mask(torch, impl, mode, q, k, v, dout, causal):  # a kernel that ignores is_causal
        return real(torch, impl, mode, q, k, v, dout, False)

    monkeypatch.setattr(gpu, "make_fn", no_mask)
    with pytest.raises(AssertionError, match="triton out torch.float16 causal=True"):
        gpu.check_kernel(torch, device="cpu", dims=(1, 2, 40, 16))


def test_window_suite_check_passes_and_catches_a_wrong_window(monkeypatch):
    attn_lib.device.triton_interprets()
    gpu.check_suite(torch, 5, device="cpu", dims=(1, 4, 2, 40, 16))
    real = gpu.suite_fn

    def wider(torch, impl, mode, q, k, v, dout, window):  # a kernel that sees one key more on the left
        return real(torch, impl, mode, q, k, v, dout, window + 1)

    monkeypatch.setattr(gpu, "suite_fn", wider)
    with pytest.raises(AssertionError, match="triton GQA \\+ window 5 torch.float16"):
        gpu.check_suite(torch, 5, device="cpu", dims=(1, 4, 2, 40, 16))


def visible_by_loop(n, L, S):
    vis = torch.zeros(1, 1, L, S, dtype=torch.bool)
    for i in range(L):
        for j in range(S):
            vis[0, 0, i, j] = j < n and j <= n - L + i
    return vis


@pytest.mark.parametrize("L", [1, 3])
def test_every_timed_decode_callable_computes_one_decode_step(L):
    attn_lib.device.triton_interprets()
    g = torch.Generator().manual_seed(0)
    S = 45
    q = torch.randn(1, 4, L, 16, generator=g)  # (B,H,L,D)
    k, v = (torch.randn(1, 2, S, 16, generator=g) for _ in range(2))  # (B,H_kv,S,D)
    want, _ = attn_lib.attention(q.double(), k.double(), v.double(), mask=visible_by_loop(S, L, S), enable_gqa=True)
    seqlens = torch.tensor([S], dtype=torch.int32)
    for impl in ("flash_fwd", "sdpa_gqa", "split_1", "split_3"):
        out = gpu.decode_fn(torch, impl, q, k, v, seqlens)()  # (B,H,L,D)
        assert_close(out, want, what=f"{impl} L={L}")


def test_one_case_of_the_decode_suite_with_a_stand_in_timer(monkeypatch):
    # bench_decode_case on CPU under the interpreter, a small shape, the timer replaced: 0.5 ms for each call.
    attn_lib.device.triton_interprets()
    monkeypatch.setattr(splits, "choose_num_splits", lambda bh, S, workers: 3)
    kw = dict(shape=(1, 4, 2, 1, 16), device="cpu", timer=lambda fn: fn() is not None and 0.5)
    r = gpu.bench_decode_case(torch, "split_auto", "float16", 40, 1e12, **kw)
    nbytes = 2 * (1 * 2 * 40 * 16) * 2  # K and V: (1, 2, 40, 16) fp16 each
    assert (r["splits"], r["ms"], r["cache_bytes"]) == (3, 0.5, nbytes)
    assert r["gb_per_s"] == pytest.approx(nbytes / 0.5e-3 / 1e9) and r["peak_fraction"] == pytest.approx(
        nbytes / 0.5e-3 / 1e12)
    assert gpu.bench_decode_case(torch, "flash_fwd", "float16", 40, None, **kw)["kv_loads_bytes"] == 2 * nbytes


def test_decode_suite_check_passes_and_catches_a_wrong_kernel(monkeypatch):
    attn_lib.device.triton_interprets()
    gpu.check_decode(torch, device="cpu", dims=(3, 4, 2, 40, 16))
    real = gpu.decode_fn

    def off_by_one(torch, impl, q, k, v, seqlens):  # a kernel that drops the last key of every entry
        return real(torch, impl, q, k, v, seqlens - 1)

    monkeypatch.setattr(gpu, "decode_fn", off_by_one)
    with pytest.raises(AssertionError, match="split_1 torch.float16 L=1"):
        gpu.check_decode(torch, device="cpu", dims=(3, 4, 2, 40, 16))


def test_without_a_gpu_every_suite_exits_with_the_message():
    res = run_script("--help")
    assert res.returncode == 0
    for flag in ("--passes", "fwd_bwd", "--window", "--gqa", "--decode", "--splits", "--compile-only"):
        assert flag in res.stdout
    if not torch.cuda.is_available():
        for suite in ([], ["--gqa"], ["--window", "8"], ["--decode"]):
            res = run_script(*suite)
            assert res.returncode == 2 and "needs a CUDA GPU" in res.stderr, suite


# --- --compile-only SM ---------------------------------------------------------------------------------------

LINE = re.compile(r"^\s+(\w+) D=(\d+)\s+(\w+)\s+((?:BLOCK_\w+=\d+ )+)stages=(\d+) warps=(\d+):\s+(\d+) bytes(.*)$")
KERNELS = [name for names in gpu.LAUNCHED_KERNELS.values() for name in names]
# A limit below the decode split kernel's first configuration (fp16, D = 64, sm_80: BLOCK_N = 128, 38912
# bytes in the full run) and above its second (BLOCK_N = 64).
DECODE_LIMIT = 30000


def compiled(stdout: str) -> list:
    """The printed kernels: dicts with dtype, D, kernel, blocks, stages, warps, shared, fits."""
    rows = []
    for line in stdout.splitlines():
        m = LINE.match(line)
        if m:
            blocks = dict(pair.split("=") for pair in m.group(4).split())
            rows.append(dict(dtype=m.group(1), D=int(m.group(2)), kernel=m.group(3),
                             blocks={k: int(v) for k, v in blocks.items()}, stages=int(m.group(5)),
                             warps=int(m.group(6)), shared=int(m.group(7)), fits="over the limit" not in m.group(8)))
    return rows


def run_code(code: str):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**ENV, "TRITON_INTERPRET": "0"}, cwd=ROOT)


def compile_only(sm: int, dtype: str, D: int, *, limit: int | None = None, decode_only: bool = False):
    """bench/gpu.py's compile_only in a fresh process (Triton compiled mode), the SM's limit optionally replaced."""
    code = (f"import importlib.util as iu, sys\nspec = iu.spec_from_file_location('gpu', {str(GPU_PATH)!r})\n"
            "gpu = iu.module_from_spec(spec); spec.loader.exec_module(gpu)\n"
            + (f"gpu.MAX_SHARED[{sm}] = {limit}\n" if limit is not None else "")
            + f"sys.exit(gpu.compile_only({sm}, [{D}], [{dtype!r}], decode_only={decode_only}))\n")
    return run_code(code)


def test_the_launched_kernels_are_the_kernel_files_names():
    assert gpu.LAUNCHED_KERNELS == {
        "attn_lib.flash.triton.forward": ("attn_fwd",),
        "attn_lib.flash.triton.backward": ("attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq"),
        "attn_lib.flash.triton.decode": ("decode_split", "decode_merge")}
    for name, kernels in gpu.LAUNCHED_KERNELS.items():
        module = attn_lib.flash.triton.entry.load_kernels(name.rsplit(".", 1)[1])
        assert all(k in module.__all__ for k in kernels)


# sm_75 bf16 (its dots in fp32, DOT_FP32) compiles for half a minute with a cold Triton cache: slow.
@pytest.mark.parametrize("sm,dtype", [(80, "float16"), pytest.param(75, "bfloat16", marks=pytest.mark.slow)])
def test_every_kernel_compiles_within_the_shared_memory_limit(sm, dtype):
    D, cap = 64, (sm // 10, sm % 10)
    res = run_script("--compile-only", str(sm), "--dtypes", dtype, "--head-dims", str(D))
    assert res.returncode == 0, res.stderr[-3000:]
    rows = compiled(res.stdout)
    assert [r["kernel"] for r in rows if r["fits"]] == KERNELS  # each launched once, in the launchers' order
    limit = gpu.MAX_SHARED[sm]
    for r in rows:
        assert (r["dtype"], r["D"]) == (dtype, D)
        assert 0 < r["shared"] and (r["shared"] <= limit) == r["fits"], r
    # bf16 on sm_75 has no bf16 tl.dot: the launchers' rule (attn_lib.rules.numerics.dot_fp32) says DOT_FP32.
    assert f"# {dtype}: DOT_FP32={sm < 80 and dtype == 'bfloat16'}" in res.stdout
    tdtype = getattr(torch, dtype)
    rows_per_group = gpu.DECODE_SHAPE[1] // gpu.DECODE_SHAPE[2] * gpu.DECODE_SHAPE[3]  # G * L
    configs = {kernel: candidate_configs(D, D, tdtype, False, kind=kind, capability=cap)
               for kernel, kind in (("attn_fwd", "fwd"), ("attn_bwd_dkdv", "dkdv"), ("attn_bwd_dq", "dq"))}
    configs["decode_split"] = decode_configs(rows_per_group, D, D, tdtype, False, capability=cap)
    for kernel, cfgs in configs.items():  # the configurations tried, in attn_lib.flash.triton.configs's order
        tried = [r for r in rows if r["kernel"] == kernel]
        assert tried, kernel
        assert [(r["blocks"], r["stages"], r["warps"]) for r in tried] == [
            ({k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_DV")}, c["num_stages"], c["num_warps"])
            for c in cfgs[:len(tried)]]


def test_a_kernel_over_the_limit_makes_the_launcher_try_its_next_configuration():
    res = compile_only(80, "float16", 64, limit=DECODE_LIMIT, decode_only=True)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = compiled(res.stdout)
    split_rows = [r for r in rows if r["kernel"] == "decode_split"]
    want = [c["BLOCK_N"] for c in decode_configs(4, 64, 64, torch.float16, False, capability=(8, 0))][:2]
    assert [r["blocks"]["BLOCK_N"] for r in split_rows] == want  # 128 tried first, then 64
    assert not split_rows[0]["fits"] and split_rows[0]["shared"] > DECODE_LIMIT
    assert split_rows[1]["fits"] and split_rows[1]["shared"] <= DECODE_LIMIT
    assert [r["kernel"] for r in rows if r["fits"]] == ["decode_split", "decode_merge"]


def test_no_configuration_fits_exits_1_naming_the_launcher():
    res = compile_only(80, "float16", 64, limit=100, decode_only=True)
    assert res.returncode == 1
    assert "no configuration of the float16 D=64 decode launcher fits sm_80" in res.stderr
    split_rows = [r for r in compiled(res.stdout) if r["kernel"] == "decode_split"]
    assert len(split_rows) == len(decode_configs(4, 64, 64, torch.float16, False, capability=(8, 0)))
    assert not any(r["fits"] for r in split_rows)


def test_unknown_sm_and_interpreter_mode_are_refused():
    assert gpu.compile_only(70, [64], ["float16"]) == 2  # no limit known for sm_70
    res = run_code(f"import os, sys\nos.environ['TRITON_INTERPRET'] = '1'\nsys.argv = [{str(GPU_PATH)!r}]\n"
                   "import runpy; g = runpy.run_path(sys.argv[0])\n"
                   "sys.exit(g['compile_only'](80, [64], ['float16']))\n")
    assert res.returncode == 2 and "interpreter mode" in res.stderr
