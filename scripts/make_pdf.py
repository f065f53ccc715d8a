"""Print the single-page build of the book to one PDF with Debian's headless Chromium (offline).

    .venv/bin/jupyter-book build --builder singlehtml .      # -> _build/singlehtml/index.html
    .venv/bin/python scripts/make_pdf.py [_build/singlehtml] [_build/pdf/book.pdf]

(``make pdf`` runs both, then copies the PDF into the site as _build/html/book.pdf, which every
page's download menu links; ``make book`` builds the site and then the PDF.) The page is served
on 127.0.0.1 (nothing leaves the machine) and opened with Playwright driving /usr/bin/chromium,
as the site tests do, laid out in print media at the width of the A4 text column. Before
printing, the script waits for MathJax (vendored) to typeset every formula; swaps the CJK and
MathJax fonts for TrueType copies holding the book's characters (pdf_fonts.py), so that the
PDF embeds real CID TrueType fonts instead of Type 3 glyph procedures; adds the print style
sheet (pdf_print.css) and runs pdf_page.js, which prints the answers and the hidden checker
code open, leaves out the set-up cells, fits code and printed tables to the column (wrapped
lines keep a hanging indent), keeps short boxes on one page and scales a figure taller than
a page; starts every chapter on a new page and puts a table of contents after the title
page. The PDF is printed twice: the first print tells on which page each chapter starts
(pdftotext, poppler-utils), the second writes those page numbers into the table of contents.
Every page has its number in the footer; the PDF has an outline (bookmarks). What pdf_page.js
changed (and the printed-table rows that still wrap) is written beside the PDF as
book-report.json, which tests/book/test_pdf.py reads.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import pdf_fonts  # noqa: E402  (scripts/ is this file's folder)
from site_server import launch_chromium, serve  # noqa: E402

PRINT_CSS = (Path(__file__).with_name("pdf_print.css")).read_text(encoding="utf-8")
PAGE_JS = (Path(__file__).with_name("pdf_page.js")).read_text(encoding="utf-8")
FONT_DIR = "_static/pdf-fonts"
# The first line of scripts/setup_cell.py (every chapter's first code cell), left out of the PDF.
SETUP_MARKER = (Path(__file__).with_name("setup_cell.py")).read_text(encoding="utf-8").lstrip().split("\n", 1)[0]
# The A4 text column in CSS pixels (210 mm - 2 × 14 mm at 96 px per inch): the page is laid out
# at this width before pdf_page.js measures it, as Chromium lays it out when printing.
COLUMN_PX = 688
PAGE_TEXT_PX = 994  # 297 mm - 16 mm - 18 mm
PAGE_OPTIONS = {"keepMaxPx": round(0.4 * PAGE_TEXT_PX), "imgMaxPx": round(0.85 * PAGE_TEXT_PX),
                "minFontScale": 0.7, "setupMarker": SETUP_MARKER}

# Runs in the page: mark each chapter's section, add the title page and the table of contents.
PREPARE_JS = """([bookTitle, author, pages]) => {
  const article = document.querySelector('article.bd-article') || document.querySelector('main');
  // singlehtml: the root page's section, then each document after its span#document-NAME marker
  const parts = [article.querySelector('section')];
  document.querySelectorAll('span[id^="document-"]').forEach(marker => {
    let s = marker.nextElementSibling;
    while (s && s.tagName !== 'SECTION') s = s.nextElementSibling;
    if (s) parts.push(s);
  });
  const chapters = parts.map((s, i) => {
    s.classList.add('book-part');
    // section ids repeat across documents in a single-page build (id1 ...): an anchor of our own
    let anchor = document.getElementById('pdf-part-' + i);
    if (!anchor) {
      anchor = document.createElement('span');
      anchor.id = 'pdf-part-' + i;
      s.prepend(anchor);
    }
    const head = s.querySelector(':scope > h1, :scope > h2');
    return {id: anchor.id, title: head.textContent.replace(/[#¶]/g, '').trim()};
  });
  const title = bookTitle;
  let cover = document.getElementById('pdf-cover');
  if (!cover) {
    cover = document.createElement('div');
    cover.id = 'pdf-cover';
    article.prepend(cover);
  }
  // The title on two lines at its colon (注意力机制 / 把「相关」变成一次加权求和), never inside a word.
  const [main, ...rest] = title.split('：');
  cover.innerHTML = '<h1></h1><p class="subtitle"></p><p class="author"></p>';
  cover.querySelector('h1').textContent = main;
  cover.querySelector('.subtitle').textContent = rest.join('：');
  cover.querySelector('.author').textContent = author;
  let toc = document.getElementById('pdf-toc');
  if (!toc) {
    toc = document.createElement('nav');
    toc.id = 'pdf-toc';
    cover.after(toc);
  }
  toc.innerHTML = '<h1>目录</h1><ol></ol>';
  const list = toc.querySelector('ol');
  chapters.forEach((c, i) => {
    const li = document.createElement('li');
    const a = document.createElement('a');
    a.href = '#' + c.id;
    a.textContent = c.title;
    const dots = document.createElement('span');
    dots.className = 'dots';
    const num = document.createElement('span');
    num.className = 'page';
    num.textContent = pages && pages[i] ? String(pages[i]) : '00';
    li.append(a, dots, num);
    list.append(li);
  });
  return chapters;
}"""

# Digits only, in DejaVu Sans (a TrueType font): the footer is drawn apart from the page and
# cannot use the page's web fonts, and Noto CJK would be embedded as a Type 3 font.
FOOTER = ('<div style="width:100%;font-size:9px;text-align:center;color:#555;'
          'font-family:\'DejaVu Sans\',sans-serif"><span class="pageNumber"></span>'
          ' / <span class="totalPages"></span></div>')


def _squash(text: str) -> str:
    """Only the Han characters: pdftotext may put a Latin run (KV, FlashAttention) out of order."""
    return "".join(re.findall(r"[\u4e00-\u9fff]", text))


def chapter_pages(pdf: Path, titles: list[str]) -> list[int | None]:
    """On which page (1-based) each title starts: the first page after the table of contents that opens with it."""
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True,
                          check=True).stdout
    pages = [_squash(p) for p in text.split("\f")]
    # page 1 is the title page; the table of contents ends on the first page that lists the last title
    start = next((i for i, p in enumerate(pages) if i >= 1 and titles and _squash(titles[-1]) in p), 1) + 1
    found = []
    for title in titles:
        page = next((i for i in range(start, len(pages)) if pages[i].startswith(_squash(title))), None)
        found.append(None if page is None else page + 1)
        start = page + 1 if page is not None else start
    return found


def _print(page, path: Path) -> None:
    page.pdf(path=str(path), format="A4", print_background=True, display_header_footer=True,
             header_template="<span></span>", footer_template=FOOTER, outline=True, tagged=True,
             margin={"top": "16mm", "bottom": "18mm", "left": "14mm", "right": "14mm"})


def _open(page, url: str) -> None:
    page.goto(url, wait_until="load")
    page.add_style_tag(content=PRINT_CSS)
    page.wait_for_function("() => !window.MathJax || (MathJax.startup && MathJax.startup.promise)", timeout=60_000)
    page.evaluate("async () => { if (window.MathJax && MathJax.startup) await MathJax.startup.promise;"
                  " await document.fonts.ready; }")
    unrendered = page.evaluate("() => document.querySelectorAll('.math:not(:has(mjx-container))').length")
    if unrendered:
        raise SystemExit(f"MathJax left {unrendered} formulas untypeset; is _static/mathjax in the build?")


# The page's @font-face rules whose source is one URL: MathJax's fonts (the theme's icon fonts
# have two sources and are not printed).
FONT_RULES_JS = r"""() => [...document.styleSheets]
  .flatMap(s => { try { return [...s.cssRules]; } catch (e) { return []; } })
  .filter(r => r instanceof CSSFontFaceRule)
  .map(r => ({family: r.style.getPropertyValue('font-family'),
              url: (r.style.getPropertyValue('src').match(/^url\("([^"]+)"\)[^,]*$/) || [null, null])[1]}))
  .filter(r => r.url)"""


def _use_truetype_fonts(page, site: Path, url: str) -> None:
    """Noto CJK as TrueType web fonts holding the page's characters (pdf_fonts.py), loaded."""
    chars = set(page.evaluate("() => document.body.textContent")) | {chr(c) for c in range(0x20, 0x7F)}
    css = pdf_fonts.write_fonts(chars, site / FONT_DIR, url + FONT_DIR + "/")
    rules = page.evaluate(FONT_RULES_JS)
    css += "\n" + pdf_fonts.mathjax_faces(rules, site, url, site / FONT_DIR, url + FONT_DIR + "/")
    page.add_style_tag(content=css)
    families = [f'{w} 16px "{fam}"' for fam, w, _, _ in pdf_fonts.FACES]
    failed = page.evaluate("async (fs) => { const out = []; for (const f of fs) {"
                           " const got = await document.fonts.load(f, '\\u6ce8a'); if (!got.length) out.push(f); }"
                           " await document.fonts.ready; return out; }", families)
    if failed:
        raise SystemExit(f"the PDF's TrueType fonts did not load: {failed}")


def make_pdf(site: Path, out: Path) -> dict:
    from playwright.sync_api import sync_playwright

    if not (site / "intro.html").is_file():
        raise SystemExit(f"{site / 'intro.html'} is missing: build it with "
                         "`.venv/bin/jupyter-book build --builder singlehtml .` (make pdf does)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with serve(site) as root, sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": COLUMN_PX, "height": PAGE_TEXT_PX})
        page.emulate_media(media="print")
        page.route(re.compile(r"^(?!http://127\.0\.0\.1)"), lambda route: route.abort())  # offline
        _open(page, root + "intro.html")  # index.html only redirects to it
        config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
        chapters = page.evaluate(PREPARE_JS, [config["title"], config.get("author", ""), None])
        _use_truetype_fonts(page, site, root)
        changed = page.evaluate(PAGE_JS, PAGE_OPTIONS)
        with tempfile.TemporaryDirectory() as tmp:
            draft = Path(tmp) / "draft.pdf"
            _print(page, draft)
            pages = chapter_pages(draft, [c["title"] for c in chapters])
        page.evaluate(PREPARE_JS, [config["title"], config.get("author", ""), pages])
        _print(page, out)
        browser.close()
    return {"pdf": str(out), "print": changed,
            "chapters": [dict(c, page=n) for c, n in zip(chapters, pages)]}


def main(argv: list[str]) -> int:
    site = Path(argv[0]) if argv else ROOT / "_build" / "singlehtml"
    out = Path(argv[1]) if len(argv) > 1 else ROOT / "_build" / "pdf" / "book.pdf"
    report = make_pdf(site.resolve(), out.resolve())
    text = json.dumps(report, ensure_ascii=False, indent=1)
    out.with_name(out.stem + "-report.json").write_text(text, encoding="utf-8")  # read by tests/book/test_pdf.py
    print(text)
    return 0 if all(c["page"] for c in report["chapters"]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
