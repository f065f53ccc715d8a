"""CPU 基准：朴素注意力、torch SDPA 与 attn_lib 分块 FlashAttention 的前向时间和峰值额外内存。

    .venv/bin/python bench/cpu.py                 # B=1, H=8, D=64, N in {1k, 4k, 8k, 16k}, causal and not
    .venv/bin/python bench/cpu.py --quick         # N in {512, 1k}: a smoke test in seconds, saves nothing
    .venv/bin/python bench/cpu.py --sizes 1024 4096 8192 --skip-naive-from 16384
    .venv/bin/python bench/cpu.py --backward      # forward+backward: SDPA vs tiled, N in {1k, 4k, 8k}

With ``--backward`` every case is one forward and one backward (``out.backward(dout)`` with a
fixed random ``dout``, inputs that require grad): ``torch SDPA`` against
``attn_lib.flash_attention(..., backend="torch")`` (the tiled forward, then the tiled
FlashAttention-2 backward of ``attn_lib.flash.tiled_backward``), and
``naive`` = the naive path's autograd, which stores the (B, H, N, N) matrices. Default
implementations there: sdpa and tiled; results go to ``bench/results/cpu_backward.json``.

Both sides of a comparison are timed alike, and the output says how and names what each side
calls: ``--checks none`` (default) calls attn_lib's unchecked cores (no input scan, no overflow
host sync), as SDPA does no checks: ``attn_lib.flash.naive.naive_core``,
``attn_lib.flash.tiled_forward.forward_core`` (with ``--backward``: ``attn_lib.flash.autograd.flash_core``),
their settings built once per case, before the timing, by their door (``attn_lib.checks.doors``);
``--checks both`` calls the public functions (``naive_attention``, ``flash_attention_torch``,
``flash_attention``) and the reference's door (``check_attention_call``) before SDPA.

Every (implementation, N, causal) case runs in its own subprocess, so each one starts from the
same memory state:

- time: the minimum over ``--reps`` timed calls after one warm-up call (wall clock,
  ``time.perf_counter``), float32, torch's default thread count unless ``--threads``;
- peak extra memory: the process's peak resident set size (``ru_maxrss``) after the calls
  minus its peak just before them, i.e. what the forward pass needed beyond its inputs
  (score matrix or tiles, temporaries and the output), in MiB. It counts pages actually
  touched, so it is the honest "how much RAM did this need" figure, not an allocator's view.

Naive attention at N = 16k needs about 17 GB (two 8.6 GB float32 score matrices);
``--skip-naive-from N`` leaves it out from that length on. Results go to
``bench/results/cpu.json`` (with the machine: CPU model, threads, torch version, date)
unless ``--quick`` or ``--no-save``. Tests never assert these numbers; chapter 08 plots them.

Chapter 12, two more suites, each one run with forward and forward+backward rows
(float32, B = 1, one subprocess per case, the same timing and memory rules as above):

    .venv/bin/python bench/cpu.py --window 256     # N in {2k, 4k, 8k, 16k}, H=8, D=64
    .venv/bin/python bench/cpu.py --window 256 --quick
    .venv/bin/python bench/cpu.py --gqa            # H=32, H_kv=8, D=128, N in {1k, 2k, 4k}, causal
    .venv/bin/python bench/cpu.py --gqa --quick

- ``--window W``: causal attention with a sliding window ``window_size=(W, 0)`` (flash-attn's
  meaning: query i sees keys i - W .. i) on the tiled path (``tiled_window``), beside full
  causal on the same path (``tiled_causal``) and torch SDPA given the band as an explicit
  bool mask (``sdpa_band``; SDPA has no window argument, so it computes every score and masks).
  The ``x smallest N`` column is the time divided by the time of the same case at the smallest
  N: linear growth gives N / N_min, quadratic (N / N_min)^2. ``sdpa_band`` materialises the
  scores: at N = 16k, H = 8 that is 8 GiB per (B, H, N, N) float32 tensor, more with the
  backward; a case killed for memory is reported as failed and the run goes on.
  Results: ``bench/results/cpu_window.json``.
- ``--gqa``: grouped-query attention, q (B, H, N, D) and k, v (B, H_kv, N, D) with H = 32,
  H_kv = 8, D = 128 (``--heads``, ``--kv-heads``, ``--head-dim``): the tiled path with
  ``enable_gqa=True`` (``tiled_gqa``) against ``F.scaled_dot_product_attention(...,
  enable_gqa=True)`` (``sdpa_gqa``), causal. Results: ``bench/results/cpu_gqa.json``.
Both use attn_lib's unchecked core ``attn_lib.flash.autograd.flash_core`` on the tiled path, its settings
built by ``attn_lib.checks.doors.check_flash_call`` (forward under ``torch.no_grad()``; forward+backward
through autograd), as SDPA does no checks.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

IMPLS = ("naive", "sdpa", "tiled")
LABELS = {"naive": "朴素注意力 naive", "sdpa": "torch SDPA", "tiled": "attn_lib 分块 tiled"}
DEFAULT_SIZES = (1024, 4096, 8192, 16384)
QUICK_SIZES = (512, 1024)
RESULTS = Path(__file__).resolve().parent / "results" / "cpu.json"
RESULTS_BACKWARD = Path(__file__).resolve().parent / "results" / "cpu_backward.json"
BACKWARD_SIZES = (1024, 4096, 8192)
# Chapter 12: sliding windows and grouped-query attention
WINDOW_IMPLS = ("tiled_window", "tiled_causal", "sdpa_band")
GQA_IMPLS = ("tiled_gqa", "sdpa_gqa")
MODES = ("fwd", "fwd_bwd")
WINDOW_SIZES = (2048, 4096, 8192, 16384)
GQA_SIZES = (1024, 2048, 4096)
SUITE_QUICK_SIZES = (256, 512)
QUICK_WINDOW = 32
SUITE_SHAPES = {  # (heads, kv_heads, head_dim): full run, --quick
    "window": ((8, 8, 64), (2, 2, 16)),
    "gqa": ((32, 8, 128), (8, 2, 32)),
}
SUITE_RESULTS = {"window": Path(__file__).resolve().parent / "results" / "cpu_window.json",
                 "gqa": Path(__file__).resolve().parent / "results" / "cpu_gqa.json"}


CHECKS = {
    "none": "# checks: none on any side (attn_lib's unchecked cores, SDPA as is: no input scan, no overflow sync)",
    "both": "# checks: on every side (the door's input checks before each call; attn_lib also checks overflow)",
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", help="sequence lengths N (L = S = N)")
    p.add_argument("--quick", action="store_true", help="small N only, do not save")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=None, help="H (default 8; --gqa: 32)")
    p.add_argument("--head-dim", type=int, default=None, help="D (default 64; --gqa: 128)")
    p.add_argument("--kv-heads", type=int, default=None, help="H_kv of --gqa (default 8)")
    p.add_argument("--window", type=int, default=None, metavar="W",
                   help="the sliding-window suite: window_size=(W, 0) beside full causal and SDPA with a band mask")
    p.add_argument("--gqa", action="store_true", help="the GQA suite: tiled enable_gqa vs SDPA enable_gqa=True")
    p.add_argument("--reps", type=int, default=3, help="timed calls per case (after one warm-up)")
    p.add_argument("--rounds", type=int, default=None,
                   help="window / GQA suites: subprocesses per case, the sides alternating (time: min over all); "
                        "default 3, --quick 1")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in every case")
    p.add_argument("--impls", nargs="+", choices=IMPLS + WINDOW_IMPLS + GQA_IMPLS, default=None,
                   help="default: all three; with --backward: sdpa and tiled")
    p.add_argument("--backward", action="store_true",
                   help="time forward+backward (autograd, inputs require grad) instead of the forward alone")
    p.add_argument("--skip-naive-from", type=int, default=None, metavar="N",
                   help="leave naive attention out for N >= this (it needs 2*B*H*N*N*4 bytes)")
    p.add_argument("--block-m", type=int, default=None, help="BLOCK_M of the tiled path")
    p.add_argument("--block-n", type=int, default=None, help="BLOCK_N of the tiled path")
    p.add_argument("--out", type=Path, default=None, help=f"where to write the JSON (default {RESULTS})")
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--checks", choices=CHECKS, default="none",
                   help="none: every side unchecked (attn_lib's unchecked cores, SDPA as is); both: the door's "
                        "input checks (types, shapes, one nan/inf scan of q, k, v) before every side")
    p.add_argument("--worker", nargs=3, metavar=("IMPL", "N", "CAUSAL"), help=argparse.SUPPRESS)
    p.add_argument("--suite-worker", nargs=4, metavar=("SUITE", "IMPL", "N", "MODE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.window is not None and args.gqa:
        p.error("--window and --gqa are two runs; give one of them")
    args.suite = "window" if args.window is not None else ("gqa" if args.gqa else None)
    if args.suite:
        return _suite_defaults(args)
    args.heads, args.head_dim = args.heads or 8, args.head_dim or 64
    if args.sizes is None:
        args.sizes = list(QUICK_SIZES if args.quick else (BACKWARD_SIZES if args.backward else DEFAULT_SIZES))
    if args.impls is None:
        args.impls = ["sdpa", "tiled"] if args.backward else list(IMPLS)
    return args


def _suite_defaults(args):
    """Sizes and shapes of the window / GQA suites (--quick: tiny ones, a smoke test)."""
    heads, kv_heads, head_dim = SUITE_SHAPES[args.suite][1 if args.quick else 0]
    args.heads, args.head_dim = args.heads or heads, args.head_dim or head_dim
    args.kv_heads = args.kv_heads or (kv_heads if args.suite == "gqa" else args.heads)
    if args.suite == "window" and args.quick:
        args.window = min(args.window, QUICK_WINDOW)
    args.rounds = args.rounds or (1 if args.quick else 3)
    if args.sizes is None:
        args.sizes = list(SUITE_QUICK_SIZES if args.quick else (WINDOW_SIZES if args.suite == "window" else GQA_SIZES))
    allowed = WINDOW_IMPLS if args.suite == "window" else GQA_IMPLS
    if args.impls is None:
        args.impls = list(allowed)
    elif not set(args.impls) <= set(allowed):
        raise SystemExit(f"--impls of the {args.suite} suite must be among {allowed}, got {args.impls}")
    return args


def machine() -> dict:
    """这台机器的描述：CPU 型号、线程数、torch 版本、日期。"""
    import torch

    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": _dt.date.today().isoformat(),
    }


def peak_rss_mib() -> float:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / 2**20  # Linux: KiB, macOS: bytes


def case_fn(impl: str, q, k, v, causal: bool, args):
    """The callable to time in the main suite: one forward of q, k, v (B, H, N, D) (with ``--backward``
    the forward whose output the caller then differentiates).

    ``--checks none`` calls attn_lib's unchecked cores, with settings built once, before the timing,
    by their door in ``attn_lib.checks.doors`` (``check_finite=False``: no overflow sync either):
    ``naive`` = ``attn_lib.flash.naive.naive_core``; ``tiled`` = ``attn_lib.flash.tiled_forward.forward_core``
    (forward) or ``attn_lib.flash.autograd.flash_core`` (``--backward``). ``--checks both`` calls the public
    functions (``naive_attention``, ``flash_attention_torch``, ``flash_attention(backend="torch")``) and runs
    the reference's door (``check_attention_call``) before SDPA.
    """
    import torch
    import torch.nn.functional as F

    from attn_lib import flash_attention, flash_attention_torch, naive_attention
    from attn_lib.checks.doors import check_attention_call, check_flash_call, check_naive_call, check_tiled_call
    from attn_lib.device import triton_interprets
    from attn_lib.flash.autograd import flash_core
    from attn_lib.flash.naive import naive_core
    from attn_lib.flash.tiled_forward import forward_core
    from attn_lib.rules.settings import Options

    checked, blocks = args.checks == "both", {"block_m": args.block_m, "block_n": args.block_n}
    unchecked = Options(is_causal=causal, check_finite=False)
    if impl == "sdpa":
        def sdpa():
            if checked:  # the same kind of door on every side
                check_attention_call(q, k, v, None, Options(is_causal=causal))
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # (B,H,N,D)
        return sdpa
    if impl == "naive":
        if checked:
            return lambda: naive_attention(q, k, v, is_causal=causal)  # (B,H,N,D)
        settings = check_naive_call(q, k, v, unchecked)
        return lambda: naive_core(q, k, v, settings)  # (B,H,N,D)
    if args.backward:  # the differentiable entry: tiled forward, then the tiled backward through autograd
        if checked:
            return lambda: flash_attention(q, k, v, is_causal=causal, backend="torch")  # (B,H,N,D)
        settings = check_flash_call(q, k, v, Options(is_causal=causal, check_finite=False, backend="torch"),
                                    triton_interprets)
        return lambda: flash_core(q, k, v, settings)  # (B,H,N,D)
    if checked:
        def tiled():
            with torch.no_grad():
                return flash_attention_torch(q, k, v, is_causal=causal, **blocks)[0]  # (B,H,N,D)
        return tiled
    settings = check_tiled_call(q, k, v, Options(is_causal=causal, check_finite=False, **blocks), None)

    def tiled_core():
        with torch.no_grad():
            return forward_core(q, k, v, settings)[0]  # (B,H,N,D)
    return tiled_core


def timed_calls(args) -> dict:
    """What each implementation of the main suite calls (printed above the table and saved with it)."""
    if args.checks == "both":
        tiled = "attn_lib.flash_attention(backend='torch')" if args.backward else "attn_lib.flash_attention_torch"
        return {"naive": "attn_lib.naive_attention", "tiled": tiled,
                "sdpa": "attn_lib.checks.doors.check_attention_call, then F.scaled_dot_product_attention"}
    tiled = "attn_lib.flash.autograd.flash_core" if args.backward else "attn_lib.flash.tiled_forward.forward_core"
    return {"naive": "attn_lib.flash.naive.naive_core (unchecked core)", "tiled": f"{tiled} (unchecked core)",
            "sdpa": "F.scaled_dot_product_attention"}


def run_case(impl: str, N: int, causal: bool, args) -> dict:
    """在本进程里跑一个情形：一次预热、reps 次计时；返回时间和峰值额外内存。"""
    import time

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)

    def prepared(n):
        """The timed callable for length n, its inputs made (and its settings built) before any timing."""
        shape = (args.batch, args.heads, n, args.head_dim)
        q, k, v = (torch.randn(shape, generator=gen).requires_grad_(args.backward) for _ in range(3))  # (B,H,n,D)
        fn = case_fn(impl, q, k, v, causal, args)
        if not args.backward:
            return fn
        dout = torch.randn(shape, generator=gen)  # (B,H,n,D), fixed

        def forward_backward():
            for t in (q, k, v):
                t.grad = None
            out = fn()  # (B,H,n,D)
            out.backward(dout)
            return out
        return forward_backward

    prepared(64)()  # load kernels and start threads before the memory baseline
    fn = prepared(N)  # float32 inputs
    before = peak_rss_mib()
    fn()  # warm-up (also reaches the peak)
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"impl": impl, "N": N, "causal": causal, "backward": bool(args.backward),
            "time_s": min(times), "times_s": times,
            "peak_extra_mib": peak_rss_mib() - before, "threads": torch.get_num_threads()}


def spawn(impl: str, N: int, causal: bool, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", impl, str(N), str(int(causal)), "--reps", str(args.reps),
           "--batch", str(args.batch), "--heads", str(args.heads), "--head-dim", str(args.head_dim),
           "--checks", args.checks]
    for flag, value in (("--threads", args.threads), ("--block-m", args.block_m), ("--block-n", args.block_n)):
        if value:
            cmd += [flag, str(value)]
    if args.backward:
        cmd.append("--backward")
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        reason = "killed (out of memory?)" if res.returncode < 0 else res.stderr.strip().splitlines()[-1:]
        return {"impl": impl, "N": N, "causal": causal, "error": str(reason)}
    return json.loads(res.stdout.strip().splitlines()[-1])


def format_table(results: list, machine_info: dict | None = None) -> str:
    """把结果排成表：每个 N 和是否因果一组，时间、相对 SDPA 的倍数、峰值额外内存。"""
    lines = []
    if machine_info:
        lines.append(f"# {machine_info['cpu']}, {machine_info['torch_threads']} threads, "
                     f"torch {machine_info['torch']}, {machine_info['date']}")
    if any(r.get("backward") for r in results):
        lines.append("# forward + backward (autograd), B=1, fp32")
    head = f"{'N':>6} {'causal':>6} {'impl':>6} {'time ms':>10} {'x SDPA':>7} {'peak extra MiB':>15}"
    lines += [head, "-" * len(head)]
    groups = {}
    for r in results:
        groups.setdefault((r["N"], r["causal"]), {})[r["impl"]] = r
    for (N, causal), rows in sorted(groups.items()):
        base = rows.get("sdpa", {}).get("time_s")
        for impl in IMPLS:
            r = rows.get(impl)
            if r is None:
                continue
            if "error" in r:
                lines.append(f"{N:>6} {str(causal):>6} {impl:>6} {'failed: ' + r['error']:>34}")
                continue
            ratio = f"{r['time_s'] / base:.2f}" if base else "-"
            lines.append(f"{N:>6} {str(causal):>6} {impl:>6} {r['time_s'] * 1e3:>10.1f} {ratio:>7} "
                         f"{r['peak_extra_mib']:>15.0f}")
    return "\n".join(lines)


def suite_case_fn(impl: str, q, k, v, dout, window: int | None, mode: str):
    """The callable to time in the window / GQA suites: one forward, or one forward and its backward.

    ``tiled_*``: attn_lib's unchecked core ``attn_lib.flash.autograd.flash_core`` (the tiled path), with
    settings built once, before the timing, by ``attn_lib.checks.doors.check_flash_call`` (``backend="torch"``,
    ``check_finite=False``): causal, ``window_size=(window, 0)`` for ``tiled_window``; k, v with H_kv heads
    for ``tiled_gqa`` (GQA by shape). ``sdpa_band``: SDPA with the band as a bool mask
    (``attn_lib.sliding_window_mask``); ``sdpa_gqa``: SDPA with ``is_causal=True, enable_gqa=True``.
    """
    import torch
    import torch.nn.functional as F

    from attn_lib import sliding_window_mask
    from attn_lib.checks.doors import check_flash_call
    from attn_lib.device import triton_interprets
    from attn_lib.flash.autograd import flash_core
    from attn_lib.rules.settings import Options

    if impl == "sdpa_band":
        keep = sliding_window_mask(q.shape[2], k.shape[2], window_size=(window, 0), is_causal=True,
                                   device=q.device)  # (L,S), True = visible

        def forward():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # (B,H,L,D)
    elif impl == "sdpa_gqa":
        def forward():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # (B,H,L,D)
    else:
        options = Options(is_causal=True, window_size=(window, 0) if impl == "tiled_window" else None,
                          enable_gqa=k.shape[1] != q.shape[1], check_finite=False, backend="torch")
        settings = check_flash_call(q, k, v, options, triton_interprets)

        def forward():
            return flash_core(q, k, v, settings)  # (B,H,L,D)
    if mode == "fwd":
        def fwd():
            with torch.no_grad():
                return forward()
        return fwd

    def fwd_bwd():
        for t in (q, k, v):
            t.grad = None
        out = forward()  # (B,H,L,D)
        out.backward(dout)
        return out
    return fwd_bwd


SUITE_CALLS = {"tiled_window": "attn_lib.flash.autograd.flash_core (unchecked core), window_size=(W, 0)",
               "tiled_causal": "attn_lib.flash.autograd.flash_core (unchecked core)",
               "tiled_gqa": "attn_lib.flash.autograd.flash_core (unchecked core), k, v with H_kv heads",
               "sdpa_band": "F.scaled_dot_product_attention(attn_mask=attn_lib.sliding_window_mask(...))",
               "sdpa_gqa": "F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)"}


def run_suite_case(impl: str, N: int, mode: str, args) -> dict:
    """Window / GQA suite: one case in this process (one warm-up, reps timed calls, peak extra memory)."""
    import time

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    B, H, Hkv, D = args.batch, args.heads, args.kv_heads, args.head_dim

    def make(n):
        q = torch.randn((B, H, n, D), generator=gen)  # (B,H,n,D)
        k, v = (torch.randn((B, Hkv, n, D), generator=gen) for _ in range(2))  # (B,H_kv,n,D)
        dout = torch.randn((B, H, n, D), generator=gen)  # (B,H,n,D)
        for t in (q, k, v):
            t.requires_grad_(mode == "fwd_bwd")
        return q, k, v, dout

    suite_case_fn(impl, *make(64), args.window, mode)()  # load kernels and start threads before the baseline
    fn = suite_case_fn(impl, *make(N), args.window, mode)
    before = peak_rss_mib()
    fn()  # warm-up (also reaches the peak)
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"suite": args.suite, "impl": impl, "N": N, "mode": mode, "B": B, "H": H, "H_kv": Hkv, "D": D,
            "window": args.window if args.suite == "window" else None, "time_s": min(times), "times_s": times,
            "peak_extra_mib": peak_rss_mib() - before, "threads": torch.get_num_threads()}


def spawn_suite_case(impl: str, N: int, mode: str, args) -> dict:
    """One window / GQA case in its own subprocess (the same memory state for every case)."""
    cmd = [sys.executable, __file__, "--suite-worker", args.suite, impl, str(N), mode, "--reps", str(args.reps),
           "--batch", str(args.batch), "--heads", str(args.heads), "--kv-heads", str(args.kv_heads),
           "--head-dim", str(args.head_dim)]
    if args.suite == "window":
        cmd += ["--window", str(args.window)]
    else:
        cmd.append("--gqa")
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        reason = "killed (out of memory?)" if res.returncode < 0 else res.stderr.strip().splitlines()[-1:]
        return {"suite": args.suite, "impl": impl, "N": N, "mode": mode, "error": str(reason)}
    return json.loads(res.stdout.strip().splitlines()[-1])


def format_suite_table(results: list, machine_info: dict | None = None) -> str:
    """窗口 / GQA 两组基准排成表：时间、相对 SDPA 的倍数、相对最小 N 的倍数、峰值额外内存。"""
    lines = []
    if machine_info:
        lines.append(f"# {machine_info['cpu']}, {machine_info['torch_threads']} threads, "
                     f"torch {machine_info['torch']}, {machine_info['date']}")
    head = f"{'pass':>7} {'N':>6} {'impl':>12} {'time ms':>10} {'x SDPA':>7} {'x N_min':>8} {'peak extra MiB':>15}"
    lines += [head, "-" * len(head)]
    ok = [r for r in results if "error" not in r]
    n_min = {(r["mode"], r["impl"]): r for r in sorted(ok, key=lambda r: -r["N"])}  # smallest N wins
    order = WINDOW_IMPLS + GQA_IMPLS
    for r in sorted(results, key=lambda r: (MODES.index(r["mode"]), r["N"], order.index(r["impl"]))):
        prefix = f"{r['mode']:>7} {r['N']:>6} {r['impl']:>12}"
        if "error" in r:
            lines.append(f"{prefix} {'failed: ' + r['error']:>34}")
            continue
        sdpa = next((o for o in ok if o["mode"] == r["mode"] and o["N"] == r["N"] and o["impl"].startswith("sdpa")),
                    None)
        ratio = f"{r['time_s'] / sdpa['time_s']:.2f}" if sdpa else "-"
        growth = f"{r['time_s'] / n_min[(r['mode'], r['impl'])]['time_s']:.2f}"
        lines.append(f"{prefix} {r['time_s'] * 1e3:>10.1f} {ratio:>7} {growth:>8} {r['peak_extra_mib']:>15.0f}")
    return "\n".join(lines)


def merge_rounds(rounds: list) -> dict:
    """同一情形的几轮子进程合成一条：时间取所有轮的最小值，内存取最大值；有一轮出错就报错。"""
    failed = [r for r in rounds if "error" in r]
    if failed:
        return failed[0]
    merged = dict(rounds[0])
    merged["times_s"] = [t for r in rounds for t in r["times_s"]]
    merged["time_s"] = min(merged["times_s"])
    merged["peak_extra_mib"] = max(r["peak_extra_mib"] for r in rounds)
    merged["rounds"] = len(rounds)
    return merged


def main_suite(args, argv) -> int:
    """Run the window or GQA suite: every (mode, N, impl) in its own subprocess; print and save the table."""
    info = machine()
    if args.threads:
        info["torch_threads"] = args.threads
    what = (f"# window suite: causal, window_size=({args.window}, 0), B={args.batch}, H={args.heads}, D={args.head_dim}"
            if args.suite == "window" else
            f"# GQA suite: causal, B={args.batch}, H={args.heads}, H_kv={args.kv_heads}, D={args.head_dim}")
    results = []
    for mode in MODES:
        for N in args.sizes:
            runs = {impl: [] for impl in args.impls}
            for _ in range(args.rounds):  # the sides alternate, so a slow spell of the machine hits both
                for impl in args.impls:
                    runs[impl].append(spawn_suite_case(impl, N, mode, args))
            for impl in args.impls:
                r = merge_rounds(runs[impl])
                results.append(r)
                print(f"  done: {mode:>7} {impl:>12} N={N:>5} "
                      + (f"{r['time_s'] * 1e3:9.1f} ms" if "time_s" in r else r["error"]), flush=True)
    print(CHECKS["none"])
    calls = {impl: SUITE_CALLS[impl] for impl in args.impls}
    for impl, call in calls.items():
        print(f"# {impl}: {call}")
    print(what + ", fp32")
    print(format_suite_table(results, info))
    out = args.out or (None if (args.quick or args.no_save) else SUITE_RESULTS[args.suite])
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"machine": info, "config": what[2:], "checks": CHECKS["none"], "calls": calls,
                   "time": "min over reps after one warm-up, over rounds subprocesses per case (the sides "
                           "alternating), seconds",
                   "memory": "peak RSS after the calls minus peak RSS before them (MiB), the largest over the rounds",
                   "command": "python bench/cpu.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                   "results": results}
        out.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {out}")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.suite_worker:
        _, impl, N, mode = args.suite_worker
        print(json.dumps(run_suite_case(impl, int(N), mode, args)))
        return 0
    if args.suite:
        return main_suite(args, argv)
    if args.worker:
        impl, N, causal = args.worker
        print(json.dumps(run_case(impl, int(N), bool(int(causal)), args)))
        return 0
    info = machine()
    if args.threads:
        info["torch_threads"] = args.threads
    results = []
    for N in args.sizes:
        for causal in (False, True):
            for impl in args.impls:
                if impl == "naive" and args.skip_naive_from and N >= args.skip_naive_from:
                    continue
                r = spawn(impl, N, causal, args)
                results.append(r)
                print(f"  done: {impl:>5} N={N:>5} causal={causal!s:>5} "
                      + (f"{r['time_s'] * 1e3:9.1f} ms" if "time_s" in r else r["error"]), flush=True)
    print(CHECKS[args.checks])
    calls = {impl: call for impl, call in timed_calls(args).items() if impl in args.impls}
    for impl, call in calls.items():
        print(f"# {impl}: {call}")
    print(format_table(results, info))
    out = args.out or (None if (args.quick or args.no_save) else (RESULTS_BACKWARD if args.backward else RESULTS))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "machine": info,
            "config": {"B": args.batch, "H": args.heads, "D": args.head_dim, "dtype": "float32", "reps": args.reps,
                       "backward": bool(args.backward),
                       "block_m": args.block_m, "block_n": args.block_n, "checks": CHECKS[args.checks],
                       "time": "min over reps after one warm-up, seconds",
                       "memory": "peak RSS after the calls minus peak RSS before them (MiB), one process per case"},
            "calls": calls,
            "command": "python bench/cpu.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "results": results,
        }
        out.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
