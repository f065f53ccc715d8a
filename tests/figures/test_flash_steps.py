"""attn_lib.figures.flash_steps: chapter 08's tiling figure marks the blocks of each step, fits the column, uses the
Chinese font without changing matplotlib's global settings, and names bad arguments."""
from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt
import pytest
from matplotlib import font_manager
from matplotlib.ft2font import FT2Font

from attn_lib.figures import flash_steps
from attn_lib.figures.plotting import MAX_WIDTH_IN


def _rc_snapshot() -> dict:
    return {k: v for k, v in mpl.rcParams.items() if k not in ("backend", "backend_fallback")}


def test_flash_step_drawing_marks_the_blocks_of_the_step():
    _, ax = plt.subplots()
    flash_steps.draw_flash_step(ax, 1, 2, n=4, write_out=True)
    labels = {t.get_text() for t in ax.texts}
    assert {"Q1", "K2", "V2", "acc1", "写 O1", "读 K、V"} <= labels
    red = {t.get_text() for t in ax.texts if t.get_color() == "white"}  # text on dark red blocks
    assert red == {"K2", "V2", "O1"}  # Q1 stays on chip (light red), O1 is written back
    plt.close("all")


def test_show_flash_steps_draws_one_panel_per_step_within_the_column():
    steps = flash_steps.show_flash_steps([(0, 0, False), (1, 2, False), (1, 3, True)])
    assert len(steps.axes) == 3 and steps.get_size_inches()[0] <= MAX_WIDTH_IN
    plt.close("all")


def test_the_steps_figure_leaves_global_settings_alone_and_speaks_chinese(default_rc):
    before = _rc_snapshot()
    fig = flash_steps.show_flash_steps([(0, 0, False), (0, 3, True)], suptitle="分块")
    assert _rc_snapshot() == before
    fig.canvas.draw()
    for text in (fig._suptitle, fig.axes[0].title):
        assert text.get_text()
        path = font_manager.findfont(text.get_fontproperties(), fallback_to_default=False)
        assert FT2Font(path).get_char_index(ord("块")) != 0, f"drawn without a CJK font: {text.get_text()}"


@pytest.mark.parametrize("args, kwargs, exc, match", [
    ((1.0, 0), {}, TypeError, r"i must be an int"),
    ((0, True), {}, TypeError, r"j must be an int"),
    ((4, 0), {}, ValueError, r"0 <= i, j < n"),
    ((0, 0), {"write_out": "yes"}, TypeError, r"write_out must be a bool"),
])
def test_draw_flash_step_refuses_bad_input(args, kwargs, exc, match):
    _, ax = plt.subplots()
    with pytest.raises(exc, match=match):
        flash_steps.draw_flash_step(ax, *args, **kwargs)
    plt.close("all")


def test_show_flash_steps_refuses_no_steps():
    with pytest.raises(ValueError, match="at least one"):
        flash_steps.show_flash_steps([])
