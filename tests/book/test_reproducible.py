"""Reproducible outputs: every chapter prints what is committed with 1 thread and with 2.

The main `pytest` run (pyproject's addopts include --nbval) is the first nbval pass over
chapters/*.ipynb, with torch's default thread count. Every chapter then runs once more with
1 thread and once more with 2, each skipped (with its reason) where another pass of the same
run already covers that count:
- 1 thread: the Colab-like simulation (tests/book/test_colab_sim.py) runs every chapter in
  kernels limited to 1 thread and compares every printed line with the committed one; where it
  is not part of the run, nbval runs here again with 1 thread;
- 2 threads: nbval runs here again with 2 threads, unless the main pass already ran with 2
  (as on a 2-core machine).
A rerun here is a fresh subprocess with torch, OpenMP and MKL limited to that count (torch
reads OMP_NUM_THREADS when it starts, and the notebook kernels inherit the environment); it
also checks that running the notebooks leaves the committed files untouched. A fast test
checks the library's own numbers (attention, tiled FlashAttention, multi-head, softmax) under
1 and 2 threads.

They take a few minutes, so they carry the `slow` marker: `make test` runs them, a quick
local run can skip them with `-m "not slow"`.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from book_helpers import COLAB_CHAPTERS, COLAB_KERNEL_THREADS, NOTEBOOKS, ROOT, digest


def _env(threads: int) -> dict:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    # A kernel must pick matplotlib's inline backend itself; an inherited MPLBACKEND=Agg (say,
    # from a CI shell) would swallow every figure and fail nbval.
    env.pop("MPLBACKEND", None)
    return env


# Every library path the chapters print from, on fixed seeds; the numbers printed the way the
# notebooks print them (rounded). Run in a fresh process per thread count.
_PROJECT_NUMBERS = r"""
import torch, attn_lib
gen = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(2, 3, 37, 16, generator=gen) for _ in range(3))  # (B,H,L,D)
out, scores = attn_lib.attention(q, k, v, is_causal=True)
tiled, lse = attn_lib.flash_attention_torch(q, k, v, is_causal=True, block_m=8, block_n=5)
layer = attn_lib.MultiHeadAttention(48, 3)
for p in layer.parameters():
    torch.nn.init.normal_(p, std=0.1, generator=gen)
x = torch.randn(2, 37, 48, generator=gen)  # (B,L,C)
mha, w = layer(x, need_weights=True)
print(torch.get_num_threads())
for t in (out, scores, tiled, lse, mha, w, attn_lib.softmax(q)):
    print([round(float(a), 4) for a in t.flatten()[::97]])
"""


def test_project_numbers_do_not_depend_on_the_thread_count():
    """The library's outputs, rounded as the notebooks print them, are the same with 1 and 2 threads
    (and the thread variables this file sets do reach torch in a fresh process, as in a kernel)."""
    runs = {}
    for threads in (1, 2):
        r = subprocess.run([sys.executable, "-c", _PROJECT_NUMBERS], env=_env(threads), capture_output=True,
                           text=True, timeout=300, check=True)
        first, *numbers = r.stdout.splitlines()
        assert first == str(threads), f"torch runs {first} threads, the environment asked for {threads}"
        assert len(numbers) == 7 and all(len(line) > 10 for line in numbers)
        runs[threads] = numbers
    assert runs[1] == runs[2], "printed numbers differ between 1 and 2 threads"


def _main_pass_threads() -> int:
    """How many threads torch takes in a kernel of the main nbval pass (the environment as it is)."""
    env = dict(os.environ)
    env.pop("MPLBACKEND", None)
    r = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                       capture_output=True, text=True, timeout=300, check=True)
    return int(r.stdout.strip())


def _colab_pass_in_this_run(session) -> bool:
    """Whether this run executes every chapter in the Colab-like simulation (its kernels: 1 thread)."""
    ran = {item.callspec.params["chapter"].name for item in session.items
           if getattr(item, "originalname", None) == "test_chapter_runs_in_the_fresh_environment"}
    return COLAB_KERNEL_THREADS["OMP_NUM_THREADS"] == "1" and ran == {p.name for p in NOTEBOOKS} == \
        {p.name for p in COLAB_CHAPTERS}


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_nbval_passes_again_with_threads(threads, request):
    if not NOTEBOOKS:
        pytest.skip("no chapters/*.ipynb yet")
    if threads == _main_pass_threads():
        pytest.skip(f"the main nbval pass of this run already executed every chapter with {threads} threads")
    if threads == 1 and _colab_pass_in_this_run(request.session):
        pytest.skip("the Colab-like simulation of this run executes every chapter with 1 thread and compares "
                    "every printed line (tests/book/test_colab_sim.py)")
    before = digest(NOTEBOOKS)
    # The same options as the main run (pyproject's addopts: --nbval --nbval-current-env
    # --nbval-sanitize-with tests/sanitize.cfg); no cache directory is written.
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           *[str(p.relative_to(ROOT)) for p in NOTEBOOKS]]
    r = subprocess.run(cmd, cwd=ROOT, env=_env(threads), capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"nbval with {threads} thread(s) failed:\n{r.stdout[-6000:]}\n{r.stderr[-2000:]}"
    assert "passed" in r.stdout
    assert digest(NOTEBOOKS) == before, "running the notebooks changed the committed files"
