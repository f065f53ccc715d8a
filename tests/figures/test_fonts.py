"""attn_lib.figures.fonts: ``setup_chinese_font`` is the one global switch, its font draws Han characters, and a
machine without any CJK font gets one warning that says how to install one. (The bundled font file itself:
tests/book/test_bundled_font.py.)"""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib as mpl
import pytest
from matplotlib import font_manager
from matplotlib.ft2font import FT2Font

from attn_lib.figures import fonts, plotting


def test_setup_chinese_font_is_the_one_global_switch(default_rc):
    font = fonts.setup_chinese_font(force=True)
    assert font is not None, fonts.NO_FONT_MESSAGE
    assert mpl.rcParams["font.sans-serif"][0] == font and mpl.rcParams["axes.unicode_minus"] is False
    assert mpl.rcParams["font.family"] == ["sans-serif"]
    assert plotting.setup_chinese_font is fonts.setup_chinese_font  # the re-export the chapters import


def test_the_chosen_font_draws_han_characters(default_rc):
    font = fonts.setup_chinese_font(force=True)
    assert font is not None, fonts.NO_FONT_MESSAGE
    path = font_manager.findfont(font_manager.FontProperties(family=font), fallback_to_default=False)
    assert FT2Font(path).get_char_index(ord("水")) != 0, "chosen font has no glyph for 水"


def test_missing_font_message(monkeypatch, default_rc):
    monkeypatch.setattr(fonts, "find_chinese_font", lambda: None)  # no system font and no bundled one
    with pytest.warns(UserWarning, match="fonts-noto-cjk"):
        assert fonts.setup_chinese_font(force=True) is None
    monkeypatch.undo()
    assert fonts.setup_chinese_font(force=True) is not None


def test_no_private_matplotlib_api_and_rcparams_only_in_the_switch():
    source = Path(fonts.__file__).read_text(encoding="utf-8")
    private = re.findall(r"(?:font_manager|mpl|matplotlib|plt)\._\w+", source)
    assert not private, f"attn_lib/figures/fonts.py uses private matplotlib names: {private}"
    before, _ = source.split("def setup_chinese_font", 1)
    assert "rcParams[" not in before, "rcParams set outside setup_chinese_font"


def test_the_bundled_font_ships_inside_the_package():
    assert fonts.BUNDLED_FONT_PATH.is_file() and fonts.BUNDLED_LICENSE_PATH.is_file()
    assert fonts.FONT_DIR == Path(fonts.__file__).resolve().parents[1] / "data" / "fonts"
