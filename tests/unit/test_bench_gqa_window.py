"""The window and GQA suites of bench/cpu.py and bench/gpu.py: argument defaults, the
FLOP count over the visible pairs (against a count by loops written here), the tables, that every
timed callable computes what its name says (against SDPA with a band mask built by a loop here),
and a --quick smoke run of the CPU suites. Timings are never asserted."""
import importlib.util as iu
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attn_lib.tolerances import tolerance

ROOT = Path(__file__).resolve().parents[2]


def _load(name):
    path = ROOT / "bench" / f"{name}.py"
    spec = iu.spec_from_file_location(f"bench_{name}_17", path)
    module = iu.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


cpu, CPU_PATH = _load("cpu")
gpu, GPU_PATH = _load("gpu")


def _band_by_loops(N, window):
    keep = torch.zeros(N, N, dtype=torch.bool)
    for i in range(N):
        for j in range(N):
            keep[i, j] = j <= i and (window is None or i - j <= window)
    return keep


@pytest.mark.parametrize("N,window", [(1, None), (7, None), (7, 0), (7, 2), (7, 6), (7, 50), (33, 5)])
def test_band_pairs_counts_the_visible_pairs(N, window):
    assert gpu.band_pairs(N, window) == int(_band_by_loops(N, window).sum())


def test_pair_flops():
    assert gpu.pair_flops(2, 4, 10, 8) == 4 * 2 * 4 * 10 * 8
    assert gpu.pair_flops(2, 4, 10, 8, "fwd_bwd") == 14 * 2 * 4 * 10 * 8  # 3.5 x forward
    with pytest.raises(ValueError, match=r"mode must be one of \('fwd', 'fwd_bwd'\), got 'bwd'"):
        gpu.pair_flops(1, 1, 1, 1, "bwd")
    # 16k tokens, window 256: (256 * 257 / 2 + (16384 - 257) * 257) pairs instead of 16384 * 16385 / 2
    assert gpu.band_pairs(16384, 256) == 257 * 258 // 2 + (16384 - 257) * 257


def test_gpu_arguments_of_the_suites():
    a = gpu.parse_args(["--window", "256"])
    assert (a.suite, a.window, a.sizes, a.dtypes, a.head_dims) == ("window", 256, [2048, 4096, 8192, 16384],
                                                                    ["bfloat16"], [128])
    assert a.impls == ["triton_window", "triton_causal", "sdpa_band", "sdpa_causal"]
    g = gpu.parse_args(["--gqa", "--quick"])
    assert (g.suite, g.sizes, g.impls) == ("gqa", [1024, 4096], ["triton_gqa", "sdpa_gqa"])
    assert gpu.parse_args(["--gqa", "--dtypes", "float16"]).dtypes == ["float16"]
    assert gpu.parse_args(["--quick"]).suite is None  # the old benchmark is unchanged
    with pytest.raises(SystemExit):
        gpu.parse_args(["--gqa", "--window", "8"])


def test_gpu_table_of_the_suites():
    rows = [dict(suite="window", impl=i, mode="fwd", dtype="bfloat16", D=128, N=n, ms=ms, tflops=1.0,
                 peak_extra_mib=0.0)
            for n, times in ((2048, (1.0, 2.0, 4.0)), (8192, (4.0, 32.0, 64.0)))
            for i, ms in zip(("triton_window", "triton_causal", "sdpa_band"), times)]
    rows.append(dict(suite="window", impl="sdpa_causal", mode="fwd", dtype="bfloat16", D=128, N=8192, error="OOM"))
    body = [line.split() for line in gpu.format_table17(rows).splitlines()[2:]]
    assert [r[3] for r in body] == ["triton_window", "triton_causal", "sdpa_band"] * 2 + ["sdpa_causal"]
    assert body[3][6:8] == ["0.06", "4.00"]  # 4 / 64 x SDPA; 4 / 1 the time at N = 2048
    assert body[4][7] == "16.00" and body[6][4] == "OOM"


