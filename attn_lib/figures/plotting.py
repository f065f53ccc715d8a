"""画图（全书共用，第 1–13 章）：热力图、柱状图，以及中文字体（第 08 章的分块示意图在 flash_steps.py）。

Font: the font functions live in ``attn_lib.figures.fonts`` and are re-exported here
(``find_chinese_font``, ``setup_chinese_font``): a system CJK font when there is one, else the
subset of Noto Sans CJK SC that ships with attn_lib.

Global state: only ``setup_chinese_font()`` changes matplotlib's global rcParams, once, when a
notebook calls it (every chapter does, in its import cell, so that the figures a chapter
draws with plain matplotlib also get the Chinese font). The plotting functions below change
no global setting: they draw inside ``book_style()``, a ``matplotlib.rc_context`` whose font
is named explicitly, so their text keeps the Chinese font whatever the global settings are.

Figures are at most ``MAX_WIDTH_IN`` (7) inches wide, so that they are shown at full size in
the website's text column; the notebooks' set-up cell saves inline figures at twice the
pixel density (``retina``), so they are sharp on high-density screens.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator, Sequence

import numpy as np

from .fonts import _font_or_none, find_chinese_font, setup_chinese_font

__all__ = [  # find_chinese_font and setup_chinese_font live in .fonts; the chapters import them from here
    "MAX_WIDTH_IN", "bar_scores", "book_rc", "book_style", "find_chinese_font", "in_book_style",
    "setup_chinese_font", "show_heatmap", "show_heatmaps", "to_numpy",
]

# Widest figure the book draws (inches): at matplotlib's 100 dpi that is 700 CSS pixels, the
# width of the website's text column on a laptop.
MAX_WIDTH_IN = 7.0


def book_rc() -> dict[str, Any]:
    """本书画图用的 matplotlib 设置（rcParams 字典）：中文字体写明字体名，负号用 ASCII 的减号。

    The font family is a list of concrete font names (the CJK font, then DejaVu Sans for
    glyphs it lacks), not the generic ``sans-serif``: text created under these settings keeps
    the CJK font when it is drawn later, outside the style context.
    """
    font = _font_or_none()
    rc: dict[str, Any] = {"axes.unicode_minus": False}
    if font is not None:
        rc["font.family"] = [font, "DejaVu Sans"]
    return rc


@contextlib.contextmanager
def book_style() -> Iterator[None]:
    """在这个 with 块里画的图用本书的设置（中文字体）；块结束后全局设置原样恢复。"""
    import matplotlib as mpl

    with mpl.rc_context(book_rc()):
        yield


def _label_font(ax) -> None:
    """Tick labels are created when the figure is drawn: name the CJK font on the Axes itself."""
    family = book_rc().get("font.family")
    if family is not None:
        ax.tick_params(labelfontfamily=family)


def in_book_style(fn):
    """Run a plotting function inside ``book_style()`` (no global setting changes)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with book_style():
            return fn(*args, **kwargs)

    return wrapper


def _capped(width: float, height: float) -> tuple[float, float]:
    """Scale a figure size down, keeping its shape, to at most ``MAX_WIDTH_IN`` wide."""
    if width <= MAX_WIDTH_IN:
        return width, height
    return MAX_WIDTH_IN, height * MAX_WIDTH_IN / width


def to_numpy(x: Any) -> np.ndarray:
    """把 torch 张量或任何数组转成 float64 的 numpy 数组（用于画图）。"""
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _format_cell(value: float, fmt: str) -> str:
    if np.isneginf(value):
        return "−∞"  # U+2212, the minus sign that $-\infty$ shows in the prose
    if np.isposinf(value):
        return "+∞"
    return fmt.format(value)


def _check_labels(row_labels, col_labels, L: int, S: int) -> None:
    for name, labels, n in (("row_labels", row_labels, L), ("col_labels", col_labels, S)):
        if labels is not None and len(labels) != n:
            raise ValueError(f"{name} has {len(labels)} labels for {n} {'rows' if name[0] == 'r' else 'columns'}")


def _annotate(ax, m: np.ndarray, im, cmap_obj, fmt: str) -> None:
    """Write each cell's value: white text on dark cells, black on light ones (by luminance)."""
    L, S = m.shape
    for i in range(L):
        for j in range(S):
            val = m[i, j]
            r, g, b, _ = cmap_obj(im.norm(val)) if np.isfinite(val) else (1, 1, 1, 1)
            dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
            ax.text(j, i, _format_cell(val, fmt), ha="center", va="center",
                    color="white" if dark else "black", fontsize=9)


