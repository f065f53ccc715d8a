"""attn_lib.figures.diagrams_decode: phone-readable diagrams (<= 7 in wide, text >= 9 pt, Chinese labels)."""
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from attn_lib.figures import diagrams_decode  # noqa: E402

HAN = re.compile(r"[\u4e00-\u9fff]")
DIAGRAMS = {
    "draw_split_kv": lambda: diagrams_decode.draw_split_kv(num_splits=3),
    "draw_split_kv_six": lambda: diagrams_decode.draw_split_kv(num_splits=6),
    "draw_busy_units": lambda: diagrams_decode.draw_busy_units(132, (8, 128), ("不拆分", "拆成 16 段")),
}


def _texts(fig):
    return [t for ax in fig.axes for t in (*ax.texts, ax.title) if isinstance(t, Text) and t.get_text().strip()]


def _colours(ax):
    return [tuple(p.get_facecolor()) for p in ax.patches if isinstance(p, Rectangle)]


@pytest.mark.parametrize("name", sorted(DIAGRAMS))
def test_diagram_fits_a_phone_and_speaks_chinese(name):
    fig = DIAGRAMS[name]()
    try:
        width, height = fig.get_size_inches()
        assert width <= 7.0 and height <= 7.0, (width, height)
        texts = _texts(fig)
        assert texts, "a diagram without labels"
        assert min(t.get_fontsize() for t in texts) >= diagrams_decode.MIN_FONT_PT
        assert any(HAN.search(t.get_text()) for t in texts), "no Chinese label"
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        box = fig.bbox
        for t in texts:
            ext = t.get_window_extent(renderer)
            assert ext.x0 >= box.x0 and ext.x1 <= box.x1, f"{t.get_text()!r} sticks out sideways"
            assert ext.y0 >= box.y0 and ext.y1 <= box.y1, f"{t.get_text()!r} sticks out vertically"
    finally:
        plt.close(fig)


@pytest.mark.parametrize("P", [1, 2, 3, 6])
def test_split_kv_draws_each_split_with_its_partial_and_one_merge(P):
    fig = diagrams_decode.draw_split_kv(num_splits=P)
    try:
        labels = [t.get_text() for t in _texts(fig)]
        assert [s for s in labels if s.startswith("K 第")] == [f"K 第 {p} 段" for p in range(1, P + 1)]
        assert [s for s in labels if s.startswith("V 第")] == [f"V 第 {p} 段" for p in range(1, P + 1)]
        assert [s for s in labels if s.startswith("o")] == [f"o{p}，lse{p}" for p in range(1, P + 1)]
        assert sum(s.startswith("合并") for s in labels) == 1
        assert any(f"切成 {P} 段" in s for s in labels)
        colours = _colours(fig.axes[0])
        for p in range(P):  # K, V and the partial of split p share its colour
            assert colours.count(matplotlib.colors.to_rgba(diagrams_decode.SPLIT_COLORS[p])) == 3
        unused = {matplotlib.colors.to_rgba(c) for c in diagrams_decode.SPLIT_COLORS[P:]}
        assert not unused & set(colours)
    finally:
        plt.close(fig)


def test_busy_units_colours_one_square_per_program_instance():
    fig = diagrams_decode.draw_busy_units(40, (8, 64), ("不拆分", "拆成 8 段"), per_row=10)
    try:
        busy = matplotlib.colors.to_rgba(diagrams_decode.SPLIT_COLORS[0])
        idle = matplotlib.colors.to_rgba(diagrams_decode.IDLE_COLOR)
        counts = [(_colours(ax).count(busy), _colours(ax).count(idle)) for ax in fig.axes]
        assert counts == [(8, 32), (40, 0)]  # 64 instances keep all 40 units busy
        assert [ax.title.get_text() for ax in fig.axes] == ["不拆分：8 个程序实例，8 / 40 个计算单元有活",
                                                            "拆成 8 段：64 个程序实例，40 / 40 个计算单元有活"]
    finally:
        plt.close(fig)


@pytest.mark.parametrize("call, match", [
    (lambda: diagrams_decode.draw_split_kv(num_splits=0), "num_splits must be an int in 1..6"),
    (lambda: diagrams_decode.draw_split_kv(num_splits=7), "num_splits must be an int in 1..6"),
    (lambda: diagrams_decode.draw_split_kv(num_splits=True), "num_splits must be an int in 1..6"),
    (lambda: diagrams_decode.draw_busy_units(0, (1,), ("a",)), "num_units must be an int in 1..264"),
    (lambda: diagrams_decode.draw_busy_units(8, (1, 2), ("a",)), "busy must be 1..3 ints >= 0 with one label"),
    (lambda: diagrams_decode.draw_busy_units(8, (-1,), ("a",)), "busy must be 1..3 ints >= 0 with one label"),
    (lambda: diagrams_decode.draw_busy_units(8, (), ()), "busy must be 1..3 ints >= 0 with one label"),
])
def test_bad_arguments_get_one_clear_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()
