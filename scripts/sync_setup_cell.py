"""Paste scripts/setup_cell.py into the first code cell of every chapter (or of the notebooks named).

    .venv/bin/python scripts/sync_setup_cell.py [chapters/NN_x.ipynb ...]

tests/book/test_setup_cell.py checks that every chapter starts with the cell verbatim; run this after
editing scripts/setup_cell.py, then re-execute the chapters (scripts/run_notebooks.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]


def sync(path: Path, cell_text: str) -> bool:
    """把 setup_cell.py 的内容放进 notebook 的第一个代码格；改了返回 True。"""
    nb = nbformat.read(path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    if first.source.rstrip("\n") == cell_text.rstrip("\n"):
        return False
    first.source = cell_text.rstrip("\n")
    nbformat.write(nb, path)
    return True


def main(argv: list[str]) -> int:
    cell_text = (ROOT / "scripts" / "setup_cell.py").read_text(encoding="utf-8")
    paths = [Path(a) for a in argv] or sorted((ROOT / "chapters").glob("*.ipynb"))
    for p in paths:
        if sync(p, cell_text):
            print(f"synced {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
