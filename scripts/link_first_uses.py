"""Link each glossary term's first use in a chapter: wrap it in {term}`…` (tests/book/test_glossary_first_use.py).

For every chapter, the first prose use of each glossary term that is not yet a {term} role (the same
reading of the markdown as the test: headings, code, math, links and other roles are not prose; a use
inside a longer term belongs to the longer term) becomes ``{term}`name```. Only markdown cells change,
so the chapter needs no re-execution. Read the diff: the script links the first use, which is not
always where the term is explained.

Usage: python scripts/link_first_uses.py [notebooks...]   (default: chapters/*.ipynb)
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "book"))
from test_glossary_first_use import (NOT_PROSE, NOT_PROSE_INLINE, ROLE,  # noqa: E402
                                     glossary_terms, unlinked_first_uses)

LINK_TEXT = re.compile(r"!?\[[^\]\n]*\]\([^)\n]*\)")


def _masked(source: str, terms: list[str], term: str) -> list[bool]:
    """True where a character is not prose, or belongs to a longer term than ``term``."""
    mask = [False] * len(source)
    for rx in (NOT_PROSE, ROLE, NOT_PROSE_INLINE, LINK_TEXT):
        for m in rx.finditer(source):
            mask[m.start():m.end()] = [True] * (m.end() - m.start())
    for longer in (t for t in terms if len(t) > len(term) and term in t):
        for m in re.finditer(re.escape(longer), source):
            mask[m.start():m.end()] = [True] * (m.end() - m.start())
    return mask


def link_first(source: str, terms: list[str], term: str) -> str | None:
    """``source`` with the first prose use of ``term`` wrapped in a role, or None if it has none."""
    mask = _masked(source, terms, term)
    for m in re.finditer(re.escape(term), source):
        if not any(mask[m.start():m.end()]):
            return source[:m.start()] + "{term}`" + term + "`" + source[m.end():]
    return None


def fix(path: Path, terms: list[str]) -> list[str]:
    """Link the notebook's unlinked first uses in place; the ones it could not place."""
    nb = nbformat.read(path, as_version=4)
    left = []
    for item in unlinked_first_uses([c.source if c.cell_type == "markdown" else "" for c in nb.cells], terms):
        term, cell = re.fullmatch(r"(.*) \(cell (\d+)\)", item).groups()
        new = link_first(nb.cells[int(cell)].source, terms, term)
        if new is None:
            left.append(item)
        else:
            nb.cells[int(cell)].source = new
    nbformat.write(nb, path)
    return left


def main(argv: list[str]) -> None:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return
    terms = [t for t in glossary_terms() if len(t) > 1]
    for name in argv or sorted(str(p) for p in (ROOT / "chapters").glob("*.ipynb")):
        left = fix(Path(name), terms)
        print(f"{name}: {'could not place ' + ', '.join(left) if left else 'first uses linked'}")


if __name__ == "__main__":
    main(sys.argv[1:])
