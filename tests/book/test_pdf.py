"""The whole book as one PDF (``make pdf`` -> _build/pdf/book.pdf), read back with poppler-utils.

Checks: a page count in the expected range; a title page, a table of contents that names every
chapter with the page it starts on (and that page does open with the chapter's title); every
chapter's title and one of its printed outputs in the text; as many images as the chapters
have figures; formulas typeset (no TeX source left); every font embedded as a real font
(TrueType / Type 1 / CID, never Type 3), Han characters extractable; a page number in every
page's footer; the site links the same PDF. One page is rendered to PNG (pdftoppm) and must not
be blank; it is kept in test-artifacts/ for a person to look at. The checks of the PDF as a
printed book (answers, hidden code, boxes, figures, tables) are in test_pdf_print.py; reading
the PDF is tests/pdf_reader.py. A missing PDF fails with the command that makes it.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import nbformat
import pytest
import yaml

import pdf_reader as pdf

IGNORE_TAGS = {"nbval-ignore-output", "nbval-skip"}


def test_poppler_is_installed():
    missing = [t for t in ("pdftotext", "pdffonts", "pdfinfo", "pdftoppm", "pdfimages") if shutil.which(t) is None]
    assert not missing, f"missing {missing}: bash scripts/install-system-deps.sh (Debian: apt-get install poppler-utils)"


def test_page_count():
    n = pdf.page_count()
    assert len(pdf.pages()) == n
    # ~190 A4 pages today; a PDF with a chapter missing or its outputs dropped would be far shorter
    assert 120 <= n <= 400, f"the PDF has {n} pages"


def test_every_chapter_title_is_in_the_text():
    text = pdf.han("".join(pdf.pages()))
    missing = [pdf.title(f) for f in pdf.toc_files() if pdf.han(pdf.title(f)) not in text]
    assert not missing, f"chapter titles missing from the PDF's text: {missing}"


def test_table_of_contents_gives_the_page_each_chapter_starts_on():
    pages = pdf.pages()
    assert pdf.han(pages[0]).startswith(pdf.han(yaml.safe_load((pdf.ROOT / "_config.yml").read_text(encoding="utf-8"))["title"]))
    toc = pages[1]
    assert pdf.squash(toc).startswith("目录"), toc[:200]
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
    for name in pdf.toc_files():
        title = pdf.title(name)
        number = entries.get(re.sub(r"[^\u4e00-\u9fff0-9]", "", title))
        assert number is not None, f"{title!r} is not in the table of contents with a page number: {entries}"
        assert pdf.han(pages[number - 1]).startswith(pdf.han(title)), f"{title!r}: page {number} does not open with it"


def _first_checked_output(nb) -> str | None:
    for cell in nb.cells:
        if cell.cell_type != "code" or IGNORE_TAGS & set(cell.metadata.get("tags", [])):
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stdout":
                line = next((ln for ln in out["text"].splitlines() if len(pdf.squash(ln)) >= 8), None)
                if line:
                    return line
    return None


def test_every_chapter_has_its_outputs():
    text = pdf.squash("".join(pdf.pages()))
    chapters = [f for f in pdf.toc_files() if (pdf.ROOT / f).with_suffix(".ipynb").is_file()]
    assert len(chapters) >= 9
    missing = []
    for name in chapters:
        line = _first_checked_output(nbformat.read((pdf.ROOT / name).with_suffix(".ipynb"), as_version=4))
        assert line, f"{name} prints nothing?"
        if pdf.squash(line) not in text:
            missing.append(f"{name}: {line!r}")
    assert not missing, "printed outputs missing from the PDF:\n" + "\n".join(missing)


def test_every_figure_is_in_the_pdf():
    figures = 0
    for name in pdf.toc_files():
        path = (pdf.ROOT / name).with_suffix(".ipynb")
        if path.is_file():
            nb = nbformat.read(path, as_version=4)
            figures += sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                           if "image/png" in o.get("data", {}))
    listing = subprocess.run(["pdfimages", "-list", str(pdf.PDF)], capture_output=True, text=True, check=True).stdout
    images = [ln for ln in listing.splitlines()[2:] if ln.split() and ln.split()[2] == "image"]
    assert figures > 20 and len(images) >= figures, f"{len(images)} images in the PDF for {figures} figures"


def _tex_commands(text: str) -> set[str]:
    return set(re.findall(r"\\[a-zA-Z]+", text))


def test_math_is_typeset():
    """TeX commands of the prose's formulas (those no code cell also uses) are not in the text."""
    in_prose, in_code = set(), set()
    for name in pdf.toc_files():
        path = (pdf.ROOT / name).with_suffix(".ipynb")
        if not path.is_file():
            continue
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "markdown":
                in_prose |= _tex_commands(" ".join(re.findall(r"\$[^$]+\$", cell.source)))
            else:
                in_code |= _tex_commands(cell.source + str(cell.get("outputs", "")))
    prose_only = in_prose - in_code
    assert len(prose_only) >= 5, prose_only
    text = "".join(pdf.pages())
    left = sorted(c for c in prose_only if c in text)
    assert not left, f"TeX source left in the PDF (MathJax did not run?): {left}"
    assert "√" in text  # a typeset square root (chapter 04)


