"""The decode suite of bench/gpu.py (``--decode``) without a GPU: its arguments, the bytes it counts (against
the bytes of real tensors), the peak bandwidth it cites, its table, and that every timed callable computes one
decode step (under Triton's interpreter, against the float64 reference with a mask built by a loop here).
Timings are never asserted."""
import importlib.util as iu
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import attn_lib
import attn_lib.flash
from attn_lib.tolerances import assert_close

ROOT = Path(__file__).resolve().parents[2]
GPU_PATH = ROOT / "bench" / "gpu.py"
_spec = iu.spec_from_file_location("bench_gpu_decode_suite", GPU_PATH)
gpu = iu.module_from_spec(_spec)
_spec.loader.exec_module(gpu)


def test_decode_arguments():
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


def test_auto_splits_is_the_library_choice(monkeypatch):
    seen = []
    fake = types.ModuleType("attn_lib.flash.decoding")
    fake.choose_num_splits = lambda batch_heads, S, workers=16: seen.append((batch_heads, S, workers)) or 7
    fake.device_workers = lambda device: {"cuda": 132}[device]  # the SMs of the GPU, as flash_decoding passes
    monkeypatch.setitem(sys.modules, "attn_lib.flash.decoding", fake)
    monkeypatch.setattr(attn_lib.flash, "decoding", fake, raising=False)
    assert gpu.auto_splits(8, 16384) == 7 and seen == [(8, 16384, 132)]
    del fake.device_workers  # an attn_lib.flash.decoding without it: its own default
    assert gpu.auto_splits(8, 16384) == 7 and seen[-1] == (8, 16384, 16)
    fake.choose_num_splits = lambda batch_heads: 2  # another signature: no number, a message
    assert gpu.auto_splits(8, 16384) is None
    monkeypatch.setitem(sys.modules, "attn_lib.flash.decoding", None)  # the module is missing: no number
    monkeypatch.delattr(attn_lib.flash, "decoding", raising=False)
    assert gpu.auto_splits(8, 16384) is None


def test_decode_table():
    rows = [dict(impl=i, dtype="float16", S=s, splits=p, ms=ms, gb_per_s=gbps, peak_fraction=frac)
            for s in (1024, 4096)
            for i, p, ms, gbps, frac in (("split_4", 4, 0.01, 400.0, 0.12), ("flash_fwd", None, 0.04, 100.0, 0.03),
                                         ("split_auto", 8, 0.008, 500.0, 0.15), ("sdpa_gqa", None, 0.05, 80.0, None))]
    rows.append(dict(impl="split_auto", dtype="bfloat16", S=1024, splits=None, error="n/a"))
    body = [line.split() for line in gpu.format_decode_table(rows).splitlines()[2:]]
    assert body[0] == ["bfloat16", "1024", "split_auto", "-", "n/a"]  # sorted by dtype, then S
    assert [r[2] for r in body[1:5]] == ["flash_fwd", "sdpa_gqa", "split_4", "split_auto"]  # baselines first
    assert [r[1] for r in body[1:]] == ["1024"] * 4 + ["4096"] * 4
    f16 = body[1:5]
    assert f16[2] == ["float16", "1024", "split_4", "4", "10.0", "400.0", "12.0", "4.00"]  # 0.04 / 0.01 x no split
    assert f16[3][3] == "8" and f16[3][7] == "5.00"  # auto: the count it chose; 0.04 / 0.008
    assert f16[1][6] == "-" and f16[0][7] == "1.00"  # SDPA: no peak share given; flash_fwd against itself


def visible_by_loop(n, L, S):
    vis = torch.zeros(1, 1, L, S, dtype=torch.bool)
    for i in range(L):
        for j in range(S):
            vis[0, 0, i, j] = j < n and j <= n - L + i
    return vis


@pytest.mark.parametrize("L", [1, 3])
def test_every_timed_callable_computes_one_decode_step(L):
    attn_lib.device.triton_interprets()
    g = torch.Generator().manual_seed(0)
    S = 45
    q = torch.randn(1, 4, L, 16, generator=g)  # (B,H,L,D)
    k, v = (torch.randn(1, 2, S, 16, generator=g) for _ in range(2))  # (B,H_kv,S,D)
    want, _ = attn_lib.attention(q.double(), k.double(), v.double(), mask=visible_by_loop(S, L, S), enable_gqa=True)
    seqlens = torch.tensor([S], dtype=torch.int32)
    for impl in ("flash_fwd", "sdpa_gqa", "split_1", "split_3"):
        out = gpu.decode_fn(torch, impl, q, k, v, seqlens, interpret=True)()  # (B,H,L,D)
        assert_close(out, want, what=f"{impl} L={L}")


def test_decode_suite_without_gpu_exits_with_the_message():
    res = subprocess.run([sys.executable, str(GPU_PATH), "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "--decode" in res.stdout and "--splits" in res.stdout
    if not torch.cuda.is_available():
        res = subprocess.run([sys.executable, str(GPU_PATH), "--decode"], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and "needs a CUDA GPU" in res.stderr


def test_one_case_of_the_suite_with_a_stand_in_timer(monkeypatch):
    # bench_decode_case on CPU under the interpreter, a small shape, the timer replaced: 0.5 ms for each call.
    attn_lib.device.triton_interprets()
    fake = types.SimpleNamespace(choose_num_splits=lambda bh, S, workers: 3, device_workers=lambda device: 4)
    monkeypatch.setitem(sys.modules, "attn_lib.flash.decoding", fake)
    monkeypatch.setattr(attn_lib.flash, "decoding", fake, raising=False)
    kw = dict(shape=(1, 4, 2, 1, 16), device="cpu", timer=lambda fn: fn() is not None and 0.5)
    r = gpu.bench_decode_case(torch, "split_auto", "float16", 40, 1e12, **kw)
    nbytes = 2 * (1 * 2 * 40 * 16) * 2  # K and V: (1, 2, 40, 16) fp16 each
    assert (r["splits"], r["ms"], r["cache_bytes"]) == (3, 0.5, nbytes)
    assert r["gb_per_s"] == pytest.approx(nbytes / 0.5e-3 / 1e9) and r["peak_fraction"] == pytest.approx(
        nbytes / 0.5e-3 / 1e12)
    assert gpu.bench_decode_case(torch, "flash_fwd", "float16", 40, None, **kw)["kv_loads_bytes"] == 2 * nbytes
    monkeypatch.setitem(sys.modules, "attn_lib.flash.decoding", None)
    monkeypatch.delattr(attn_lib.flash, "decoding", raising=False)
    assert gpu.bench_decode_case(torch, "split_auto", "float16", 40, None, **kw)["error"] == "n/a"


def test_the_suites_correctness_check_passes_and_catches_a_wrong_kernel(monkeypatch):
    attn_lib.device.triton_interprets()
    gpu.check_decode(torch, device="cpu", dims=(3, 4, 2, 40, 16))
    real = gpu.decode_fn

    def off_by_one(torch, impl, q, k, v, seqlens, **kw):  # a kernel that drops the last key of every entry
        return real(torch, impl, q, k, v, seqlens - 1, **kw)

    monkeypatch.setattr(gpu, "decode_fn", off_by_one)
    with pytest.raises(AssertionError, match="split_1 torch.float16 L=1"):
        gpu.check_decode(torch, device="cpu", dims=(3, 4, 2, 40, 16))
