"""Reproducible outputs: nbval passes three times in a row, with 1 thread and with 2.

The main `pytest` run (pyproject's addopts include --nbval) is the first nbval pass over
chapters/*.ipynb; the tests here run nbval twice more in fresh subprocesses, with torch,
OpenMP and MKL limited to 1 and then 2 threads (torch reads OMP_NUM_THREADS when it starts,
and the notebook kernels inherit the environment). They also check that running the
notebooks leaves the committed files untouched.

They take a few minutes, so they carry the `slow` marker: `make test` runs them, a quick
local run can skip them with `-m "not slow"`.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))


def _env(threads: int) -> dict:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    # A kernel must pick matplotlib's inline backend itself; an inherited MPLBACKEND=Agg (say,
    # from a CI shell) would swallow every figure and fail nbval.
    env.pop("MPLBACKEND", None)
    return env


def _digest(paths) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def test_torch_honours_the_thread_variables():
    """The variables this file sets do reach torch in a fresh process (and so in a kernel)."""
    for threads in (1, 2):
        r = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                           env=_env(threads), capture_output=True, text=True, timeout=120, check=True)
        assert r.stdout.strip() == str(threads)


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_nbval_passes_again_with_threads(threads):
    if not NOTEBOOKS:
        pytest.skip("no chapters/*.ipynb yet")
    before = _digest(NOTEBOOKS)
    # The same options as the main run (pyproject's addopts: --nbval --nbval-current-env
    # --nbval-sanitize-with tests/sanitize.cfg); no cache directory is written.
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           *[str(p.relative_to(ROOT)) for p in NOTEBOOKS]]
    r = subprocess.run(cmd, cwd=ROOT, env=_env(threads), capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"nbval with {threads} thread(s) failed:\n{r.stdout[-6000:]}\n{r.stderr[-2000:]}"
    assert "passed" in r.stdout
    assert _digest(NOTEBOOKS) == before, "running the notebooks changed the committed files"
