"""What the prose says about a figure agrees with how the figure is built.

Read from the committed notebooks (no execution):
- 「下图」 / 「下面这张图」: the next code cell that shows something shows a figure (or a widget, whose
  static figure follows); 「上图」 / 「上面这张图」: the one before does;
- 「图下打印」 means text printed after the figure in its cell, 「图上方打印」 text printed before it.

Read from the figures as the chapter builds them (tests/figure_record.py runs each chapter and records
every figure it shows):
- in a figure of several panels, one colour means one series: two panels do not give a colour to
  different series, nor one series different colours (a series is a legend label up to its 「：」 or
  「（」, so 「不缩放：中位数」 and 「不缩放：平均值」, or 「朴素注意力」 and 「朴素注意力（因果）」, are one
  series drawn in two line styles);
- a markdown cell next to a figure (the figure cells right before and right after it) that speaks of
  panels above and below (「上面一张」「下半幅」…) or left and right (「左图」「右边一张」…) has such a
  figure there; a colour it names (「蓝线」「灰色」…) is drawn there; a label it quotes (「标作「…」」) is
  written there.
"""
from __future__ import annotations

import colorsys
import re
from functools import lru_cache

import pytest

from book_helpers import NOTEBOOKS, read_notebook
from figure_record import record_figures

BELOW = re.compile(r"下图|下面这张图|下面的图|下面这幅图")
ABOVE = re.compile(r"上图|上面这张图|上面的图|上面这幅图")
PRINTED_BELOW = re.compile(r"图下(?:方|面)?打印")
PRINTED_ABOVE = re.compile(r"图上(?:方|面)?打印")
STACKED = re.compile(r"上面一张|下面一张|上半幅|下半幅|上下两张|上下两幅")
SIDE_BY_SIDE = re.compile(r"左图|右图|左边一张|右边一张|左半幅|右半幅|左右两张|左右两幅|左边的图|右边的图")
COLOUR = re.compile(r"(红|橙|黄|绿|蓝|紫|灰)(?:色|线|点|框|格|柱|条|圈)")
QUOTED_LABEL = re.compile(r"(?:标作|标着|标为|标成|写着|标的是)「([^」]+)」")


def _has_image(cell) -> bool:
    """A figure, or a widget (whose static figure follows it)."""
    return any("image/png" in o.get("data", {}) or WIDGET in o.get("data", {}) for o in cell.get("outputs", []))


WIDGET = "application/vnd.jupyter.widget-view+json"


def _code_cells(nb, indices) -> list:
    """The code cells among ``indices`` that show something (a cell that only defines is skipped)."""
    return [nb.cells[j] for j in indices if 0 <= j < len(nb.cells) and nb.cells[j].cell_type == "code"
            and nb.cells[j].get("outputs")]


def _order_problems(nb, name: str) -> list[str]:
    bad = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        text = cell.source
        after = _code_cells(nb, range(i + 1, len(nb.cells)))[:1]
        before = _code_cells(nb, range(i - 1, -1, -1))[:1]
        if BELOW.search(text) and not any(map(_has_image, after)):
            bad.append(f"{name} cell {i}: 「{BELOW.search(text).group(0)}」 but the next code cell shows no figure")
        if ABOVE.search(text) and not any(map(_has_image, before)):
            bad.append(f"{name} cell {i}: 「{ABOVE.search(text).group(0)}」 but the code cell before shows no figure")
        for pattern, want in ((PRINTED_BELOW, "after"), (PRINTED_ABOVE, "before")):
            if pattern.search(text):
                near = [c for c in before + after if _has_image(c)]
                if not any(_printed(c, want) for c in near):
                    bad.append(f"{name} cell {i}: 「{pattern.search(text).group(0)}」 but no text printed {want} the figure")
    return bad


def _printed(cell, where: str) -> bool:
    kinds = ["image" if "image/png" in o.get("data", {}) else "text" for o in cell.outputs
             if o.get("output_type") == "stream" or "image/png" in o.get("data", {})]
    if "image" not in kinds:
        return False
    first, last = kinds.index("image"), len(kinds) - 1 - kinds[::-1].index("image")
    return "text" in (kinds[last + 1:] if where == "after" else kinds[:first])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_figures_stand_where_the_prose_says(path):
    bad = _order_problems(read_notebook(path), path.stem)
    assert bad == [], "\n".join(bad)


# --- from the figures as built -------------------------------------------------------------------

