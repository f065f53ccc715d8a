"""GPU 基准（第 08、09 章）：朴素注意力、torch SDPA（FlashAttention 后端）与 attn_lib 的 Triton 核函数，前向与前向+反向的 TFLOP/s。

    .venv/bin/python bench/gpu.py            # fp16 and bf16, D in {64, 128}, N in {1k, 2k, 4k, 8k, 16k}, causal and not
    .venv/bin/python bench/gpu.py --quick    # N in {1k, 4k}, fp16, D = 64
    .venv/bin/python bench/gpu.py --passes fwd_bwd          # forward + backward only
    .venv/bin/python bench/gpu.py --batch 1 --heads 8   # the CPU benchmark's shape

Shapes follow flash-attn's benchmark: B * N = 16k tokens and H * D = 2048 (so B = 16384 // N,
H = 2048 // D) unless --batch / --heads are given. Forward FLOPs are ``4 * B * H * N * N * D``
(two matrix products); the backward has five products, 2.5 times the forward, so forward +
backward is 3.5 times the forward (flash-attn's convention); half of each with ``causal``.
TFLOP/s = FLOPs / time. Every side is timed without input checks (the output says so): the
Triton kernels through ``attn_lib._triton_launch.launch`` and ``launch_backward`` (the kernels
alone), the naive path through its unchecked core, SDPA as is; SDPA's and the naive path's
backward run through autograd (``out.backward(dout)``).
Time: ``triton.testing.do_bench`` (median, L2 flushed between runs). Memory:
``torch.cuda.max_memory_allocated`` during one call minus before it, MiB. Naive attention
that does not fit is reported as "OOM". Runs in a few minutes on one recent GPU. Writes
``bench/results/gpu.json`` unless --quick or --no-save. Exits with a message (code 2) when
there is no CUDA GPU.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from pathlib import Path

IMPLS = ("naive", "sdpa_flash", "triton")
DTYPES = ("float16", "bfloat16")
PASSES = ("fwd", "fwd_bwd")
DEFAULT_SIZES = (1024, 2048, 4096, 8192, 16384)
BWD_FLOP_RATIO = 2.5  # backward / forward FLOPs: five N x N x D products against two
RESULTS = Path(__file__).resolve().parent / "results" / "gpu.json"
NO_GPU_MESSAGE = ("bench/gpu.py needs a CUDA GPU and torch with CUDA; none was found "
                  "(torch.cuda.is_available() is False). For this machine run bench/cpu.py.")


CHECKS = "# checks: none on any side (the Triton launchers and the naive core unchecked, SDPA as is)"

def attention_flops(B: int, H: int, L: int, S: int, D: int, causal: bool = False, mode: str = "fwd") -> float:
    """注意力的浮点运算次数：前向 QKᵀ 和 PV 两次矩阵乘各 2·B·H·L·S·D；反向是前向的 2.5 倍；因果时只算一半。

    Args:
        B, H, L, S, D: batch, heads, queries, keys, head dim.
        causal: half of the score matrix is skipped.
        mode: ``"fwd"`` (forward) or ``"fwd_bwd"`` (forward + backward, 3.5 x forward).
    """
    if mode not in PASSES:
        raise ValueError(f"mode must be one of {PASSES}, got {mode!r}")
    flops = 4.0 * B * H * L * S * D
    if mode == "fwd_bwd":
        flops *= 1 + BWD_FLOP_RATIO
    return flops / 2 if causal else flops


def shape_for(N: int, D: int, batch: int | None, heads: int | None, tokens: int = 16384, model_dim: int = 2048):
    """按 flash-attn 基准的约定选 (B, H):B·N = tokens,H·D = model_dim（可被 --batch/--heads 覆盖）。"""
    B = batch if batch else max(1, tokens // N)
    H = heads if heads else max(1, model_dim // D)
    return B, H


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", help="sequence lengths N (L = S = N)")
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    p.add_argument("--passes", nargs="+", choices=PASSES, default=list(PASSES),
                   help="fwd: forward only; fwd_bwd: forward + backward")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--compile-only", metavar="SM", type=int, default=None,
                   help="no GPU needed: compile every kernel for compute capability SM (e.g. 75 for a T4, 80, 90) "
                        "with Triton's bundled ptxas and print the shared memory each configuration needs")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes = args.sizes or [1024, 4096]
        args.head_dims, args.dtypes = [64], ["float16"]
    args.sizes = args.sizes or list(DEFAULT_SIZES)
    return args


def format_table(results: list) -> str:
    """排成表：TFLOP/s、相对 SDPA（flash 后端）吞吐量的倍数、峰值额外显存；前向与前向+反向分行。"""
    head = (f"{'pass':>7} {'dtype':>8} {'D':>4} {'N':>6} {'causal':>6} {'impl':>10} {'ms':>9} {'TFLOP/s':>8} "
            f"{'x SDPA':>7} {'MiB':>8}")
    lines = [head, "-" * len(head)]
    groups = {}
    for r in results:
        key = (PASSES.index(r.get("mode", "fwd")), r["dtype"], r["D"], r["N"], r["causal"])
        groups.setdefault(key, {})[r["impl"]] = r
    for key, rows in sorted(groups.items()):
        base = rows.get("sdpa_flash", {}).get("tflops")
        for impl in IMPLS:
            r = rows.get(impl)
            if r is None:
                continue
            prefix = f"{PASSES[key[0]]:>7} {key[1]:>8} {key[2]:>4} {key[3]:>6} {str(key[4]):>6} {impl:>10}"
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
            "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
            "cuda": torch.version.cuda, "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "date": _dt.date.today().isoformat()}


def make_fn(torch, impl: str, mode: str, q, k, v, dout, causal: bool, kernel, flags: dict):
    """The callable to time: one forward, or one forward followed by its backward."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attn_lib._numerics import resolve_scale
    from attn_lib.naive import _naive_core

    scale = resolve_scale(None, q.shape[-1])
    if impl == "triton":
        def fwd():
            return kernel.launch(q, k, v, None, causal, scale, interpret=False, dot_fp32=flags["dot_fp32"],
                                 capability=flags["capability"])
        if mode == "fwd":
            return fwd

        def fwd_bwd():
            out, lse = fwd()
            return kernel.launch_backward(q, k, v, out, lse, dout, None, causal, scale, interpret=False,
                                          dot_fp32=flags["dot_fp32"], capability=flags["capability"])
        return fwd_bwd
    if impl == "naive":
        def forward():  # the unchecked core, as the kernels and SDPA run without checks
            return _naive_core(q, k, v, causal, scale, None, check_overflow=False)
    else:
        def forward():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if mode == "fwd":
        return forward

    def forward_backward():
        forward().backward(dout)
    return forward_backward


