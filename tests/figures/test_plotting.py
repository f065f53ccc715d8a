"""attn_lib.figures.plotting: heatmaps and bar charts get the Chinese font without changing matplotlib's global state.

What these tests protect: a plotting call must not change global rcParams, nor rebuild the
font list with matplotlib's private ``font_manager._load_fontmanager`` (both once happened on
every call). Only the explicit ``setup_chinese_font()`` (attn_lib.figures.fonts, tests/figures/test_fonts.py)
touches rcParams; the plotting functions draw inside ``book_style()`` (a ``matplotlib.rc_context``) and name
the CJK font on their own text. (The tiling figure: tests/figures/test_flash_steps.py.)
"""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib as mpl
import matplotlib.pyplot as plt
import torch
from matplotlib import font_manager
from matplotlib.ft2font import FT2Font

from attn_lib.core import worked_example as we
from attn_lib.figures import plotting


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
    return ax, fig, bar


def test_plot_functions_leave_global_settings_alone(default_rc):
    plotting.find_chinese_font()  # the font lookup itself may register fonts; not a setting
    before = _rc_snapshot()
    _all_plots()
    after = _rc_snapshot()
    changed = sorted(k for k in before if before[k] != after[k])
    assert not changed, f"plotting changed global rcParams: {changed}"


def test_plot_text_uses_a_cjk_font_even_with_default_settings(default_rc):
    assert mpl.rcParams["font.family"] == ["sans-serif"]
    assert "Noto Sans CJK SC" not in mpl.rcParams["font.sans-serif"][:1]
    ax, fig, bar = _all_plots()
    for figure in (ax.figure, fig, bar.figure):
        figure.canvas.draw()  # tick labels exist once drawn, outside any style context
    texts = [ax.title, bar.title, *ax.get_xticklabels(), *ax.get_yticklabels(), *bar.get_xticklabels(),
             fig.axes[0].title]
    assert texts and all(t.get_text() for t in texts)
    missing = [t.get_text() for t in texts if not _draws_han(t)]
    assert not missing, f"drawn without a CJK font: {missing}"


def test_no_private_matplotlib_api():
    source = Path(plotting.__file__).read_text(encoding="utf-8")
    private = re.findall(r"(?:font_manager|mpl|matplotlib|plt)\._\w+", source)
    assert not private, f"attn_lib/figures/plotting.py uses private matplotlib names: {private}"
    assert "rcParams[" not in source, "plotting sets rcParams (only fonts.setup_chinese_font may)"


def test_figures_fit_the_column():
    fig = plotting.show_heatmaps(torch.rand(4, 15, 15), ncols=2)
    assert fig.get_size_inches()[0] <= plotting.MAX_WIDTH_IN
    ax = plotting.bar_scores(list(range(12)), [f"键{i}" for i in range(12)])
    assert ax.figure.get_size_inches()[0] <= plotting.MAX_WIDTH_IN
    plt.close("all")


def test_plots_label_their_cells():
    ax = plotting.show_heatmap(torch.tensor([[0.61, 0.06, float("-inf")]]), row_labels=["它"],
                               col_labels=list(we.KEY_TOKENS), title="注意力分数")
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["0.61", "0.06", "\u2212∞"]  # a true minus sign, as $-\infty$ in the prose
    assert [t.get_text() for t in ax.get_xticklabels()] == ["水", "书", "打翻"]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("键", "查询")  # one name per term, as in the glossary
    fig = plotting.show_heatmaps(torch.rand(3, 2, 2), titles=["头 1", "头 2", "头 3"], ncols=2)
    assert len(fig.axes) == 4
    ax = plotting.bar_scores([0.61, 0.06, 0.33], list(we.KEY_TOKENS))
    assert [t.get_text() for t in ax.texts] == ["0.61", "0.06", "0.33"]
    plt.close("all")