@in_book_style
def show_heatmap(
    matrix: Any,
    *,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    title: str | None = None,
    xlabel: str = "键",
    ylabel: str = "查询",
    ax=None,
    fmt: str = "{:.2f}",
    cmap: str = "Reds",
    vmin: float | None = 0.0,
    vmax: float | None = None,
    annotate: bool = True,
    colorbar: bool = True,
):
    """画一张热力图（注意力分数或评分），每个格子里写上数值。

    Args:
        matrix: 2-D array (L, S): rows are queries, columns are keys (numpy or torch).
            ``-inf`` cells (masked logits) are drawn grey and labelled ``−∞`` (a true minus sign, U+2212).
        row_labels, col_labels: tick labels (e.g. tokens), lengths L and S.
        title, xlabel, ylabel: text (Chinese renders, see ``setup_chinese_font``).
        ax: a matplotlib Axes to draw into; a new figure when None.
        fmt: format of the numbers written in the cells.
        cmap, vmin, vmax: colour scale (default 0 .. max, suited to proportions).
        annotate: write the numbers into the cells.
        colorbar: draw a colour bar.

    Returns:
        The matplotlib Axes.
    """
    import matplotlib.pyplot as plt

    m = to_numpy(matrix)
    if m.ndim != 2:
        raise ValueError(f"show_heatmap needs a 2-D (L, S) matrix, got shape {m.shape}; pick one head with m[b, h]")
    L, S = m.shape
    _check_labels(row_labels, col_labels, L, S)
    if ax is None:
        _, ax = plt.subplots(figsize=_capped(1.0 + 0.75 * S, 0.8 + 0.6 * L))
    _label_font(ax)
    finite = np.where(np.isfinite(m), m, np.nan)
    cmap_obj = plt.get_cmap(cmap).with_extremes(bad="#d9d9d9")
    top = vmax if vmax is not None else (np.nanmax(finite) if np.isfinite(finite).any() else 1.0)
    im = ax.imshow(np.ma.masked_invalid(finite), cmap=cmap_obj, vmin=vmin, vmax=top, aspect="auto")
    ax.set_xticks(range(S), labels=list(col_labels) if col_labels is not None else range(S))
    ax.set_yticks(range(L), labels=list(row_labels) if row_labels is not None else range(L))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if annotate:
        _annotate(ax, m, im, cmap_obj, fmt)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return ax


@in_book_style
def show_heatmaps(
    matrices: Any,
    *,
    titles: Sequence[str] | None = None,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    ncols: int | None = None,
    suptitle: str | None = None,
    **kwargs,
):
    """把多张热力图排成一格一格（比如每个头一张）。

    Args:
        matrices: array (N, L, S) or a list of (L, S) matrices, e.g. ``scores[0]`` for the
            heads of the first batch element.
        titles: one title per matrix.
        row_labels, col_labels: shared tick labels.
        ncols: columns in the grid (default: all in one row, at most 3). The figure is at
            most ``MAX_WIDTH_IN`` inches wide (its height scaled to match).
        suptitle: a title for the whole figure.
        **kwargs: passed on to ``show_heatmap``.

    Returns:
        The matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    mats = [to_numpy(m) for m in matrices]
    n = len(mats)
    if n == 0:
        raise ValueError("show_heatmaps needs at least one matrix")
    if titles is not None and len(titles) != n:
        raise ValueError(f"got {len(titles)} titles for {n} matrices")
    ncols = ncols or min(n, 3)
    nrows = -(-n // ncols)
    L, S = mats[0].shape
    fig, axes = plt.subplots(nrows, ncols, figsize=_capped(ncols * (1.2 + 0.7 * S), nrows * (1.0 + 0.55 * L)),
                             squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= n:
            ax.axis("off")
            continue
        show_heatmap(mats[i], row_labels=row_labels, col_labels=col_labels,
                     title=titles[i] if titles else None, ax=ax, colorbar=False, **kwargs)
    if suptitle:
        fig.suptitle(suptitle)
    fig.tight_layout()
    return fig


@in_book_style
def bar_scores(
    values: Any,
    labels: Sequence[str],
    *,
    title: str | None = None,
    ylabel: str = "注意力分数",
    ax=None,
    fmt: str = "{:.2f}",
    color: str = "tab:red",
):
    """画一组数的柱状图，柱顶写上数值（比如「它」分给 水 / 书 / 打翻 的比例；纵轴默认写「注意力分数」）。

    Args:
        values: 1-D array of length S.
        labels: S labels.
        title, ylabel: text.
        ax: Axes to draw into; a new figure when None.
        fmt: format of the numbers above the bars.
        color: bar colour.

    Returns:
        The matplotlib Axes.
    """
    import matplotlib.pyplot as plt

    vals = to_numpy(values).reshape(-1)  # (...) -> (S,)
    if len(labels) != len(vals):
        raise ValueError(f"got {len(labels)} labels for {len(vals)} values")
    if ax is None:
        _, ax = plt.subplots(figsize=_capped(1.2 + 0.9 * len(vals), 3.0))
    _label_font(ax)
    bars = ax.bar(range(len(vals)), vals, color=color)
    ax.set_xticks(range(len(vals)), labels=list(labels))
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    for b, v in zip(bars, vals):
        ax.annotate(_format_cell(v, fmt), (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=9)
    return ax