def test_gpu_suites_without_gpu_exit_with_the_message():
    res = subprocess.run([sys.executable, str(GPU_PATH), "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "--window" in res.stdout and "--gqa" in res.stdout
    if not torch.cuda.is_available():
        res = subprocess.run([sys.executable, str(GPU_PATH), "--gqa"], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and "needs a CUDA GPU" in res.stderr


def test_cpu_arguments_of_the_suites():
    a = cpu.parse_args(["--window", "256"])
    assert (a.suite, a.window, a.sizes, a.heads, a.kv_heads, a.head_dim) == ("window", 256, [2048, 4096, 8192, 16384],
                                                                            8, 8, 64)
    q = cpu.parse_args(["--window", "256", "--quick"])
    assert (q.window, q.sizes) == (32, [256, 512])
    g = cpu.parse_args(["--gqa"])
    assert (g.heads, g.kv_heads, g.head_dim, g.sizes, g.impls) == (32, 8, 128, [1024, 2048, 4096],
                                                                   ["tiled_gqa", "sdpa_gqa"])
    old = cpu.parse_args([])
    assert (old.suite, old.heads, old.head_dim, old.impls) == (None, 8, 64, ["naive", "sdpa", "tiled"])
    with pytest.raises(SystemExit):
        cpu.parse_args(["--gqa", "--impls", "tiled_window"])


def test_cpu_table_of_the_suites():
    rows = [dict(suite="gqa", impl=i, mode=m, N=n, time_s=t, peak_extra_mib=1.0)
            for m in ("fwd", "fwd_bwd") for n, ts in ((1024, (0.2, 0.1)), (2048, (0.9, 0.4)))
            for i, t in zip(("tiled_gqa", "sdpa_gqa"), ts)]
    body = [line.split() for line in cpu.format_table17(rows).splitlines()[2:]]
    assert [(r[0], r[1], r[2]) for r in body[:4]] == [("fwd", "1024", "tiled_gqa"), ("fwd", "1024", "sdpa_gqa"),
                                                      ("fwd", "2048", "tiled_gqa"), ("fwd", "2048", "sdpa_gqa")]
    assert body[2][4:6] == ["2.25", "4.50"]  # 0.9 / 0.4 x SDPA; 0.9 / 0.2 the time at N = 1024
    assert body[4][0] == "fwd_bwd"


def _inputs(H, H_kv, N=40, D=8, grad=False):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, H, N, D, generator=g)  # (B,H,N,D)
    k, v = (torch.randn(1, H_kv, N, D, generator=g) for _ in range(2))  # (B,H_kv,N,D)
    dout = torch.randn(1, H, N, D, generator=g)  # (B,H,N,D)
    for t in (q, k, v):
        t.requires_grad_(grad)
    return q, k, v, dout


def test_sdpa_band_case_is_the_band():
    q, k, v, dout = _inputs(2, 2)
    out = cpu.case17_fn("sdpa_band", q, k, v, dout, 5, "fwd")()  # (B,H,N,D)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=_band_by_loops(40, 5))  # (B,H,N,D)
    torch.testing.assert_close(out, want, **tolerance(torch.float32))


@pytest.mark.parametrize("impl,H_kv,window", [("tiled_window", 4, 5), ("tiled_causal", 4, None),
                                              ("tiled_gqa", 1, None), ("sdpa_gqa", 1, None)])
@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_tiled_and_gqa_cases_compute_what_they_say(impl, H_kv, window, mode):
    """Needs the merged API (window_size, GQA by shape on the tiled path)."""
    q, k, v, dout = _inputs(4, H_kv, grad=mode == "fwd_bwd")
    out = cpu.case17_fn(impl, q, k, v, dout, window, mode)()  # (B,H,N,D)
    kr, vr = (t.detach().repeat_interleave(4 // H_kv, dim=1) for t in (k, v))  # (B,H,N,D), the oracle only
    want = F.scaled_dot_product_attention(q.detach(), kr, vr, attn_mask=_band_by_loops(40, window))  # (B,H,N,D)
    torch.testing.assert_close(out.detach(), want, **tolerance(torch.float32))
    if mode == "fwd_bwd":
        assert all(t.grad is not None and t.grad.shape == t.shape for t in (q, k, v))


@pytest.mark.parametrize("suite", [["--window", "16"], ["--gqa"]])
def test_cpu_suites_quick_smoke(suite, tmp_path):
    """Every case of the suite runs (needs the merged API); nothing is saved with --quick."""
    out = tmp_path / "r.json"
    res = subprocess.run([sys.executable, str(CPU_PATH), *suite, "--quick", "--reps", "1", "--sizes", "128",
                          "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    results = json.loads(out.read_text())["results"]
    impls = cpu.WINDOW_IMPLS if suite[0] == "--window" else cpu.GQA_IMPLS
    assert sorted((r["impl"], r["mode"]) for r in results) == sorted((i, m) for i in impls for m in cpu.MODES)
    assert not [r for r in results if "error" in r], [r["error"] for r in results if "error" in r]
    assert "failed" not in res.stdout


def test_rounds_merge_to_the_fastest_call_and_the_largest_memory():
    """--rounds: one case spawned several times, the sides alternating; the table keeps the minimum time over
    every timed call of every round, the largest peak memory, and an error if any round failed."""
    rounds = [{"impl": "tiled_gqa", "time_s": 0.30, "times_s": [0.31, 0.30], "peak_extra_mib": 70.0},
              {"impl": "tiled_gqa", "time_s": 0.25, "times_s": [0.25, 0.29], "peak_extra_mib": 72.0},
              {"impl": "tiled_gqa", "time_s": 0.27, "times_s": [0.28, 0.27], "peak_extra_mib": 71.0}]
    merged = cpu.merge_rounds(rounds)
    assert merged["time_s"] == 0.25 and merged["peak_extra_mib"] == 72.0 and merged["rounds"] == 3
    assert merged["times_s"] == [0.31, 0.30, 0.25, 0.29, 0.28, 0.27]
    failed = {"impl": "tiled_gqa", "error": "killed (out of memory?)"}
    assert cpu.merge_rounds([rounds[0], failed]) == failed
    assert cpu.parse_args(["--gqa"]).rounds == 3 and cpu.parse_args(["--gqa", "--quick"]).rounds == 1
