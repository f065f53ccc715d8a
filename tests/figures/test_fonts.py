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


RARE = "\u4dae"  # 䶮, CJK Ext-A: outside the bundled subset (tests/book/test_bundled_font.py checks that)


@pytest.fixture
def bundled_only(monkeypatch, default_rc):
    """setup_chinese_font() as on a machine without a CJK font: it picks the bundled subset; undone afterwards."""
    monkeypatch.setattr(fonts, "find_chinese_font", fonts.register_bundled_font)
    yield
    monkeypatch.undo()
    fonts.setup_chinese_font(force=True)


def _draw(*labels: str) -> None:
    import io

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.set_title(labels[0])
    for i, label in enumerate(labels[1:]):
        ax.text(0.1, 0.2 * i, label)
    for fmt in ("png", "pdf", "svg"):
        fig.savefig(io.BytesIO(), format=fmt)
    fig.canvas.draw()
    plt.close(fig)


def test_a_character_outside_the_subset_gives_one_warning_with_the_remedy(bundled_only):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # before the set-up, as a notebook's filters are
        assert fonts.setup_chinese_font(force=True) == fonts.BUNDLED_FAMILY
        assert ord(RARE) not in FT2Font(str(fonts.BUNDLED_FONT_PATH)).get_charmap()
        _draw(f"蒸馏 {RARE}{RARE}", f"x {RARE}")
        first = [str(w.message) for w in caught]
        _draw(f"第二张图 {RARE}")  # the same character again: already named
        again = [str(w.message) for w in caught][len(first):]
    assert len(first) == 1 and caught[0].category is fonts.MissingGlyphsWarning, first
    assert "1 个字符" in first[0] and f"{RARE}（U+{ord(RARE):04X}）" in first[0], first[0]
    assert "sudo apt-get install fonts-noto-cjk" in first[0] and "!apt-get install -y fonts-noto-cjk" in first[0]
    assert again == [], again


def test_a_new_missing_character_is_named_once_more_and_other_warnings_stay(bundled_only):
    import warnings

    other = "\u4db5"  # U+4DB5, also CJK Ext-A
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fonts.setup_chinese_font(force=True)
        _draw(RARE)
        _draw(f"{RARE} {other}")
        warnings.warn("an unrelated warning")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots()
        ax.set_title("中", fontfamily="DejaVu Sans")  # not the subset: matplotlib's own warning stays
        fig.canvas.draw()
    messages = [str(w.message) for w in caught]
    ours = [m for m in messages if "attn_lib 自带的中文字体" in m]
    assert len(ours) == 2 and RARE in ours[0] and other in ours[1] and RARE not in ours[1], ours
    assert "an unrelated warning" in messages
    assert any(m.startswith("Glyph 20013 ") and m.endswith("missing from font(s) DejaVu Sans.") for m in messages), messages


def test_with_a_system_font_nothing_is_watched(default_rc):
    font = fonts.setup_chinese_font(force=True)
    assert font in fonts.CJK_FONT_CANDIDATES, font  # Noto CJK is installed on this machine
    assert fonts.FIGURE_HOOK not in mpl.rcParams["figure.hooks"]


def test_figure_code_asks_only_for_the_weight_the_bundled_font_has():
    """The bundled subset is one regular weight: a bold label makes matplotlib print a findfont warning on
    stderr (a notebook output) on every machine without a system CJK font, e.g. Colab."""
    root = Path(fonts.__file__).resolve().parent
    found = [f"{p.name}:{n}" for p in sorted(root.glob("*.py"))
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"(font)?weight\s*=\s*['\"](bold|heavy|semibold|demibold|black)", line)]
    assert not found, f"bold text in figure code (the bundled font has no bold): {found}"
