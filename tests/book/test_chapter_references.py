"""Every reference to a chapter agrees with _toc.yml: 「第 NN 章」 names a chapter that exists, a link
whose text is 「第 NN 章」 goes to chapter NN, 「前 N 章」 counts only chapters before this one,
「最后一章」 is the last chapter, 「上一章」 / 「下一章」 exist, 「全书 N 章」 is the book's count, and
「第 NN 章讲过」 (past) / 「第 NN 章会讲」 (future) point backwards / forwards from the chapter that says it.

Read: the intro, the glossary, every markdown cell, every code cell's source (comments and strings the
reader sees) and the committed text outputs of every chapter.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from book_helpers import ROOT, read_notebook

TOC = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
CHAPTERS = [e["file"] for e in TOC["chapters"] if e["file"].startswith("chapters/")]
LAST = len(CHAPTERS)
NUMERALS = {c: i for i, c in enumerate("零一二三四五六七八九十", start=0)}

NUMBER = r"(\d+|[一二三四五六七八九十]+)"
CHAPTER = re.compile(rf"第\s*{NUMBER}\s*章")
LINK = re.compile(r"\[([^\]]*第\s*\d+\s*章[^\]]*)\]\(([^)\s]+)\)")
FIRST_N = re.compile(rf"前\s*{NUMBER}\s*章")
COUNT = re.compile(rf"(?:全书|本书|一共|共)(?:有|的)?\s*{NUMBER}\s*章")
PAST = re.compile(rf"第\s*{NUMBER}\s*章(?:里|中)?(?:已经|讲过|算过|介绍过|见过|做过|说过|证明过|用过|量过|训练过)")
FUTURE = re.compile(rf"第\s*{NUMBER}\s*章(?:里|中)?(?:会|将|再来|再讲|才)")
LAST_CHAPTER = re.compile(r"最后一章")


def number(text: str) -> int:
    """「08」「8」「十」「十三」 as an int."""
    if text.isdigit():
        return int(text)
    if text == "十":
        return 10
    if text.startswith("十"):
        return 10 + NUMERALS[text[1]]
    if len(text) == 1:
        return NUMERALS[text]
    tens, _, ones = text.partition("十")
    return NUMERALS[tens] * 10 + (NUMERALS[ones] if ones else 0)


def _texts() -> list[tuple[str, int | None, str]]:
    """(where, chapter number or None, text) for every piece of text the reader sees."""
    out = [("intro.md", None, (ROOT / "intro.md").read_text(encoding="utf-8")),
           ("glossary.md", None, (ROOT / "glossary.md").read_text(encoding="utf-8"))]
    for k, stem in enumerate(CHAPTERS, start=1):
        nb = read_notebook(ROOT / f"{stem}.ipynb")
        for i, cell in enumerate(nb.cells):
            out.append((f"{Path(stem).name} cell {i}", k, cell.source))
            for o in cell.get("outputs", []):
                if o.get("output_type") == "stream":
                    out.append((f"{Path(stem).name} cell {i} output", k, o["text"]))
    return out


TEXTS = _texts()


def _context(text: str, m: re.Match) -> str:
    return text[max(0, m.start() - 20):m.end() + 20].replace("\n", " ")


def _problems(where: str, k: int | None, text: str) -> list[str]:
    bad = []
    for m in CHAPTER.finditer(text):
        if not 1 <= number(m.group(1)) <= LAST:
            bad.append(f"{where}: no chapter {m.group(1)} (the book has {LAST}): {_context(text, m)}")
    for m in LINK.finditer(text):
        n = number(CHAPTER.search(m.group(1)).group(1))
        target = Path(m.group(2).split("#")[0]).name
        if target and not target.startswith(f"{n:02d}_"):
            bad.append(f"{where}: the link 「{m.group(1)}」 goes to {m.group(2)}")
    for m in FIRST_N.finditer(text):
        most = LAST if k is None else k - 1
        if number(m.group(1)) > most:
            bad.append(f"{where}: 「{m.group(0)}」, but only {most} chapters come before: {_context(text, m)}")
    for m in COUNT.finditer(text):
        if number(m.group(1)) != LAST:
            bad.append(f"{where}: 「{m.group(0)}」, but the book has {LAST} chapters: {_context(text, m)}")
    for m in LAST_CHAPTER.finditer(text):
        near = text[max(0, m.start() - 30):m.end() + 30]
        if k != LAST and not re.search(rf"第\s*{LAST}\s*章|{LAST}_", near):
            bad.append(f"{where}: 「最后一章」 is chapter {LAST}: {_context(text, m)}")
    if k == LAST and "下一章" in text:
        bad.append(f"{where}: 「下一章」 in the last chapter")
    if k == 1 and "上一章" in text:
        bad.append(f"{where}: 「上一章」 in the first chapter")
    if k is not None:
        bad += [f"{where}: 「{m.group(0)}」 (past) from chapter {k}: {_context(text, m)}"
                for m in PAST.finditer(text) if number(m.group(1)) >= k]
        bad += [f"{where}: 「{m.group(0)}」 (future) from chapter {k}: {_context(text, m)}"
                for m in FUTURE.finditer(text) if number(m.group(1)) <= k]
    return bad


def test_there_is_text_to_check():
    assert LAST == 13 and len(TEXTS) > 500
    assert sum(len(CHAPTER.findall(t)) for _, _, t in TEXTS) > 100


@pytest.mark.parametrize("where, k, text, expected", [
    ("x", 5, "见第 14 章", 1), ("x", 5, "[第 08 章](07_multi_head.ipynb)", 1), ("x", 5, "[第 07 章](07_multi_head.ipynb#a)", 0),
    ("x", 11, "前十章讲完了", 0), ("x", 11, "前 11 章", 1), ("x", 11, "这最后一章", 1), ("x", 13, "这最后一章", 0),
    ("intro.md", None, "最后一章（第 13 章）", 0), ("x", 13, "下一章", 1), ("x", 1, "上一章", 1),
    ("x", 5, "全书十二章", 1), ("x", 5, "第 08 章讲过", 1), ("x", 9, "第 08 章讲过", 0), ("x", 9, "第 08 章会讲", 1),
    ("x", 5, "第十章会讲", 0),
])
def test_the_rules_catch_what_they_should(where, k, text, expected):
    assert len(_problems(where, k, text)) == expected, _problems(where, k, text)


def test_chapter_references_agree_with_the_toc():
    bad = [p for where, k, text in TEXTS for p in _problems(where, k, text)]
    assert bad == [], "\n".join(bad)
