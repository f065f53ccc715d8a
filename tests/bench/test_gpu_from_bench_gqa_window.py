"""Moved verbatim from tests/unit/test_bench_gqa_window.py (its bench/gpu.py part: the window and GQA suites'
arguments, FLOP count, table and the exit without a GPU), for the tests of bench/gpu.py to merge into
tests/bench/test_gpu.py; the bench/cpu.py part is in tests/bench/test_cpu.py. Not migrated (format_table17
is a tracker-numbered name of bench/gpu.py).

The window and GQA suites of bench/cpu.py and bench/gpu.py: argument defaults, the
FLOP count over the visible pairs (against a count by loops written here), the tables, that every
timed callable computes what its name says (against SDPA with a band mask built by a loop here),
and a --quick smoke run of the CPU suites. Timings are never asserted."""
import importlib.util as iu
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _load(name):
    path = ROOT / "bench" / f"{name}.py"
    spec = iu.spec_from_file_location(f"bench_{name}_17", path)
    module = iu.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


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
