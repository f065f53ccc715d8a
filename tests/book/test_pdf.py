"""The whole book as one PDF (``make pdf`` -> _build/pdf/book.pdf), read back with poppler-utils.

Checks: a page count in the expected range; a title page, a table of contents that names every
chapter with the page it starts on (and that page does open with the chapter's title); every
chapter's title and one of its printed outputs in the text; as many images as the chapters
have figures; formulas typeset (no TeX source left, no escape such as BLOCK\\_M printed);
every font embedded as a real font (TrueType / Type 1 / CID, never Type 3), Han characters
extractable; a page number in every page's footer. As a printed book: every 参考答案 printed
open (each answer's text is in the PDF), the hidden checker code printed and the set-up cells
left out (no 「展开被隐藏的代码」 bar), no page ending in an empty code box (pages rendered by
pdftoppm and scanned for a tall empty box), no figure split across two pages (pdfimages), no
row of a printed table wrapped (the report make_pdf.py writes beside the PDF). One page is
rendered to PNG (pdftoppm) and must not be blank; it is kept in test-artifacts/ for a person
to look at. A missing PDF fails with the command that makes it.
"""
from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PDF = ROOT / "_build" / "pdf" / "book.pdf"
SITE_PDF = ROOT / "_build" / "html" / "book.pdf"
REPORT = PDF.with_name("book-report.json")
EMPTY_BOX_PT = 100  # an empty stretch of code box this tall ends a page: its code went to the next
SCAN_DPI = 30
ARTIFACTS = ROOT / "test-artifacts"
IGNORE_TAGS = {"nbval-ignore-output", "nbval-skip"}


def _toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    return [toc["root"], *(c["file"] for c in toc["chapters"])]


def _title(name: str) -> str:
    path = ROOT / name
    if path.with_suffix(".ipynb").is_file():
        nb = nbformat.read(path.with_suffix(".ipynb"), as_version=4)
        text = next(c.source for c in nb.cells if c.cell_type == "markdown")
    else:
        text = path.with_suffix(".md").read_text(encoding="utf-8")
    return re.search(r"^# (.+)$", text, re.M).group(1).strip()


def _han(text: str) -> str:
    """Han characters only: pdftotext may move a Latin run (KV, FlashAttention) within a line."""
    return "".join(re.findall(r"[\u4e00-\u9fff]", text))


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


@functools.lru_cache(maxsize=None)
def _pages() -> tuple[str, ...]:
    if not PDF.is_file():
        pytest.fail(f"{PDF} is missing: run `make pdf` (`make test` makes it before the tests)")
    text = subprocess.run(["pdftotext", "-layout", str(PDF), "-"], capture_output=True, text=True, check=True).stdout
    return tuple(text.split("\f")[:-1] if text.endswith("\f") else text.split("\f"))


def _page_count() -> int:
    info = subprocess.run(["pdfinfo", str(PDF)], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"^Pages:\s+(\d+)", info, re.M).group(1))


def test_poppler_is_installed():
    missing = [t for t in ("pdftotext", "pdffonts", "pdfinfo", "pdftoppm", "pdfimages") if shutil.which(t) is None]
    assert not missing, f"missing {missing}: bash scripts/install-system-deps.sh (Debian: apt-get install poppler-utils)"


def test_page_count():
    n = _page_count()
    assert len(_pages()) == n
    # ~190 A4 pages today; a PDF with a chapter missing or its outputs dropped would be far shorter
    assert 120 <= n <= 400, f"the PDF has {n} pages"


def test_every_chapter_title_is_in_the_text():
    text = _han("".join(_pages()))
    missing = [_title(f) for f in _toc_files() if _han(_title(f)) not in text]
    assert not missing, f"chapter titles missing from the PDF's text: {missing}"


def test_table_of_contents_gives_the_page_each_chapter_starts_on():
    pages = _pages()
    assert _han(pages[0]).startswith(_han(yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["title"]))
    toc = pages[1]
    assert _squash(toc).startswith("目录"), toc[:200]
    # Entries as Han characters and digits only (pdftotext may move a Latin run), each ending in
    # its page number at the end of a line; an entry may run over two lines where full-width
    # punctuation leaves a wide gap (「02 点积：」 / 「「有多像」怎么算 17」).
    entries, pending = {}, ""
    for line in toc.rstrip().splitlines()[1:-1]:  # after 目录, before the footer's "2 / 240"
        pending += re.sub(r"[^\u4e00-\u9fff0-9]", "", line)
        m = re.fullmatch(r"(.*?\D)(\d+)", pending)
        if m:
            entries[m.group(1)] = int(m.group(2))
            pending = ""
    for name in _toc_files():
        title = _title(name)
        number = entries.get(re.sub(r"[^\u4e00-\u9fff0-9]", "", title))
        assert number is not None, f"{title!r} is not in the table of contents with a page number: {entries}"
        assert _han(pages[number - 1]).startswith(_han(title)), f"{title!r}: page {number} does not open with it"


