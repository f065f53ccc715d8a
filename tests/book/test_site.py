"""The built website in a real browser: Debian's Chromium driven by playwright, offline.

The site (``_build/html``; ``make test`` builds it first) is served on 127.0.0.1 and every
page is opened once in headless Chromium with every request to any other host blocked, as
on a machine with no network. For every page: no console error, no failed or blocked
request, math typeset by the vendored MathJax, no broken image, Chinese drawn with a CJK
font, and a full-page screenshot in test-artifacts/screenshots/ at 1280×800 (laptop) and
390×844 (phone, ``*@390.png``). Notebook pages also get their Colab, Binder and download
buttons checked. (Search, figure shapes, the phone drawer and the sidebar on landing:
test_site_reading.py.)

As a reader meets the site: the ☰ button opens the table of contents on a phone
and folds the sidebar on a laptop, the page-contents button opens the page outline on a
phone, no empty header bar; no page scrolls sideways at 390 px; every figure is shown at
>= 80% of its design size at 1280×800 (design size in CSS px = PNG pixel width × 100 / its
dpi), has twice the pixels it is shown with (sharp on 2x screens) and Chinese alt text; no
formula is clipped; a Chinese character is exactly two Latin columns in printed output; no
testing marker (NBVAL) on any page. ``test-artifacts/site-report.json`` lists, per page, the
smallest figure scale and the page width at 390 px.

A missing site or browser fails (it is never a skip).
"""
from __future__ import annotations

import json
import re
import struct
import urllib.parse
from pathlib import Path

import pytest

from attn_lib.tolerances import LAYOUT_PX

from site_server import (
    ROOT,
    SITE,
    html_pages,
    offline_context,
    open_page,
    notebook_pages,
    repository,
    site_missing_message,
    wait_for_page,
    watch_page,
)

MISSING = site_missing_message()
MODELSCOPE_URL = "https://modelscope.cn/my/mynotebook"  # _site/readers.py
# index.html is only a redirect to intro.html (tested on its own below).
PAGES = [p for p in html_pages() if p != "index.html"] or ["(site not built)"]
NOTEBOOK_PAGES = notebook_pages()
SHOTS = ROOT / "test-artifacts" / "screenshots"
REPORT = ROOT / "test-artifacts" / "site-report.json"
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
MIN_FIGURE_SCALE = 0.8

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
def context(browser, base_url):
    ctx = offline_context(browser, base_url, LAPTOP)
    yield ctx
    ctx.close()


@pytest.fixture(scope="module")
def phone_context(browser, base_url):
    ctx = offline_context(browser, base_url, PHONE)
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


# Layout as a reader sees it, at the page's viewport: page width, clipped formulas, figures,
# the header bar, testing markers, and the widths of Chinese and Latin text in printed output.
_LAYOUT_JS = r"""
() => {
  const de = document.documentElement;
  const box = el => { const r = el.getBoundingClientRect(); return {left: r.left, right: r.right, width: r.width}; };
  const clipped = [];
  for (const m of document.querySelectorAll('article mjx-container')) {
    const r = box(m), p = box(m.parentElement);
    const tex = (m.closest('.math') || m.parentElement).textContent.slice(0, 60);
    if (r.left < p.left - 1 || r.right > p.right + 1) clipped.push({tex, why: `box ${Math.round(r.left)}..${Math.round(r.right)} outside its parent ${Math.round(p.left)}..${Math.round(p.right)}`});
    else if (m.scrollWidth > m.clientWidth + 1 && getComputedStyle(m).display !== 'inline') clipped.push({tex, why: `content ${m.scrollWidth}px in a ${m.clientWidth}px box`});
  }
  const figures = Array.from(document.querySelectorAll('article img')).map(i => ({
    src: i.currentSrc || i.src, alt: i.getAttribute('alt') || '', shown: i.getBoundingClientRect().width,
    natural: i.naturalWidth, inOutput: !!i.closest('.cell_output')}));
  const hdr = document.querySelector('.bd-header');
  let header = null;
  if (hdr) {
    const r = hdr.getBoundingClientRect();
    const visible = Array.from(hdr.querySelectorAll('a, button, input, img')).filter(e => { const b = e.getBoundingClientRect(); return b.width > 0 && b.height > 0 && getComputedStyle(e).visibility !== 'hidden'; });
    header = {height: r.height, controls: visible.map(e => (e.getAttribute('aria-label') || e.getAttribute('title') || e.textContent || e.tagName).trim().slice(0, 30))};
  }
  let cjk = null;
  const pre = document.querySelector('.cell_output pre');
  if (pre) {
    const mk = t => { const s = document.createElement('span'); s.textContent = t; pre.appendChild(s); const w = s.getBoundingClientRect().width; s.remove(); return w; };
    cjk = {han: mk('注意力分数比'), latin: mk('abcdefghijkl'), family: getComputedStyle(pre).fontFamily};
  }
  return {pageWidth: Math.max(de.scrollWidth, document.body.scrollWidth), viewport: innerWidth, clipped, figures, header,
          nbval: /NBVAL/.test(document.body.innerText) || /NBVAL/.test(de.outerHTML), cjk};
}
"""


