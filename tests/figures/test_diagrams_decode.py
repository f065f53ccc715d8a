"""attn_lib.figures.diagrams_decode: phone-readable diagrams (<= 7 in wide, text >= 9 pt, Chinese labels)."""
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from attn_lib.costs import decode_cost  # noqa: E402
from attn_lib.figures import diagrams_decode  # noqa: E402
from figure_text import assert_subscripts_in_mathtext  # noqa: E402

HAN = re.compile(r"[\u4e00-\u9fff]")
DIAGRAMS = {
    "draw_split_kv": lambda: diagrams_decode.draw_split_kv(num_splits=3),
    "draw_split_kv_six": lambda: diagrams_decode.draw_split_kv(num_splits=6),
    "draw_busy_units": lambda: diagrams_decode.draw_busy_units(132, (8, 128), ("不拆分", "拆成 16 段")),
    "draw_roofline": lambda: _roofline(),
}
# Chapter 13's roofline: the H100 SXM and the chapter's three kernels (MHA and GQA decode steps, a prefill).
CHAPTER_POINTS = [("解码步（MHA）", decode_cost.decode_step_cost(1, 32, 32, 16384, 128).intensity, "tab:red"),
                  ("解码步（GQA，4 个共用）", decode_cost.decode_step_cost(1, 32, 8, 16384, 128).intensity, "tab:orange"),
                  ("预填充 N = 4096", decode_cost.prefill_cost(1, 32, 8, 4096, 128).intensity, "tab:blue")]


def _roofline(gpu="H100 SXM", points=CHAPTER_POINTS):
    return diagrams_decode.draw_roofline(decode_cost.GPUS[gpu], points)


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


@pytest.mark.parametrize("name", sorted(DIAGRAMS))
def test_diagram_writes_subscripts_in_mathtext(name):
    assert_subscripts_in_mathtext(DIAGRAMS[name])


@pytest.mark.parametrize("P", [1, 2, 3, 6])
def test_split_kv_draws_each_split_with_its_partial_and_one_merge(P):
    fig = diagrams_decode.draw_split_kv(num_splits=P)
    try:
        labels = [t.get_text() for t in _texts(fig)]
        assert [s for s in labels if s.startswith("K 第")] == [f"K 第 {p} 段" for p in range(1, P + 1)]
        assert [s for s in labels if s.startswith("V 第")] == [f"V 第 {p} 段" for p in range(1, P + 1)]
        assert [s for s in labels if s.startswith("$o_")] == [f"$o_{{{p}}}$，$\\mathrm{{lse}}_{{{p}}}$" for p in range(1, P + 1)]
        assert sum(s.startswith("合并") for s in labels) == 1
        assert any(f"切成 {P} 段" in s for s in labels)
        colours = _colours(fig.axes[0])
        for p in range(P):  # K, V and the partial of split p share its colour
            assert colours.count(matplotlib.colors.to_rgba(diagrams_decode.SPLIT_COLORS[p])) == 3
        unused = {matplotlib.colors.to_rgba(c) for c in diagrams_decode.SPLIT_COLORS[P:]}
        assert not unused & set(colours)
    finally:
        plt.close(fig)


def _crosses(p, q, box) -> bool:
    """Whether the segment p-q (display coordinates) meets the rectangle ``box`` (Liang-Barsky clipping)."""
    t0, t1 = 0.0, 1.0
    d = (q[0] - p[0], q[1] - p[1])
    for delta, lo, hi, start in ((d[0], box.x0, box.x1, p[0]), (d[1], box.y0, box.y1, p[1])):
        if delta == 0:
            if not lo <= start <= hi:
                return False
            continue
        a, b = (lo - start) / delta, (hi - start) / delta
        t0, t1 = max(t0, min(a, b)), min(t1, max(a, b))
        if t0 > t1:
            return False
    return True


def _overlaps(fig):
    """Every text of the axes that a drawn line runs through, covers a marker, or overlaps another text."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    texts = [(t.get_text().replace("\n", " / "), t.get_window_extent(renderer).padded(2)) for t in ax.texts]
    found = []
    drawn = [(line.get_transform().transform(line.get_xydata()),
              line.get_markersize() * fig.dpi / 72 / 2 if line.get_marker() not in (None, "", "None") else 0)
             for line in ax.get_lines()]
    drawn += [(c.get_transform().transform(seg), 0) for c in ax.collections if isinstance(c, LineCollection)
              for seg in c.get_segments()]
    for xy, half in drawn:
        for text, box in texts:
            if any(_crosses(p, q, box) for p, q in zip(xy[:-1], xy[1:])):
                found.append(f"a line runs through {text!r}")
            if half and any(box.x0 - half <= x <= box.x1 + half and box.y0 - half <= y <= box.y1 + half
                            for x, y in xy):
                found.append(f"{text!r} covers a marker")
    for i, (a, box_a) in enumerate(texts):
        found += [f"{a!r} overlaps {b!r}" for b, box_b in texts[i + 1:] if box_a.overlaps(box_b)]
        if not ax.bbox.contains(box_a.x0, box_a.y0) or not ax.bbox.contains(box_a.x1, box_a.y1):
            found.append(f"{a!r} leaves the axes")
    return found


def test_crossing_reader():
    from matplotlib.transforms import Bbox

    box = Bbox.from_extents(0, 0, 10, 10)
    assert _crosses((-5, 5), (15, 5), box) and _crosses((-1, -1), (11, 11), box) and _crosses((2, 2), (3, 3), box)
    assert not _crosses((-5, 11), (15, 11), box) and not _crosses((11, -20), (30, 20), box)
    assert not _crosses((-5, 0), (0, -5.1), box)


@pytest.mark.parametrize("gpu", sorted(decode_cost.GPUS))
def test_roofline_labels_stay_clear_of_the_lines_and_of_each_other(gpu):
    fig = _roofline(gpu)
    try:
        labels = [t.get_text() for t in fig.axes[0].texts]
        assert any("\n1 FLOP/字节" in s for s in labels) and any("\n4 FLOP/字节" in s for s in labels), labels
        assert _overlaps(fig) == []
    finally:
        plt.close(fig)


def test_the_overlap_check_sees_a_label_on_a_line():
    fig = _roofline()
    try:
        ax = fig.axes[0]
        ax.text(1.0, decode_cost.GPUS["H100 SXM"].bandwidth_tb_s, "on the slope", fontsize=9)
        ax.vlines(0.4, 50, 500)
        ax.text(0.4, 150, "on a vline", fontsize=9)
        assert sorted(_overlaps(fig)) == ["'on the slope' covers a marker", "a line runs through 'on a vline'",
                                          "a line runs through 'on the slope'"]
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
    (lambda: _roofline(points=[]), "points must be 1..3"),
    (lambda: _roofline(points=[("a", 0, "red")]), "points must be 1..3"),
])
def test_bad_arguments_get_one_clear_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()
