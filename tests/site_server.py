"""Helpers for the website tests: find the built site, serve it on 127.0.0.1, start Chromium.

Used by tests/book/test_site.py and test_site_reading.py (in the browser) and tests/book/test_links.py (static crawl).
The site is ``_build/html`` (``make book`` builds it; ``make test`` builds it before the
tests); set ``ATTN_BOOK_HTML`` to test a site built elsewhere
(``jupyter-book build --path-output DIR .`` puts it in ``DIR/_build/html``).
"""
from __future__ import annotations

import contextlib
import functools
import http.server
import os
import threading
from pathlib import Path
from typing import Iterator

import yaml

from book_helpers import ROOT  # noqa: E402  (tests/ is on sys.path: conftest.py)
SITE = Path(os.environ.get("ATTN_BOOK_HTML", ROOT / "_build" / "html")).resolve()

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# Pages Sphinx writes that are not content pages (no launch buttons, no article text).
SPECIAL_PAGES = {"genindex.html", "search.html", "index.html"}


def site_missing_message() -> str | None:
    """站点没建好时返回一句说明怎么建的话;建好了返回 None。"""
    if not (SITE / "intro.html").is_file():
        return (
            f"the built website is missing: {SITE / 'intro.html'} does not exist. Build it first "
            "with `make book` (or `.venv/bin/jupyter-book build --warningiserror --keep-going .`); "
            "`make test` builds it before running the tests."
        )
    return None


def html_pages() -> list[str]:
    """站点里全部页面(相对路径,正斜杠),不含 _static/ 与 _sources/ 里的文件。"""
    if site_missing_message():
        return []
    pages = []
    for path in sorted(SITE.rglob("*.html")):
        rel = path.relative_to(SITE).as_posix()
        if rel.split("/")[0] in ("_static", "_sources", "_images"):
            continue
        pages.append(rel)
    return pages


def notebook_pages() -> dict[str, str]:
    """每个由 notebook 生成的页面 -> 它在仓库里的 .ipynb 路径,例如 chapters/01_x.html -> chapters/01_x.ipynb。"""
    out = {}
    for page in html_pages():
        nb = ROOT / (page[: -len(".html")] + ".ipynb")
        if nb.is_file():
            out[page] = nb.relative_to(ROOT).as_posix()
    return out


def book_config() -> dict:
    """读 _config.yml。"""
    return yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))


def repository() -> tuple[str, str, str]:
    """_config.yml 里的仓库:返回 (url, "owner/name", branch)。"""
    repo = book_config()["repository"]
    url = repo["url"].rstrip("/")
    prefix = "https://github.com/"
    if not url.startswith(prefix):
        raise AssertionError(f"repository.url in _config.yml must be a GitHub URL, got {url!r}")
    return url, url[len(prefix):], repo.get("branch", "main")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - signature fixed by the base class
        pass


@contextlib.contextmanager
def serve(directory: Path = SITE) -> Iterator[str]:
    """在 127.0.0.1 的一个空闲端口上用后台线程提供 ``directory``;产出根 URL(以 / 结尾)。"""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="site-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def launch_chromium(playwright):
    """用 Debian 的 Chromium 启动一个无头浏览器(全新的临时用户目录,不装 Playwright 自带的浏览器)。"""
    if not Path(CHROMIUM).exists():
        raise AssertionError(
            f"{CHROMIUM} is missing. Install the system packages the tests need with "
            "`bash scripts/install-system-deps.sh` (Debian: apt-get install chromium fonts-noto-cjk); "
            "never `playwright install`."
        )
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def offline_context(browser, base_url: str, viewport: dict):
    """一个只连得到本地服务器的浏览器上下文：发往其他主机的请求都被拦下（记在 ``ctx.blocked`` 里）。"""
    ctx = browser.new_context(viewport=viewport, color_scheme="light", locale="zh-CN")
    blocked: list[str] = []

    def only_local(route):
        if route.request.url.startswith(base_url):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    ctx.route("**/*", only_local)
    ctx.blocked = blocked  # type: ignore[attr-defined]
    return ctx


def watch_page(page, problems: list[str]) -> None:
    """把页面的控制台错误、脚本异常、失败的请求和 4xx/5xx 响应记进 ``problems``。"""
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} ({r.failure})"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)


def wait_for_page(page) -> None:
    """等 MathJax 排完公式、每张图解码完、网络空闲。"""
    if page.evaluate("() => !!(window.MathJax && window.MathJax.startup)"):
        page.wait_for_function("() => window.MathJax.startup.promise !== undefined", timeout=15000)
        page.evaluate("() => window.MathJax.startup.promise.then(() => true)")
    page.evaluate(
        "() => Promise.all(Array.from(document.images).map(i => { i.loading = 'eager';"
        " return i.decode().catch(() => null); }))"
    )
    page.wait_for_load_state("networkidle")


def open_page(ctx, base_url: str, rel: str):
    """在 ``ctx`` 里打开站点的一页并等它排好；返回 ``(page, problems)``（站点没建好或没有这一页时测试失败）。"""
    import pytest

    missing = site_missing_message()
    if missing or rel not in html_pages():
        pytest.fail(missing or f"{rel} is not in the built site")
    page = ctx.new_page()
    problems: list[str] = []
    watch_page(page, problems)
    page.goto(base_url + rel, wait_until="load")
    wait_for_page(page)
    return page, problems
