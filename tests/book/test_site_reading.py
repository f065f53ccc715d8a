"""The website as a reader meets it, in the real browser (Debian's Chromium, offline): figures in
their own shape, search for the book's terms, the phone drawer, the sidebar on landing, formulas.

- Every figure on every page, at 390×844 (phone) and 1280×800 (laptop): its rendered height ÷
  width equals its image's own ratio within ``SHAPE_TOLERANCE`` (a figure used to keep its
  inline design height while the theme narrowed it to the column, up to 2.3× too tall).
- Search: every term of the glossary, and words that are not one dictionary word
  (``MULTI_WORD_QUERIES``: the book's own title word 注意力机制, 查询头 ...), return every page
  whose article text contains them (``_site/zh_search.py``).
- Phone: choosing a section in the page-contents drawer closes the drawer.
- Laptop: landing on the last chapter, the sidebar shows the book's title and the search box.
- Formulas: no TeX escape printed literally (a backslash in a formula's rendered text, as
  ``\\text{BLOCK\\_M}`` once showed 「BLOCK\\_M」), read from MathJax's own MathML copy.
- The download menu: the whole-book PDF answers, and the theme's print item says it prints one page.

Each page is opened once per width (``_visit``); a missing site or browser fails (the fixtures are
in tests/book/conftest.py).
"""
from __future__ import annotations

import re
import urllib.parse
import urllib.request

import pytest

from site_server import (
    SITE,
    SPECIAL_PAGES,
    html_pages,
    notebook_pages,
    offline_context,
    open_page,
    site_missing_message,
    watch_page,
)

MISSING = site_missing_message()
PAGES = [p for p in html_pages() if p != "index.html"] or ["(site not built)"]
CONTENT_PAGES = [p for p in PAGES if p not in SPECIAL_PAGES]
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
SHAPE_TOLERANCE = 0.02
MULTI_WORD_QUERIES = ["注意力机制", "查询头", "评分矩阵", "显存带宽"]
LAST_CHAPTER = (sorted(notebook_pages()) or ["(no notebook pages)"])[-1]


def _glossary_terms() -> list[str]:
    """The glossary's terms, read from the built glossary page (the <dt> of its term list)."""
    path = SITE / "glossary.html"
    if not path.is_file():
        return ["(site not built)"]
    html = path.read_text(encoding="utf-8")
    terms = [re.sub(r"<[^>]+>", "", re.sub(r'<a class="headerlink".*?</a>', "", t)).strip()
             for t in re.findall(r'<dt id="term-[^"]*">(.*?)</dt>', html, flags=re.S)]
    return [t for t in terms if t] or ["(no glossary terms found)"]


@pytest.fixture(scope="module")
def contexts(browser, base_url):
    made = {name: offline_context(browser, base_url, size) for name, size in (("laptop", LAPTOP), ("phone", PHONE))}
    yield made
    for ctx in made.values():
        ctx.close()


# --- One visit per page and size ----------------------------------------------------------------

# A formula's rendered text: the token elements of MathJax's MathML copy (what a screen reader reads).
_MATH_TEXT_JS = """() => Array.from(document.querySelectorAll('article mjx-container')).map(m => {
  const mml = m.querySelector('mjx-assistive-mml');
  return {tex: (m.closest('.math') || m.parentElement).textContent.slice(0, 60),
          shown: Array.from(mml ? mml.querySelectorAll('mi, mo, mn, mtext, ms') : []).map(t => t.textContent).join(' ')};
})"""
_SHAPES_JS = """() => Array.from(document.querySelectorAll('article img')).map(i => {
  const r = i.getBoundingClientRect();
  return {src: i.getAttribute('src'), width: r.width, height: r.height, nw: i.naturalWidth, nh: i.naturalHeight};
})"""
_visits: dict[tuple[str, str], dict] = {}


def _visit(contexts, base_url: str, rel: str, size: str) -> dict:
    """Open a page once per size: its figures' shapes and (on the laptop) its formulas' text."""
    if (rel, size) not in _visits:
        page, _ = open_page(contexts[size], base_url, rel)
        try:
            _visits[rel, size] = {"shapes": page.evaluate(_SHAPES_JS),
                                  "formulas": page.evaluate(_MATH_TEXT_JS) if size == "laptop" else None}
        finally:
            page.close()
    return _visits[rel, size]


