"""Execute notebooks top to bottom in place, the way nbval will re-run them.

Usage: python scripts/run_notebooks.py chapters/01_dictionary.ipynb [...]

Runs each notebook with the current environment's python3 kernel, from the notebook's own
folder, then checks what nbval and the before-stop hook check: no stderr output, execution
counts 1..n in order. Consecutive prints of one stream are stored as one output (how the kernel
flushed them varies from run to run; nbval compares them joined, and the site shows them as one
box), so that re-running a notebook does not change its file where its text did not change.
Commit the notebooks afterwards: nbval compares against these outputs.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_poll import use_sliced_polling  # noqa: E402

use_sliced_polling()

KERNEL_METADATA = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def merge_streams(outputs: list) -> list:
    """把相邻、同名（stdout 或 stderr）的文字输出合成一个。"""
    merged: list = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if (prev is not None and out.get("output_type") == "stream" and prev.get("output_type") == "stream"
                and out.get("name") == prev.get("name")):
            prev["text"] = prev["text"] + out["text"]
        else:
            merged.append(out)
    return merged


def run(path: Path, timeout: int = 600) -> float:
    nb = nbformat.read(path, as_version=4)
    nb.metadata["kernelspec"] = KERNEL_METADATA
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - t0
    # No saved widget state (nbclient's store_widget_state=False breaks on Output widgets):
    # the site renders no widgets and shows the static figure beside each one instead.
    nb.metadata.pop("widgets", None)
    problems = []
    expected = 1
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        cell.metadata.pop("execution", None)
        if cell.execution_count != expected:
            problems.append(f"cell {i}: execution_count {cell.execution_count}, expected {expected}")
        expected += 1
        cell.outputs = merge_streams(cell.get("outputs", []))
        for out in cell.get("outputs", []):
            if out.get("name") == "stderr":
                problems.append(f"cell {i}: stderr output: {out.get('text', '')[:200]!r}")
    nbformat.write(nb, path)
    if problems:
        raise SystemExit(f"{path}:\n  " + "\n  ".join(problems))
    return elapsed


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    for name in argv:
        elapsed = run(Path(name))
        print(f"{name}: executed in {elapsed:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
