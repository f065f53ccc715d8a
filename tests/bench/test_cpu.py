"""bench/cpu.py (chapters 08, 09 and 12's CPU benchmarks): the argument defaults, the tables, the merge of
rounds, that every timed callable computes what its name says (against SDPA given a band from
tests/attn_paths.visible_band, or the float64 reference), that the output names what each side calls, and smoke runs of the main
suite and of the window / GQA suites. Timings are never asserted."""
import importlib.util as iu
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import attn_lib
from attn_lib.tolerances import assert_close
from attn_paths import visible_band

ROOT = Path(__file__).resolve().parents[2]
CPU_PATH = ROOT / "bench" / "cpu.py"
_spec = iu.spec_from_file_location("bench_cpu", CPU_PATH)
cpu = iu.module_from_spec(_spec)
_spec.loader.exec_module(cpu)


# --- the main suite -------------------------------------------------------------------------------------------

def test_main_suite_arguments():
    args = cpu.parse_args(["--quick", "--reps", "1", "--heads", "2", "--head-dim", "16"])
    assert args.sizes == list(cpu.QUICK_SIZES) and (args.heads, args.head_dim) == (2, 16)
    default = cpu.parse_args([])
    assert default.sizes == [1024, 4096, 8192, 16384] and default.impls == ["naive", "sdpa", "tiled"]
    assert default.checks == "none" and (default.suite, default.heads, default.head_dim) == (None, 8, 64)
    backward = cpu.parse_args(["--backward"])
    assert backward.sizes == [1024, 4096, 8192] and backward.impls == ["sdpa", "tiled"]


def test_the_main_suite_runs_and_tabulates_in_process():
    args = cpu.parse_args(["--quick", "--reps", "1", "--heads", "2", "--head-dim", "16"])
    results = [cpu.run_case(impl, 64, causal, args) for impl in cpu.IMPLS for causal in (False, True)]
    for r in results:
        assert r["time_s"] > 0 and r["peak_extra_mib"] >= 0 and len(r["times_s"]) == 1
    table = cpu.format_table(results, cpu.machine())
    assert table.count("\n") == 2 + 6 and "torch" in table.splitlines()[0]
    sdpa_rows = [line for line in table.splitlines() if " sdpa " in line]
    assert len(sdpa_rows) == 2 and all(" 1.00 " in line for line in sdpa_rows)  # SDPA is the unit of the ratio


def inputs(H, H_kv, N=40, D=8, grad=False):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, H, N, D, generator=g)  # (B,H,N,D)
    k, v = (torch.randn(1, H_kv, N, D, generator=g) for _ in range(2))  # (B,H_kv,N,D)
    dout = torch.randn(1, H, N, D, generator=g)  # (B,H,N,D)
    for t in (q, k, v):
        t.requires_grad_(grad)
    return q, k, v, dout


