"""层与 softmax 的 CPU 基准：attn_lib.MultiHeadAttention 对 torch.nn.MultiheadAttention，attn_lib.softmax 对 torch.softmax。

    .venv/bin/python bench/layers.py               # three layer shapes (small, medium, GPT-2 small), 2 threads, float32
    .venv/bin/python bench/layers.py --threads 1 --reps 20
    .venv/bin/python bench/layers.py --quick       # a smoke run: tiny shapes, 3 reps
    .venv/bin/python bench/layers.py --check-finite  # our layer with its nan / inf scans on

Both layers run the same job: self-attention over x (B, L, C) with H heads, bias, no mask,
no dropout, ``need_weights=False``, in eval mode under ``torch.no_grad()`` (torch's layer
with ``batch_first=True``, so neither side transposes). Time: the median of ``--reps``
calls after warm-up, the two sides interleaved so that both see the same machine load.

Validation is timed alike on both sides: by default our layer runs with ``check_finite=False``
(argument checks only, no scan of the data and no host sync), as torch's layer, which checks
its arguments and never scans the data. ``--check-finite`` times our layer with its nan / inf
scan and overflow check instead; the first line printed says which.
Prints a Markdown table; the targets are ratio <= 1.3 for every row. Tests never assert
these numbers.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import attn_lib

SHAPES = ((8, 128, 256, 8), (4, 512, 512, 8), (1, 2048, 768, 12))  # (B, L, C, H)
SOFTMAX_SHAPE = (8, 8, 256, 256)
QUICK_SHAPES = ((2, 16, 32, 4),)
QUICK_SOFTMAX_SHAPE = (2, 2, 16, 16)


def _median_pair(f, g, reps: int) -> tuple[float, float]:
    for _ in range(3):
        f(), g()
    tf, tg = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        t1 = time.perf_counter()
        g()
        t2 = time.perf_counter()
        tf.append(t1 - t0)
        tg.append(t2 - t1)
    return statistics.median(tf), statistics.median(tg)


def bench_mha(B: int, L: int, C: int, H: int, reps: int, check_finite: bool = False) -> tuple[float, float]:
    torch.manual_seed(0)
    ours = attn_lib.MultiHeadAttention(C, H, check_finite=check_finite).eval()
    theirs = torch.nn.MultiheadAttention(C, H, batch_first=True).eval()
    with torch.no_grad():  # the same weights on both sides
        theirs.in_proj_weight.copy_(ours.qkv.weight)
        theirs.in_proj_bias.copy_(ours.qkv.bias)
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)
    x = torch.randn(B, L, C)  # (B,L,C)
    with torch.no_grad():
        a, b = ours(x), theirs(x, x, x, need_weights=False)[0]
        assert torch.allclose(a, b, atol=1e-4), float((a - b).abs().max())
        return _median_pair(lambda: ours(x), lambda: theirs(x, x, x, need_weights=False), reps)


def bench_softmax(reps: int, shape=SOFTMAX_SHAPE) -> tuple[float, float]:
    x = torch.randn(*shape)  # (B,H,L,S)
    with torch.no_grad():
        return _median_pair(lambda: attn_lib.softmax(x, dim=-1), lambda: torch.softmax(x, dim=-1), reps)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 3 reps: a smoke run")
    parser.add_argument("--check-finite", action="store_true", help="time our layer with its nan / inf scans")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    reps = 3 if args.quick else args.reps
    shapes, softmax_shape = (QUICK_SHAPES, QUICK_SOFTMAX_SHAPE) if args.quick else (SHAPES, SOFTMAX_SHAPE)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, need_weights=False, median of {reps}")
    if args.check_finite:
        print("validation: attn_lib with check_finite=True (argument checks + nan/inf scan + overflow check), "
              "torch with its argument checks only: NOT alike")
    else:
        print("validation: alike on both sides: argument checks only, no scan of the data "
              "(attn_lib with check_finite=False)")
    print()
    print("| B, L, C, H | attn_lib MHA (ms) | torch MHA (ms) | ratio |")
    print("|---|---|---|---|")
    for B, L, C, H in shapes:
        ours, theirs = bench_mha(B, L, C, H, reps, check_finite=args.check_finite)
        print(f"| {B}, {L}, {C}, {H} | {ours * 1e3:.2f} | {theirs * 1e3:.2f} | {ours / theirs:.2f} |")
    ours, theirs = bench_softmax(reps, softmax_shape)
    print()
    print("| softmax shape | attn_lib.softmax (ms) | torch.softmax (ms) | ratio |")
    print("|---|---|---|---|")
    print(f"| {', '.join(map(str, softmax_shape))} | {ours * 1e3:.2f} | {theirs * 1e3:.2f} | {ours / theirs:.2f} |")


if __name__ == "__main__":
    main()
