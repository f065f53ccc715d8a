"""The built website in a real browser: Debian's Chromium driven by playwright, offline.

The site (``_build/html``; ``make test`` builds it first) is served on 127.0.0.1 and every
page is opened once in headless Chromium with every request to any other host blocked, as
on a machine with no network. For every page: no console error, no failed or blocked
request, math typeset by the vendored MathJax, no broken image, Chinese drawn with a CJK
font, and a full-page screenshot in test-artifacts/screenshots/. Notebook pages also get
their Colab, Binder and download buttons checked; the search page must find chapters for
Chinese terms. A missing site or browser fails (it is never a skip).
"""
from __future__ import annotations

import json
import re
import urllib.parse
from pathlib import Path

import pytest

from site_server import (
    ROOT,
    SITE,
    SPECIAL_PAGES,
    html_pages,
    launch_chromium,
    notebook_pages,
    repository,
    serve,
    site_missing_message,
)

MISSING = site_missing_message()
# index.html is only a redirect to intro.html (tested on its own below).
PAGES = [p for p in html_pages() if p != "index.html"] or ["(site not built)"]
NOTEBOOK_PAGES = notebook_pages()
SHOTS = ROOT / "test-artifacts" / "screenshots"

# Fonts that carry Chinese glyphs (what fontconfig / the OS may pick for Han characters).
CJK_FONT_HINTS = ("CJK", "Source Han", "WenQuanYi", "SimHei", "YaHei", "PingFang", "Heiti", "Hiragino", "SimSun")

# Everything a visit records, computed in the page after MathJax and the images are done.
_PAGE_REPORT_JS = r"""
() => {
  const mathNodes = Array.from(document.querySelectorAll('span.math, div.math'));
  const untypeset = mathNodes.filter(n => !n.querySelector('mjx-container')).map(n => n.textContent.slice(0, 80));
  const article = document.querySelector('article') || document.body;
  const clone = article.cloneNode(true);
  clone.querySelectorAll('pre, code, script, style, mjx-container, textarea').forEach(n => n.remove());
  const text = clone.textContent;
  const rawTex = (text.match(/\\\(|\\\)|\\\[|\\\]|\$\$/g) || []).length;
  const images = Array.from(document.images).map(i => ({src: i.currentSrc || i.src, ok: i.complete && i.naturalWidth > 0}));
  const h1 = document.querySelector('article h1') || document.querySelector('h1');
  let glyph = null;
  if (h1) {
    const cs = getComputedStyle(h1);
    const ctx = document.createElement('canvas').getContext('2d');
    ctx.font = `${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
    glyph = {fontSize: parseFloat(cs.fontSize), family: cs.fontFamily,
             han: ctx.measureText('注意力').width, missing: ctx.measureText('\u{10FFFD}\u{10FFFD}\u{10FFFD}').width};
  }
  const links = Array.from(document.querySelectorAll('a[href]')).map(a => ({href: a.getAttribute('href'), abs: a.href, text: a.textContent.trim(), title: a.getAttribute('title') || ''}));
  const widgets = Array.from(document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]')).map(s => {
    const out = s.parentElement;
    const cell = s.closest('.cell');
    let img = false;
    for (const step of ['nextElementSibling', 'previousElementSibling']) {
      let node = cell;
      for (let i = 0; i < 4 && node && !img; i++) { node = node[step]; img = !!(node && node.querySelector('img')); }
    }
    return {note: getComputedStyle(out, '::before').content, staticFigureNearby: img};
  });
  return {title: document.title, widgets, mjx: document.querySelectorAll('mjx-container').length,
          mathNodes: mathNodes.length, untypeset, rawTex, images, glyph, links,
          mathjaxScripts: Array.from(document.scripts).filter(s => /mathjax/i.test(s.src)).map(s => s.src),
          hasHan: /[\u4e00-\u9fff]/.test(document.body.innerText)};
}
"""


@pytest.fixture(scope="module")
def base_url():
    if MISSING:
        pytest.fail(MISSING)
    with serve(SITE) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # pragma: no cover - the pinned requirements include playwright
        pytest.fail("the Python package playwright is missing: .venv/bin/python -m pip install -r requirements.txt")
    with sync_playwright() as p:
        b = launch_chromium(p)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def context(browser, base_url):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="light", locale="zh-CN")
    blocked: list[str] = []

    def only_local(route):
        if route.request.url.startswith(base_url):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    ctx.route("**/*", only_local)
    ctx.blocked = blocked  # type: ignore[attr-defined]
    yield ctx
    ctx.close()


