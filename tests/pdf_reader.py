"""Reading the whole-book PDF back for the tests (tests/book/test_pdf.py, test_pdf_print.py): the file,
the report make_pdf.py writes beside it, its pages' text (pdftotext, poppler-utils), the book's parts.

A missing PDF fails with the command that makes it.
"""
from __future__ import annotations

import functools
import json
import re
import subprocess

import nbformat
import pytest
import yaml

from book_helpers import ROOT

PDF = ROOT / "_build" / "pdf" / "book.pdf"
SITE_PDF = ROOT / "_build" / "html" / "book.pdf"
REPORT = PDF.with_name("book-report.json")
ARTIFACTS = ROOT / "test-artifacts"


def toc_files() -> list[str]:
    """书的各部分（_toc.yml 的根和每一章），不带扩展名。"""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    return [toc["root"], *(c["file"] for c in toc["chapters"])]




def chapter_cells():
    """书里每一章 notebook 的每一格，按目录的顺序：产出 ``(章的文件名, 格)``。"""
    for name in toc_files():
        path = (ROOT / name).with_suffix(".ipynb")
        if path.is_file():
            for cell in nbformat.read(path, as_version=4).cells:
                yield path.stem, cell


def title(name: str) -> str:
    """一部分的标题（它的第一个一级标题）。"""
    path = ROOT / name
    if path.with_suffix(".ipynb").is_file():
        nb = nbformat.read(path.with_suffix(".ipynb"), as_version=4)
        text = next(c.source for c in nb.cells if c.cell_type == "markdown")
    else:
        text = path.with_suffix(".md").read_text(encoding="utf-8")
    return re.search(r"^# (.+)$", text, re.M).group(1).strip()


def han(text: str) -> str:
    """只留汉字：pdftotext 可能把一行里的拉丁字母串（KV、FlashAttention）挪了位置。"""
    return "".join(re.findall(r"[\u4e00-\u9fff]", text))


def han_digits(text: str) -> str:
    """只留汉字和数字。"""
    return re.sub(r"[^\u4e00-\u9fff0-9]", "", text)


def squash(text: str) -> str:
    """去掉所有空白。"""
    return re.sub(r"\s+", "", text)


@functools.lru_cache(maxsize=None)
def pages() -> tuple[str, ...]:
    """PDF 每一页的文字（pdftotext -layout）。"""
    if not PDF.is_file():
        pytest.fail(f"{PDF} is missing: run `make pdf` (`make book` and `make test` make it)")
    text = subprocess.run(["pdftotext", "-layout", str(PDF), "-"], capture_output=True, text=True, check=True).stdout
    return tuple(text.split("\f")[:-1] if text.endswith("\f") else text.split("\f"))


def page_count() -> int:
    """pdfinfo 报的页数。"""
    info = subprocess.run(["pdfinfo", str(PDF)], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"^Pages:\s+(\d+)", info, re.M).group(1))


def report() -> dict:
    """make_pdf.py 写在 PDF 旁边的报告（pdf_page.js 改了什么）；缺了或比 PDF 旧时测试失败。"""
    if not REPORT.is_file() or REPORT.stat().st_mtime < PDF.stat().st_mtime - 5:
        pytest.fail(f"{REPORT} is missing or older than the PDF: run `make pdf`")
    return json.loads(REPORT.read_text(encoding="utf-8"))
