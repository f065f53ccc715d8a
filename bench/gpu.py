"""GPU 基准（第 08、09、12、13 章）：朴素注意力、torch SDPA（FlashAttention 后端）与 attn_lib 的 Triton 核函数，前向与前向+反向的 TFLOP/s；解码一步读 KV 缓存的带宽。

    .venv/bin/python bench/gpu.py            # fp16 and bf16, D in {64, 128}, N in {1k, 2k, 4k, 8k, 16k}, causal and not
    .venv/bin/python bench/gpu.py --quick    # N in {1k, 4k}, fp16, D = 64
    .venv/bin/python bench/gpu.py --passes fwd_bwd          # forward + backward only
    .venv/bin/python bench/gpu.py --batch 1 --heads 8   # the CPU benchmark's shape
    .venv/bin/python bench/gpu.py --compile-only 75      # no GPU needed: every kernel compiled for sm_75 (or 80, 86, 89, 90)

``--compile-only SM`` runs attn_lib's launchers (forward, backward, decode step) as on a GPU of compute
capability SM with each kernel launch replaced by ``triton.compile`` for that GPU (Triton's bundled ptxas),
and prints the shared memory of every configuration a launcher tries until one fits the SM's limit
(``MAX_SHARED``); exit code 1 when some launcher finds none. ``--dtypes`` and ``--head-dims`` narrow it.

Shapes follow flash-attn's benchmark: B * N = 16k tokens and H * D = 2048 (so B = 16384 // N,
H = 2048 // D) unless --batch / --heads are given. Forward FLOPs are ``4 * B * H * N * N * D``
(two matrix products); the backward has five products, 2.5 times the forward, so forward +
backward is 3.5 times the forward (flash-attn's convention); half of each with ``causal``.
TFLOP/s = FLOPs / time. Every side is timed without input checks (the output says so): the
Triton path through ``attn_lib.flash.autograd.flash_core`` (the unchecked core of
``flash_attention``, its settings built once by the door ``attn_lib.checks.doors.check_flash_call``
with ``check_finite=False``, so no overflow check and no host sync), the naive path through
``attn_lib.flash.naive.naive_core`` (settings from ``check_naive_call``), SDPA as is; every
backward runs through autograd (``out.backward(dout)``).
Time: ``triton.testing.do_bench`` (median, L2 flushed between runs). Memory:
``torch.cuda.max_memory_allocated`` during one call minus before it, MiB. Naive attention
that does not fit is reported as "OOM". Runs in a few minutes on one recent GPU. Writes
``bench/results/gpu.json`` unless --quick or --no-save. Exits with a message (code 2) when
there is no CUDA GPU.

Chapter 12, the cases of ``bench/cpu.py --window`` / ``--gqa`` on the GPU:

    .venv/bin/python bench/gpu.py --window 256      # bf16, D=128, N in {2k, 4k, 8k, 16k}, B*N = 16k, H*D = 2048
    .venv/bin/python bench/gpu.py --gqa             # bf16, H=32, H_kv=8, D=128, N in {1k .. 16k}, B*N = 16k
    .venv/bin/python bench/gpu.py --window 256 --quick

- ``--window W``: causal with ``window_size=(W, 0)`` on the Triton path (``triton_window``),
  full causal on the Triton path (``triton_causal``), SDPA with the band as an explicit bool mask
  (``sdpa_band``, whatever backend SDPA picks for a mask) and SDPA's flash backend with
  ``is_causal`` (``sdpa_causal``, for reference). FLOPs count the (query, key) pairs each row
  really sees (``band_pairs``): ``4 * B * H * pairs * D`` forward, 3.5 x that forward+backward,
  for every row of this suite (full causal included, N(N+1)/2 pairs), so TFLOP/s compare the
  useful work.
- ``--gqa``: q (B, 32, N, 128), k, v (B, 8, N, 128), causal: the Triton path with k, v of H_kv
  heads (``triton_gqa``) against ``F.scaled_dot_product_attention(..., is_causal=True,
  enable_gqa=True)`` (``sdpa_gqa``). FLOPs as above with H = the query heads.
Both call ``attn_lib.flash.autograd.flash_core`` with settings from ``check_flash_call``
(``backend="triton"``, ``check_finite=False``; forward under ``torch.no_grad()``, forward+backward
through autograd), after a correctness check against the float64 reference. Results:
``bench/results/gpu_window.json`` / ``gpu_gqa.json``.

Chapter 13, one decode step (FlashDecoding, ``attn_lib/flash/triton/decode.py``):

    .venv/bin/python bench/gpu.py --decode           # fp16 and bf16, S in {1k .. 32k}, splits 1 2 4 8 16 auto
    .venv/bin/python bench/gpu.py --decode --quick   # S in {1k, 16k}
    .venv/bin/python bench/gpu.py --decode --splits 1 4 32 --dtypes bfloat16
    .venv/bin/python bench/gpu.py --compile-only 90 --decode   # no GPU needed: the decode kernels alone

- q (1, 32, 1, 128), the cache k, v (1, 8, S, 128), one causal step (the L queries are the last L
  positions, bottom-right; with L = 1 every key is seen): the split kernel + merge kernel with each
  split count (``split_P``, through the unchecked launcher ``attn_lib.flash.triton.decode.launch``
  with a ``DecodeSettings`` built here; ``split_auto``: the count ``flash_decoding(num_splits=None)``
  picks on this GPU, ``attn_lib.flash.splits.choose_num_splits``) against no split: chapter 8's
  forward kernel through its unchecked launcher ``attn_lib.flash.triton.forward.launch`` with the
  causal band aligned bottom-right (offset S - L; ``flash_fwd``: its grid is (query blocks, B*H),
  32 programs here, each loading the K/V of its query head, G = 4 times the cache) and SDPA with
  ``enable_gqa=True`` (``sdpa_gqa``). Bandwidth: the cache's bytes
  ``B*H_kv*S*(D+Dv)*element bytes`` (``cache_bytes``: what the split kernel's loads request, each
  K/V block once per group) / time, against the device's peak HBM bandwidth (``peak_bandwidth``:
  the vendor's datasheet figure for known GPUs, cited in the output and in ``PEAK_BANDWIDTH``,
  else 2 x bus width x memory clock from the device properties). Checked against the float64
  reference first. Results: ``bench/results/gpu_decode.json``.
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


CHECKS = ("# timed without input checks: triton = attn_lib.flash.autograd.flash_core (unchecked core, settings from "
          "check_flash_call once, check_finite=False), naive = attn_lib.flash.naive.naive_core (unchecked core), "
          "SDPA as is; backward through autograd")
SUITE_CHECKS = ("# timed without input checks: triton_* = attn_lib.flash.autograd.flash_core (unchecked core, settings "
                "from check_flash_call once, check_finite=False), SDPA as is")
DECODE_CHECKS = ("# timed without input checks: split_P = attn_lib.flash.triton.decode.launch, flash_fwd = "
                 "attn_lib.flash.triton.forward.launch (unchecked launchers, settings built once), SDPA as is")
# Chapter 12
WINDOW_IMPLS = ("triton_window", "triton_causal", "sdpa_band", "sdpa_causal")
GQA_IMPLS = ("triton_gqa", "sdpa_gqa")
WINDOW_SIZES = (2048, 4096, 8192, 16384)
QUICK_SUITE_SIZES = (1024, 4096)
GQA_SHAPE = (32, 8, 128)  # H, H_kv, D
RESULTS_SUITES = {"window": Path(__file__).resolve().parent / "results" / "gpu_window.json",
                  "gqa": Path(__file__).resolve().parent / "results" / "gpu_gqa.json"}

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


def band_pairs(N: int, window: int | None = None) -> int:
    """因果注意力里真正可见的 (查询, 键) 对数：不带窗口时 N(N+1)/2；窗口 (W, 0) 时第 i 行看 min(i, W) + 1 个键。

    Args:
        N: queries = keys.
        window: W of ``window_size=(W, 0)``; None for full causal.
    """
    if window is None:
        return N * (N + 1) // 2
    m = min(N, window + 1)  # rows 0 .. m-1 see i + 1 keys, the others W + 1
    return m * (m + 1) // 2 + (N - m) * (window + 1)


def pair_flops(B: int, H: int, pairs: int, D: int, mode: str = "fwd") -> float:
    """按可见的 (查询, 键) 对数算浮点运算：前向 4·B·H·pairs·D，前向 + 反向再乘 3.5。"""
    if mode not in PASSES:
        raise ValueError(f"mode must be one of {PASSES}, got {mode!r}")
    return 4.0 * B * H * pairs * D * ((1 + BWD_FLOP_RATIO) if mode == "fwd_bwd" else 1)


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
    p.add_argument("--impls", nargs="+", choices=IMPLS + WINDOW_IMPLS + GQA_IMPLS, default=list(IMPLS))
    p.add_argument("--passes", nargs="+", choices=PASSES, default=list(PASSES),
                   help="fwd: forward only; fwd_bwd: forward + backward")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--window", type=int, default=None, metavar="W",
                   help="the sliding-window suite: window_size=(W, 0) beside full causal and SDPA with a band mask")
    p.add_argument("--gqa", action="store_true", help="the GQA suite: H=32, H_kv=8, D=128 vs SDPA enable_gqa=True")
    p.add_argument("--decode", action="store_true",
                   help="the decode-step suite: B=1, H=32, H_kv=8, L=1, D=128, split counts vs no split, GB/s")
    p.add_argument("--splits", nargs="+", default=None, metavar="P",
                   help="the decode suite's split counts (ints or 'auto'); default 1 2 4 8 16 auto")
    p.add_argument("--compile-only", metavar="SM", type=int, default=None,
                   help="no GPU needed: compile every kernel for compute capability SM (e.g. 75 for a T4, 80, 90) "
                        "with Triton's bundled ptxas and print the shared memory each configuration needs")
    args = p.parse_args(argv)
    if (args.window is not None) + args.gqa + args.decode > 1:
        p.error("--window, --gqa and --decode are separate runs; give one of them")
    args.suite = "window" if args.window is not None else ("gqa" if args.gqa else ("decode" if args.decode else None))
    if args.suite == "decode":
        return _decode_defaults(p, args)
    if args.suite:
        return _suite_defaults(args, sys.argv[1:] if argv is None else argv)
    if args.quick:
        args.sizes = args.sizes or [1024, 4096]
        args.head_dims, args.dtypes = [64], ["float16"]
    args.sizes = args.sizes or list(DEFAULT_SIZES)
    return args


def _suite_defaults(args, argv):
    """The window / GQA suites: bf16, D = 128, their own sizes and implementations."""
    if "--dtypes" not in argv:
        args.dtypes = ["bfloat16"]
    if "--head-dims" not in argv:
        args.head_dims = [GQA_SHAPE[2]]
    if args.sizes is None:
        args.sizes = list(QUICK_SUITE_SIZES if args.quick else (WINDOW_SIZES if args.suite == "window" else DEFAULT_SIZES))
    allowed = WINDOW_IMPLS if args.suite == "window" else GQA_IMPLS
    args.impls = [i for i in args.impls if i in allowed] or list(allowed)
    return args


def _decode_defaults(p, args):
    """The decode suite: fp16 and bf16, S = 1k .. 32k, the split counts and the two baselines."""
    splits = args.splits or [str(x) for x in DECODE_SPLITS]
    bad = [x for x in splits if x != "auto" and not (x.isdigit() and int(x) >= 1)]
    if bad:
        p.error(f"--splits must be ints >= 1 or 'auto', got {bad}")
    args.splits = [x if x == "auto" else int(x) for x in splits]
    if args.sizes is None:
        args.sizes = list(QUICK_DECODE_SIZES if args.quick else DECODE_SIZES)
    args.impls = decode_impls(args.splits)
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


def triton_settings(q, k, v, **options):
    """The settings the Triton path is timed with: the door ``check_flash_call`` once, ``backend="triton"``,
    ``check_finite=False`` (no nan scan before, no overflow check after: no host sync), ``options`` as in
    ``flash_attention`` (is_causal, window_size, enable_gqa ...)."""
    from attn_lib import device
    from attn_lib.checks.doors import check_flash_call
    from attn_lib.rules.settings import Options

    return check_flash_call(q, k, v, Options(backend="triton", check_finite=False, **options), device.triton_interprets)


def make_fn(torch, impl: str, mode: str, q, k, v, dout, causal: bool):
    """The callable to time: one forward, or one forward followed by its backward (through autograd).

    ``triton``: ``attn_lib.flash.autograd.flash_core`` (settings from ``triton_settings``); ``naive``:
    ``attn_lib.flash.naive.naive_core`` (settings from ``check_naive_call``, no overflow check); ``sdpa_flash``:
    SDPA with its FlashAttention backend. For ``fwd_bwd`` q, k, v must require grad; the call returns None and
    leaves the gradients in ``q.grad``, ``k.grad``, ``v.grad``.
    """
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attn_lib.checks.doors import check_naive_call
    from attn_lib.flash.autograd import flash_core
    from attn_lib.flash.naive import naive_core
    from attn_lib.rules.settings import Options

    if impl == "triton":
        settings = triton_settings(q, k, v, is_causal=causal)

        def forward():
            return flash_core(q, k, v, settings)  # (B,H,L,Dv)
    elif impl == "naive":
        settings = check_naive_call(q, k, v, Options(is_causal=causal, check_finite=False))

        def forward():
            return naive_core(q, k, v, settings)  # (B,H,L,Dv)
    else:
        def forward():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # (B,H,L,Dv)
    if mode == "fwd":
        return forward

    def forward_backward():
        forward().backward(dout)
    return forward_backward


def bench_case(torch, impl, dtype, N, D, causal, args, mode="fwd"):
    from triton.testing import do_bench

    B, H = shape_for(N, D, args.batch, args.heads)
    gen = torch.Generator(device="cuda").manual_seed(0)
    grad = mode == "fwd_bwd"  # every backward runs through autograd: leaves that require grad
    q, k, v, dout = (torch.randn(B, H, N, D, device="cuda", dtype=getattr(torch, dtype), generator=gen)
                     for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(grad)
    base = {"impl": impl, "mode": mode, "dtype": dtype, "D": D, "N": N, "B": B, "H": H, "causal": causal}
    try:
        fn = make_fn(torch, impl, mode, q, k, v, dout, causal)
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


def _grad_rule(fast, naive, ref, what: str) -> None:
    """flash-attn's gradient rule: error <= 2 x the naive error in the same dtype + one rounding step of it."""
    rr = ref.to(fast.dtype)
    atol = 2 * float(((rr + 0.3 - 0.3) - rr).abs().max())
    err, naive_err = float((fast.double() - ref).abs().max()), float((naive.double() - ref).abs().max())
    assert err <= 2 * naive_err + atol, f"{what}: {err:.3e} vs naive {naive_err:.3e}"