def _png_design_width(path: Path) -> float:
    """CSS pixels a PNG is drawn for: pixel width × 100 / its dpi (the pHYs chunk; 100 dpi if none)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width = struct.unpack(">I", data[16:20])[0]
    dpi, i = 100.0, 8
    while i < len(data):
        length, kind = struct.unpack(">I4s", data[i:i + 8])
        if kind == b"pHYs":
            per_metre, _, unit = struct.unpack(">IIB", data[i + 8:i + 17])
            if unit == 1 and per_metre:
                dpi = per_metre * 0.0254
            break
        i += 12 + length
    return width * 100 / dpi


def _shot_name(rel: str, suffix: str = "") -> str:
    return rel.replace("/", "__").replace(".html", "") + suffix + ".png"


_visits: dict[str, dict] = {}
_phone_visits: dict[str, dict] = {}


def visit_phone(phone_context, base_url: str, rel: str) -> dict:
    """Open one page at 390×844 (once per session): layout, problems, a full-page screenshot."""
    if rel in _phone_visits:
        return _phone_visits[rel]
    page = phone_context.new_page()
    problems: list[str] = []
    watch_page(page, problems)
    blocked_before = len(phone_context.blocked)
    try:
        page.goto(base_url + rel, wait_until="load")
        wait_for_page(page)
        report = page.evaluate(_LAYOUT_JS)
        SHOTS.mkdir(parents=True, exist_ok=True)
        shot = SHOTS / _shot_name(rel, "@390")
        page.screenshot(path=str(shot), full_page=True)
        report["screenshot"] = shot
    finally:
        page.close()
    report["problems"] = problems + [f"blocked request to another host: {u}" for u in phone_context.blocked[blocked_before:]]
    _phone_visits[rel] = report
    return report


def visit(context, base_url: str, rel: str) -> dict:
    """Open one page (once per test session), wait for MathJax and images, record everything."""
    if rel in _visits:
        return _visits[rel]
    page = context.new_page()
    problems: list[str] = []
    watch_page(page, problems)
    blocked_before = len(context.blocked)
    try:
        page.goto(base_url + rel, wait_until="load")
        wait_for_page(page)
        report = page.evaluate(_PAGE_REPORT_JS)
        report["layout"] = page.evaluate(_LAYOUT_JS)
        report["fonts"] = _platform_fonts(page, "article h1") or _platform_fonts(page, "h1")
        SHOTS.mkdir(parents=True, exist_ok=True)
        shot = SHOTS / _shot_name(rel)
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
    # ModelScope (魔搭) cannot open a GitHub notebook: its notebook page, in the same launch menu
    assert MODELSCOPE_URL in hrefs, f"{rel}: no ModelScope button to {MODELSCOPE_URL}"
    assert base_url + "book.pdf" in hrefs, f"{rel}: no link to the whole book's PDF"
    assert url in hrefs, f"{rel}: no repository button to {url}"
    downloads = [h for h in hrefs if h.startswith(base_url + "_sources/") and h.endswith(".ipynb")]
    assert downloads, f"{rel}: no download button for the .ipynb"
    # The downloaded file is the committed notebook itself.
    local = SITE / urllib.parse.unquote(downloads[0][len(base_url):])
    assert local.is_file(), f"{rel}: download link {downloads[0]} points at a missing file"
    assert json.loads(local.read_text(encoding="utf-8")) == json.loads((ROOT / nb_path).read_text(encoding="utf-8"))


def test_modelscope_is_in_every_chapter_s_launch_menu():
    """Static check of the written HTML: the ModelScope entry sits in the launch dropdown, beside Colab."""
    if not NOTEBOOK_PAGES:
        pytest.fail(MISSING or "the site has no page built from a notebook")
    for rel in NOTEBOOK_PAGES:
        html = (SITE / rel).read_text(encoding="utf-8")
        menu = re.search(r'<div class="dropdown dropdown-launch-buttons">.*?</ul>', html, flags=re.S)
        assert menu, f"{rel}: no launch menu"
        assert f'href="{MODELSCOPE_URL}"' in menu.group(0) and "colab.research.google.com" in menu.group(0), rel
        assert "ModelScope（魔搭）" in menu.group(0), rel


@pytest.mark.parametrize("english", ["Toggle hidden content", 'aria-label="Main"', 'aria-label="Page"'])
def test_ui_labels_are_chinese(english):
    """sphinx-togglebutton's and the theme's untranslated labels are replaced in every written file."""
    if MISSING:
        pytest.fail(MISSING)
    files = [SITE / p for p in html_pages()] + [SITE / "_static" / "togglebutton.js"]
    left = [f.relative_to(SITE).as_posix() for f in files if english in f.read_text(encoding="utf-8")]
    assert not left, f"{english!r} is still in {left}"


def test_index_redirects_to_intro(context, base_url):
    page = context.new_page()
    try:
        page.goto(base_url + "index.html")
        page.wait_for_url(base_url + "intro.html", timeout=10000)
        assert page.title(), "intro.html has no title"
    finally:
        page.close()


def test_screenshots_cover_every_page(context, phone_context, base_url):
    for rel in PAGES:
        visit(context, base_url, rel)
        visit_phone(phone_context, base_url, rel)
    shots = {p.name for p in SHOTS.glob("*.png")}
    missing = [name for rel in PAGES for name in (_shot_name(rel), _shot_name(rel, "@390")) if name not in shots]
    assert not missing, f"no screenshot {missing}"


# --- As a reader meets the site on a phone (390×844) and a laptop (1280×800) ----------------

# Whether any element matching ``sel`` is on screen (null: none on the page). On a phone the
# theme moves the sidebar's content into a modal <dialog>; on a laptop folding slides it away.
_SIDEBAR_JS = """
(sel) => {
  const els = Array.from(document.querySelectorAll(sel));
  if (!els.length) return null;
  return els.some(el => {
    const r = el.getBoundingClientRect(), cs = getComputedStyle(el);
    return r.width > 50 && r.height > 20 && r.right > 5 && r.left < innerWidth - 5
           && cs.visibility !== 'hidden' && cs.display !== 'none';
  });
}
"""
PRIMARY = "nav.bd-docs-nav"  # the table of contents
SECONDARY = "nav.page-toc, nav.bd-toc-nav"  # the page outline
TOGGLE_PAGES = (["chapters/04_scaling.html"] if "chapters/04_scaling.html" in NOTEBOOK_PAGES
                else sorted(NOTEBOOK_PAGES)[:1]) or ["(no notebook pages)"]


def _click_visible(page, selector: str) -> str:
    """Click the one visible button matching ``selector``; return its tooltip."""
    buttons = page.locator(selector)
    visible = [i for i in range(buttons.count()) if buttons.nth(i).is_visible()]
    assert len(visible) == 1, f"{len(visible)} visible {selector} buttons (want exactly one)"
    button = buttons.nth(visible[0])
    title = button.get_attribute("title") or button.get_attribute("aria-label") or ""
    button.click()
    page.wait_for_timeout(500)  # the theme's slide-in transition
    return title


def _shown(page, selector: str) -> bool:
    state = page.evaluate(_SIDEBAR_JS, selector)
    assert state is not None, f"no {selector} on the page"
    return state


@pytest.mark.parametrize("rel", TOGGLE_PAGES)
def test_phone_menu_button_opens_the_table_of_contents(phone_context, base_url, rel):
    page, problems = open_page(phone_context, base_url, rel)
    try:
        assert not _shown(page, PRIMARY), "the table of contents is open before ☰ is tapped"
        title = _click_visible(page, ".primary-toggle")
        assert _shown(page, PRIMARY), "tapping ☰ did not open the table of contents"
        assert re.search(r"[\u4e00-\u9fff]", title), f"☰ has an English tooltip {title!r}"
        page.keyboard.press("Escape")
        page.wait_for_timeout(500)
        assert not _shown(page, PRIMARY), "Escape did not close the table of contents"
    finally:
        page.close()
    assert not problems, problems


@pytest.mark.parametrize("rel", TOGGLE_PAGES)
def test_phone_contents_button_opens_the_page_outline(phone_context, base_url, rel):
    page, problems = open_page(phone_context, base_url, rel)
    try:
        assert not _shown(page, SECONDARY), "the page outline is open before its button is tapped"
        title = _click_visible(page, ".secondary-toggle")
        assert _shown(page, SECONDARY), "tapping the page-contents button did not open the page outline"
        assert re.search(r"[\u4e00-\u9fff]", title), f"the page-contents button has an English tooltip {title!r}"
        page.keyboard.press("Escape")
        page.wait_for_timeout(500)
        assert not _shown(page, SECONDARY), "Escape did not close the page outline"
    finally:
        page.close()
    assert not problems, problems


@pytest.mark.parametrize("rel", TOGGLE_PAGES)
def test_laptop_menu_button_folds_and_unfolds_the_sidebar(context, base_url, rel):
    page, problems = open_page(context, base_url, rel)
    try:
        article = lambda: page.locator("article").bounding_box()["width"]  # noqa: E731
        assert _shown(page, PRIMARY), "the table of contents is not shown on a laptop"
        narrow = article()
        _click_visible(page, ".primary-toggle")
        assert not _shown(page, PRIMARY), "☰ did not fold the sidebar away"
        assert article() > narrow + 100, "the text did not take the sidebar's room"
        # Folding is not a modal pop-up: the text stays on top and clickable.
        assert page.evaluate("() => { const r = document.querySelector('article').getBoundingClientRect();"
                             " const e = document.elementFromPoint(r.left + r.width / 2, innerHeight / 2);"
                             " return !!(e && e.closest('article')); }"), "the text is covered after ☰"
        _click_visible(page, ".primary-toggle")
        assert _shown(page, PRIMARY), "☰ did not bring the sidebar back"
    finally:
        page.close()
    assert not problems, problems


def _header_problem(layout: dict) -> str | None:
    h = layout["header"]
    if h is None or h["height"] < 1:
        return None
    others = [c for c in h["controls"] if "搜索" not in c and "search" not in c.lower()]
    if not others:
        return f"a {h['height']:.0f}px header bar that holds only {h['controls']}"
    return None


@pytest.mark.parametrize("rel", PAGES)
def test_no_empty_header_bar(context, phone_context, base_url, rel):
    for size, r in (("1280×800", visit(context, base_url, rel)["layout"]), ("390×844", visit_phone(phone_context, base_url, rel))):
        problem = _header_problem(r)
        assert problem is None, f"{rel} at {size}: {problem}"


@pytest.mark.parametrize("rel", PAGES)
def test_phone_page_does_not_scroll_sideways(phone_context, base_url, rel):
    r = visit_phone(phone_context, base_url, rel)
    assert not r["problems"], f"{rel} at 390×844: " + "\n".join(r["problems"])
    assert r["pageWidth"] <= r["viewport"], f"{rel} is {r['pageWidth']}px wide in a {r['viewport']}px phone screen"
    assert r["screenshot"].is_file() and r["screenshot"].stat().st_size > 1000


@pytest.mark.parametrize("rel", PAGES)
def test_no_clipped_formula(context, phone_context, base_url, rel):
    for size, r in (("1280×800", visit(context, base_url, rel)["layout"]), ("390×844", visit_phone(phone_context, base_url, rel))):
        assert not r["clipped"], f"{rel} at {size}: formulas not fully visible: {r['clipped']}"


def _figures(report: dict, base_url: str) -> list[dict]:
    """The page's figures (images from notebook outputs) with their design width and scale."""
    out = []
    for f in report["layout"]["figures"]:
        if not f["inOutput"]:
            continue
        local = SITE / urllib.parse.unquote(f["src"][len(base_url):])
        design = _png_design_width(local) if local.suffix == ".png" else f["natural"]
        out.append({**f, "design": design, "scale": f["shown"] / design, "file": local.name})
    return out


