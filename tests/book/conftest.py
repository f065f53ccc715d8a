"""Fixtures the browser tests share (test_site.py, test_site_reading.py): the built site served on
127.0.0.1 and Debian's headless Chromium, one of each per test module."""
from __future__ import annotations

import pytest

from site_server import SITE, launch_chromium, serve, site_missing_message


@pytest.fixture(scope="module")
def base_url():
    """The root URL of the built site, served on a free local port (a missing site fails)."""
    missing = site_missing_message()
    if missing:
        pytest.fail(missing)
    with serve(SITE) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium, headless, driven by playwright (never a browser playwright downloads)."""
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
