"""One name per term for the two kinds of numbers of attention: 「评分」 before Softmax (q·k, q·k/√d, with
a mask added) and 「注意力分数」 after it (the proportions, plainly 「比例」). A bare 「分数」 would read as
either, so it appears only inside 「注意力分数」 (「部分数据」 is not the word).

Read: the intro, the glossary, the README, every cell's source, committed text output and figure alt
text / caption (cell metadata) of every chapter, and the .py files of attn_lib, bench and scripts (strings, comments and docstrings alike:
the library's messages and figure labels reach the reader).
"""
from __future__ import annotations

import re

import pytest

from book_helpers import NOTEBOOKS, ROOT, read_notebook

BARE = re.compile(r"(?<!注意力)(?<!部)分数")


def _bare(text: str) -> list[str]:
    return [text[max(0, m.start() - 12):m.end() + 12].replace("\n", " ") for m in BARE.finditer(text)]


def _notebook_text(path) -> str:
    nb = read_notebook(path)
    parts = [c.source for c in nb.cells]
    parts += [o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    parts += [_figure_text(c.get("metadata", {})) for c in nb.cells]
    return "\n".join(parts)


def _figure_text(metadata) -> str:
    """A cell's figure alt text and caption (metadata mystnb.image / mystnb.figure): the site shows them."""
    mystnb = metadata.get("mystnb", {})
    return "\n".join(str(v) for key in ("image", "figure") for v in mystnb.get(key, {}).values())


FILES = [ROOT / "intro.md", ROOT / "glossary.md", ROOT / "README.md",
         *sorted((ROOT / "attn_lib").rglob("*.py")), *sorted((ROOT / "bench").glob("*.py")),
         *sorted((ROOT / "scripts").glob("*.py"))]


def test_the_rule_sees_what_it_should():
    assert _bare("一行分数") and _bare("分数矩阵") and not _bare("注意力分数") and not _bare("那部分数据")
    assert _bare(_figure_text({"mystnb": {"image": {"alt": "柱状图：每个键的分数"}}}))
    assert len(FILES) > 50 and NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_bare_score_word_in_the_chapters(path):
    found = _bare(_notebook_text(path))
    assert found == [], f"{path.name}: bare 「分数」 (write 评分 before Softmax, 注意力分数 after):\n  " + "\n  ".join(found)


def test_no_bare_score_word_elsewhere():
    found = [f"{p.relative_to(ROOT)}: {hit}" for p in FILES for hit in _bare(p.read_text(encoding="utf-8"))]
    assert found == [], "bare 「分数」 (write 评分 before Softmax, 注意力分数 after):\n  " + "\n  ".join(found)
