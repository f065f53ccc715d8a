"""GPU 基准:朴素注意力、torch SDPA(FlashAttention 后端)与 attn_lib 的 Triton 核函数,前向 TFLOP/s。

    .venv/bin/python bench/gpu.py            # fp16 and bf16, D in {64, 128}, N in {1k, 2k, 4k, 8k, 16k}, causal and not
    .venv/bin/python bench/gpu.py --quick    # N in {1k, 4k}, fp16, D = 64
    .venv/bin/python bench/gpu.py --batch 1 --heads 8   # the CPU benchmark's shape

Shapes follow flash-attn's benchmark: B * N = 16k tokens and H * D = 2048 (so B = 16384 // N,
H = 2048 // D) unless --batch / --heads are given. Forward FLOPs are ``4 * B * H * N * N * D``
(two matrix products), half of that with ``causal``; TFLOP/s = FLOPs / time. The Triton kernel
is timed through ``attn_lib.flash_triton.launch`` (the kernel alone, as SDPA is called without
attn_lib's input checks). Time: ``triton.testing.do_bench`` (median, L2 flushed between runs).
Memory: ``torch.cuda.max_memory_allocated`` during the call minus before it, MiB. Naive
attention that does not fit is reported as "OOM". Runs in a few minutes on one recent GPU.
Writes ``bench/results/gpu.json`` unless --quick or --no-save. Exits with a message (code 2)
when there is no CUDA GPU.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

IMPLS = ("naive", "sdpa_flash", "triton")
DTYPES = ("float16", "bfloat16")
DEFAULT_SIZES = (1024, 2048, 4096, 8192, 16384)
RESULTS = Path(__file__).resolve().parent / "results" / "gpu.json"
NO_GPU_MESSAGE = ("bench/gpu.py needs a CUDA GPU and torch with CUDA; none was found "
                  "(torch.cuda.is_available() is False). For this machine run bench/cpu.py.")


def attention_flops(B: int, H: int, L: int, S: int, D: int, causal: bool = False) -> float:
    """注意力前向的浮点运算次数:QKᵀ 和 PV 两次矩阵乘各 2·B·H·L·S·D;因果时只算一半。"""
    flops = 4.0 * B * H * L * S * D
    return flops / 2 if causal else flops


def shape_for(N: int, D: int, batch: int | None, heads: int | None, tokens: int = 16384, model_dim: int = 2048):
    """按 flash-attn 基准的约定选 (B, H):B·N = tokens,H·D = model_dim(可被 --batch/--heads 覆盖)。"""
    B = batch if batch else max(1, tokens // N)
    H = heads if heads else max(1, model_dim // D)
    return B, H


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+")
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes = args.sizes or [1024, 4096]
        args.head_dims, args.dtypes = [64], ["float16"]
    args.sizes = args.sizes or list(DEFAULT_SIZES)
    return args


def format_table(results: list) -> str:
    """排成表:TFLOP/s、相对 SDPA(flash 后端)吞吐量的倍数、峰值额外显存。"""
    head = (f"{'dtype':>8} {'D':>4} {'N':>6} {'causal':>6} {'impl':>10} {'ms':>9} {'TFLOP/s':>8} "
            f"{'x SDPA':>7} {'MiB':>8}")
    lines = [head, "-" * len(head)]
    groups = {}
    for r in results:
        groups.setdefault((r["dtype"], r["D"], r["N"], r["causal"]), {})[r["impl"]] = r
    for key, rows in sorted(groups.items()):
        base = rows.get("sdpa_flash", {}).get("tflops")
        for impl in IMPLS:
            r = rows.get(impl)
            if r is None:
                continue
            prefix = f"{key[0]:>8} {key[1]:>4} {key[2]:>6} {str(key[3]):>6} {impl:>10}"
            if "error" in r:
                lines.append(f"{prefix} {r['error']:>9}")
                continue
            ratio = f"{r['tflops'] / base:.2f}" if base else "-"
            lines.append(f"{prefix} {r['ms']:>9.3f} {r['tflops']:>8.1f} {ratio:>7} {r['peak_extra_mib']:>8.0f}")
    return "\n".join(lines)


def machine(torch) -> dict:
    import platform

    import triton

    props = torch.cuda.get_device_properties(0)
    return {"gpu": torch.cuda.get_device_name(0), "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "cuda": torch.version.cuda, "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "date": _dt.date.today().isoformat()}


def bench_case(torch, impl, dtype, N, D, causal, args, kernel):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    import attn_lib

    B, H = shape_for(N, D, args.batch, args.heads)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=getattr(torch, dtype), generator=gen) for _ in range(3))
    scale = D ** -0.5
    if impl == "naive":
        fn = lambda: attn_lib.naive_attention(q, k, v, causal=causal)  # noqa: E731
    elif impl == "sdpa_flash":
        def fn():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    else:
        fn = lambda: kernel.launch(q, k, v, None, causal, scale, interpret=False)  # noqa: E731
    base = {"impl": impl, "dtype": dtype, "D": D, "N": N, "B": B, "H": H, "causal": causal}
    try:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - before) / 2**20
        ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return {**base, "error": "OOM"}
    tflops = attention_flops(B, H, N, N, D, causal) / (ms * 1e-3) / 1e12
    return {**base, "ms": ms, "tflops": tflops, "peak_extra_mib": peak}


def check_kernel(torch, kernel) -> None:
    """Before timing: the Triton kernel agrees with the float32 reference on a small case."""
    import attn_lib
    from attn_lib.tolerances import assert_flash_rule

    gen = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = (torch.randn(2, 4, 300, 64, device="cuda", generator=gen) for _ in range(3))
        for causal in (False, True):
            ref, _ = attn_lib.attention(q.double(), k.double(), v.double(), is_causal=causal)
            ql, kl, vl = q.to(dtype), k.to(dtype), v.to(dtype)
            out, _ = kernel.launch(ql, kl, vl, None, causal, 64 ** -0.5, interpret=False)
            naive = attn_lib.naive_attention(ql, kl, vl, causal=causal)
            assert_flash_rule(out, naive, ref, what=f"triton {dtype} causal={causal}")


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(NO_GPU_MESSAGE, file=sys.stderr)
        return 2
    from attn_lib.flash import load_kernel, triton_mode

    kernel = load_kernel(interpret=False)
    # The kernel is launched directly (to time it alone), so pin the compiled mode here in case
    # the shell exports TRITON_INTERPRET=1.
    with triton_mode(False):
        return _run(args, argv, torch, kernel)


def _run(args, argv, torch, kernel) -> int:
    check_kernel(torch, kernel)
    info = machine(torch)
    print(f"# {info['gpu']}, CUDA {info['cuda']}, torch {info['torch']}, triton {info['triton']}, {info['date']}")
    results = []
    for dtype in args.dtypes:
        for D in args.head_dims:
            for N in args.sizes:
                for causal in (False, True):
                    for impl in args.impls:
                        r = bench_case(torch, impl, dtype, N, D, causal, args, kernel)
                        results.append(r)
                        print(f"  {dtype} D={D} N={N} causal={causal} {impl}: "
                              + (f"{r['tflops']:.1f} TFLOP/s" if "tflops" in r else r["error"]), flush=True)
    print(format_table(results))
    out = args.out or (None if (args.quick or args.no_save) else RESULTS)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"machine": info,
                   "config": {"shape": "B = 16384 // N, H = 2048 // D unless --batch/--heads",
                              "time": "triton.testing.do_bench median, ms", "flops": "4*B*H*N*N*D, /2 if causal"},
                   "command": "python bench/gpu.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                   "results": results}
        out.write_text(json.dumps(payload, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