@pytest.mark.parametrize("impl", cpu.IMPLS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("checks", ["none", "both"])
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd_bwd"])
def test_every_main_suite_callable_computes_attention(impl, causal, checks, backward):
    argv = ["--checks", checks, "--block-m", "16", "--block-n", "8"] + (["--backward"] if backward else [])
    args = cpu.parse_args(argv)
    q, k, v, dout = inputs(2, 2, grad=backward)
    out = cpu.case_fn(impl, q, k, v, causal, args)()  # (B,H,N,D)
    want, _ = attn_lib.attention(*(t.detach().double() for t in (q, k, v)), is_causal=causal)
    assert_close(out.detach(), want, dtype=torch.float32, what=impl)
    assert out.requires_grad == backward
    if backward:
        out.backward(dout)
        ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
        grads = torch.autograd.grad(attn_lib.attention(*ref, is_causal=causal)[0], ref, dout.double())
        for t, g in zip((q, k, v), grads):
            assert_close(t.grad, g, dtype=torch.float32, kind="gradient")


def test_the_output_names_what_each_side_calls():
    unchecked = cpu.timed_calls(cpu.parse_args([]))
    assert unchecked["naive"].startswith("attn_lib.flash.naive.naive_core") and "unchecked core" in unchecked["naive"]
    assert unchecked["tiled"].startswith("attn_lib.flash.tiled_forward.forward_core")
    assert cpu.timed_calls(cpu.parse_args(["--backward"]))["tiled"].startswith("attn_lib.flash.autograd.flash_core")
    checked = cpu.timed_calls(cpu.parse_args(["--checks", "both"]))
    assert checked["tiled"] == "attn_lib.flash_attention_torch" and checked["naive"] == "attn_lib.naive_attention"
    assert "check_attention_call" in checked["sdpa"]


def test_a_main_suite_smoke_run_in_subprocesses(tmp_path):
    out = tmp_path / "r.json"
    res = subprocess.run([sys.executable, str(CPU_PATH), "--quick", "--reps", "1", "--sizes", "64", "--impls", "tiled",
                          "sdpa", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    payload = json.loads(out.read_text())
    assert sorted((r["impl"], r["causal"]) for r in payload["results"]) == [("sdpa", False), ("sdpa", True),
                                                                          ("tiled", False), ("tiled", True)]
    assert not [r for r in payload["results"] if "error" in r]
    assert payload["calls"]["tiled"].startswith("attn_lib.flash.tiled_forward.forward_core")
    assert "# tiled: attn_lib.flash.tiled_forward.forward_core (unchecked core)" in res.stdout


# --- the window and GQA suites ---------------------------------------------------------------------------------

def test_suite_arguments():
    a = cpu.parse_args(["--window", "256"])
    assert (a.suite, a.window, a.sizes, a.heads, a.kv_heads, a.head_dim) == ("window", 256, [2048, 4096, 8192, 16384],
                                                                            8, 8, 64)
    q = cpu.parse_args(["--window", "256", "--quick"])
    assert (q.window, q.sizes) == (32, [256, 512])
    g = cpu.parse_args(["--gqa"])
    assert (g.heads, g.kv_heads, g.head_dim, g.sizes, g.impls) == (32, 8, 128, [1024, 2048, 4096],
                                                                   ["tiled_gqa", "sdpa_gqa"])
    with pytest.raises(SystemExit):
        cpu.parse_args(["--gqa", "--impls", "tiled_window"])
    with pytest.raises(SystemExit):
        cpu.parse_args(["--gqa", "--window", "8"])


def test_the_suite_table():
    rows = [dict(suite="gqa", impl=i, mode=m, N=n, time_s=t, peak_extra_mib=1.0)
            for m in ("fwd", "fwd_bwd") for n, ts in ((1024, (0.2, 0.1)), (2048, (0.9, 0.4)))
            for i, t in zip(("tiled_gqa", "sdpa_gqa"), ts)]
    rows.append(dict(suite="gqa", impl="sdpa_gqa", mode="fwd_bwd", N=4096, error="killed (out of memory?)"))
    body = [line.split() for line in cpu.format_suite_table(rows).splitlines()[2:]]
    assert [(r[0], r[1], r[2]) for r in body[:4]] == [("fwd", "1024", "tiled_gqa"), ("fwd", "1024", "sdpa_gqa"),
                                                      ("fwd", "2048", "tiled_gqa"), ("fwd", "2048", "sdpa_gqa")]
    assert body[2][4:6] == ["2.25", "4.50"]  # 0.9 / 0.4 x SDPA; 0.9 / 0.2 the time at N = 1024
    assert body[4][0] == "fwd_bwd" and body[-1][3] == "failed:"


def test_the_sdpa_band_case_is_the_band():
    q, k, v, dout = inputs(2, 2)
    out = cpu.suite_case_fn("sdpa_band", q, k, v, dout, 5, "fwd")()  # (B,H,N,D)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=visible_band(40, 40, True, (5, 0)))  # (B,H,N,D)
    assert_close(out, want, dtype=torch.float32)


@pytest.mark.parametrize("impl,H_kv,window", [("tiled_window", 4, 5), ("tiled_causal", 4, None),
                                              ("tiled_gqa", 1, None), ("sdpa_gqa", 1, None)])
@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_tiled_and_gqa_suite_cases_compute_what_they_say(impl, H_kv, window, mode):
    q, k, v, dout = inputs(4, H_kv, grad=mode == "fwd_bwd")
    out = cpu.suite_case_fn(impl, q, k, v, dout, window, mode)()  # (B,H,N,D)
    kr, vr = (t.detach().repeat_interleave(4 // H_kv, dim=1) for t in (k, v))  # (B,H,N,D), the oracle only
    want = F.scaled_dot_product_attention(q.detach(), kr, vr, attn_mask=visible_band(40, 40, True, None if window is None else (window, 0)))  # (B,H,N,D)
    assert_close(out.detach(), want, dtype=torch.float32)
    if mode == "fwd_bwd":
        assert all(t.grad is not None and t.grad.shape == t.shape for t in (q, k, v))


@pytest.mark.parametrize("suite", [["--window", "16"], ["--gqa"]])
def test_suite_quick_smoke(suite, tmp_path):
    """Every case of the suite runs; nothing is saved with --quick unless --out says where."""
    out = tmp_path / "r.json"
    res = subprocess.run([sys.executable, str(CPU_PATH), *suite, "--quick", "--reps", "1", "--sizes", "128",
                          "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    payload = json.loads(out.read_text())
    impls = cpu.WINDOW_IMPLS if suite[0] == "--window" else cpu.GQA_IMPLS
    results = payload["results"]
    assert sorted((r["impl"], r["mode"]) for r in results) == sorted((i, m) for i in impls for m in cpu.MODES)
    assert not [r for r in results if "error" in r], [r["error"] for r in results if "error" in r]
    assert "failed" not in res.stdout
    assert sorted(payload["calls"]) == sorted(impls) and "flash_core (unchecked core)" in res.stdout


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