def check_kernel(torch, *, device="cuda", dims=(2, 4, 300, 64)) -> None:
    """Before timing: what ``make_fn("triton", ...)`` times, forward and backward, agrees with the float64
    reference (flash-attn's rule against the naive path in the same dtype). dims = (B, H, N, D)."""
    import attn_lib
    from attn_lib.tolerances import assert_flash_rule

    gen = torch.Generator(device=device).manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v, dout = (torch.randn(*dims, device=device, generator=gen) for _ in range(4))  # (B,H,N,D)
        for causal in (False, True):
            leaves = [t.double().requires_grad_() for t in (q, k, v)]
            ref, _ = attn_lib.attention(*leaves, is_causal=causal)
            ref.backward(dout.double())
            ql, kl, vl, dl = (t.to(dtype) for t in (q, k, v, dout))
            out = make_fn(torch, "triton", "fwd", ql, kl, vl, dl, causal)()  # (B,H,N,D)
            tl = [t.detach().requires_grad_() for t in (ql, kl, vl)]
            make_fn(torch, "triton", "fwd_bwd", *tl, dl, causal)()
            nl = [t.detach().requires_grad_() for t in (ql, kl, vl)]
            naive = attn_lib.naive_attention(*nl, is_causal=causal)
            naive.backward(dl)
            assert_flash_rule(out, naive.detach(), ref.detach(), what=f"triton out {dtype} causal={causal}")
            for name, t, n, r in zip(("dq", "dk", "dv"), tl, nl, leaves):
                _grad_rule(t.grad, n.grad, r.grad, f"triton {name} {dtype} causal={causal}")


