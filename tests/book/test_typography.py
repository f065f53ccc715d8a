"""Chinese typography: no half-width , : ; ? ! ( ) next to a Chinese character in prose.

Checked: every Markdown file of the book and every markdown cell (outside code spans, code
blocks, math, URLs and MyST syntax); the Chinese string literals of notebook code cells and of
attn_lib/ and scripts/ (f-string fields and escapes excluded); and the Chinese lines that the
notebooks print (their committed stream outputs). scripts/fix_punctuation.py fixes all of it;
run it, re-execute the notebooks whose code it changed, and this test passes.
"""
from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from book_helpers import NOTEBOOKS, ROOT, read_notebook

_spec = importlib.util.spec_from_file_location("fix_punctuation", ROOT / "scripts" / "fix_punctuation.py")
fp = importlib.util.module_from_spec(_spec)
sys.modules["fix_punctuation"] = fp
_spec.loader.exec_module(fp)

HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
# A half-width mark with a Chinese character right before or right after it.
BAD = re.compile(rf"[{HAN}][,:;?!()]|[,:;?!()][{HAN}]")

MARKDOWN_FILES = [p for p in [ROOT / "intro.md", ROOT / "glossary.md", ROOT / "README.md",
                              *sorted((ROOT / "chapters").glob("*.md"))] if p.exists()]
PY_FILES = sorted((ROOT / "attn_lib").rglob("*.py")) + sorted((ROOT / "scripts").glob("*.py"))


def _violations(text: str) -> list[str]:
    out = []
    for m in BAD.finditer(text):
        a, b = max(0, m.start() - 12), m.end() + 12
        out.append(text[a:b].replace("\n", " "))
    return out


def _report(where: str, found: list[str]) -> str:
    return f"{where}: half-width punctuation next to Chinese (run scripts/fix_punctuation.py):\n  " + \
        "\n  ".join(found[:20])


def test_there_is_something_to_check():
    assert MARKDOWN_FILES and NOTEBOOKS and PY_FILES


@pytest.mark.parametrize("path", MARKDOWN_FILES, ids=lambda p: p.name)
def test_markdown_files(path):
    found = _violations(fp.prose_of_markdown(path.read_text(encoding="utf-8")))
    assert not found, _report(path.name, found)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_markdown_cells(path):
    nb = read_notebook(path)
    cells = [c for c in nb.cells if c.cell_type == "markdown"]
    assert cells, f"{path.name} has no markdown cell"
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            found += [f"[cell {i}] {v}" for v in _violations(fp.prose_of_markdown(cell.source))]
    assert not found, _report(path.name, found)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_code_strings(path):
    nb = read_notebook(path)
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            for lit in fp.chinese_python_literals(cell.source):
                found += [f"[cell {i}] {v}" for v in _violations(lit)]
    assert not found, _report(path.name, found)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_printed_chinese(path):
    """What a notebook prints in Chinese follows the same rule (outputs are committed)."""
    nb = read_notebook(path)
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if out.get("output_type") == "stream" and out.get("name") == "stdout":
                for line in out.get("text", "").splitlines():
                    found += [f"[cell {i}] {v}" for v in _violations(line)]
    assert not found, _report(path.name, found)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_figure_alt_text(path):
    """Every figure's alt text (cell metadata mystnb.image.alt) follows the same rule."""
    nb = read_notebook(path)
    found = []
    for i, cell in enumerate(nb.cells):
        alt = cell.get("metadata", {}).get("mystnb", {}).get("image", {}).get("alt")
        if alt is not None:
            found += [f"[cell {i}] {v}" for v in _violations(alt)]
    assert not found, _report(path.name, found)


@pytest.mark.parametrize("path", PY_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_chinese_strings(path):
    found = []
    for lit in fp.chinese_python_literals(path.read_text(encoding="utf-8")):
        found += _violations(lit)
    assert not found, _report(str(path.relative_to(ROOT)), found)


# ---------------------------------------------------------------------------- the fixer itself

@pytest.mark.parametrize("before, after", [
    ("桌上有一杯水和一本书,它被打翻了。请问被打翻的是什么?", "桌上有一杯水和一本书，它被打翻了。请问被打翻的是什么？"),
    ("比例(实测)都不小于 0;见下文:", "比例（实测）都不小于 0；见下文："),
    ("长度L为4096时", "长度 L 为 4096 时"),
    ("统一为 (B, H, L, D),与 PyTorch 相同", "统一为 (B, H, L, D)，与 PyTorch 相同"),
    ("用 `f(x, y)` 算,再看 $a(b):c$ 和 {term}`点积`:它", "用 `f(x, y)` 算，再看 $a(b):c$ 和 {term}`点积`：它"),
    ("见 [第 01 章](chapters/01_dictionary.ipynb),或 https://a.b/c?d=1,e", "见 [第 01 章](chapters/01_dictionary.ipynb)，或 https://a.b/c?d=1,e"),
    ("- (可选) 再跑一遍", "- （可选）再跑一遍"),
    ("```python\nprint(\"你好,世界\")  # 注释,不动\n```\n", "```python\nprint(\"你好,世界\")  # 注释,不动\n```\n"),
    (":::{dropdown} 参考答案\n:open:\n先算点积,再除以 √d。\n:::\n", ":::{dropdown} 参考答案\n:open:\n先算点积，再除以 √d。\n:::\n"),
    ("softmax(x) 的第一行:", "softmax(x) 的第一行："),
])
def test_fix_markdown_examples(before, after):
    assert fp.fix_markdown(before) == after
    assert fp.fix_markdown(after) == after  # idempotent


def test_fix_python_touches_only_chinese_literals():
    src = 'x = "a,b"  # 注释,不动\nprint(f"比例:{p:.3f},和 {s}")\nt = "第 {i} 个\\n好,的"\n'
    assert fp.fix_python(src) == 'x = "a,b"  # 注释,不动\nprint(f"比例：{p:.3f}，和 {s}")\nt = "第 {i} 个\\n好，的"\n'
    assert fp.fix_python(fp.fix_python(src)) == fp.fix_python(src)


def test_fixer_leaves_the_book_unchanged():
    """The committed book is already fixed: a run of the fixer changes nothing."""
    assert fp.main(["--check"]) == 0
