"""Print the single-page build of the book to one PDF with Debian's headless Chromium (offline).

    .venv/bin/jupyter-book build --builder singlehtml .      # -> _build/singlehtml/index.html
    .venv/bin/python scripts/make_pdf.py [_build/singlehtml] [_build/pdf/book.pdf]

(``make pdf`` runs both, then copies the PDF into the site as _build/html/book.pdf, which every
page's download menu links.) The page is served on 127.0.0.1 (nothing leaves the machine) and
opened with Playwright driving /usr/bin/chromium, as the site tests do. Before printing, the
script waits for MathJax (vendored) to typeset every formula and for the web fonts, starts
every chapter on a new page, wraps long code lines instead of cutting them, and puts a table
of contents after the title page. The PDF is printed twice: the first print tells on which
page each chapter starts (pdftotext, poppler-utils), the second writes those page numbers into
the table of contents. Every page has its number in the footer; the PDF has an outline
(bookmarks) and the CJK fonts Chromium used (Noto CJK) embedded as subsets.
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

from site_server import launch_chromium, serve  # noqa: E402

PRINT_CSS = """
@page { size: A4; margin: 16mm 14mm 18mm 14mm; }
.bd-header-article, .bd-sidebar-primary, .bd-sidebar-secondary, .prev-next-area, footer,
.bd-header, .header-article, .headerlink, #jb-print-docs-body, .bd-footer-article,
.bd-footer-content, .footer-items, .search-button-field { display: none !important; }
.bd-main .bd-content .bd-article-container { max-width: 100% !important; padding: 0 !important; }
.bd-page-width { max-width: 100% !important; }
article pre, div.highlight pre, .cell_output pre { white-space: pre-wrap !important; overflow-wrap: anywhere;
  overflow: visible !important; max-height: none !important; }
.cell_output img { max-width: 100% !important; height: auto; break-inside: avoid; }
.bd-main .bd-content .bd-article h1:first-of-type { display: block !important; }  /* the theme hides it in print */
section.book-part { break-before: page; }
section.book-part > h2 { font-size: 2em; }
#pdf-cover { break-after: page; text-align: center; padding-top: 30vh; }
#pdf-cover h1 { font-size: 2.1em; margin: 0 0 1em 0; }
#pdf-toc { break-after: page; }
#pdf-toc ol { list-style: none; padding: 0; font-size: 1.05em; }
#pdf-toc li { display: flex; margin: 0.45em 0; }
#pdf-toc li a { color: inherit; text-decoration: none; }
#pdf-toc li .dots { flex: 1; border-bottom: 1px dotted #999; margin: 0 0.4em 0.3em; }
"""

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
  cover.innerHTML = '<h1></h1><p></p>';
  cover.querySelector('h1').textContent = title;
  cover.querySelector('p').textContent = author;
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
  document.querySelectorAll('details').forEach(d => { d.open = false; });
  return chapters;
}"""

FOOTER = ('<div style="width:100%;font-size:9px;text-align:center;color:#555;'
          'font-family:\'Noto Sans CJK SC\',sans-serif">第 <span class="pageNumber"></span> 页'
          '，共 <span class="totalPages"></span> 页</div>')


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


def make_pdf(site: Path, out: Path) -> dict:
    from playwright.sync_api import sync_playwright

    if not (site / "intro.html").is_file():
        raise SystemExit(f"{site / 'intro.html'} is missing: build it with "
                         "`.venv/bin/jupyter-book build --builder singlehtml .` (make pdf does)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with serve(site) as root, sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page()
        page.route(re.compile(r"^(?!http://127\.0\.0\.1)"), lambda route: route.abort())  # offline
        _open(page, root + "intro.html")  # index.html only redirects to it
        config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
        chapters = page.evaluate(PREPARE_JS, [config["title"], config.get("author", ""), None])
        with tempfile.TemporaryDirectory() as tmp:
            draft = Path(tmp) / "draft.pdf"
            _print(page, draft)
            pages = chapter_pages(draft, [c["title"] for c in chapters])
        page.evaluate(PREPARE_JS, [config["title"], config.get("author", ""), pages])
        _print(page, out)
        browser.close()
    return {"pdf": str(out), "chapters": [dict(c, page=n) for c, n in zip(chapters, pages)]}


def main(argv: list[str]) -> int:
    site = Path(argv[0]) if argv else ROOT / "_build" / "singlehtml"
    out = Path(argv[1]) if len(argv) > 1 else ROOT / "_build" / "pdf" / "book.pdf"
    report = make_pdf(site.resolve(), out.resolve())
    print(json.dumps(report, ensure_ascii=False, indent=1))
    return 0 if all(c["page"] for c in report["chapters"]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
