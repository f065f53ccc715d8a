"""层与 softmax 的 CPU 基准:attn_lib.MultiHeadAttention 对 torch.nn.MultiheadAttention,attn_lib.softmax 对 torch.softmax。

    .venv/bin/python bench/layers.py               # the three shapes of issue 9, 2 threads, float32
    .venv/bin/python bench/layers.py --threads 1 --reps 20

Both layers run the same job: self-attention over x (B, L, C) with H heads, bias, no mask,
no dropout, ``need_weights=False``, in eval mode under ``torch.no_grad()`` (torch's layer
with ``batch_first=True``, so neither side transposes). Time: the median of ``--reps``
calls after warm-up, the two sides interleaved so that both see the same machine load.
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


def bench_mha(B: int, L: int, C: int, H: int, reps: int) -> tuple[float, float]:
    torch.manual_seed(0)
    ours = attn_lib.MultiHeadAttention(C, H).eval()
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


def bench_softmax(reps: int) -> tuple[float, float]:
    x = torch.randn(*SOFTMAX_SHAPE)  # (B,H,L,S)
    with torch.no_grad():
        return _median_pair(lambda: attn_lib.softmax(x, dim=-1), lambda: torch.softmax(x, dim=-1), reps)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, need_weights=False, median of {args.reps}")
    print()
    print("| B, L, C, H | attn_lib MHA (ms) | torch MHA (ms) | ratio |")
    print("|---|---|---|---|")
    for B, L, C, H in SHAPES:
        ours, theirs = bench_mha(B, L, C, H, args.reps)
        print(f"| {B}, {L}, {C}, {H} | {ours * 1e3:.2f} | {theirs * 1e3:.2f} | {ours / theirs:.2f} |")
    ours, theirs = bench_softmax(args.reps)
    print()
    print("| softmax shape | attn_lib.softmax (ms) | torch.softmax (ms) | ratio |")
    print("|---|---|---|---|")
    print(f"| {', '.join(map(str, SOFTMAX_SHAPE))} | {ours * 1e3:.2f} | {theirs * 1e3:.2f} | {ours / theirs:.2f} |")


if __name__ == "__main__":
    main()
