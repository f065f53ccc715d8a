"""Every committed notebook looks like it was just run top to bottom in a clean kernel.

nbval (the main `pytest` run) re-executes the notebooks and compares outputs; these checks
catch what nbval does not: stderr or error outputs, cells run out of order or not at all
(counts must be exactly 1..n in cell order), a stream split into several outputs, the kernel, and printed floats with so many
digits that they may differ between machines, thread counts, or CPU and GPU. (The set-up
cell is checked in test_setup_cell.py.)
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from book_helpers import NOTEBOOKS, UNCHECKED_TAGS, read_notebook

# Raw float reprs (e.g. 0.28000000119209290 from float32 .item()) carry 10+ decimals; only
# cells tagged nbval-ignore-output / nbval-skip may print them. Testing markers are cell tags,
# never "# NBVAL_..." comments (the website would show those to the reader).
LONG_FLOAT = re.compile(r"\d\.\d{10,}")

params = pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])


def _code_cells(path: Path):
    nb = read_notebook(path)
    return nb, [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]


def _output_text(out) -> str:
    if out.get("output_type") == "stream":
        text = out.get("text", "")
    else:
        text = out.get("data", {}).get("text/plain", "")
    return "".join(text) if isinstance(text, list) else text


@params
def test_no_nbval_comments(path):
    """nbval's markers are cell tags: a "# NBVAL_..." comment would be shown on the website."""
    _, cells = _code_cells(path)
    bad = [i for i, c in cells if "NBVAL" in c.source]
    assert not bad, f"{path.name}: cells {bad} carry an NBVAL comment; tag them nbval-ignore-output instead"


@params
def test_execution_counts_are_1_to_n_in_order(path):
    """Every code cell ran, once, in order, in one fresh kernel (no empty code cells either:
    the executor skips them and would leave a gap)."""
    _, cells = _code_cells(path)
    problems = []
    for n, (i, cell) in enumerate(cells, start=1):
        if not cell.source.strip():
            problems.append(f"cell {i}: empty code cell (delete it)")
        elif cell.execution_count != n:
            problems.append(f"cell {i}: execution_count {cell.execution_count}, expected {n}")
    assert not problems, f"{path.name} was not run top to bottom (scripts/run_notebooks.py):\n" + "\n".join(problems)


@params
def test_no_stderr_and_no_errors(path):
    _, cells = _code_cells(path)
    problems = []
    for i, cell in cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                problems.append(f"cell {i}: error output {out.get('ename')}: {out.get('evalue', '')[:200]}")
            elif out.get("name") == "stderr":
                problems.append(f"cell {i}: stderr output {_output_text(out)[:200]!r}")
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


@params
def test_consecutive_prints_are_one_output(path):
    """scripts/run_notebooks.py joins a stream's consecutive outputs: how the kernel flushed them
    varies between runs, so split outputs would change the file on every re-run."""
    _, cells = _code_cells(path)
    split = [f"cell {i}" for i, cell in cells for a, b in zip(cell.get("outputs", []), cell.get("outputs", [])[1:])
             if a.get("output_type") == b.get("output_type") == "stream" and a.get("name") == b.get("name")]
    assert not split, f"{path.name}: consecutive {split} (re-run it with scripts/run_notebooks.py)"


@params
def test_kernel_is_python3(path):
    nb, _ = _code_cells(path)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernelspec must be python3"


@params
def test_checked_outputs_print_rounded_numbers(path):
    """Outputs nbval compares must not contain unrounded floats (10+ decimals): their last
    digits depend on summation order, which depends on threads, BLAS and CPU vs GPU."""
    _, cells = _code_cells(path)
    problems = []
    for i, cell in cells:
        if UNCHECKED_TAGS & set(cell.metadata.get("tags", [])):
            continue
        for out in cell.get("outputs", []):
            for m in LONG_FLOAT.finditer(_output_text(out)):
                problems.append(f"cell {i}: {m.group(0)!r} — round it (e.g. f'{{x:.4f}}')")
    assert not problems, f"{path.name}:\n" + "\n".join(problems)