def _shapes(contexts, base_url: str, rel: str, size: str) -> list[dict]:
    return _visit(contexts, base_url, rel, size)["shapes"]


# --- Figures in their own shape ---------------------------------------------------------------

@pytest.mark.parametrize("size", ["phone", "laptop"])
@pytest.mark.parametrize("rel", PAGES)
def test_figures_keep_their_shape(contexts, base_url, rel, size):
    wrong = []
    for f in _shapes(contexts, base_url, rel, size):
        assert f["nw"] > 0 and f["nh"] > 0, f"{rel}: {f['src']} did not load"
        if f["width"] < 1:  # not displayed at this width (an icon of a hidden menu)
            continue
        ratio = (f["height"] / f["width"]) / (f["nh"] / f["nw"])
        if abs(ratio - 1) > SHAPE_TOLERANCE:
            wrong.append(f"{f['src']}: drawn {f['width']:.0f}×{f['height']:.0f} px for a "
                         f"{f['nw']}×{f['nh']} image ({ratio:.2f}× too tall)")
    assert not wrong, f"{rel} at {size}:\n" + "\n".join(wrong)


def test_the_shape_checks_see_figures(contexts, base_url):
    counts = {size: sum(len([f for f in _shapes(contexts, base_url, rel, size) if f["width"] >= 1])
                        for rel in CONTENT_PAGES) for size in ("phone", "laptop")}
    assert min(counts.values()) >= 40, f"too few figures measured: {counts}"


# --- Search -------------------------------------------------------------------------------------

def _search(ctx, base_url: str, query: str) -> set[str]:
    page = ctx.new_page()
    problems: list[str] = []
    watch_page(page, problems)
    try:
        page.goto(base_url + "search.html?q=" + urllib.parse.quote(query), wait_until="load")
        page.wait_for_function(
            "() => { const s = document.querySelector('#search-results .search-summary');"
            " return s && s.textContent.trim().length > 0 && !document.querySelector('#search-progress:not(:empty)'); }",
            timeout=20000,
        )
        hrefs = page.eval_on_selector_all("#search-results ul.search li a", "els => els.map(a => a.href)")
    finally:
        page.close()
    assert not problems, f"search for {query}: {problems}"
    return {urllib.parse.urlsplit(h).path.lstrip("/") for h in hrefs}


_article_text: dict[str, str] = {}


def _pages_containing(term: str) -> set[str]:
    """Content pages whose article text contains ``term`` (case and runs of spaces ignored)."""
    if not _article_text:
        for rel in CONTENT_PAGES:
            html = (SITE / rel).read_text(encoding="utf-8")
            m = re.search(r"<article.*?</article>", html, flags=re.S)
            text = re.sub(r"<[^>]+>", "", m.group(0)) if m else ""
            _article_text[rel] = re.sub(r"\s+", " ", text.replace("&nbsp;", " ")).lower()
    want = re.sub(r"\s+", " ", term).lower()
    return {rel for rel, text in _article_text.items() if want in text}


@pytest.mark.parametrize("term", _glossary_terms() + MULTI_WORD_QUERIES)
def test_search_finds_every_page_that_uses_a_term(contexts, base_url, term):
    expected = _pages_containing(term)
    assert expected, f"no page contains {term!r}?"
    found = _search(contexts["laptop"], base_url, term)
    assert expected <= found, f"search for {term} found {sorted(found)}, missed {sorted(expected - found)}"


def test_the_glossary_has_its_terms():
    terms = _glossary_terms()
    assert len(terms) >= 50 and "注意力分数" in terms and "隐藏层维度" in terms, terms[:10]
    assert "注意力机制" not in terms  # so that the search for it tests the splitting of a query


# --- Phone drawer, sidebar on landing -------------------------------------------------------------

_OPEN_DIALOGS_JS = "() => Array.from(document.querySelectorAll('dialog[open]')).map(d => d.id)"