# --compile-only SM (no GPU needed): attn_lib's launchers run as they would on a GPU of compute capability SM,
# with every kernel launch replaced by triton.compile for that GPU (KernelCompiler). So the arguments, the
# constexprs and the configuration each launcher picks are the launchers' own, never a copy of them here.
MAX_SHARED = {75: 65536, 80: 166912, 86: 101376, 89: 101376, 90: 232448}
# ^ bytes of shared memory one block may use (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, what Triton
# checks when it loads a kernel): the CUDA C++ Programming Guide, "Technical Specifications per Compute
# Capability": 64 KB (7.5), 163 KB (8.0), 99 KB (8.6, 8.9), 227 KB (9.0).
COMPILE_SHAPE = (1, 8, 2, 1024)  # B, H, H_kv, L = S of the forward and backward launches (causal, key padding)
COMPILE_DECODE_SPLITS = 4  # the decode launch: DECODE_SHAPE, a cache of 4096 keys, this many splits
COMPILE_DECODE_KEYS = 4096
# The kernel files and the kernels their launchers start, in launch order (forward, backward, decode step).
LAUNCHED_KERNELS = {"attn_lib.flash.triton.forward": ("attn_fwd",),
                    "attn_lib.flash.triton.backward": ("attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq"),
                    "attn_lib.flash.triton.decode": ("decode_split", "decode_merge")}