def _first_checked_output(nb) -> str | None:
    for cell in nb.cells:
        if cell.cell_type != "code" or IGNORE_TAGS & set(cell.metadata.get("tags", [])):
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stdout":
                line = next((ln for ln in out["text"].splitlines() if len(_squash(ln)) >= 8), None)
                if line:
                    return line
    return None


def test_every_chapter_has_its_outputs():
    text = _squash("".join(_pages()))
    chapters = [f for f in _toc_files() if (ROOT / f).with_suffix(".ipynb").is_file()]
    assert len(chapters) >= 9
    missing = []
    for name in chapters:
        line = _first_checked_output(nbformat.read((ROOT / name).with_suffix(".ipynb"), as_version=4))
        assert line, f"{name} prints nothing?"
        if _squash(line) not in text:
            missing.append(f"{name}: {line!r}")
    assert not missing, "printed outputs missing from the PDF:\n" + "\n".join(missing)


def test_every_figure_is_in_the_pdf():
    figures = 0
    for name in _toc_files():
        path = (ROOT / name).with_suffix(".ipynb")
        if path.is_file():
            nb = nbformat.read(path, as_version=4)
            figures += sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                           if "image/png" in o.get("data", {}))
    listing = subprocess.run(["pdfimages", "-list", str(PDF)], capture_output=True, text=True, check=True).stdout
    images = [ln for ln in listing.splitlines()[2:] if ln.split() and ln.split()[2] == "image"]
    assert figures > 20 and len(images) >= figures, f"{len(images)} images in the PDF for {figures} figures"


def _tex_commands(text: str) -> set[str]:
    return set(re.findall(r"\\[a-zA-Z]+", text))


def test_math_is_typeset():
    """TeX commands of the prose's formulas (those no code cell also uses) are not in the text."""
    in_prose, in_code = set(), set()
    for name in _toc_files():
        path = (ROOT / name).with_suffix(".ipynb")
        if not path.is_file():
            continue
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "markdown":
                in_prose |= _tex_commands(" ".join(re.findall(r"\$[^$]+\$", cell.source)))
            else:
                in_code |= _tex_commands(cell.source + str(cell.get("outputs", "")))
    prose_only = in_prose - in_code
    assert len(prose_only) >= 5, prose_only
    text = "".join(_pages())
    left = sorted(c for c in prose_only if c in text)
    assert not left, f"TeX source left in the PDF (MathJax did not run?): {left}"
    assert "√" in text  # a typeset square root (chapter 04)


def test_fonts_are_embedded():
    listing = subprocess.run(["pdffonts", str(PDF)], capture_output=True, text=True, check=True).stdout
    rows = [ln for ln in listing.splitlines()[2:] if ln.strip()]
    assert len(rows) >= 2
    # columns: name, type, encoding, emb, sub, uni, object ID (the name may be "[none]" for Type 3)
    not_embedded = [ln for ln in rows if ln.split()[-5] != "yes"]
    assert not not_embedded, "fonts not embedded:\n" + "\n".join(not_embedded)
    assert all(ln.split()[-3] == "yes" for ln in rows), "a font without a Unicode map: text would not copy out"
    han = _han("".join(_pages()))
    assert len(han) > 50_000, f"only {len(han)} Han characters extractable"


def test_fonts_are_real_fonts_not_type_3():
    """Chromium embeds CFF fonts (Noto CJK, MathJax's) as Type 3; make_pdf.py gives it TrueType copies."""
    listing = subprocess.run(["pdffonts", str(PDF)], capture_output=True, text=True, check=True).stdout
    rows = [ln for ln in listing.splitlines()[2:] if ln.strip()]
    type3 = [ln for ln in rows if " Type 3 " in ln]
    assert not type3, f"{len(type3)} Type 3 fonts, e.g.\n" + "\n".join(type3[:5])
    names = " ".join(ln.split()[0] for ln in rows)
    assert "NotoSansCJKsc" in names and "NotoSansMonoCJKsc" in names and "MathJax_Main" in names, names