def hue_names(hex_colour: str) -> set[str]:
    """The colour words a colour answers to (generous at the borders: 「橙」 and 「红」 overlap)."""
    r, g, b = (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    h, s, v = colorsys.rgb_to_hsv(r, g, b)
    if s < 0.2 or v < 0.2:
        return {"灰"} if 0.2 <= v <= 0.9 else set()
    deg = h * 360
    ranges = {"红": [(0, 20), (330, 360)], "橙": [(10, 50)], "黄": [(40, 70)], "绿": [(65, 170)],
              "蓝": [(170, 260)], "紫": [(250, 335)]}
    return {name for name, spans in ranges.items() if any(a <= deg <= b for a, b in spans)}


def _panels(fig) -> list[dict]:
    """The figure's panels, without colour bars and other thin strips."""
    return [p for p in fig["panels"] if p["bounds"][2] > 0.06 and p["bounds"][3] > 0.06]


def _arranged(fig, axis: int) -> bool:
    """Two panels one above the other (axis 1) or side by side (axis 0)."""
    starts = sorted({round(p["bounds"][axis], 2) for p in _panels(fig)})
    return len(starts) >= 2 and starts[-1] - starts[0] > 0.1


def colour_clashes(fig) -> list[str]:
    """One colour for two series, or two colours for one series, across the panels of a figure."""
    by_colour, by_series = {}, {}
    for k, panel in enumerate(_panels(fig)):
        for label, colours, _style in panel["series"]:
            if label.startswith("_") or not colours:
                continue
            series = re.split(r"[：:（(]", label, maxsplit=1)[0].strip()
            by_colour.setdefault(colours[0], set()).add(series)
            by_series.setdefault(series, set()).add(colours[0])
    out = [f"colour {c} means {sorted(s)}" for c, s in by_colour.items() if len(s) > 1]
    return out + [f"series 「{s}」 drawn in {sorted(c)}" for s, c in by_series.items() if len(c) > 1]


def _texts_match(quoted: str, fig) -> bool:
    squash = lambda t: re.sub(r"[\s$]", "", t)  # noqa: E731
    return any(squash(quoted) in squash(t) for t in fig["texts"])


@lru_cache(maxsize=None)
def _records(path) -> list[dict]:
    return record_figures(path)


def _neighbours(records: list[dict], i: int) -> list[dict]:
    """The figures of the nearest figure cell before cell i and of the nearest one after it."""
    before = [r["cell"] for r in records if r["cell"] < i]
    after = [r["cell"] for r in records if r["cell"] > i]
    cells = ([max(before)] if before else []) + ([min(after)] if after else [])
    return [r for r in records if r["cell"] in cells]


def description_problems(nb, records: list[dict], name: str) -> list[str]:
    bad = [f"{name} figure of cell {r['cell']}: {c}" for r in records if len(_panels(r)) > 1
           for c in colour_clashes(r)]
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        near, text = _neighbours(records, i), cell.source
        where = f"{name} cell {i}"
        if STACKED.search(text) and not any(_arranged(f, 1) for f in near):
            bad.append(f"{where}: 「{STACKED.search(text).group(0)}」 but no figure nearby has panels one above the other")
        if SIDE_BY_SIDE.search(text) and not any(_arranged(f, 0) for f in near):
            bad.append(f"{where}: 「{SIDE_BY_SIDE.search(text).group(0)}」 but no figure nearby has panels side by side")
        drawn = {n for f in near for p in f["panels"] for c in p["colours"] for n in hue_names(c)}
        bad += [f"{where}: 「{m.group(0)}」 but no {m.group(1)} is drawn in the figures nearby"
                for m in COLOUR.finditer(text) if m.group(1) not in drawn]
        bad += [f"{where}: quotes the label 「{m.group(1)}」, which no figure nearby writes"
                for m in QUOTED_LABEL.finditer(text) if not any(_texts_match(m.group(1), f) for f in near)]
    return bad


def test_the_rules_catch_what_they_should():
    two = lambda a, b, top=True: {"panels": [  # noqa: E731
        {"bounds": [0.1, 0.55, 0.8, 0.4], "series": a, "colours": []},
        {"bounds": [0.1, 0.05, 0.8, 0.4] if top else [0.55, 0.55, 0.4, 0.4], "series": b, "colours": []}],
        "texts": ["片上 SRAM（小、快）"], "cell": 3}
    blue, orange = "#1f77b4", "#ff7f0e"
    clash = two([["不缩放", [blue], "-"], ["除以 √d", [orange], "-"]],
                [["不缩放：中位数", [blue], "-"], ["不缩放：平均值", [orange], ":"]])
    assert len(colour_clashes(clash)) == 2
    assert colour_clashes(two([["不缩放", [blue], "-"]], [["不缩放：平均值", [blue], ":"]])) == []
    assert hue_names(blue) == {"蓝"} and "橙" in hue_names(orange) and hue_names("#7f7f7f") == {"灰"}
    nb = read_notebook(NOTEBOOKS[0])
    nb.cells = [nb.cells[0]] * 3 + [nb.cells[0]]
    nb.cells[1] = type(nb.cells[1])(cell_type="markdown", source="左图是…，图里标作「片上缓存 SRAM」，红线", metadata={})
    found = description_problems(nb, [dict(two([], []), cell=2)], "x")
    assert len(found) == 3, found  # stacked, not side by side; a label not drawn; no red drawn
    assert _arranged(two([], [], top=False), 0) and not _arranged(two([], []), 0)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_figure_descriptions_match_the_figures(path):
    records = _records(path)
    assert records or not any(map(_has_image, read_notebook(path).cells)), f"{path.stem}: no figure recorded"
    bad = description_problems(read_notebook(path), records, path.stem)
    assert bad == [], "\n".join(bad)
