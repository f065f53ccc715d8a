"""bench/decode.py (chapter 13's decode-step benchmark): the argument defaults, the table (times, the ratio to
SDPA, the cache bandwidth, failed cases), the timing loop, that every timed callable computes the same decode
step (against the float64 reference given the step's visible keys written out here) whether it calls the
public flash_decoding or its unchecked core, that the output names which one ran, and a --quick smoke run.
Timings are never asserted."""
import importlib.util as iu
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import attn_lib.flash.decoding as decoding
from attn_lib.core.reference import attention
from attn_lib.tolerances import assert_close

ROOT = Path(__file__).resolve().parents[2]
PATH = ROOT / "bench" / "decode.py"
_spec = iu.spec_from_file_location("bench_decode", PATH)
decode = iu.module_from_spec(_spec)
_spec.loader.exec_module(decode)


def test_arguments():
    a = decode.parse_args([])
    assert (a.heads, a.kv_heads, a.head_dim, a.queries, a.batch) == (32, 8, 128, 1, 1)
    assert a.sizes == [1024, 2048, 4096, 8192, 16384, 32768] and a.rounds == 3
    assert a.call == "flash_decoding"  # the public function unless asked otherwise
    assert a.impls == ["sdpa_gqa", "decode", "decode_8", "decode_repeat"]
    q = decode.parse_args(["--quick"])
    assert (q.sizes, q.rounds, q.heads, q.kv_heads, q.head_dim) == ([256, 512], 1, 8, 2, 32) and q.reps <= 2
    assert a.min_time == 0.5 and q.min_time == 0.0
    assert decode.parse_args(["--sizes", "64", "--rounds", "5", "--kv-heads", "1"]).kv_heads == 1
    assert decode.parse_args(["--call", "decode_core"]).call == "decode_core"
    for bad in (["--impls", "naive"], ["--call", "unchecked"]):
        with pytest.raises(SystemExit):
            decode.parse_args(bad)


def test_table_ratios_bandwidth_and_failures():
    def row(S, impl, t):
        return {"S": S, "impl": impl, "time_s": t, "cache_bytes": 2 * 8 * S * 128 * 4}

    rows = [row(1024, "decode_repeat", 0.004), row(1024, "sdpa_gqa", 0.002), row(1024, "decode", 0.001),
            row(4096, "sdpa_gqa", 0.010), row(4096, "decode", 0.0025),
            {"S": 4096, "impl": "decode_8", "error": "out of memory"}]
    text = decode.format_table(rows, {"cpu": "test CPU", "torch_threads": 2, "torch": "2.13", "date": "2026-12-01"})
    lines = text.splitlines()
    assert lines[0] == "# test CPU, 2 threads, torch 2.13, 2026-12-01"
    body = [line.split() for line in lines[3:]]
    assert [(r[0], r[1]) for r in body] == [("1024", "sdpa_gqa"), ("1024", "decode"), ("1024", "decode_repeat"),
                                            ("4096", "sdpa_gqa"), ("4096", "decode"), ("4096", "decode_8")]
    assert body[1][2:4] == ["1.00", "0.50"]  # 1 ms, half of SDPA's 2 ms
    assert body[2][3] == "2.00" and body[4][3] == "0.25"
    assert body[1][4] == f"{2 * 8 * 1024 * 128 * 4 / 0.001 / 1e9:.1f}"  # the cache's bytes over the time
    assert body[5][2:] == ["failed:", "out", "of", "memory"]
    no_sdpa = decode.format_table([row(64, "decode", 0.001)]).splitlines()[2].split()
    assert no_sdpa[3] == "-"


def test_timed_calls_go_on_until_the_minimum_time():
    calls = []
    times = decode.time_case(lambda: calls.append(1), reps=3)
    assert len(times) == 3 and len(calls) == 4  # one warm-up call, then the timed ones
    times = decode.time_case(lambda: None, reps=2, min_time=0.05, max_calls=50)
    assert len(times) == 50  # calls of microseconds: the cap ends it before 0.05 s
    slow = decode.time_case(lambda: time.sleep(0.01), reps=1, min_time=0.035)
    assert min(slow) >= 0.01 and sum(slow[:-1]) < 0.035 <= sum(slow) + 0.005  # stopped at the first call past it


def answer_key(q, k, v):
    """float64 reference: query i of L sees keys 0 .. S - L + i (the last L positions), written out."""
    L, S = q.shape[2], k.shape[2]
    mask = torch.zeros(L, S, dtype=torch.bool)
    for i in range(L):
        mask[i, : S - L + i + 1] = True
    return attention(q.double(), k.double(), v.double(), mask=mask, enable_gqa=True)[0]


@pytest.mark.parametrize("impl", ["sdpa_gqa", "decode", "decode_8", "decode_repeat"])
@pytest.mark.parametrize("L,call", [(1, "flash_decoding"), (3, "flash_decoding"), (1, "decode_core"),
                                    (3, "decode_core")])
def test_every_timed_callable_computes_the_decode_step(impl, L, call):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, L, 16, generator=g)  # (B,H,L,D)
    k, v = (torch.randn(1, 2, 700, 16, generator=g) for _ in range(2))  # (B,H_kv,S,D)
    with torch.no_grad():
        out = decode.case_fn(impl, q, k, v, call=call)()  # (B,H,L,D)
    assert_close(out, answer_key(q, k, v), dtype=torch.float32, what=impl)


@pytest.mark.parametrize("call", ["flash_decoding", "decode_core"])
def test_the_attn_lib_sides_call_what_they_say(call, monkeypatch):
    """--call flash_decoding goes through the public door; --call decode_core calls the core alone."""
    doors, cores = [], []
    real_door, real_core = decoding.check_decode_call, decoding.decode_core
    monkeypatch.setattr(decoding, "check_decode_call", lambda *a: doors.append(1) or real_door(*a))
    monkeypatch.setattr(decoding, "decode_core", lambda *a: cores.append(1) or real_core(*a))
    q, k, v = torch.randn(1, 8, 1, 16), torch.randn(1, 2, 300, 16), torch.randn(1, 2, 300, 16)
    fn = decode.case_fn("decode", q, k, v, call=call)
    doors.clear()
    for _ in range(3):
        fn()
    assert len(cores) == 3 and len(doors) == (3 if call == "flash_decoding" else 0)  # the core's door: once, before
    assert decode.CALLS[call].startswith("# attn_lib sides: ")
    assert ("attn_lib.flash_decoding" if call == "flash_decoding" else "attn_lib.flash.decoding.decode_core") \
        in decode.CALLS[call]


@pytest.mark.parametrize("extra,named", [([], "the public attn_lib.flash_decoding"),
                                         (["--call", "decode_core"], "the unchecked core")])
def test_quick_smoke_run(tmp_path, extra, named):
    out = tmp_path / "r.json"
    res = subprocess.run([sys.executable, str(PATH), "--quick", "--sizes", "128", "--reps", "1", "--out", str(out),
                          *extra], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    payload = json.loads(out.read_text())
    assert {"machine", "config", "checks", "call", "time", "command", "results"} <= set(payload)
    assert payload["machine"]["torch"] == torch.__version__ and named in payload["checks"]
    assert sorted(r["impl"] for r in payload["results"]) == sorted(decode.IMPLS)
    assert not [r for r in payload["results"] if "error" in r]
    assert all(r["S"] == 128 and r["rounds"] == 1 and len(r["times_s"]) == 1 for r in payload["results"])
    assert "x SDPA" in res.stdout and "failed" not in res.stdout and named in res.stdout
