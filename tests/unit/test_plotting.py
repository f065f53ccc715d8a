"""attn_lib.figures.plotting: figures get the Chinese font without changing matplotlib's global state.

What these tests protect: a plotting call must not change global rcParams, nor rebuild the
font list with matplotlib's private ``font_manager._load_fontmanager`` (both once happened on
every call). Only the explicit
``setup_chinese_font()`` touches rcParams; the plotting functions draw inside
``book_style()`` (a ``matplotlib.rc_context``) and name the CJK font on their own text.
"""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib as mpl  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib import font_manager  # noqa: E402
from matplotlib.ft2font import FT2Font  # noqa: E402

from attn_lib.figures import plotting  # noqa: E402
from attn_lib.core import worked_example as we  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def default_rc():
    """matplotlib's own defaults (no Chinese font), restored afterwards."""
    with mpl.rc_context():
        mpl.rcdefaults()
        yield
    plt.close("all")


def _draws_han(text) -> bool:
    """Whether the font matplotlib picks for this Text artist has a glyph for 注."""
    path = font_manager.findfont(text.get_fontproperties(), fallback_to_default=False)
    return FT2Font(path).get_char_index(ord("注")) != 0


def _rc_snapshot() -> dict:
    return {k: v for k, v in mpl.rcParams.items() if k not in ("backend", "backend_fallback")}


def _all_plots():
    ax = plotting.show_heatmap(torch.tensor([[0.5, 0.5], [0.2, 0.8]]), row_labels=["它", "水"],
                               col_labels=["书", "打翻"], title="注意力分数")
    fig = plotting.show_heatmaps(torch.rand(2, 3, 3), titles=["头 1", "头 2"], row_labels=["桌", "上", "水"])
    bar = plotting.bar_scores([0.61, 0.06, 0.33], ["水", "书", "打翻"], title="比例")
    steps = flash_steps.show_flash_steps([(0, 0, False), (0, 3, True)], suptitle="分块")
    return ax, fig, bar, steps


def test_plot_functions_leave_global_settings_alone(default_rc):
    plotting.find_chinese_font()  # the font lookup itself may register fonts; not a setting
    before = _rc_snapshot()
    _all_plots()
    after = _rc_snapshot()
    changed = sorted(k for k in before if before[k] != after[k])
    assert not changed, f"plotting changed global rcParams: {changed}"


def test_plot_text_uses_a_cjk_font_even_with_default_settings(default_rc):
    assert mpl.rcParams["font.family"] == ["sans-serif"] and "Noto Sans CJK SC" not in mpl.rcParams["font.sans-serif"][:1]
    ax, fig, bar, steps = _all_plots()
    for figure in (ax.figure, fig, bar.figure, steps):
        figure.canvas.draw()  # tick labels exist once drawn, outside any style context
    texts = [ax.title, bar.title, *ax.get_xticklabels(), *ax.get_yticklabels(), *bar.get_xticklabels(),
             fig.axes[0].title, steps._suptitle, steps.axes[0].title]
    assert texts and all(t.get_text() for t in texts)
    missing = [t.get_text() for t in texts if not _draws_han(t)]
    assert not missing, f"drawn without a CJK font: {missing}"


def test_setup_chinese_font_is_the_one_global_switch(default_rc):
    font = plotting.setup_chinese_font(force=True)
    assert font is not None, plotting.NO_FONT_MESSAGE
    assert mpl.rcParams["font.sans-serif"][0] == font and mpl.rcParams["axes.unicode_minus"] is False


def test_no_private_matplotlib_api():
    source = (ROOT / "attn_lib" / "figures" / "plotting.py").read_text(encoding="utf-8")
    private = re.findall(r"(?:font_manager|mpl|matplotlib|plt)\._\w+", source)
    assert not private, f"attn_lib/figures/plotting.py uses private matplotlib names: {private}"
    assert "rcParams[" not in source.split("def setup_chinese_font", 1)[0], "rcParams set outside setup_chinese_font"


def test_figures_fit_the_column():
    fig = plotting.show_heatmaps(torch.rand(4, 15, 15), ncols=2)
    assert fig.get_size_inches()[0] <= plotting.MAX_WIDTH_IN
    ax = plotting.bar_scores(list(range(12)), [f"键{i}" for i in range(12)])
    assert ax.figure.get_size_inches()[0] <= plotting.MAX_WIDTH_IN
    steps = flash_steps.show_flash_steps([(0, 0, False), (1, 2, False), (1, 3, True)])
    assert len(steps.axes) == 3 and steps.get_size_inches()[0] <= plotting.MAX_WIDTH_IN
    plt.close("all")


def test_flash_step_drawing_marks_the_blocks_of_the_step():
    _, ax = plt.subplots()
    plotting.draw_flash_step(ax, 1, 2, n=4, write_out=True)
    labels = {t.get_text() for t in ax.texts}
    assert {"Q1", "K2", "V2", "acc1", "写 O1", "读 K、V"} <= labels
    red = {t.get_text() for t in ax.texts if t.get_color() == "white"}  # text on dark red blocks
    assert red == {"K2", "V2", "O1"}  # Q1 stays on chip (light red), O1 is written back
    plt.close("all")


@pytest.mark.parametrize("args, kwargs, exc, match", [
    ((1.0, 0), {}, TypeError, r"i must be an int"),
    ((0, True), {}, TypeError, r"j must be an int"),
    ((4, 0), {}, ValueError, r"0 <= i, j < n"),
    ((0, 0), {"write_out": "yes"}, TypeError, r"write_out must be a bool"),
])
def test_draw_flash_step_refuses_bad_input(args, kwargs, exc, match):
    _, ax = plt.subplots()
    with pytest.raises(exc, match=match):
        plotting.draw_flash_step(ax, *args, **kwargs)
    plt.close("all")


def test_show_flash_steps_refuses_no_steps():
    with pytest.raises(ValueError, match="at least one"):
        plotting.show_flash_steps([])


# --- the CJK font and the labels of every plot ------------------------------------------------
def test_plots_use_a_cjk_font_and_label_cells():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import font_manager

    font = plotting.setup_chinese_font(force=True)
    assert font is not None, plotting.NO_FONT_MESSAGE
    path = font_manager.findfont(font_manager.FontProperties(family=font), fallback_to_default=False)
    from matplotlib.ft2font import FT2Font

    assert FT2Font(path).get_char_index(ord("水")) != 0, "chosen font has no glyph for 水"
    ax = plotting.show_heatmap(torch.tensor([[0.61, 0.06, float("-inf")]]), row_labels=["它"],
                               col_labels=list(we.KEY_TOKENS), title="注意力分数")
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["0.61", "0.06", "-∞"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["水", "书", "打翻"]
    fig = plotting.show_heatmaps(torch.rand(3, 2, 2), titles=["头 1", "头 2", "头 3"], ncols=2)
    assert len(fig.axes) == 4
    ax = plotting.bar_scores([0.61, 0.06, 0.33], list(we.KEY_TOKENS))
    assert [t.get_text() for t in ax.texts] == ["0.61", "0.06", "0.33"]
    plt.close("all")


def test_missing_font_message(monkeypatch):
    from attn_lib.figures import fonts

    monkeypatch.setattr(fonts, "find_chinese_font", lambda: None)  # no system font and no bundled one
    with pytest.warns(UserWarning, match="fonts-noto-cjk"):
        assert plotting.setup_chinese_font(force=True) is None
    monkeypatch.undo()
    assert plotting.setup_chinese_font(force=True) is not None
