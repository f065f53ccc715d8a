"""The whole-book PDF as a printed book (``make pdf`` -> _build/pdf/book.pdf), read with poppler-utils.

Every 参考答案 printed open (each answer's text is in the PDF); the hidden checker code printed and
the set-up cells left out (no fold-out bar: neither label of ``_config.yml`` printed); no page ending in an empty code box (pages
rendered by pdftoppm and scanned for a tall flat grey stretch); no blank page; no figure split
across two pages (pdfimages); short printed tables on one page; no row of a printed table
wrapped and nothing wider than the column (the report make_pdf.py writes beside the PDF); no TeX
escape such as BLOCK\\_M printed. A missing PDF fails with the command that makes it.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np

import pdf_reader as pdf
from book_helpers import SETUP_CELL

EMPTY_BOX_PT = 100  # an empty stretch of code box this tall ends a page: its code went to the next
SCAN_DPI = 30


def _answers() -> list[tuple[str, str]]:
    """(chapter, the longest run of Han characters) of every 参考答案 dropdown in the chapters."""
    found = []
    for chapter, cell in pdf.chapter_cells():
        if cell.cell_type != "markdown":
            continue
        for m in re.finditer(r"^(:{3,})\{dropdown\}\s*参考答案\s*$(.*?)^\1\s*$", cell.source, flags=re.S | re.M):
            body = re.sub(r"\$\$.*?\$\$|\$[^$]*\$|`[^`]*`|\[[^\]]*\]\([^)]*\)", " ", m.group(2), flags=re.S)
            runs = re.findall(r"[\u4e00-\u9fff]+", body)
            if runs:
                found.append((chapter, max(runs, key=len)))
    return found


def test_every_answer_is_printed_open():
    answers = _answers()
    assert len(answers) >= 45, f"only {len(answers)} 参考答案 found in the chapters"
    text = pdf.han("".join(pdf.pages()))
    missing = [f"{chapter}: {run}" for chapter, run in answers if run not in text]
    assert not missing, f"{len(missing)} of {len(answers)} answers are not in the PDF:\n" + "\n".join(missing[:10])
    assert text.count("参考答案") >= len(answers)


def _hidden_cells() -> tuple[list[str], str]:
    """The first line of every code cell tagged hide-input or hide-output, and the set-up cell's first line."""
    setup = SETUP_CELL.lstrip().split("\n", 1)[0]
    lines = []
    for _, cell in pdf.chapter_cells():
        tags = set(cell.get("metadata", {}).get("tags", []))
        first = cell.source.strip().split("\n", 1)[0] if cell.source.strip() else ""
        if cell.cell_type == "code" and tags & {"hide-input", "hide-output"} and first and first != setup:
            lines.append(first)
    return lines, setup


def _fold_labels() -> list[str]:
    """The fold-out bar's two labels, as ``_config.yml`` sets them (nb_code_prompt_show / _hide)."""
    config = (Path(__file__).resolve().parents[2] / "_config.yml").read_text(encoding="utf-8")
    labels = re.findall(r"^\s*nb_code_prompt_(?:show|hide):\s*(\S+)\s*$", config, flags=re.M)
    assert len(labels) == 2, labels
    return labels


def test_hidden_code_is_printed_and_the_set_up_cells_left_out():
    text = "".join(pdf.pages())
    assert not [label for label in _fold_labels() if label in text], "a fold-out bar printed"
    hidden, setup = _hidden_cells()
    assert len(hidden) >= 40, hidden[:3]
    flat = pdf.squash(text)
    missing = [line for line in hidden if pdf.squash(line) not in flat]
    assert not missing, f"hidden code not printed: {missing[:10]}"
    assert pdf.han(setup) not in pdf.han(text), "the set-up cell is printed"


def _empty_box_runs(pgm: Path) -> float:
    """The tallest stretch (pt) of rows that are one flat light grey across the middle of a page."""
    from PIL import Image

    a = np.asarray(Image.open(pgm), dtype=np.int16)
    mid = a[:, int(a.shape[1] * 0.2):int(a.shape[1] * 0.8)]
    lo, hi = mid.min(axis=1), mid.max(axis=1)
    flat = (hi - lo <= 2) & (lo >= 225) & (hi <= 251)  # a code box's background, no ink, not white paper
    best = run = 0
    for row in flat:
        run = run + 1 if row else 0
        best = max(best, run)
    return best * 72 / SCAN_DPI