def _platform_fonts(page, selector: str) -> list[dict]:
    """The fonts Chromium actually used to draw the text of ``selector`` (DevTools protocol)."""
    cdp = page.context.new_cdp_session(page)
    try:
        cdp.send("DOM.enable")
        cdp.send("CSS.enable")
        root = cdp.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
        node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
        if not node:
            return []
        return cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
    finally:
        cdp.detach()


_visits: dict[str, dict] = {}


def visit(context, base_url: str, rel: str) -> dict:
    """Open one page (once per test session), wait for MathJax and images, record everything."""
    if rel in _visits:
        return _visits[rel]
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} ({r.failure})"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    blocked_before = len(context.blocked)
    try:
        page.goto(base_url + rel, wait_until="load")
        has_mathjax = page.evaluate("() => !!(window.MathJax && window.MathJax.startup)")
        if has_mathjax:
            page.wait_for_function("() => window.MathJax.startup.promise !== undefined", timeout=15000)
            page.evaluate("() => window.MathJax.startup.promise.then(() => true)")
        page.evaluate(
            "() => Promise.all(Array.from(document.images).map(i => { i.loading = 'eager';"
            " return i.decode().catch(() => null); }))"
        )
        page.wait_for_load_state("networkidle")
        report = page.evaluate(_PAGE_REPORT_JS)
        report["fonts"] = _platform_fonts(page, "article h1") or _platform_fonts(page, "h1")
        SHOTS.mkdir(parents=True, exist_ok=True)
        shot = SHOTS / (rel.replace("/", "__").replace(".html", "") + ".png")
        page.screenshot(path=str(shot), full_page=True)
        report["screenshot"] = shot
    finally:
        page.close()
    report["problems"] = problems + [f"blocked request to another host: {u}" for u in context.blocked[blocked_before:]]
    _visits[rel] = report
    return report


@pytest.mark.parametrize("rel", PAGES)
def test_page_loads_without_errors(context, base_url, rel):
    r = visit(context, base_url, rel)
    assert not r["problems"], f"{rel}: " + "\n".join(r["problems"])
    assert r["screenshot"].is_file() and r["screenshot"].stat().st_size > 1000


@pytest.mark.parametrize("rel", PAGES)
def test_math_is_typeset_by_vendored_mathjax(context, base_url, rel):
    r = visit(context, base_url, rel)
    scripts = r["mathjaxScripts"]
    # Sphinx adds MathJax only to pages with math; where it does, once, from the vendored copy.
    assert len(scripts) <= 1 and all(s.startswith(base_url + "_static/mathjax/") for s in scripts), (
        f"{rel}: MathJax scripts {scripts}"
    )
    if r["mathNodes"]:
        assert scripts, f"{rel}: {r['mathNodes']} math nodes but no MathJax script"
    assert not r["untypeset"], f"{rel}: math left untypeset: {r['untypeset']}"
    assert r["mjx"] >= r["mathNodes"], f"{rel}: {r['mathNodes']} math nodes but {r['mjx']} mjx-container"
    if rel not in ("search.html", "genindex.html"):
        assert r["rawTex"] == 0, f"{rel}: {r['rawTex']} raw TeX delimiters (\\( \\[ $$) left in the text"


def test_some_page_has_math(context, base_url):
    """The math check above must have something to check: the glossary and chapters use math."""
    glossary = visit(context, base_url, "glossary.html")
    assert glossary["mathNodes"] > 0 and glossary["mjx"] >= glossary["mathNodes"]


@pytest.mark.parametrize("rel", PAGES)
def test_no_broken_image(context, base_url, rel):
    r = visit(context, base_url, rel)
    broken = [i["src"] for i in r["images"] if not i["ok"]]
    assert not broken, f"{rel}: broken images {broken}"


@pytest.mark.parametrize("rel", PAGES)
def test_chinese_text_uses_a_cjk_font(context, base_url, rel):
    r = visit(context, base_url, rel)
    assert r["hasHan"], f"{rel}: no Chinese text on the page"
    fonts = r["fonts"]
    cjk = [f for f in fonts if any(h.lower() in f["familyName"].lower() for h in CJK_FONT_HINTS)]
    assert cjk and sum(f["glyphCount"] for f in cjk) > 0, (
        f"{rel}: the heading's Chinese text is not drawn with a CJK font; Chromium used {fonts}. "
        "Install fonts-noto-cjk (bash scripts/install-system-deps.sh)."
    )
    g = r["glyph"]
    # A CJK font draws each Han character one em wide: 「注意力」 is 3 em (a missing glyph is not).
    assert g is not None and abs(g["han"] - 3 * g["fontSize"]) <= 0.1 * g["fontSize"], f"{rel}: {g}"