@pytest.mark.parametrize("rel", PAGES)
def test_figures_are_large_sharp_and_described(context, base_url, rel):
    r = visit(context, base_url, rel)
    problems = []
    for f in _figures(r, base_url):
        if f["scale"] < MIN_FIGURE_SCALE - 1e-3:
            problems.append(f"{f['file']}: shown {f['shown']:.0f}px for a {f['design']:.0f}px design ({f['scale']:.2f}×)")
        if f["natural"] < 1.9 * f["shown"]:
            problems.append(f"{f['file']}: {f['natural']}px of pixels for {f['shown']:.0f}px shown (soft on 2x screens)")
        if not re.search(r"[\u4e00-\u9fff]", f["alt"]) or re.fullmatch(r"\S*\.(png|svg|jpe?g)|\S*/\S*", f["alt"]):
            problems.append(f"{f['file']}: alt text {f['alt']!r} does not say in Chinese what the figure shows")
    assert not problems, f"{rel} at 1280×800:\n" + "\n".join(problems)


def test_the_figure_checks_have_figures(context, base_url):
    found = {rel: len(_figures(visit(context, base_url, rel), base_url)) for rel in NOTEBOOK_PAGES}
    assert sum(found.values()) >= 10, f"too few figures found to check: {found}"


@pytest.mark.parametrize("rel", PAGES)
def test_no_testing_markers_shown(context, base_url, rel):
    assert not visit(context, base_url, rel)["layout"]["nbval"], (
        f"{rel} shows an NBVAL marker: tag the cell nbval-ignore-output instead of a # NBVAL comment")