def test_no_page_ends_in_an_empty_code_box(tmp_path):
    subprocess.run(["pdftoppm", "-gray", "-r", str(SCAN_DPI), str(pdf.PDF), str(tmp_path / "p")], check=True, timeout=300)
    scans = sorted(tmp_path.glob("p-*.pgm"))
    assert len(scans) == pdf.page_count()
    empty = {int(f.stem.split("-")[1]): round(_empty_box_runs(f)) for f in scans}
    bad = {page: pt for page, pt in empty.items() if pt >= EMPTY_BOX_PT}
    assert not bad, f"pages with an empty code box of {EMPTY_BOX_PT} pt or more (page: pt): {bad}"


def test_the_empty_box_scan_sees_a_box(tmp_path):
    """The scan itself: a drawn page with a 150 pt empty grey box is caught, a white page is not."""
    from PIL import Image

    page = np.full((int(11.69 * SCAN_DPI), int(8.27 * SCAN_DPI)), 255, dtype=np.uint8)
    white = tmp_path / "white.pgm"
    Image.fromarray(page).save(white)
    rows = int(150 * SCAN_DPI / 72)
    page[100:100 + rows, 20:-20] = 247
    boxed = tmp_path / "boxed.pgm"
    Image.fromarray(page).save(boxed)
    assert _empty_box_runs(white) == 0 and _empty_box_runs(boxed) >= 140


def test_no_figure_is_split_across_pages():
    listing = subprocess.run(["pdfimages", "-list", str(pdf.PDF)], capture_output=True, text=True, check=True).stdout
    pages_of: dict[str, set[int]] = {}
    for ln in listing.splitlines()[2:]:
        cols = ln.split()
        if len(cols) > 10 and cols[2] == "image":
            pages_of.setdefault(cols[10], set()).add(int(cols[0]))  # object number -> pages it is drawn on
    assert len(pages_of) > 20
    split = {obj: sorted(p) for obj, p in pages_of.items() if len(p) > 1}
    assert not split, f"images drawn on more than one page (object: pages): {split}"


def test_nothing_is_wider_than_the_column():
    """One element wider than the A4 column and Chromium shrinks every page to fit it (236 pages became 149)."""
    assert pdf.report()["print"]["overflowPx"] == 0


def test_no_printed_table_row_wraps():
    changed = pdf.report()["print"]
    assert changed["pre"] > 300 and changed["details"] >= 45, changed
    assert not changed["tableRowsWrapped"], (
        "rows of printed tables too wide for the column even at the smallest code size (shorten the "
        "table's columns in the chapter):\n" + "\n".join(changed["tableRowsWrapped"]))


def test_no_tex_escape_is_printed():
    text = "".join(pdf.pages())
    escapes = sorted(set(re.findall(r".{0,20}[A-Za-z]\\_[A-Za-z].{0,10}", text)))
    assert not escapes, f"TeX escapes printed literally: {escapes}"


def test_no_page_is_blank():
    """A page with nothing but its footer (the last box of a chapter spilling over, an empty marker)."""
    blank = [i + 1 for i, page in enumerate(pdf.pages())
             if not [ln for ln in page.splitlines() if ln.strip() and not re.fullmatch(r"\s*\d+ / \d+\s*", ln)]]
    assert not blank, f"pages with nothing but the page number: {blank}"


_COLUMNS = re.compile(r"\S {2,}\S")




def _short_printed_tables() -> list[tuple[str, str, str]]:
    """(chapter, first line, last line) of each printed output of 3 to 20 lines that is a table."""
    found = []
    for chapter, cell in pdf.chapter_cells():
        text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if 3 <= len(lines) <= 20 and sum(bool(_COLUMNS.search(ln)) for ln in lines) >= 3:
            found.append((chapter, lines[0], lines[-1]))
    return found


def test_short_printed_tables_stay_on_one_page():
    """A printed table no taller than the keep limit is not split: its first and last line share a page."""
    pages = [pdf.han_digits(p) for p in pdf.pages()]
    checked, split = 0, []
    for chapter, first, last in _short_printed_tables():
        a, b = pdf.han_digits(first), pdf.han_digits(last)
        on_a = [i + 1 for i, p in enumerate(pages) if len(a) >= 6 and a in p]
        on_b = [i + 1 for i, p in enumerate(pages) if len(b) >= 6 and b in p]
        if len(on_a) == 1 and len(on_b) == 1:  # both found, each on one page only
            checked += 1
            if on_a != on_b:
                split.append(f"{chapter}: {first.strip()[:40]!r} on p. {on_a[0]}, {last.strip()[:40]!r} on p. {on_b[0]}")
    assert checked >= 10, f"only {checked} short printed tables could be located in the PDF"
    assert not split, "printed tables split across pages:\n" + "\n".join(split)