@pytest.mark.parametrize("rel", PAGES)
def test_widgets_have_a_note_and_a_static_figure(context, base_url, rel):
    """The site loads no widget renderer: each widget says so and has a static figure beside it."""
    r = visit(context, base_url, rel)
    for i, w in enumerate(r["widgets"]):
        assert "交互控件" in w["note"], f"{rel}: widget {i} has no note where it would be ({w['note']!r})"
        assert w["staticFigureNearby"], f"{rel}: widget {i} has no static figure within 4 blocks before or after it"


@pytest.mark.parametrize("rel", sorted(NOTEBOOK_PAGES) or ["(no notebook pages)"])
def test_launch_and_download_buttons(context, base_url, rel):
    if rel not in NOTEBOOK_PAGES:
        pytest.fail(MISSING or "the site has no page built from a notebook (chapters/*.ipynb)")
    nb_path = NOTEBOOK_PAGES[rel]
    url, owner_repo, branch = repository()
    r = visit(context, base_url, rel)
    hrefs = {link["abs"] for link in r["links"]}
    colab = f"https://colab.research.google.com/github/{owner_repo}/blob/{branch}/{nb_path}"
    binder = f"https://mybinder.org/v2/gh/{owner_repo}/{branch}?urlpath=tree/{nb_path}"
    assert colab in hrefs, f"{rel}: no Colab button to {colab}; links: {sorted(h for h in hrefs if 'colab' in h)}"
    assert binder in hrefs, f"{rel}: no Binder button to {binder}; links: {sorted(h for h in hrefs if 'binder' in h)}"
    assert url in hrefs, f"{rel}: no repository button to {url}"
    downloads = [h for h in hrefs if h.startswith(base_url + "_sources/") and h.endswith(".ipynb")]
    assert downloads, f"{rel}: no download button for the .ipynb"
    # The downloaded file is the committed notebook itself.
    local = SITE / urllib.parse.unquote(downloads[0][len(base_url):])
    assert local.is_file(), f"{rel}: download link {downloads[0]} points at a missing file"
    assert json.loads(local.read_text(encoding="utf-8")) == json.loads((ROOT / nb_path).read_text(encoding="utf-8"))


def _search(context, base_url: str, query: str) -> list[str]:
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    try:
        page.goto(base_url + "search.html?q=" + urllib.parse.quote(query), wait_until="load")
        page.wait_for_function(
            "() => { const s = document.querySelector('#search-results .search-summary');"
            " return s && s.textContent.trim().length > 0 && !document.querySelector('#search-progress:not(:empty)'); }",
            timeout=20000,
        )
        page.wait_for_load_state("networkidle")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"search__{query}.png"), full_page=True)
        hrefs = page.eval_on_selector_all("#search-results ul.search li a", "els => els.map(a => a.href)")
    finally:
        page.close()
    assert not problems, f"search for {query}: {problems}"
    return [urllib.parse.urlsplit(h).path.lstrip("/") for h in hrefs]


def _pages_containing(word: str) -> set[str]:
    """Content pages whose article text contains ``word`` (what the search must find)."""
    found = set()
    for rel in html_pages():
        if rel in SPECIAL_PAGES:
            continue
        html = (SITE / rel).read_text(encoding="utf-8")
        m = re.search(r"<article.*?</article>", html, flags=re.S)
        if m and word in re.sub(r"<[^>]+>", "", m.group(0)):
            found.add(rel)
    return found


@pytest.mark.parametrize("query", ["注意力分数", "隐藏层维度", "掩码"])
def test_search_finds_chinese_terms(context, base_url, query):
    if MISSING:
        pytest.fail(MISSING)
    expected = _pages_containing(query)
    assert "glossary.html" in expected, f"the glossary should define {query}"
    found = set(_search(context, base_url, query))
    assert expected <= found, f"search for {query} found {sorted(found)}, missed {sorted(expected - found)}"
    chapters = sorted(p for p in expected if p.startswith("chapters/"))
    if NOTEBOOK_PAGES and query == "注意力分数":
        assert chapters, "no chapter uses 注意力分数?"


def test_index_redirects_to_intro(context, base_url):
    page = context.new_page()
    try:
        page.goto(base_url + "index.html")
        page.wait_for_url(base_url + "intro.html", timeout=10000)
        assert page.title(), "intro.html has no title"
    finally:
        page.close()


def test_screenshots_cover_every_page(context, base_url):
    for rel in PAGES:
        visit(context, base_url, rel)
    shots = {p.name for p in SHOTS.glob("*.png")}
    missing = [rel for rel in PAGES if rel.replace("/", "__").replace(".html", "") + ".png" not in shots]
    assert not missing, f"no screenshot for {missing}"