def test_fonts_are_embedded():
    listing = subprocess.run(["pdffonts", str(pdf.PDF)], capture_output=True, text=True, check=True).stdout
    rows = [ln for ln in listing.splitlines()[2:] if ln.strip()]
    assert len(rows) >= 2
    # columns: name, type, encoding, emb, sub, uni, object ID (the name may be "[none]" for Type 3)
    not_embedded = [ln for ln in rows if ln.split()[-5] != "yes"]
    assert not not_embedded, "fonts not embedded:\n" + "\n".join(not_embedded)
    assert all(ln.split()[-3] == "yes" for ln in rows), "a font without a Unicode map: text would not copy out"
    han = pdf.han("".join(pdf.pages()))
    assert len(han) > 50_000, f"only {len(han)} Han characters extractable"


def test_fonts_are_real_fonts_not_type_3():
    """Chromium embeds CFF fonts (Noto CJK, MathJax's) as Type 3; make_pdf.py gives it TrueType copies."""
    listing = subprocess.run(["pdffonts", str(pdf.PDF)], capture_output=True, text=True, check=True).stdout
    rows = [ln for ln in listing.splitlines()[2:] if ln.strip()]
    type3 = [ln for ln in rows if " Type 3 " in ln]
    assert not type3, f"{len(type3)} Type 3 fonts, e.g.\n" + "\n".join(type3[:5])
    names = " ".join(ln.split()[0] for ln in rows)
    assert "NotoSansCJKsc" in names and "NotoSansMonoCJKsc" in names and "MathJax_Main" in names, names


def test_every_page_has_its_number():
    pages = pdf.pages()
    n = len(pages)
    unnumbered = [i + 1 for i, p in enumerate(pages) if f"{i + 1}/{n}" not in pdf.squash(p)]
    assert not unnumbered, f"pages without a page number in the footer: {unnumbered[:20]}"


def test_a_rendered_page_is_not_blank():
    """pdftoppm renders the first page of chapter 04 (text, a formula, a figure follow)."""
    pages = pdf.pages()
    title = pdf.han(pdf.title("chapters/04_scaling"))
    number = next(i + 1 for i, p in enumerate(pages) if i > 1 and pdf.han(p).startswith(title))
    pdf.ARTIFACTS.mkdir(exist_ok=True)
    prefix = pdf.ARTIFACTS / "pdf-page"
    subprocess.run(["pdftoppm", "-f", str(number), "-l", str(number), "-r", "80", "-png", "-singlefile",
                    str(pdf.PDF), str(prefix)], check=True, timeout=120)
    png = prefix.with_suffix(".png")
    from matplotlib import image

    pixels = image.imread(png)  # (H, W, 3), floats in [0, 1]
    dark = (pixels[..., :3].mean(axis=-1) < 0.5).mean()
    assert pixels.shape[0] > pixels.shape[1] > 500  # an A4 page, portrait
    assert 0.01 < dark < 0.5, f"{png}: {dark:.1%} dark pixels, a blank or black page?"


def test_the_site_links_the_pdf():
    site = pdf.ROOT / "_build" / "html"
    if not (site / "intro.html").is_file():
        pytest.fail("the site is missing: make book")
    assert pdf.SITE_PDF.is_file() and pdf.SITE_PDF.read_bytes() == pdf.PDF.read_bytes(), (
        "_build/html/book.pdf is missing or stale: `make pdf` copies it there after `make book`")
    for page in ("intro.html", "chapters/04_scaling.html", "glossary.html"):
        html = (site / page).read_text(encoding="utf-8")
        want = "book.pdf" if "/" not in page else "../book.pdf"
        assert f'href="{want}"' in html, f"{page} does not link {want}"
