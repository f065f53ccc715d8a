"""Run a chapter and record how each figure it shows is built: its panels (position in the figure), the
labelled series of each panel with their colours, every colour drawn, and every text drawn.

Used by tests/book/test_figure_descriptions.py, which compares the prose around a figure with the figure.
The chapter runs in a kernel of the current environment (as nbval runs it); a cell put before the
chapter's first cell wraps matplotlib's ``FigureCanvasBase.print_figure``, through which the inline
backend renders every figure it shows, and counts the code cells the kernel runs with IPython's
``pre_run_cell`` event (mapped back to the chapter's cell indices). The record is a list of dicts, one per figure, in the order they were shown.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

RECORDER = r'''
import json as _json
from matplotlib.backend_bases import FigureCanvasBase as _Canvas
from matplotlib.colors import to_hex as _hex
from matplotlib.text import Text as _Text

_FIG_CELL = [-1]
_FIG_RECORD = []
get_ipython().events.register("pre_run_cell", lambda *a: _FIG_CELL.__setitem__(0, _FIG_CELL[0] + 1))


def _colours(value):
    try:
        return [_hex(value, keep_alpha=False)]
    except (ValueError, TypeError):
        try:
            return [_hex(c, keep_alpha=False) for c in value]
        except (ValueError, TypeError):
            return []


def _panel(ax):
    series, drawn = [], []
    for line in ax.get_lines():
        series.append([line.get_label(), _colours(line.get_color()), str(line.get_linestyle())])
        drawn += _colours(line.get_color()) + _colours(line.get_markerfacecolor())
    for c in ax.collections:
        face = _colours(c.get_facecolor())
        series.append([c.get_label(), face[:1], "collection"])
        drawn += face + _colours(c.get_edgecolor())
    for container in ax.containers:
        face = _colours(container.patches[0].get_facecolor()) if getattr(container, "patches", None) else []
        series.append([container.get_label(), face, "bars"])
    for p in ax.patches:
        drawn += _colours(p.get_facecolor()) + _colours(p.get_edgecolor())
    for im in ax.images:
        cmap = im.get_cmap()
        drawn += [_hex(cmap(i / 15), keep_alpha=False) for i in range(16)]
    drawn += [_hex(t.get_color(), keep_alpha=False) for t in ax.texts]
    return {"bounds": list(ax.get_position().bounds), "title": ax.get_title(), "series": series,
            "colours": sorted(set(drawn))}


def _record(fig):
    fig.canvas.draw()
    texts = [t.get_text() for t in fig.findobj(_Text) if t.get_visible() and t.get_text().strip()]
    panels = [_panel(ax) for ax in fig.axes if ax.get_visible()]
    _FIG_RECORD.append({"cell": _FIG_CELL[0], "panels": panels, "texts": texts})


_print_figure = _Canvas.print_figure


def _recording_print_figure(self, *args, **kwargs):
    if not getattr(self.figure, "_book_recorded", False):
        self.figure._book_recorded = True
        _record(self.figure)
    return _print_figure(self, *args, **kwargs)


_Canvas.print_figure = _recording_print_figure
'''


def record_figures(path: Path, timeout: int = 600) -> list[dict]:
    """Execute the chapter at ``path`` and return one record per figure it shows (see the module doc)."""
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        dump = f"_json.dump(_FIG_RECORD, open({str(out)!r}, 'w', encoding='utf-8'), ensure_ascii=False)"
        nb.cells = [nbformat.v4.new_code_cell(RECORDER)] + nb.cells + [nbformat.v4.new_code_cell(dump)]
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        records = json.loads(out.read_text(encoding="utf-8"))
    # The kernel counts the code cells it runs (nbclient skips markdown and empty code cells): the
    # k-th one it runs after the recorder is the chapter's cell ran[k].
    ran = [i for i, c in enumerate(nb.cells[1:-1]) if c.cell_type == "code" and c.source.strip()]
    return [dict(r, cell=ran[r["cell"]]) for r in records if 0 <= r["cell"] < len(ran)]
