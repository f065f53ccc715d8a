"""CPU 基准（第 13 章）：一步解码（L 个新查询对 S 个缓存的键），attn_lib 的 flash_decoding（torch 分段路径）对 torch SDPA（enable_gqa=True）。

    .venv/bin/python bench/decode.py            # B=1, H=32, H_kv=8, L=1, D=128, S in {1k, 2k, 4k, 8k, 16k, 32k}, fp32
    .venv/bin/python bench/decode.py --quick    # tiny shapes, S in {256, 512}: a smoke test in seconds, saves nothing
    .venv/bin/python bench/decode.py --threads 2 --rounds 5 --sizes 4096 16384
    .venv/bin/python bench/decode.py --impls sdpa_gqa decode decode_unchecked decode_8 decode_repeat
        # chapter 13's table (shipped as attn_lib/data/cpu_decode_bench.json): the public function and its core

Implementations (every one computes the same output; tests/bench/test_decode.py checks that for the four
default ones):

- ``sdpa_gqa``: ``F.scaled_dot_product_attention(q, k, v, enable_gqa=True)`` (for L > 1 with the
  bottom-right causal mask of a decode step);
- ``decode``: ``attn_lib.flash_decoding``'s torch path (``is_causal=True``: the L queries are the last
  L positions), ``num_splits`` chosen by
  ``choose_num_splits`` for this machine (on a CPU with B·H_kv >= threads: one split);
- ``decode_8``: the same path with 8 splits (on a CPU the splits run one after another: what
  they cost without a GPU's parallel programs);
- ``decode_repeat``: K and V first repeated to H heads (``repeat_interleave``, inside the timed
  call), then the same path with H_kv = H: the grouped layout's share of the difference;
- ``decode_unchecked`` (only when named in ``--impls``): ``decode``'s step through the unchecked core
  whatever ``--call`` says, so that one run times the public function and its core side by side
  (what the door's checks cost).

Timing: float32; per case one warm-up call, then timed calls (``time.perf_counter``), at least
``--reps`` and more until ``--min-time`` seconds have passed (a short step gets many calls, so that
on a busy machine some of them run undisturbed); ``--rounds`` rounds in which the implementations alternate (so a slow spell of the machine hits
every side), the time is the minimum over every timed call of every round; each row also keeps every
round's own minimum (``round_min_s``), so that a reader sees how far the rounds spread. ``--call flash_decoding``
(default) times the public ``attn_lib.flash_decoding``, whose door scans q and the cache for nan / inf
(one more read of the cache) and whose core checks the result for overflow; ``--call decode_core`` times
attn_lib's unchecked core ``attn_lib.flash.decoding.decode_core`` instead (its settings built once, before
the timing, by ``attn_lib.checks.decoding.check_decode_call``, the overflow check off: no input scan, no
overflow sync), as SDPA checks nothing. The output names the one that ran. The ``cache GB/s`` column
is the bytes of K and V (B·H_kv·S·(D + Dv)·4) over the time: a decode step reads the whole
cache once and does little arithmetic per byte. Results go to ``bench/results/cpu_decode.json``
(with the machine: CPU model, threads, torch version, date) unless ``--quick`` or ``--no-save``.
Tests never assert these numbers.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu import machine, merge_rounds  # noqa: E402  (bench/cpu.py: the same machine record and round rule)

IMPLS = ("sdpa_gqa", "decode", "decode_8", "decode_repeat")
OPTIONAL_IMPLS = ("decode_unchecked",)  # only when named in --impls
ALL_IMPLS = ("sdpa_gqa", "decode", "decode_unchecked", "decode_8", "decode_repeat")  # the table's order
DEFAULT_SIZES = (1024, 2048, 4096, 8192, 16384, 32768)
QUICK_SIZES = (256, 512)
SHAPE = (32, 8, 128)  # H, H_kv, D of the full run (Llama-3-8B's attention)
QUICK_SHAPE = (8, 2, 32)
RESULTS = Path(__file__).resolve().parent / "results" / "cpu_decode.json"
CALLS = {
    "flash_decoding": "# attn_lib sides: the public attn_lib.flash_decoding (its door: types, shapes, one nan/inf "
                      "scan of q and the cache; its overflow check); SDPA as is",
    "decode_core": "# attn_lib sides: the unchecked core attn_lib.flash.decoding.decode_core (settings from its "
                   "door once, before the timing; no input scan, no overflow sync); SDPA as is",
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", help="cache lengths S")
    p.add_argument("--quick", action="store_true", help="tiny shapes and S, one round, do not save")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=None, help=f"H (default {SHAPE[0]})")
    p.add_argument("--kv-heads", type=int, default=None, help=f"H_kv (default {SHAPE[1]})")
    p.add_argument("--head-dim", type=int, default=None, help=f"D = Dv (default {SHAPE[2]})")
    p.add_argument("--queries", type=int, default=1, help="L, the new queries of the step (default 1)")
    p.add_argument("--reps", type=int, default=5, help="timed calls per case and round (after one warm-up)")
    p.add_argument("--min-time", type=float, default=0.5,
                   help="seconds per case and round: timed calls go on until then (at least --reps; --quick 0)")
    p.add_argument("--rounds", type=int, default=None, help="rounds, the sides alternating (default 3, --quick 1)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--impls", nargs="+", choices=ALL_IMPLS, default=None,
                   help=f"default: {' '.join(IMPLS)} (add {' '.join(OPTIONAL_IMPLS)} by naming it)")
    p.add_argument("--call", choices=CALLS, default="flash_decoding",
                   help="what the attn_lib sides time: the public flash_decoding (default) or its unchecked core")
    p.add_argument("--out", type=Path, default=None, help=f"where to write the JSON (default {RESULTS})")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    H, H_kv, D = QUICK_SHAPE if args.quick else SHAPE
    args.heads, args.kv_heads, args.head_dim = args.heads or H, args.kv_heads or H_kv, args.head_dim or D
    args.sizes = args.sizes or list(QUICK_SIZES if args.quick else DEFAULT_SIZES)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.impls = args.impls or list(IMPLS)
    if args.quick:
        args.reps, args.min_time = min(args.reps, 2), 0.0
    return args


def case_fn(impl: str, q, k, v, *, call: str = "flash_decoding"):
    """The callable to time: one decode step of q (B, H, L, D) against the cache k, v (B, H_kv, S, D).

    The L queries are the last L positions of the cache (causal, bottom-right: SDPA's side gets that mask
    for L > 1). ``call``: ``"flash_decoding"`` (the public function) or ``"decode_core"`` (the unchecked core,
    its settings built here, before any timing, by ``check_decode_call``, with the overflow check off);
    ``impl="decode_unchecked"`` takes the core whatever ``call`` says.
    """
    import dataclasses

    import torch.nn.functional as F

    from attn_lib import causal_mask, flash_decoding
    from attn_lib.checks.decoding import check_decode_call
    from attn_lib.device import triton_interprets
    from attn_lib.flash.decoding import decode_core
    from attn_lib.rules.settings import Options

    L, S, G = q.shape[2], k.shape[2], q.shape[1] // k.shape[1]
    if impl == "sdpa_gqa":
        mask = None if L == 1 else causal_mask(L, S, align="bottom-right")  # (L,S) the step's rule
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=G > 1)  # (B,H,L,D)
    splits = {"decode": None, "decode_unchecked": None, "decode_8": 8, "decode_repeat": 1}[impl]
    if call == "flash_decoding" and impl != "decode_unchecked":
        def step(kk, vv):
            return flash_decoding(q, kk, vv, num_splits=splits, enable_gqa=kk.shape[1] != q.shape[1],
                                  is_causal=True, backend="torch")  # (B,H,L,D)
    else:
        options = Options(is_causal=True, enable_gqa=G > 1, num_splits=splits, backend="torch")
        settings = dataclasses.replace(check_decode_call(q, (k, v), (None, None), options, triton_interprets),
                                       check_overflow=False)  # the same for K, V repeated to H heads

        def step(kk, vv):
            return decode_core(q, kk, vv, settings)  # (B,H,L,D)

    if impl == "decode_repeat":
        return lambda: step(k.repeat_interleave(G, 1), v.repeat_interleave(G, 1))  # (B,H_kv,S,D) -> (B,H,S,D)
    return lambda: step(k, v)


def time_case(fn, reps: int, min_time: float = 0.0, max_calls: int = 1000) -> list:
    """One warm-up call, then at least ``reps`` timed calls, more until ``min_time`` seconds have passed
    (at most ``max_calls``); returns their times in seconds."""
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < reps or (time.perf_counter() - start < min_time and len(times) < max_calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def run_size(S: int, args) -> list:
    """All implementations at one S, ``args.rounds`` rounds with the sides alternating; one merged row each."""
    import torch

    gen = torch.Generator().manual_seed(0)
    B, H, Hkv, D, L = args.batch, args.heads, args.kv_heads, args.head_dim, args.queries
    q = torch.randn(B, H, L, D, generator=gen)  # (B,H,L,D)
    k, v = (torch.randn(B, Hkv, S, D, generator=gen) for _ in range(2))  # (B,H_kv,S,D)
    fns = {impl: case_fn(impl, q, k, v, call=args.call) for impl in args.impls}
    runs = {impl: [] for impl in args.impls}
    with torch.no_grad():
        for _ in range(args.rounds):
            for impl in args.impls:
                try:
                    times = time_case(fns[impl], args.reps, args.min_time)
                    runs[impl].append({"impl": impl, "S": S, "time_s": min(times), "times_s": times,
                                       "peak_extra_mib": 0.0})
                except (RuntimeError, MemoryError) as e:  # out of memory at the largest S: report, go on
                    runs[impl].append({"impl": impl, "S": S, "error": str(e).splitlines()[0][:80]})
    rows = []
    for impl in args.impls:
        r = merge_rounds(runs[impl])
        r.pop("peak_extra_mib", None)
        if "error" not in r:
            r["round_min_s"] = [run["time_s"] for run in runs[impl]]  # each round's fastest call: the spread
        r.update({"B": B, "H": H, "H_kv": Hkv, "L": L, "D": D, "cache_bytes": 2 * B * Hkv * S * D * 4,
                  "threads": torch.get_num_threads()})
        rows.append(r)
    return rows


def format_table(results: list, machine_info: dict | None = None) -> str:
    """把结果排成表：每个 S 一组，时间、相对 SDPA 的倍数（< 1 即比 SDPA 快）、读缓存的带宽。"""
    lines = []
    if machine_info:
        lines.append(f"# {machine_info['cpu']}, {machine_info['torch_threads']} threads, "
                     f"torch {machine_info['torch']}, {machine_info['date']}")
    head = f"{'S':>6} {'impl':>16} {'time ms':>10} {'x SDPA':>7} {'cache GB/s':>11}"
    lines += [head, "-" * len(head)]
    ok = {(r["S"], r["impl"]): r for r in results if "error" not in r}
    for r in sorted(results, key=lambda r: (r["S"], ALL_IMPLS.index(r["impl"]))):
        prefix = f"{r['S']:>6} {r['impl']:>16}"
        if "error" in r:
            lines.append(f"{prefix} {'failed: ' + r['error']:>30}")
            continue
        sdpa = ok.get((r["S"], "sdpa_gqa"))
        ratio = f"{r['time_s'] / sdpa['time_s']:.2f}" if sdpa else "-"
        bandwidth = r["cache_bytes"] / r["time_s"] / 1e9
        lines.append(f"{prefix} {r['time_s'] * 1e3:>10.2f} {ratio:>7} {bandwidth:>11.1f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    import torch

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    info = machine()
    what = (f"# decode step: B={args.batch}, H={args.heads}, H_kv={args.kv_heads}, L={args.queries}, "
            f"D={args.head_dim}, fp32, {args.rounds} rounds x (>= {args.reps} calls, >= {args.min_time:g} s)")
    results = []
    for S in args.sizes:
        for r in run_size(S, args):
            results.append(r)
            print(f"  done: {r['impl']:>16} S={S:>6} "
                  + (f"{r['time_s'] * 1e3:9.2f} ms" if "time_s" in r else r["error"]), flush=True)
    checks = CALLS[args.call] + ("; decode_unchecked: the unchecked core, as with --call decode_core"
                                 if "decode_unchecked" in args.impls and args.call != "decode_core" else "")
    print(checks)
    print(what)
    print(format_table(results, info))
    out = args.out or (None if (args.quick or args.no_save) else RESULTS)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"machine": info, "config": what[2:], "checks": checks, "call": args.call,
                   "time": "min over the timed calls (>= reps, until min_time) after one warm-up, over rounds "
                           "(the sides alternating), seconds",
                   "command": "python bench/decode.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                   "results": results}
        out.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