def test_every_page_has_its_number():
    pages = _pages()
    n = len(pages)
    unnumbered = [i + 1 for i, p in enumerate(pages) if f"{i + 1}/{n}" not in _squash(p)]
    assert not unnumbered, f"pages without a page number in the footer: {unnumbered[:20]}"


def test_a_rendered_page_is_not_blank():
    """pdftoppm renders the first page of chapter 04 (text, a formula, a figure follow)."""
    pages = _pages()
    title = _han(_title("chapters/04_scaling"))
    number = next(i + 1 for i, p in enumerate(pages) if i > 1 and _han(p).startswith(title))
    ARTIFACTS.mkdir(exist_ok=True)
    prefix = ARTIFACTS / "pdf-page"
    subprocess.run(["pdftoppm", "-f", str(number), "-l", str(number), "-r", "80", "-png", "-singlefile",
                    str(PDF), str(prefix)], check=True, timeout=120)
    png = prefix.with_suffix(".png")
    from matplotlib import image

    pixels = image.imread(png)  # (H, W, 3), floats in [0, 1]
    dark = (pixels[..., :3].mean(axis=-1) < 0.5).mean()
    assert pixels.shape[0] > pixels.shape[1] > 500  # an A4 page, portrait
    assert 0.01 < dark < 0.5, f"{png}: {dark:.1%} dark pixels, a blank or black page?"


def test_the_site_links_the_pdf():
    site = ROOT / "_build" / "html"
    if not (site / "intro.html").is_file():
        pytest.fail("the site is missing: make book")
    assert SITE_PDF.is_file() and SITE_PDF.read_bytes() == PDF.read_bytes(), (
        "_build/html/book.pdf is missing or stale: `make pdf` copies it there after `make book`")
    for page in ("intro.html", "chapters/04_scaling.html", "glossary.html"):
        html = (site / page).read_text(encoding="utf-8")
        want = "book.pdf" if "/" not in page else "../book.pdf"
        assert f'href="{want}"' in html, f"{page} does not link {want}"


# --- As a printed book ---------------------------------------------------------------------------

def _answers() -> list[tuple[str, str]]:
    """(chapter, the longest run of Han characters) of every 参考答案 dropdown in the chapters."""
    found = []
    for name in _toc_files():
        path = (ROOT / name).with_suffix(".ipynb")
        if not path.is_file():
            continue
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "markdown":
                continue
            for m in re.finditer(r"^(:{3,})\{dropdown\}\s*参考答案\s*$(.*?)^\1\s*$", cell.source, flags=re.S | re.M):
                body = re.sub(r"\$\$.*?\$\$|\$[^$]*\$|`[^`]*`|\[[^\]]*\]\([^)]*\)", " ", m.group(2), flags=re.S)
                runs = re.findall(r"[\u4e00-\u9fff]+", body)
                if runs:
                    found.append((path.stem, max(runs, key=len)))
    return found


def test_every_answer_is_printed_open():
    answers = _answers()
    assert len(answers) >= 45, f"only {len(answers)} 参考答案 found in the chapters"
    text = _han("".join(_pages()))
    missing = [f"{chapter}: {run}" for chapter, run in answers if run not in text]
    assert not missing, f"{len(missing)} of {len(answers)} answers are not in the PDF:\n" + "\n".join(missing[:10])
    assert text.count("参考答案") >= len(answers)


def _hidden_cells() -> tuple[list[str], str]:
    """The first line of every code cell tagged hide-input or hide-output, and the set-up cell's first line."""
    setup = (ROOT / "scripts" / "setup_cell.py").read_text(encoding="utf-8").lstrip().split("\n", 1)[0]
    lines = []
    for name in _toc_files():
        path = (ROOT / name).with_suffix(".ipynb")
        if path.is_file():
            for cell in nbformat.read(path, as_version=4).cells:
                tags = set(cell.get("metadata", {}).get("tags", []))
                first = cell.source.strip().split("\n", 1)[0] if cell.source.strip() else ""
                if cell.cell_type == "code" and tags & {"hide-input", "hide-output"} and first and first != setup:
                    lines.append(first)
    return lines, setup