class KernelCompiler:
    """没有 GPU 时代替一个 @triton.jit 核函数：``kernel[grid](...)`` 不启动，而是为目标 GPU 编译它并记下共享内存。

    Triton's own binder specializes the arguments as a launch would (pointer dtypes, strides of 1,
    divisibility by 16). A kernel needing more shared memory than ``limit`` raises OutOfResources
    after it is logged, as loading it on that GPU does, so the launcher goes on to its next configuration.
    Relies on Triton 3.7's binder (``create_function_from_signature``, ``JITFunction._pack_args``).
    """

    def __init__(self, fn, target, limit: int, log: list):
        self.fn, self.target, self.limit, self.log = fn, target, limit, log

    def __getitem__(self, grid):
        return self.compile

    def compile(self, *args, **kwargs):
        import triton
        from triton.compiler import ASTSource, make_backend
        from triton.runtime.errors import OutOfResources
        from triton.runtime.jit import create_function_from_signature

        backend = make_backend(self.target)
        binder = create_function_from_signature(self.fn.signature, self.fn.params, backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = self.fn._pack_args(backend, kwargs, bound, specialization, options)
        compiled = triton.compile(ASTSource(self.fn, signature, constexprs, attrs), target=self.target,
                                  options=options.__dict__)
        shared = compiled.metadata.shared
        self.log.append(dict(kernel=self.fn.__name__, shared=shared, fits=shared <= self.limit,
                             num_warps=options.num_warps, num_stages=options.num_stages,
                             blocks={k: v for k, v in kwargs.items() if k.startswith("BLOCK_")},
                             constexprs={name: v for name, v in kwargs.items() if name.isupper()}))
        if shared > self.limit:
            raise OutOfResources(shared, self.limit, "shared memory")


def compile_launches(sm: int, dtype_name: str, D: int, log: list, decode_only: bool = False) -> list:
    """为计算能力 sm 的 GPU 跑一遍 attn_lib 的每个启动器（前向、反向、解码），核函数只编译不启动；返回没有一个配置放得下的启动器。

    Args:
        sm: compute capability, e.g. 75, 80, 90 (a key of ``MAX_SHARED``).
        dtype_name: ``"float16"`` or ``"bfloat16"``; D: the head dim (Dv = D).
        log: gets one dict per compiled kernel (``KernelCompiler``), in launch order.
        decode_only: the decode launcher alone.
    """
    import contextlib
    import importlib
    from unittest import mock

    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime.errors import OutOfResources

    from attn_lib.rules.band import Band
    from attn_lib.rules.settings import AttentionSettings, DecodeSettings

    fwd, bwd, dec = modules = [importlib.import_module(name) for name in LAUNCHED_KERNELS]
    target = (False, (sm // 10, sm % 10))  # compiled, for this GPU: the launchers' own flags and configurations
    meta = dict(dtype=getattr(torch, dtype_name), device="meta")  # shapes and strides, no memory
    B, H, H_kv, N = COMPILE_SHAPE
    q, out, dout = (torch.empty(B, H, N, D, **meta) for _ in range(3))  # (B,H,L,D)
    k, v = (torch.empty(B, H_kv, N, D, **meta) for _ in range(2))  # (B,H_kv,S,D)
    lse = torch.empty(B, H, N, dtype=torch.float32, device="meta")  # (B,H,L)
    kpm = torch.ones(B, N, dtype=torch.bool, device="meta")  # (B,S)
    settings = AttentionSettings(band=Band.resolve(N, N, is_causal=True), scale=D ** -0.5, work_dtype=torch.float32,
                                 key_mask=kpm, check_overflow=False, backend="triton")
    Bd, Hd, Hd_kv, Ld, _ = DECODE_SHAPE
    qd = torch.empty(Bd, Hd, Ld, D, **meta)  # (B,H,L,D)
    kd, vd = (torch.empty(Bd, Hd_kv, COMPILE_DECODE_KEYS, D, **meta) for _ in range(2))  # (B,H_kv,S,D)
    one_step = DecodeSettings(scale=D ** -0.5, work_dtype=torch.float32, is_causal=DECODE_CAUSAL,
                          seqlens=torch.empty(Bd, dtype=torch.int32, device="meta"),  # (B,)
                          num_splits=COMPILE_DECODE_SPLITS, check_overflow=False, backend="triton")
    steps = {"forward": lambda: fwd.launch(q, k, v, settings, target=target),
             "backward": lambda: bwd.launch(q, k, v, (out, lse, dout), settings, target=target),
             "decode": lambda: dec.launch(qd, kd, vd, one_step, target=target)}
    failed = []
    with contextlib.ExitStack() as stack:
        gpu = GPUTarget("cuda", sm, 32)
        for module in modules:
            for name in LAUNCHED_KERNELS[module.__name__]:
                compiler = KernelCompiler(getattr(module, name), gpu, MAX_SHARED[sm], log)
                stack.enter_context(mock.patch.object(module, name, compiler))
        for what, step in steps.items():
            if decode_only and what != "decode":
                continue
            try:
                step()
            except OutOfResources:  # even the launcher's last configuration needs too much shared memory
                failed.append(what)
    return failed


def _compiled_line(dtype_name: str, D: int, r: dict) -> str:
    blocks = " ".join(f"{k}={v}" for k, v in r["blocks"].items())
    note = "" if r["fits"] else "  over the limit: the launcher tries its next configuration"
    return (f"  {dtype_name:>8} D={D:<4} {r['kernel']:<20} {blocks} stages={r['num_stages']} warps={r['num_warps']}: "
            f"{r['shared']:>6} bytes{note}")


def compile_only(sm: int, head_dims, dtypes, decode_only: bool = False) -> int:
    """没有 GPU 也能做：为计算能力 sm 编译每个启动器会用的核函数，打印每个的共享内存；有启动器放不下时返回 1。"""
    import importlib

    import torch

    if sm not in MAX_SHARED:
        print(f"--compile-only must be one of {sorted(MAX_SHARED)}, got {sm}; pick the GPU's compute capability",
              file=sys.stderr)
        return 2
    # Not through attn_lib.flash.triton.entry.load_kernels: without a GPU it would pick the interpreter; the
    # __main__ block set TRITON_INTERPRET=0, so these imports build compilable kernels.
    if type(importlib.import_module("attn_lib.flash.triton.forward").attn_fwd).__name__ != "JITFunction":
        print("Triton is in interpreter mode in this process; run: python bench/gpu.py --compile-only SM",
              file=sys.stderr)
        return 2
    numerics = importlib.import_module("attn_lib.rules.numerics")
    B, H, H_kv, N = COMPILE_SHAPE
    Bd, Hd, Hd_kv, Ld, _ = DECODE_SHAPE
    print(f"# sm_{sm}: at most {MAX_SHARED[sm]} bytes of shared memory per block; each kernel as attn_lib's launchers "
          "build it for this GPU, every configuration they try until one fits, compiled without a GPU")
    print("# " + ("" if decode_only else f"forward and backward: causal, key padding, B={B} H={H} H_kv={H_kv} L=S={N}; ")
          + f"decode: B={Bd} H={Hd} H_kv={Hd_kv} L={Ld} S={COMPILE_DECODE_KEYS}, {COMPILE_DECODE_SPLITS} splits, "
          f"is_causal={DECODE_CAUSAL}")
    failed = []
    for dtype_name in dtypes:
        dot_fp32 = numerics.dot_fp32(getattr(torch, dtype_name), (sm // 10, sm % 10), False)
        print(f"# {dtype_name}: DOT_FP32={dot_fp32}" + (" (no bf16 tl.dot before sm_80)" if dot_fp32 else ""))
        for D in head_dims:
            log = []
            for what in compile_launches(sm, dtype_name, D, log, decode_only):
                failed.append(f"{dtype_name} D={D} {what}")
            for r in log:
                print(_compiled_line(dtype_name, D, r), flush=True)
    for what in failed:
        print(f"# no configuration of the {what} launcher fits sm_{sm}", file=sys.stderr)
    return 1 if failed else 0


def suite_fn(torch, impl: str, mode: str, q, k, v, dout, window: int | None):
    """The callable to time in the window / GQA suites: one forward, or one forward and its backward.

    The Triton rows call ``attn_lib.flash.autograd.flash_core`` with settings from ``triton_settings``
    (causal; ``window_size=(window, 0)`` for ``triton_window``; k, v may have H_kv heads).
    """
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attn_lib.flash.autograd import flash_core
    from attn_lib.rules.band import band, band_mask

    if impl == "sdpa_band":
        keep = band_mask(q.shape[2], k.shape[2], *band(True, (window, 0)), device=q.device)  # (L,S), True = visible

        def forward():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # (B,H,L,D)
    elif impl == "sdpa_causal":
        def forward():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B,H,L,D)
    elif impl == "sdpa_gqa":
        def forward():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # (B,H,L,D)
    else:
        settings = triton_settings(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1],
                                   window_size=(window, 0) if impl == "triton_window" else (-1, -1))

        def forward():
            return flash_core(q, k, v, settings)  # (B,H,L,D); k, v may have H_kv heads
    if mode == "fwd":
        def fwd():
            with torch.no_grad():
                return forward()
        return fwd

    def fwd_bwd():
        forward().backward(dout)
    return fwd_bwd


def bench_suite_case(torch, impl: str, dtype: str, N: int, D: int, args, mode: str) -> dict:
    """One case of the window / GQA suites: do_bench median, TFLOP/s over the visible pairs, peak extra MiB."""
    from triton.testing import do_bench

    if args.suite == "gqa":
        H, H_kv = GQA_SHAPE[0], GQA_SHAPE[1]
        B = args.batch or max(1, 16384 // N)
    else:
        B, H = shape_for(N, D, args.batch, args.heads)
        H_kv = H
    gen = torch.Generator(device="cuda").manual_seed(0)
    t = getattr(torch, dtype)
    q, dout = (torch.randn(B, H, N, D, device="cuda", dtype=t, generator=gen) for _ in range(2))  # (B,H,N,D)
    k, v = (torch.randn(B, H_kv, N, D, device="cuda", dtype=t, generator=gen) for _ in range(2))  # (B,H_kv,N,D)
    grad = mode == "fwd_bwd"
    for x in (q, k, v):
        x.requires_grad_(grad)
    window = args.window if impl in ("triton_window", "sdpa_band") else None
    base = {"suite": args.suite, "impl": impl, "mode": mode, "dtype": dtype, "D": D, "N": N, "B": B, "H": H,
            "H_kv": H_kv, "window": window}
    try:
        fn = suite_fn(torch, impl, mode, q, k, v, dout, window)
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
    tflops = pair_flops(B, H, band_pairs(N, window), D, mode) / (ms * 1e-3) / 1e12
    return {**base, "ms": ms, "tflops": tflops, "peak_extra_mib": peak}


def check_suite(torch, window: int, *, device="cuda", dims=(2, 8, 2, 300, 64)) -> None:
    """Before timing: what ``suite_fn("triton_window", ...)`` times, with GQA, agrees with the float64 reference
    (flash-attn's rule against SDPA in the same dtype with the band as a mask). dims = (B, H, H_kv, N, D)."""
    import attn_lib
    import torch.nn.functional as F
    from attn_lib.tolerances import assert_flash_rule

    B, H, H_kv, N, D = dims
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(B, H, N, D, device=device, generator=gen)  # (B,H,L,D)
    k, v = (torch.randn(B, H_kv, N, D, device=device, generator=gen) for _ in range(2))  # (B,H_kv,S,D)
    for dtype in (torch.float16, torch.bfloat16):
        ql, kl, vl = (x.to(dtype) for x in (q, k, v))
        ref, _ = attn_lib.attention(q.double(), k.double(), v.double(), is_causal=True, enable_gqa=True,
                                    window_size=(window, 0))  # (B,H,L,D)
        keep = torch.ones(N, N, dtype=torch.bool, device=device).tril().triu(-window)  # (L,S) band, by hand
        sdpa = F.scaled_dot_product_attention(ql, kl, vl, attn_mask=keep, enable_gqa=True)  # (B,H,L,D)
        out = suite_fn(torch, "triton_window", "fwd", ql, kl, vl, None, window)()  # (B,H,L,D)
        assert_flash_rule(out, sdpa, ref, what=f"triton GQA + window {window} {dtype}")


def format_suite_table(results: list) -> str:
    """窗口 / GQA 两组排成表：TFLOP/s（按可见的对数）、相对 SDPA 的倍数、相对最小 N 的时间倍数、显存。"""
    head = (f"{'pass':>7} {'dtype':>8} {'N':>6} {'impl':>13} {'ms':>9} {'TFLOP/s':>8} {'x SDPA':>7} {'t/t(N_min)':>10} "
            f"{'MiB':>8}")
    lines = [head, "-" * len(head)]
    ok = [r for r in results if "error" not in r]
    first = {(r["mode"], r["dtype"], r["impl"]): r for r in sorted(ok, key=lambda r: -r["N"])}  # smallest N wins
    order = WINDOW_IMPLS + GQA_IMPLS
    for r in sorted(results, key=lambda r: (PASSES.index(r["mode"]), r["dtype"], r["N"], order.index(r["impl"]))):
        prefix = f"{r['mode']:>7} {r['dtype']:>8} {r['N']:>6} {r['impl']:>13}"
        if "error" in r:
            lines.append(f"{prefix} {r['error']:>9}")
            continue
        sdpa = next((o for o in ok if (o["mode"], o["dtype"], o["N"]) == (r["mode"], r["dtype"], r["N"])
                     and o["impl"] in ("sdpa_band", "sdpa_gqa")), None)
        ratio = f"{r['ms'] / sdpa['ms']:.2f}" if sdpa else "-"
        growth = r["ms"] / first[(r["mode"], r["dtype"], r["impl"])]["ms"]
        lines.append(f"{prefix} {r['ms']:>9.3f} {r['tflops']:>8.1f} {ratio:>7} {growth:>10.2f} {r['peak_extra_mib']:>8.0f}")
    return "\n".join(lines)


def _run_suite(args, argv, torch) -> int:
    """The window or GQA suite on the GPU: check, time, print, save."""
    check_suite(torch, args.window if args.suite == "window" else 64)
    info = machine(torch)
    print(f"# {info['gpu']} (sm_{info['capability'].replace('.', '')}), CUDA {info['cuda']}, torch {info['torch']}, "
          f"triton {info['triton']}, {info['date']}")
    print(SUITE_CHECKS + "; "
          + (f"window_size=({args.window}, 0), causal" if args.suite == "window" else "H=32, H_kv=8, causal"))
    results = []
    for mode in args.passes:
        for dtype in args.dtypes:
            for D in args.head_dims:
                for N in args.sizes:
                    for impl in args.impls:
                        r = bench_suite_case(torch, impl, dtype, N, D, args, mode)
                        results.append(r)
                        print(f"  {mode} {dtype} D={D} N={N} {impl}: "
                              + (f"{r['tflops']:.1f} TFLOP/s" if "tflops" in r else r["error"]), flush=True)
    print(format_suite_table(results))
    out = args.out or (None if (args.quick or args.no_save) else RESULTS_SUITES[args.suite])
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"machine": info, "config": {"time": "triton.testing.do_bench median, ms",
                                               "flops": "4*B*H*pairs*D (fwd), 3.5 x (fwd_bwd); pairs = band_pairs"},
                   "command": "python bench/gpu.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                   "results": results}
        out.write_text(json.dumps(payload, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


# Chapter 13: the decode step (FlashDecoding)
DECODE_SHAPE = (1, 32, 8, 1, 128)  # B, H, H_kv, L, D
DECODE_SIZES = (1024, 2048, 4096, 8192, 16384, 32768)
QUICK_DECODE_SIZES = (1024, 16384)
DECODE_SPLITS = (1, 2, 4, 8, 16, "auto")
DECODE_BASE_IMPLS = ("flash_fwd", "sdpa_gqa")  # no split: chapter 8's kernel (parallel over queries), torch SDPA
DECODE_CAUSAL = True  # the step's L queries are the last L keys' positions (bottom-right); with L = 1 all keys
RESULTS_DECODE = Path(__file__).resolve().parent / "results" / "gpu_decode.json"
# Peak HBM bandwidth from the vendors' datasheets, bytes/s; the first name fragment found in the device name wins.
PEAK_BANDWIDTH = (
    ("H200", 4.8e12, "NVIDIA H200 datasheet, nvidia.com/en-us/data-center/h200 (4.8 TB/s)"),
    ("H100 PCIe", 2.0e12, "NVIDIA H100 datasheet, nvidia.com/en-us/data-center/h100 (PCIe: 2 TB/s)"),
    ("H100 NVL", 3.9e12, "NVIDIA H100 datasheet, nvidia.com/en-us/data-center/h100 (NVL: 3.9 TB/s)"),
    ("H100", 3.35e12, "NVIDIA H100 datasheet, nvidia.com/en-us/data-center/h100 (SXM: 3.35 TB/s)"),
    ("A100 80GB PCIe", 1.935e12, "NVIDIA A100 datasheet, nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf "
                                 "(80GB PCIe: 1,935 GB/s)"),
    ("A100-SXM4-80GB", 2.039e12, "NVIDIA A100 datasheet, nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf "
                                 "(80GB SXM: 2,039 GB/s)"),
    ("A100", 1.555e12, "NVIDIA A100 datasheet, nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (40GB: 1,555 GB/s)"),
    ("L40S", 0.864e12, "NVIDIA L40S datasheet (864 GB/s)"),
    ("L40", 0.864e12, "NVIDIA L40 datasheet (864 GB/s)"),
    ("A10", 0.6e12, "NVIDIA A10 datasheet (600 GB/s)"),
    ("L4", 0.3e12, "NVIDIA L4 datasheet (300 GB/s)"),
    ("T4", 0.32e12, "NVIDIA T4 datasheet (320 GB/s)"),
    ("V100", 0.9e12, "NVIDIA V100 datasheet (900 GB/s)"),
)


def decode_impls(splits=DECODE_SPLITS) -> list:
    """解码一步要计时的实现：两个不切分的基线，然后每个段数一行（split_1、split_2 …… split_auto）。"""
    return list(DECODE_BASE_IMPLS) + [f"split_{p}" for p in splits]


def cache_bytes(B: int, H_kv: int, S: int, D: int, Dv: int, element_bytes: int) -> int:
    """一步解码读的 KV 缓存字节数：B·H_kv·S·(D + Dv)·每个元素的字节数（每个键/值头只读一遍，GQA 不重复）。"""
    return B * H_kv * S * (D + Dv) * element_bytes


def kv_loads_bytes(impl: str, B: int, H: int, H_kv: int, S: int, D: int, Dv: int, element_bytes: int):
    """实现的 load 指令请求的 K、V 字节数：切分核函数每组一遍；第 8 章的核函数每个查询头一遍（G 倍，可能由 L2 供给）；SDPA 未知（None）。"""
    once = cache_bytes(B, H_kv, S, D, Dv, element_bytes)
    if impl.startswith("split_"):
        return once
    return once * (H // H_kv) if impl == "flash_fwd" else None


def peak_bandwidth(name: str, bus_width_bits: int | None = None, memory_clock_khz: int | None = None):
    """设备的峰值显存带宽（字节/秒）和出处：已知型号取厂商数据表；否则按 2 × 总线宽度 × 显存时钟算（同 torch.cuda._device_limits）。

    Returns:
        ``(bytes_per_s, source)``; ``(None, "unknown")`` when the name is unknown and the properties are missing.
    """
    import re

    for fragment, peak, source in PEAK_BANDWIDTH:  # a whole model name: "A10" is not "A100", "L4" not "L40S"
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(fragment)}(?![0-9])", name, flags=re.IGNORECASE):
            return peak, source
    if bus_width_bits and memory_clock_khz:
        return 2 * bus_width_bits / 8 * memory_clock_khz * 1e3, (
            f"2 x {bus_width_bits}-bit bus x {memory_clock_khz / 1e3:.0f} MHz memory clock "
            "(cudaDeviceProp, as torch.cuda._device_limits)")
    return None, "unknown"


def auto_splits(batch_heads: int, S: int, device="cuda") -> int:
    """attn_lib 自己选的段数：flash_decoding(num_splits=None) 在这台设备上的选择。

    That is ``attn_lib.flash.splits.choose_num_splits(batch_heads, S, workers=device_workers(device))``
    (workers: the SMs of a GPU, the threads of a CPU).
    """
    from attn_lib.flash import splits

    return int(splits.choose_num_splits(batch_heads, S, workers=splits.device_workers(device)))


def decode_fn(torch, impl: str, q, k, v, seqlens):
    """The callable to time for one decode step (no input checks): k, v of H_kv heads, read in place.

    One causal step (``DECODE_CAUSAL``: the L queries are the last L of the keys, bottom-right). ``split_P``:
    the unchecked launcher ``attn_lib.flash.triton.decode.launch`` with P splits; ``flash_fwd``: chapter 8's
    ``attn_lib.flash.triton.forward.launch`` with the band aligned bottom-right (offset S - L), reading every
    key (seqlens is S for every entry there); ``sdpa_gqa``: SDPA with ``enable_gqa=True``. The kernels run as
    this process's Triton mode says (under the interpreter on CPU tensors).
    """
    import torch.nn.functional as F

    from attn_lib.flash.triton.entry import load_kernels
    from attn_lib.rules.band import Band
    from attn_lib.rules.numerics import resolve_scale, work_dtype
    from attn_lib.rules.settings import AttentionSettings, DecodeSettings

    scale, work = resolve_scale(None, q.shape[-1]), work_dtype(q.dtype)
    L, S = q.shape[2], k.shape[2]
    if impl == "sdpa_gqa":  # L queries, bottom-right causal: with L = 1 every key is visible
        keep = None if L == 1 else torch.ones(L, S, dtype=torch.bool, device=q.device).tril(S - L)  # (L,S)
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)  # (B,H,L,D)
    if impl == "flash_fwd":
        fwd = load_kernels("forward")
        settings = AttentionSettings(band=Band.resolve(L, S, is_causal=DECODE_CAUSAL, offset=S - L), scale=scale,
                                     work_dtype=work, check_overflow=False, backend="triton")
        return lambda: fwd.launch(q, k, v, settings)[0]  # (B,H,L,Dv)
    dec = load_kernels("decode")
    settings = DecodeSettings(scale=scale, work_dtype=work, seqlens=seqlens.to(torch.int32), is_causal=DECODE_CAUSAL,
                              num_splits=int(impl.removeprefix("split_")), check_overflow=False, backend="triton")
    return lambda: dec.launch(q, k, v, settings)  # (B,H,L,Dv)


def bench_decode_case(torch, impl: str, dtype: str, S: int, peak, *, shape=DECODE_SHAPE, device="cuda",
                      timer=None) -> dict:
    """One decode step: do_bench median (L2 flushed), the cache read's GB/s and its share of the peak.

    ``shape`` is (B, H, H_kv, L, D); ``timer(fn) -> ms`` replaces do_bench (the CPU test of this suite).
    """
    B, H, H_kv, L, D = shape
    gen = torch.Generator(device=device).manual_seed(0)
    t = getattr(torch, dtype)
    q = torch.randn(B, H, L, D, device=device, dtype=t, generator=gen)  # (B,H,L,D)
    k, v = (torch.randn(B, H_kv, S, D, device=device, dtype=t, generator=gen) for _ in range(2))  # (B,H_kv,S,D)
    seqlens = torch.full((B,), S, dtype=torch.int32, device=device)  # (B,) every entry uses the whole cache
    splits = None
    if impl.startswith("split_"):
        splits = auto_splits(B * H_kv, S, device) if impl == "split_auto" else int(impl.removeprefix("split_"))
    base = {"suite": "decode", "impl": impl, "dtype": dtype, "S": S, "B": B, "H": H, "H_kv": H_kv, "L": L, "D": D,
            "splits": splits}
    fn = decode_fn(torch, impl if splits is None else f"split_{splits}", q, k, v, seqlens)
    if timer is None:
        from triton.testing import do_bench

        def timer(f):
            return do_bench(f, warmup=25, rep=100, return_mode="median")
    ms = timer(fn)
    nbytes = cache_bytes(B, H_kv, S, D, D, q.element_size())
    gbps = nbytes / (ms * 1e-3) / 1e9
    return {**base, "ms": ms, "cache_bytes": nbytes,
            "kv_loads_bytes": kv_loads_bytes(impl, B, H, H_kv, S, D, D, q.element_size()), "gb_per_s": gbps,
            "peak_fraction": None if peak is None else gbps * 1e9 / peak}


def plain_decode(torch, q, k, v, keep):
    """The plain formula in q's dtype (flash-attn's naive side): K, V repeated over the group, scores and softmax
    in that dtype. keep (B, 1, L, S) bool, every row with a visible key."""
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)  # (B,H_kv,S,D) -> (B,H,S,D)
    s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B,H,L,S)
    return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v  # (B,H,L,D)


def check_decode(torch, *, device="cuda", dims=(3, 8, 2, 1000, 128)) -> None:
    """Before timing: the split kernels agree with the float64 reference (flash-attn's rule), ragged lengths too."""
    import attn_lib
    from attn_lib.tolerances import assert_flash_rule

    gen = torch.Generator(device=device).manual_seed(0)
    B, H, H_kv, S, D = dims
    lens = [S, 3, S // 2 + 17][:B]  # every row sees a key
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    for dtype in (torch.float16, torch.bfloat16):
        for L in (1, 3):
            q = torch.randn(B, H, L, D, device=device, generator=gen).to(dtype)  # (B,H,L,D)
            k, v = (torch.randn(B, H_kv, S, D, device=device, generator=gen).to(dtype) for _ in range(2))
            keep = torch.zeros(B, 1, L, S, dtype=torch.bool, device=device)  # (B,1,L,S) the decode rule, by hand
            for b, n in enumerate(lens):
                keep[b, 0, :, :n] = torch.ones(L, n, dtype=torch.bool, device=device).tril(n - L)  # j <= n - L + i
            ref, _ = attn_lib.attention(q.double(), k.double(), v.double(), mask=keep, enable_gqa=True)
            naive = plain_decode(torch, q, k, v, keep)  # (B,H,L,D) in dtype
            for impl in ("split_1", "split_3", "split_8"):
                out = decode_fn(torch, impl, q, k, v, seqlens)()  # (B,H,L,D)
                assert_flash_rule(out, naive, ref, what=f"{impl} {dtype} L={L}")


def _decode_rank(impl: str) -> tuple:
    """Table order: the baselines, then the split counts ascending, 'auto' last."""
    if impl in DECODE_BASE_IMPLS:
        return (0, DECODE_BASE_IMPLS.index(impl))
    tail = impl.removeprefix("split_")
    return (1, int(tail)) if tail.isdigit() else (2, 0)


def format_decode_table(results: list) -> str:
    """解码一步排成表：时间、缓存读取的 GB/s、占峰值带宽的百分比、相对不切分（第 8 章核函数）的加速倍数。"""
    head = f"{'dtype':>8} {'S':>6} {'impl':>10} {'splits':>6} {'us':>9} {'GB/s':>8} {'% peak':>7} {'x no split':>10}"
    lines = [head, "-" * len(head)]
    ok = {(r["dtype"], r["S"], r["impl"]): r for r in results if "error" not in r}
    for r in sorted(results, key=lambda r: (r["dtype"], r["S"], _decode_rank(r["impl"]))):
        prefix = f"{r['dtype']:>8} {r['S']:>6} {r['impl']:>10} {str(r.get('splits') or '-'):>6}"
        if "error" in r:
            lines.append(f"{prefix} {r['error']:>9}")
            continue
        base = ok.get((r["dtype"], r["S"], "flash_fwd"))
        speedup = f"{base['ms'] / r['ms']:.2f}" if base else "-"
        share = "-" if r.get("peak_fraction") is None else f"{100 * r['peak_fraction']:.1f}"
        lines.append(f"{prefix} {1e3 * r['ms']:>9.1f} {r['gb_per_s']:>8.1f} {share:>7} {speedup:>10}")
    return "\n".join(lines)


def _run_decode(args, argv, torch) -> int:
    """The decode suite on the GPU: check, time, print, save."""
    check_decode(torch)
    info = machine(torch)
    props = torch.cuda.get_device_properties(0)
    peak, source = peak_bandwidth(info["gpu"], getattr(props, "memory_bus_width", None),
                                  getattr(props, "memory_clock_rate", None))
    B, H, H_kv, L, D = DECODE_SHAPE
    print(f"# {info['gpu']} (sm_{info['capability'].replace('.', '')}), CUDA {info['cuda']}, torch {info['torch']}, "
          f"triton {info['triton']}, {info['date']}")
    print(DECODE_CHECKS)
    print(f"# decode step B={B} H={H} H_kv={H_kv} L={L} D={D}, is_causal={DECODE_CAUSAL} (bottom-right); "
          f"GB/s = B*H_kv*S*2D*bytes / time; peak " + ("unknown" if peak is None else f"{peak / 1e12:.2f} TB/s")
          + f" ({source})")
    results = []
    for dtype in args.dtypes:
        for S in args.sizes:
            for impl in args.impls:
                r = bench_decode_case(torch, impl, dtype, S, peak)
                results.append(r)
                print(f"  {dtype} S={S} {impl}: " + (f"{r['gb_per_s']:.0f} GB/s" if "ms" in r else r["error"]),
                      flush=True)
    print(format_decode_table(results))
    out = args.out or (None if (args.quick or args.no_save) else RESULTS_DECODE)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"machine": info, "peak_bandwidth": {"bytes_per_s": peak, "source": source},
                   "config": {"time": "triton.testing.do_bench median, ms",
                              "bandwidth": "cache_bytes = B*H_kv*S*(D+Dv)*element bytes, GB/s = cache_bytes / time"},
                   "command": "python bench/gpu.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                   "results": results}
        out.write_text(json.dumps(payload, indent=1) + "\n")
        print(f"wrote {out}")
    return 0



def main(argv=None) -> int:
    args = parse_args(argv)
    if args.compile_only is not None:
        return compile_only(args.compile_only, args.head_dims, args.dtypes, decode_only=args.suite == "decode")
    import torch

    if not torch.cuda.is_available():
        print(NO_GPU_MESSAGE, file=sys.stderr)
        return 2
    from attn_lib import device
    from attn_lib.flash.triton.entry import load_kernels

    load_kernels("forward")  # fixes this process's Triton mode (compiled: the __main__ block pinned it)
    if device.triton_interprets():
        print("Triton was imported in interpreter mode before bench/gpu.py could pin compiled mode; "
              "run it as a script: python bench/gpu.py", file=sys.stderr)
        return 2
    if args.suite == "decode":
        return _run_decode(args, argv, torch)
    if args.suite:
        return _run_suite(args, argv, torch)
    return _run(args, argv, torch)


def _run(args, argv, torch) -> int:
    check_kernel(torch)
    info = machine(torch)
    print(f"# {info['gpu']} (sm_{info['capability'].replace('.', '')}), CUDA {info['cuda']}, torch {info['torch']}, "
          f"triton {info['triton']}, {info['date']}")
    print(CHECKS)
    results = []
    for mode in args.passes:
        for dtype in args.dtypes:
            for D in args.head_dims:
                for N in args.sizes:
                    for causal in (False, True):
                        for impl in args.impls:
                            r = bench_case(torch, impl, dtype, N, D, causal, args, mode)
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