def bench_case(torch, impl, dtype, N, D, causal, args, kernel, flags, mode="fwd"):
    from triton.testing import do_bench

    B, H = shape_for(N, D, args.batch, args.heads)
    gen = torch.Generator(device="cuda").manual_seed(0)
    grad = mode == "fwd_bwd" and impl != "triton"  # autograd paths need leaves that require grad
    q, k, v, dout = (torch.randn(B, H, N, D, device="cuda", dtype=getattr(torch, dtype), generator=gen)
                     for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(grad)
    base = {"impl": impl, "mode": mode, "dtype": dtype, "D": D, "N": N, "B": B, "H": H, "causal": causal}
    try:
        fn = make_fn(torch, impl, mode, q, k, v, dout, causal, kernel, flags)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - before) / 2**20
        ms = do_bench(fn, warmup=25, rep=100, return_mode="median", grad_to_none=[q, k, v] if grad else None)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return {**base, "error": "OOM"}
    tflops = attention_flops(B, H, N, N, D, causal, mode) / (ms * 1e-3) / 1e12
    return {**base, "ms": ms, "tflops": tflops, "peak_extra_mib": peak}


def check_kernel(torch, kernel, flags_for) -> None:
    """Before timing: forward and backward agree with the float64 reference (flash-attn's rule)."""
    import attn_lib
    from attn_lib.tolerances import assert_flash_rule

    gen = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v, dout = (torch.randn(2, 4, 300, 64, device="cuda", generator=gen) for _ in range(4))
        for causal in (False, True):
            leaves = [t.double().requires_grad_() for t in (q, k, v)]
            ref, _ = attn_lib.attention(*leaves, is_causal=causal)
            ref.backward(dout.double())
            ql, kl, vl, dl = (t.to(dtype) for t in (q, k, v, dout))
            flags = flags_for(dtype)
            out, lse = kernel.launch(ql, kl, vl, None, causal, 64 ** -0.5, interpret=False, dot_fp32=flags["dot_fp32"],
                                     capability=flags["capability"])
            grads = kernel.launch_backward(ql, kl, vl, out, lse, dl, None, causal, 64 ** -0.5, interpret=False,
                                           dot_fp32=flags["dot_fp32"], capability=flags["capability"])
            nl = [t.detach().requires_grad_() for t in (ql, kl, vl)]
            naive = attn_lib.naive_attention(*nl, is_causal=causal)
            naive.backward(dl)
            assert_flash_rule(out, naive.detach(), ref.detach(), what=f"triton out {dtype} causal={causal}")
            for name, g, n, r in zip(("dq", "dk", "dv"), grads, nl, leaves):
                # flash-attn's gradient rule: twice the naive error plus one rounding step of dtype
                rr = r.grad.to(dtype)
                atol = 2 * float(((rr + 0.3 - 0.3) - rr).abs().max())
                err, naive_err = float((g.double() - r.grad).abs().max()), float((n.grad.double() - r.grad).abs().max())
                assert err <= 2 * naive_err + atol, f"triton {name} {dtype} causal={causal}: {err:.3e} vs {naive_err:.3e}"