def test_hidden_code_is_printed_and_the_set_up_cells_left_out():
    text = "".join(_pages())
    assert "展开被隐藏的代码" not in text and "收起代码" not in text, "a fold-out bar printed"
    hidden, setup = _hidden_cells()
    assert len(hidden) >= 40, hidden[:3]
    flat = _squash(text)
    missing = [line for line in hidden if _squash(line) not in flat]
    assert not missing, f"hidden code not printed: {missing[:10]}"
    assert _han(setup) not in _han(text), "the set-up cell is printed"


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
    subprocess.run(["pdftoppm", "-gray", "-r", str(SCAN_DPI), str(PDF), str(tmp_path / "p")], check=True, timeout=300)
    scans = sorted(tmp_path.glob("p-*.pgm"))
    assert len(scans) == _page_count()
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
    listing = subprocess.run(["pdfimages", "-list", str(PDF)], capture_output=True, text=True, check=True).stdout
    pages_of: dict[str, set[int]] = {}
    for ln in listing.splitlines()[2:]:
        cols = ln.split()
        if len(cols) > 10 and cols[2] == "image":
            pages_of.setdefault(cols[10], set()).add(int(cols[0]))  # object number -> pages it is drawn on
    assert len(pages_of) > 20
    split = {obj: sorted(p) for obj, p in pages_of.items() if len(p) > 1}
    assert not split, f"images drawn on more than one page (object: pages): {split}"


def _report() -> dict:
    if not REPORT.is_file() or REPORT.stat().st_mtime < PDF.stat().st_mtime - 5:
        pytest.fail(f"{REPORT} is missing or older than the PDF: run `make pdf`")
    return json.loads(REPORT.read_text(encoding="utf-8"))


def test_nothing_is_wider_than_the_column():
    """One element wider than the A4 column and Chromium shrinks every page to fit it (236 pages became 149)."""
    assert _report()["print"]["overflowPx"] == 0


def test_no_printed_table_row_wraps():
    changed = _report()["print"]
    assert changed["pre"] > 300 and changed["details"] >= 45, changed
    assert not changed["tableRowsWrapped"], (
        "rows of printed tables too wide for the column even at the smallest code size (shorten the "
        "table's columns in the chapter):\n" + "\n".join(changed["tableRowsWrapped"]))


def test_no_tex_escape_is_printed():
    text = "".join(_pages())
    escapes = sorted(set(re.findall(r".{0,20}[A-Za-z]\\_[A-Za-z].{0,10}", text)))
    assert not escapes, f"TeX escapes printed literally: {escapes}"


def test_no_page_is_blank():
    """A page with nothing but its footer (the last box of a chapter spilling over, an empty marker)."""
    blank = [i + 1 for i, page in enumerate(_pages())
             if not [ln for ln in page.splitlines() if ln.strip() and not re.fullmatch(r"\s*\d+ / \d+\s*", ln)]]
    assert not blank, f"pages with nothing but the page number: {blank}"


_COLUMNS = re.compile(r"\S {2,}\S")


def _han_digits(text: str) -> str:
    return re.sub(r"[^\u4e00-\u9fff0-9]", "", text)


def _short_printed_tables() -> list[tuple[str, str, str]]:
    """(chapter, first line, last line) of each printed output of 3 to 20 lines that is a table."""
    found = []
    for name in _toc_files():
        path = (ROOT / name).with_suffix(".ipynb")
        if not path.is_file():
            continue
        for cell in nbformat.read(path, as_version=4).cells:
            text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
            lines = [ln for ln in text.splitlines() if ln.strip()]
            if 3 <= len(lines) <= 20 and sum(bool(_COLUMNS.search(ln)) for ln in lines) >= 3:
                found.append((path.stem, lines[0], lines[-1]))
    return found


def test_short_printed_tables_stay_on_one_page():
    """A printed table no taller than the keep limit is not split: its first and last line share a page."""
    pages = [_han_digits(p) for p in _pages()]
    checked, split = 0, []
    for chapter, first, last in _short_printed_tables():
        a, b = _han_digits(first), _han_digits(last)
        on_a = [i + 1 for i, p in enumerate(pages) if len(a) >= 6 and a in p]
        on_b = [i + 1 for i, p in enumerate(pages) if len(b) >= 6 and b in p]
        if len(on_a) == 1 and len(on_b) == 1:  # both found, each on one page only
            checked += 1
            if on_a != on_b:
                split.append(f"{chapter}: {first.strip()[:40]!r} on p. {on_a[0]}, {last.strip()[:40]!r} on p. {on_b[0]}")
    assert checked >= 10, f"only {checked} short printed tables could be located in the PDF"
    assert not split, "printed tables split across pages:\n" + "\n".join(split)
