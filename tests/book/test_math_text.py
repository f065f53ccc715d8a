"""Text inside formulas: no backslash escape in ``\\text{…}`` (MathJax 3 would print it literally).

MathJax 3, as the site loads it (_vendor/mathjax/tex-chtml.js, no ``textmacros`` extension),
typesets the argument of ``\\text``, ``\\textrm``, ``\\textbf``, ``\\textit``, ``\\textsf``,
``\\texttt``, ``\\mbox`` and ``\\hbox`` as plain characters: ``\\text{BLOCK\\_M}`` shows
「BLOCK\\_M」 with its backslash (LaTeX, for the PDF, shows 「BLOCK_M」). A name with an underscore is
written ``\\mathtt{BLOCK\\_M}`` instead, which both typeset alike. Checked: every Markdown file of
the book (intro.md, glossary.md, README.md) and every chapter's markdown cells, outside code spans
and code blocks; the argument is read up to its matching brace.
"""
from __future__ import annotations

import re

import pytest

from book_helpers import NOTEBOOKS, ROOT, read_notebook

TEXT_COMMANDS = re.compile(r"\\(?:text(?:rm|bf|it|sf|tt|normal)?|mbox|hbox)\s*\{")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+).*?\1")
MARKDOWN_FILES = [p for p in (ROOT / "intro.md", ROOT / "glossary.md", ROOT / "README.md") if p.exists()]


def _without_code(text: str) -> str:
    """Markdown text with fenced code blocks and code spans blanked out."""
    kept, fence = [], None
    for line in text.split("\n"):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is None:
            kept.append(CODE_SPAN.sub(" ", line))
            continue
        kept.append("")
    return "\n".join(kept)


def literal_escapes(text: str) -> list[str]:
    """Each ``\\text{…}`` (and its kin) whose argument holds a backslash, as written."""
    text, found = _without_code(text), []
    for m in TEXT_COMMANDS.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0) if text[i - 1] != "\\" else 0
            i += 1
        if "\\" in text[m.end():i - 1]:
            found.append(text[m.start():i])
    return found


@pytest.mark.parametrize("text, found", [
    (r"$(\lceil L/\text{BLOCK\_M}\rceil)$", [r"\text{BLOCK\_M}"]),
    (r"$\textrm{a\,b} + \mbox{x\%}$", [r"\textrm{a\,b}", r"\mbox{x\%}"]),
    (r"$\text{a {b\_c}}$", [r"\text{a {b\_c}}"]),
    (r"$\mathtt{BLOCK\_M}$、$\text{新}$、$\text{scale}\cdot x$", []),
    ("`\\text{a\\_b}` 是代码\n```latex\n\\text{a\\_b}\n```\n", []),
])
def test_the_reader_finds_literal_escapes(text, found):
    assert literal_escapes(text) == found


@pytest.mark.parametrize("path", MARKDOWN_FILES, ids=lambda p: p.name)
def test_markdown_files(path):
    found = literal_escapes(path.read_text(encoding="utf-8"))
    assert not found, f"{path.name}: MathJax prints these backslashes literally (use \\mathtt{{…}}): {found}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_markdown_cells(path):
    found = [f"[cell {i}] {t}" for i, c in enumerate(read_notebook(path).cells) if c.cell_type == "markdown"
             for t in literal_escapes(c.source)]
    assert not found, f"{path.name}: MathJax prints these backslashes literally (use \\mathtt{{…}}): {found}"