_NOT_POINTERS = {"H", "L", "S", "HZ_START", "CAUSAL_OFFSET", "SPLIT_SCALE", "D", "DV", "CAUSAL", "HAS_KPM", "DOT_FP32",
                 "INPUT_PRECISION", "INT64", "BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_DV"}


def kernel_signature(arg_names, dtype_name: str, constexprs: dict) -> dict:
    """为 triton.compile 写出核函数的参数类型：大写名字是指针（掩码 int8,lse/Delta float32），小写是 int32 / fp32。

    Args:
        arg_names: the kernel's argument names, in order.
        dtype_name: Triton's name of the inputs' type, e.g. ``"fp16"``.
        constexprs: the compile-time arguments (typed ``"constexpr"``).
    """
    sig = {}
    for name in arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name == "KPM":
            sig[name] = "*i8"
        elif name in ("LSE", "Delta"):
            sig[name] = "*fp32"
        elif name[0].isupper() and name not in _NOT_POINTERS:
            sig[name] = f"*{dtype_name}"
        elif name in ("qk_scale", "sm_scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def compile_only(sm: int, head_dims, dtypes) -> int:
    """Compile every kernel for compute capability ``sm`` without a GPU; print shared memory per kernel."""
    import time

    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import importlib

    # Not through attn_lib.flash.load_kernel: without a GPU it would pick the interpreter; the
    # __main__ block set TRITON_INTERPRET=0, so this import builds compilable kernels.
    kernel = importlib.import_module("attn_lib.flash_triton")
    backward = importlib.import_module("attn_lib.flash_triton_backward")
    config = importlib.import_module("attn_lib._triton_config")
    numerics = importlib.import_module("attn_lib._numerics")
    if type(kernel._attn_fwd).__name__ != "JITFunction":
        print("Triton is in interpreter mode in this process; run: python bench/gpu.py --compile-only SM",
              file=sys.stderr)
        return 2
    target = GPUTarget("cuda", sm, 32)
    kernels = (("fwd", kernel._attn_fwd), ("dkdv", backward._attn_bwd_dkdv), ("dq", backward._attn_bwd_dq))
    print(f"# sm_{sm}: shared memory per program, first configuration of each kernel (causal, key padding)")
    for dtype in dtypes:
        tdtype = getattr(torch, dtype)
        dot_fp32 = numerics.dot_fp32(tdtype, (sm // 10, sm % 10), False)  # the rule of attn_lib._numerics
        for D in head_dims:
            for kind, fn in kernels:
                cfg = config.candidate_configs(D, D, tdtype, False, kind=kind, capability=(sm // 10, sm % 10))[0]
                consts = dict(D=D, DV=D, CAUSAL=True, HAS_KPM=True, DOT_FP32=dot_fp32,
                              INPUT_PRECISION=numerics.dot_input_precision(tdtype, dot_fp32), INT64=False, SPLIT_SCALE=False,
                              **{k: cfg[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_DV")})
                src = ASTSource(fn=fn, signature=kernel_signature(fn.arg_names, {"float16": "fp16", "bfloat16": "bf16"}[dtype],
                                                                  consts),
                                constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
                start = time.time()
                compiled = triton.compile(src, target=target,
                                          options=dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"]))
                print(f"  {dtype:>8} D={D:<4} {kind:>4} BLOCK_M={cfg['BLOCK_M']:<4} BLOCK_N={cfg['BLOCK_N']:<4} "
                      f"stages={cfg['num_stages']} warps={cfg['num_warps']}: {compiled.metadata.shared:>6} bytes "
                      f"({time.time() - start:.0f} s to compile)", flush=True)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.compile_only is not None:
        return compile_only(args.compile_only, args.head_dims, args.dtypes)
    import torch

    if not torch.cuda.is_available():
        print(NO_GPU_MESSAGE, file=sys.stderr)
        return 2
    from attn_lib import device
    from attn_lib.flash import kernel_flags, load_kernel

    kernel = load_kernel()
    if device.triton_interprets():
        print("Triton was imported in interpreter mode before bench/gpu.py could pin compiled mode; "
              "run it as a script: python bench/gpu.py", file=sys.stderr)
        return 2
    return _run(args, argv, torch, kernel, lambda dtype: kernel_flags(dtype, torch.device("cuda", 0), False))


def _run(args, argv, torch, kernel, flags_for) -> int:
    check_kernel(torch, kernel, flags_for)
    info = machine(torch)
    print(f"# {info['gpu']} (sm_{info['capability'].replace('.', '')}), CUDA {info['cuda']}, torch {info['torch']}, "
          f"triton {info['triton']}, {info['date']}")
    print(CHECKS)
    results = []
    for mode in args.passes:
        for dtype in args.dtypes:
            flags = flags_for(getattr(torch, dtype))
            for D in args.head_dims:
                for N in args.sizes:
                    for causal in (False, True):
                        for impl in args.impls:
                            r = bench_case(torch, impl, dtype, N, D, causal, args, kernel, flags, mode)
                            results.append(r)
                            print(f"  {mode} {dtype} D={D} N={N} causal={causal} {impl}: "
                                  + (f"{r['tflops']:.1f} TFLOP/s" if "tflops" in r else r["error"]), flush=True)
    print(format_table(results))
    out = args.out or (None if (args.quick or args.no_save) else RESULTS)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"machine": info,
                   "config": {"shape": "B = 16384 // N, H = 2048 // D unless --batch/--heads",
                              "time": "triton.testing.do_bench median, ms",
                              "flops": "fwd: 4*B*H*N*N*D; fwd_bwd: 3.5 x fwd; /2 if causal"},
                   "checks": CHECKS,
                   "command": "python bench/gpu.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                   "results": results}
        out.write_text(json.dumps(payload, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    # The kernels are timed compiled: Triton's mode is fixed when it is first imported, so pin
    # it before anything imports triton, even if the shell exports TRITON_INTERPRET=1.
    os.environ["TRITON_INTERPRET"] = "0"
    sys.exit(main())
