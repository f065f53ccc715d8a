"""Table headers are in Chinese: no English word in the header row of a printed or a markdown table.

What is a printed table (in a chapter's committed stdout): a block of at least three consecutive lines
(a header row and at least two body rows; a line of dashes may follow the header), each with at least
two cells, a cell being a run of text between runs of two or more spaces, in which some column is
numeric: in every body row a cell with a digit and no Chinese character ends (or, in every body row,
starts) at the same display column (a Chinese character is two columns wide, as text_table counts
them). The first line is then a header row if its cell at that column has no digit: it names the column.
(Listings such as 「apple   分到的比例 0.6」 have no such column and are not tables.) A markdown table's
header row is the line above its delimiter row.

What is an English word: a run of two or more Latin letters with a lower-case one in it, not part of a
code name (touching ``_``, ``.``, ``(``, a digit, a quote or a backtick, as ``max_position_embeddings``,
``torch.float32``, ``fp16``, ``exp2``), not quoted or a token in angle brackets (``<bos>``), and not one the book keeps in Latin letters: a unit (ms, GiB,
MiB, KiB), a function the tables compare by name (softmax, exp, sigmoid, log), FlashAttention and its
short form Flash. Symbols and acronyms in capitals (B, H, L, D, N, S, KV, FLOP, GPU, SDPA, MHA, TB/s)
have no lower-case letter and stay.
"""
from __future__ import annotations

import re

import pytest

from attn_lib.figures.text_table import display_width
from book_helpers import NOTEBOOKS, ROOT, read_notebook

HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
KEPT_IN_LATIN = {"ms", "GiB", "MiB", "KiB", "softmax", "Softmax", "exp", "sigmoid", "log", "FlashAttention", "Flash"}
WORD = re.compile(r"(?<![A-Za-z0-9_.'\"`])[A-Za-z][A-Za-z'-]*(?![A-Za-z0-9_(.'\"`])")
QUOTED = re.compile(r"(['\"`]).*?\1|<[^<>\s]+>")  # quoted code and tokens such as <bos>
DASHES = re.compile(r"\s*-{3,}\s*")
DELIMITER = re.compile(r"^\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
MARKDOWN_FILES = [p for p in (ROOT / "intro.md", ROOT / "glossary.md") if p.exists()]  # the book's own pages


def english_words(header: str) -> list[str]:
    """The English words of a header row (see the module's docstring)."""
    return [w for w in WORD.findall(QUOTED.sub(" ", header))
            if len(w) >= 2 and any(c.islower() for c in w) and w not in KEPT_IN_LATIN]


def _cells(line: str) -> list[tuple[int, int, str]]:
    """(first display column, column after the last, text) of each cell of a printed line."""
    return [(display_width(line[:m.start()]), display_width(line[:m.end()]), m.group(0))
            for m in re.finditer(r"\S+(?: \S+)*", line)]


def _numeric(cell: str) -> bool:
    return bool(re.search(r"\d", cell)) and not HAN.search(cell)


def _names_a_numeric_column(header, body) -> bool:
    for edge in (1, 0):  # right edges (right-aligned columns), then left edges
        for col in {c[edge] for c in body[0] if _numeric(c[2])}:
            if all(any(c[edge] == col and _numeric(c[2]) for c in row) for row in body):
                title = [c[2] for c in header if c[edge] == col]
                if title and not re.search(r"\d", title[0]):
                    return True
    return False


def printed_table_headers(text: str) -> list[str]:
    """The header rows of the tables in a printed text (see the module's docstring)."""
    lines, found, i = text.split("\n"), [], 0
    while i < len(lines):
        header, j = _cells(lines[i]), i + 1
        if j < len(lines) and DASHES.fullmatch(lines[j]):
            j += 1
        body = []
        while j < len(lines) and len(_cells(lines[j])) >= 2:
            body.append(_cells(lines[j]))
            j += 1
        if len(header) >= 2 and len(body) >= 2 and _names_a_numeric_column(header, body):
            found.append(lines[i].strip())
            i = j
        else:
            i += 1
    return found


def markdown_table_headers(text: str) -> list[str]:
    lines = text.split("\n")
    return [lines[k - 1] for k in range(1, len(lines)) if DELIMITER.match(lines[k]) and "|" in lines[k - 1]]


OLD_KV_TABLE = ("       model  tokens  stored  KV cache GiB  without sharing GiB\n" + "-" * 63 + "\n"
                "  Llama-2-7B    4096    4096          2.00                 2.00\n"
                "  Mistral-7B   32768    4096          0.50                 2.00\n")


@pytest.mark.parametrize("text, headers, words", [
    (OLD_KV_TABLE, ["model  tokens  stored  KV cache GiB  without sharing GiB"],
     ["model", "tokens", "stored", "cache", "without", "sharing"]),
    ("     L |   softmax        exp    sigmoid\n     4 |     4.709       34.0        9.2\n"
     "    16 |     4.219      114.1       33.2\n", ["L |   softmax        exp    sigmoid"], []),
    (" GPU   峰值 TFLOP/s   读完缓存 μs   flash_decoding ÷ SDPA ms   <bos>\n"
     "  T4         65.0          1.5                          2.0       1\n"
     "H100        989.5          0.1                          3.0       2\n",
     ["GPU   峰值 TFLOP/s   读完缓存 μs   flash_decoding ÷ SDPA ms   <bos>"], []),
    ("apple   分到的比例 0.6\nbanana  分到的比例 0.4\nchair   分到的比例 0\n", [], []),
    ("fruit   [1.0, 2.0, -1.0]\napple   [1.0, 1.0, 0.0]\nchair   [-0.5, -1.0, 2.0]\n", [], []),
])
def test_the_reader_finds_table_headers_and_english_words(text, headers, words):
    assert printed_table_headers(text) == headers
    assert [w for h in headers for w in english_words(h)] == words


def test_the_reader_finds_markdown_headers():
    text = "| 步骤 | Answer |\n|---|---|\n| 1 | 2 |\n"
    assert markdown_table_headers(text) == ["| 步骤 | Answer |"] and english_words("| 步骤 | Answer |") == ["Answer"]


def _stdout(cell) -> str:
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []) if o.get("name") == "stdout")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_printed_table_headers_are_chinese(path):
    cells = read_notebook(path).cells
    found = [f"[cell {i}] {h!r}: {english_words(h)}" for i, c in enumerate(cells) if c.cell_type == "code"
             for h in printed_table_headers(_stdout(c)) if english_words(h)]
    assert not found, f"{path.name}: English words in a printed table's header row:\n  " + "\n  ".join(found)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_markdown_table_headers_are_chinese(path):
    cells = read_notebook(path).cells
    found = [f"[cell {i}] {h!r}: {english_words(h)}" for i, c in enumerate(cells) if c.cell_type == "markdown"
             for h in markdown_table_headers(c.source) if english_words(h)]
    assert not found, f"{path.name}: English words in a markdown table's header row: {found}"


@pytest.mark.parametrize("path", MARKDOWN_FILES, ids=lambda p: p.name)
def test_markdown_file_table_headers_are_chinese(path):
    found = [h for h in markdown_table_headers(path.read_text(encoding="utf-8")) if english_words(h)]
    assert not found, f"{path.name}: English words in a markdown table's header row: {found}"
