"""A chapter links its first use of a glossary term: glossary.md says 「各章第一次出现某个术语时会链接到这里」.

Read from the notebooks' markdown and from intro.md (no site needed; tests/book/test_links.py checks on the built site
that each chapter links the glossary at all). A use is the term's name in prose: headings, code
(fenced and inline), math, links (text and target: a link's text already links somewhere) and other roles are
not prose. A use inside a longer term
(「掩码」 in 「因果掩码」) is a use of the longer one. A ``{term}`shown <name>``` role is a link to
``name``. One-character names (「值」「键」「类」「批」「秩」) are left out: they occur inside ordinary
words (「数值」「一批」), so a machine cannot tell a use from a coincidence.
"""
from __future__ import annotations

import re

import pytest

from book_helpers import NOTEBOOKS, ROOT, read_notebook

ROLE = re.compile(r"\{term\}`([^`]*)`")
NOT_PROSE = re.compile(r"```.*?```|~~~.*?~~~|\$\$.*?\$\$|^[ \t]*#[^\n]*$", re.S | re.M)  # fences, display math, headings
NOT_PROSE_INLINE = re.compile(r"\{(?!term\})[\w-]+\}`[^`]*`|`[^`]*`|\$[^$\n]*\$|!?\[[^\]\n]*\]\([^)\n]*\)|\]\([^)]*\)")


def glossary_terms() -> list[str]:
    """The names the glossary defines (the unindented lines of its {glossary} block)."""
    text = (ROOT / "glossary.md").read_text(encoding="utf-8")
    block = text.split(":::{glossary}", 1)[1].split("\n:::", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip() and not line.startswith(" ")]


def _target(body: str) -> str:
    m = re.fullmatch(r"(.*?)\s*<([^>]+)>", body)
    return m.group(2).strip() if m else body.strip()


def _plain_uses(text: str, terms: list[str]) -> set[str]:
    """The terms used in a piece of prose (a use inside a longer term counts for the longer one)."""
    text = NOT_PROSE_INLINE.sub(" ", text)
    found = set()
    for term in sorted(terms, key=len, reverse=True):
        if term in text:
            found.add(term)
            text = text.replace(term, "\0")
    return found


def unlinked_first_uses(sources: list[str], terms: list[str]) -> list[str]:
    """'term (cell N)' for each term whose first use in these markdown sources (one per cell, in
    order; a code cell gives "") is not a {term} role."""
    seen, bad = set(), []
    for i, source in enumerate(sources):
        source = NOT_PROSE.sub(" ", source)
        pos = 0
        for m in [*ROLE.finditer(source), None]:
            plain = source[pos:m.start() if m else len(source)]
            for term in sorted(_plain_uses(plain, terms) - seen):
                bad.append(f"{term} (cell {i})")
                seen.add(term)
            if m:
                seen.add(_target(m.group(1)))
                pos = m.end()
    return bad


def test_the_rule_sees_what_it_should():
    terms = ["掩码", "因果掩码", "评分", "主走查"]
    assert unlinked_first_uses(["# 掩码\n\n{term}`因果掩码`把评分盖住", "评分"], terms) == ["评分 (cell 0)"]
    assert unlinked_first_uses(["{term}`评分 <评分>`和 `评分`、$评分$", "评分、{term}`掩码`"], terms) == []
    assert unlinked_first_uses(["{ref}`主走查 <walk>` 之后", "主走查"], terms) == ["主走查 (cell 1)"]
    assert unlinked_first_uses(["[第 08 章的 Triton](08.ipynb)", "Triton 核"], ["Triton"]) == ["Triton (cell 1)"]
    assert len(glossary_terms()) > 50 and "评分" in glossary_terms() and "KV 缓存" in glossary_terms()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_first_use_of_a_term_is_linked(path):
    terms = [t for t in glossary_terms() if len(t) > 1]
    nb = read_notebook(path)
    bad = unlinked_first_uses([c.source if c.cell_type == "markdown" else "" for c in nb.cells], terms)
    assert bad == [], f"{path.name}: first use not linked to the glossary (write {{term}}`…`): {bad}"


def test_first_use_of_a_term_in_the_introduction_is_linked():
    terms = [t for t in glossary_terms() if len(t) > 1]
    bad = unlinked_first_uses([(ROOT / "intro.md").read_text(encoding="utf-8")], terms)
    assert bad == [], f"intro.md: first use not linked to the glossary (write {{term}}`…`): {bad}"