def test_choosing_a_section_closes_the_phone_drawer(contexts, base_url):
    page, problems = open_page(contexts["phone"], base_url, "chapters/04_scaling.html")
    try:
        buttons = page.locator(".secondary-toggle")
        visible = [i for i in range(buttons.count()) if buttons.nth(i).is_visible()]
        assert len(visible) == 1, f"{len(visible)} visible page-contents buttons"
        buttons.nth(visible[0]).click()
        page.wait_for_timeout(300)
        assert page.evaluate(_OPEN_DIALOGS_JS) == ["pst-secondary-sidebar-modal"], "the drawer did not open"
        links = page.locator("#pst-secondary-sidebar-modal nav a[href^='#']")
        assert links.count() >= 3, "the page outline has too few sections"
        target = links.nth(2)
        anchor = target.get_attribute("href")[1:]
        target.click()
        page.wait_for_timeout(500)
        assert page.evaluate(_OPEN_DIALOGS_JS) == [], "the drawer is still open after choosing a section"
        # The theme scrolls smoothly: wait until the section has arrived near the top.
        top_js = "(id) => document.getElementById(decodeURIComponent(id)).getBoundingClientRect().top"
        try:
            page.wait_for_function(f"(id) => {{ const t = ({top_js})(id); return t >= -5 && t < {PHONE['height'] / 2}; }}",
                                   arg=anchor, timeout=5000)
        except Exception:
            pytest.fail(f"the chosen section is at {page.evaluate(top_js, anchor):.0f}px, not in view")
    finally:
        page.close()
    assert not problems, problems


_VISIBLE_IN_SIDEBAR_JS = """(sel) => {
  const el = document.querySelector(sel);
  if (!el) return 'missing';
  const r = el.getBoundingClientRect();
  if (r.height < 1 || r.bottom < 0 || r.top > innerHeight) return `at ${Math.round(r.top)}px`;
  const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
  return hit && (hit === el || el.contains(hit)) ? 'visible' : 'covered';
}"""


def test_landing_on_the_last_chapter_shows_the_title_and_search(contexts, base_url):
    page, problems = open_page(contexts["laptop"], base_url, LAST_CHAPTER)
    try:
        page.wait_for_timeout(300)
        for what, sel in (("the book's title", ".bd-sidebar-primary .navbar-brand"),
                          ("the search box", ".bd-sidebar-primary .search-button-field"),
                          ("this chapter's entry", ".bd-sidebar-primary .bd-docs-nav .current.active > a")):
            state = page.evaluate(_VISIBLE_IN_SIDEBAR_JS, sel)
            assert state == "visible", f"{LAST_CHAPTER} at 1280×800: {what} ({sel}) is {state}"
    finally:
        page.close()
    assert not problems, problems


# --- Formulas: no TeX escape printed ---------------------------------------------------------------

@pytest.mark.parametrize("rel", CONTENT_PAGES or ["(site not built)"])
def test_no_formula_prints_a_backslash(contexts, base_url, rel):
    formulas = _visit(contexts, base_url, rel, "laptop")["formulas"]
    literal = [f"{f['shown']!r} (from {f['tex']!r})" for f in formulas if "\\" in f["shown"]]
    assert not literal, f"{rel}: formulas that show a backslash:\n" + "\n".join(literal)


def test_the_formula_check_reads_formulas(contexts, base_url):
    formulas = _visit(contexts, base_url, "chapters/08_flash_attention.html", "laptop")["formulas"]
    shown = " ".join(f["shown"].replace(" ", "") for f in formulas)
    assert "BLOCK_M" in shown and "softmax" in shown.lower(), shown[:300]


# --- The download menu ---------------------------------------------------------------------------

def test_the_download_menu_s_pdf_items(contexts, base_url):
    page, problems = open_page(contexts["laptop"], base_url, "chapters/04_scaling.html")
    try:
        items = page.evaluate("() => Array.from(document.querySelectorAll('.dropdown-download-buttons li'))"
                              ".map(li => ({text: li.textContent.trim(), href: (li.querySelector('a') || {}).href || null,"
                              " title: (li.querySelector('[title]') || li).getAttribute('title') || ''}))")
    finally:
        page.close()
    book = [i for i in items if i["text"] == "整本书 PDF"]
    assert len(book) == 1, items
    with urllib.request.urlopen(book[0]["href"]) as response:  # the local server
        body = response.read()  # all of it: closing early would reset the server's connection
    assert response.status == 200 and body[:5] == b"%PDF-", "the whole-book PDF does not answer"
    printing = [i for i in items if ".pdf" in i["text"] and i is not book[0]]
    assert len(printing) == 1 and "这一页" in printing[0]["text"], f"the print item: {printing}"
    assert not problems, problems