def test_chinese_is_two_columns_in_printed_output(context, base_url):
    measured = {}
    for rel in sorted(NOTEBOOK_PAGES):
        cjk = visit(context, base_url, rel)["layout"]["cjk"]
        if cjk:
            measured[rel] = cjk
            # 6 Han characters against 12 Latin letters: equal widths when a Han character is 2 columns.
            assert abs(cjk["han"] - cjk["latin"]) <= LAYOUT_PX, (
                f"{rel}: 6 Chinese characters are {cjk['han']:.1f}px, 12 Latin letters {cjk['latin']:.1f}px "
                f"in printed output (font {cjk['family']}); put the CJK monospace font first in book.css")
    assert measured, "no page with printed output to measure"


@pytest.fixture(scope="module", autouse=True)
def site_report(base_url):
    """After the tests: per page, the smallest figure scale at 1280×800 and the width at 390 px."""
    yield
    rows = {}
    for rel in PAGES:
        row = {}
        if rel in _visits and "layout" in _visits[rel]:
            scales = [f["scale"] for f in _figures(_visits[rel], base_url)]
            row["figures"] = len(scales)
            row["smallest_figure_scale"] = round(min(scales), 3) if scales else None
        if rel in _phone_visits:
            row["width_at_390"] = _phone_visits[rel]["pageWidth"]
        if row:
            rows[rel] = row
    if rows:
        REPORT.parent.mkdir(parents=True, exist_ok=True)
        REPORT.write_text(json.dumps(rows, ensure_ascii=False, indent=1), encoding="utf-8")
