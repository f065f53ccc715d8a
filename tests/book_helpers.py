"""Shared helpers for the book tests (tests/book): where the repository and its notebooks are,
the set-up cell every notebook opens with, the tags that exempt a cell's output from checking,
and how a notebook is read.

The website helpers (the built site, the local server, Chromium) are in site_server.py.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]  # the repository root, whatever the working directory
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))  # the chapters, in reading order
SETUP_CELL = (ROOT / "scripts" / "setup_cell.py").read_text(encoding="utf-8")  # the one source of the set-up cell
UNCHECKED_TAGS = {"nbval-ignore-output", "nbval-skip"}  # cell tags whose outputs nbval does not compare
COLAB_CHAPTERS = NOTEBOOKS  # the chapters tests/book/test_colab_sim.py runs in its fresh environment
# The kernels of that simulation run torch, OpenMP and MKL with 1 thread: it is also the book's 1-thread
# pass (printed numbers identical with 1 and 2 threads; tests/book/test_reproducible.py runs nbval with
# 2 threads where the main pass did not already).
COLAB_KERNEL_THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """The notebook at ``path`` as nbformat version 4."""
    return nbformat.read(path, as_version=4)


def digest(paths) -> dict:
    """{file name: sha256} of files (to check that running the notebooks leaves them untouched)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
