"""Every markdown table of the repository (README.md, DEVELOPERS.md, tests/README.md, intro.md, glossary.md
and the chapters' markdown cells) has as many cells in each row as in its header. Cells are counted as
GitHub and markdown-it count them: every | that is not escaped as \\| ends a cell, also inside a code span,
so an unescaped | in a formula or a code span silently cuts the row short and drops the rest of it."""
from __future__ import annotations

import re

import pytest

from book_helpers import NOTEBOOKS, ROOT, read_notebook

FILES = [ROOT / name for name in ("README.md", "DEVELOPERS.md", "tests/README.md", "intro.md", "glossary.md")]
DELIMITER = re.compile(r"^\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")


def cell_count(row: str) -> int:
    cells = re.split(r"(?<!\\)\|", row.strip())
    return len(cells) - (row.strip().startswith("|")) - (row.strip().endswith("|") and not row.strip().endswith("\\|"))


def ragged_rows(text: str) -> list[str]:
    lines, bad, fenced = text.splitlines(), [], False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced or i == 0 or not DELIMITER.match(line) or "|" not in lines[i - 1]:
            continue
        header = cell_count(lines[i - 1])
        for row in lines[i + 1:]:
            if "|" not in row or not row.strip():
                break
            if cell_count(row) != header:
                bad.append(f"{cell_count(row)} cells, header {header}: {row[:90]}")
    return bad


def test_the_counter_counts_as_gfm_does():
    assert cell_count("| a | b |") == 2
    assert cell_count("| `x \\| y` | b |") == 2
    assert cell_count("| `x | y` | b |") == 3  # a code span does not protect a pipe
    assert ragged_rows("| a | b |\n|---|---|\n| 1 | 2 |\n| 1 | 2 | 3 |\n") == ["3 cells, header 2: | 1 | 2 | 3 |"]


@pytest.mark.parametrize("path", [p for p in FILES if p.exists()], ids=lambda p: str(p.relative_to(ROOT)))
def test_markdown_file_tables_are_rectangular(path):
    assert ragged_rows(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_chapter_tables_are_rectangular(path):
    cells = [c for c in read_notebook(path)["cells"] if c["cell_type"] == "markdown"]
    assert [row for c in cells for row in ragged_rows("".join(c["source"]))] == []
