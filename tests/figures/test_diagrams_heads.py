"""attn_lib.figures.diagrams_heads: phone-readable diagrams (<= 7 in wide, text >= 9 pt, Chinese labels)."""
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from attn_lib.figures import diagrams_heads  # noqa: E402
from figure_text import assert_subscripts_in_mathtext  # noqa: E402

HAN = re.compile(r"[\u4e00-\u9fff]")
DIAGRAMS = {
    "draw_multihead_flow": lambda: diagrams_heads.draw_multihead_flow(num_heads=3),
    "draw_recompute": diagrams_heads.draw_recompute,
    "draw_rotation": lambda: diagrams_heads.draw_rotation(theta=0.5, positions=(0, 1, 2, 3)),
}


def _texts(fig):
    # the labels drawn on the axes (ax.text, titles), not the hidden tick labels of an axis turned off
    return [t for ax in fig.axes for t in (*ax.texts, ax.title) if isinstance(t, Text) and t.get_text().strip()]


@pytest.mark.parametrize("name", sorted(DIAGRAMS))
def test_diagram_fits_a_phone_and_speaks_chinese(name):
    fig = DIAGRAMS[name]()
    try:
        width, height = fig.get_size_inches()
        assert width <= 7.0 and height <= 7.0, (width, height)
        texts = _texts(fig)
        assert texts, "a diagram without labels"
        assert min(t.get_fontsize() for t in texts) >= diagrams_heads.MIN_FONT_PT
        assert any(HAN.search(t.get_text()) for t in texts), "no Chinese label"
        fig.canvas.draw()  # every label lies inside the figure
        renderer = fig.canvas.get_renderer()
        box = fig.bbox
        for t in texts:
            ext = t.get_window_extent(renderer)
            assert ext.x0 >= box.x0 and ext.x1 <= box.x1, f"{t.get_text()!r} sticks out sideways"
    finally:
        plt.close(fig)


@pytest.mark.parametrize("name", sorted(DIAGRAMS))
def test_diagram_writes_subscripts_in_mathtext(name):
    assert_subscripts_in_mathtext(DIAGRAMS[name])


def test_multihead_flow_draws_one_colour_per_head():
    for n in (1, 2, 3):
        fig = diagrams_heads.draw_multihead_flow(num_heads=n)
        try:
            colours = {tuple(p.get_facecolor()) for p in fig.axes[0].patches if isinstance(p, Rectangle)}
            head_colours = {tuple(matplotlib.colors.to_rgba(c)) for c in diagrams_heads.HEAD_COLORS[:n]}
            assert head_colours <= colours
            other = {tuple(matplotlib.colors.to_rgba(c)) for c in diagrams_heads.HEAD_COLORS[n:]}
            assert not (other & colours), f"{n} heads drawn with the colour of a head that is not there"
            labels = [t.get_text() for t in _texts(fig)]
            assert sum(label.startswith("头 ") for label in labels) == n
        finally:
            plt.close(fig)


def test_rotation_labels_every_position():
    fig = diagrams_heads.draw_rotation(theta=0.3, positions=(0, 2, 5))
    try:
        labels = [t.get_text() for t in _texts(fig)]
        assert [label for label in labels if label.startswith("位置")] == ["位置 0：不转", "位置 2：转 2θ", "位置 5：转 5θ"]
    finally:
        plt.close(fig)


@pytest.mark.parametrize("call, match", [
    (lambda: diagrams_heads.draw_multihead_flow(num_heads=4), "num_heads must be an int in 1..3"),
    (lambda: diagrams_heads.draw_multihead_flow(num_heads=True), "num_heads must be an int in 1..3"),
    (lambda: diagrams_heads.draw_rotation(theta=2.0), "theta must be a number in"),
    (lambda: diagrams_heads.draw_rotation(positions=()), "positions must be 1..6 non-negative ints"),
    (lambda: diagrams_heads.draw_rotation(positions=(0, -1)), "positions must be 1..6 non-negative ints"),
])
def test_bad_arguments_get_one_clear_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()
