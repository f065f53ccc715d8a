"""Internal links of the built website: a crawl of _build/html, no browser needed.

Every ``href`` / ``src`` that points inside the site must name an existing file, and every
``#fragment`` must be an ``id`` (or ``name``) in the target page. Pages must not load
scripts, styles, fonts or images from other hosts (the site works offline). A missing site
fails with the command that builds it.
"""
from __future__ import annotations

import functools
import re
import urllib.parse
from pathlib import Path

import pytest
from bs4 import BeautifulSoup

from site_server import SITE, html_pages, site_missing_message

MISSING = site_missing_message()
PAGES = html_pages() or ["(site not built)"]

_LINK_ATTRS = (("a", "href"), ("link", "href"), ("img", "src"), ("script", "src"), ("source", "src"),
               ("iframe", "src"), ("video", "src"), ("audio", "src"))
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, data:, javascript: ...


@functools.lru_cache(maxsize=None)
def _soup(path: Path) -> BeautifulSoup:
    return BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


@functools.lru_cache(maxsize=None)
def _anchors(path: Path) -> frozenset[str]:
    soup = _soup(path)
    ids = {el["id"] for el in soup.find_all(id=True)}
    names = {el["name"] for el in soup.find_all("a", attrs={"name": True})}
    return frozenset(ids | names)


def _links(page: str):
    soup = _soup(SITE / page)
    for tag, attr in _LINK_ATTRS:
        for el in soup.find_all(tag, attrs={attr: True}):
            yield tag, el[attr].strip()
    for el in soup.find_all("meta", attrs={"http-equiv": re.compile("^refresh$", re.I)}):
        m = re.search(r"url=(.+)$", el.get("content", ""), flags=re.I)
        if m:
            yield "meta refresh", m.group(1).strip()


def _require_site():
    if MISSING:
        pytest.fail(MISSING)


@pytest.mark.parametrize("page", PAGES)
def test_internal_links_resolve(page):
    _require_site()
    broken = []
    checked = 0
    for tag, url in _links(page):
        if not url or _EXTERNAL.match(url) or url.startswith("//"):
            continue
        parts = urllib.parse.urlsplit(url)
        target = (SITE / page).parent if parts.path else None
        if parts.path:
            target = ((SITE / page).parent / urllib.parse.unquote(parts.path)).resolve()
            if parts.path.endswith("/") or target.is_dir():
                target = target / "index.html"
            if SITE not in target.parents:
                broken.append(f"<{tag}> {url}: points outside the site")
                continue
            if not target.is_file():
                broken.append(f"<{tag}> {url}: no file {target.relative_to(SITE)}")
                continue
        else:
            target = SITE / page
        checked += 1
        fragment = urllib.parse.unquote(parts.fragment)
        if fragment and target.suffix == ".html" and fragment not in _anchors(target):
            broken.append(f"<{tag}> {url}: no id {fragment!r} in {target.relative_to(SITE)}")
    assert checked > 0, f"{page}: no internal link at all?"
    assert not broken, f"{page}: broken internal links:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", PAGES)
def test_nothing_loaded_from_other_hosts(page):
    """Scripts, styles, images and fonts all come from the site itself (no CDN)."""
    _require_site()
    external = [f"<{tag}> {url}" for tag, url in _links(page)
                if tag != "a" and (url.startswith(("http:", "https:", "//")))]
    assert not external, f"{page} loads from other hosts: {external}"
    html = (SITE / page).read_text(encoding="utf-8")
    cdn = sorted(set(re.findall(r"https?://(?:cdn\.jsdelivr\.net|unpkg\.com|cdnjs\.cloudflare\.com)[^\"' )]*", html)))
    assert not cdn, f"{page} names CDN URLs: {cdn}"


def test_glossary_terms_are_linked_from_chapters():
    """Chapters link their first use of a term to the glossary ({term} roles resolved)."""
    _require_site()
    chapters = [p for p in html_pages() if p.startswith("chapters/")]
    if not chapters:
        pytest.fail("the site has no chapter pages")
    linking = [p for p in chapters
               if any("glossary.html#term-" in url for tag, url in _links(p) if tag == "a")]
    assert linking == chapters, f"chapters without a link to a glossary term: {sorted(set(chapters) - set(linking))}"
