"""画图:注意力分数热力图(格子里写上数)、分数柱状图,以及全书唯一的中文字体选择。

The first plot calls ``setup_chinese_font()``, which picks the first installed CJK font from
``CJK_FONT_CANDIDATES``. When none is installed it warns once with how to get one
(Chinese labels would otherwise show as empty boxes).
"""
from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np

CJK_FONT_CANDIDATES = (
    "Noto Sans CJK SC",
    "Noto Sans CJK JP",
    "Noto Sans SC",
    "Source Han Sans SC",
    "Source Han Sans CN",
    "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei",
    "SimHei",
    "Microsoft YaHei",
    "PingFang SC",
    "Heiti SC",
    "Arial Unicode MS",
)

NO_FONT_MESSAGE = (
    "没有找到中文字体,图里的中文会显示成方框。安装一个再重启内核即可:"
    "Debian/Ubuntu 运行 `sudo apt-get install fonts-noto-cjk`;"
    "Google Colab 运行 `!apt-get -qq install fonts-noto-cjk`;"
    "macOS 与 Windows 自带的 PingFang SC / Microsoft YaHei 会被自动选中。"
    f"(attn_lib 依次查找:{', '.join(CJK_FONT_CANDIDATES)})"
)

_chosen_font: str | None = None
_font_checked = False


def _installed_font_names() -> set[str]:
    from matplotlib import font_manager

    return {f.name for f in font_manager.fontManager.ttflist}


def find_chinese_font() -> str | None:
    """返回第一个已安装的中文字体名;都没有就返回 None。

    Matplotlib caches its font list; a font installed after the cache was written is found
    by rebuilding the cache once.
    """
    names = _installed_font_names()
    for cand in CJK_FONT_CANDIDATES:
        if cand in names:
            return cand
    from matplotlib import font_manager

    font_manager.fontManager = font_manager._load_fontmanager(try_read_cache=False)
    names = _installed_font_names()
    return next((c for c in CJK_FONT_CANDIDATES if c in names), None)


def setup_chinese_font(*, force: bool = False) -> str | None:
    """让 matplotlib 用中文字体;返回选中的字体名,找不到时提醒一次怎么安装并返回 None。"""
    global _chosen_font, _font_checked
    if _font_checked and not force:
        return _chosen_font
    import matplotlib as mpl

    _font_checked = True
    _chosen_font = find_chinese_font()
    if _chosen_font is None:
        warnings.warn(NO_FONT_MESSAGE, stacklevel=2)
        return None
    rest = [f for f in mpl.rcParams["font.sans-serif"] if f != _chosen_font]
    mpl.rcParams["font.sans-serif"] = [_chosen_font, *rest]
    mpl.rcParams["font.family"] = "sans-serif"
    mpl.rcParams["axes.unicode_minus"] = False
    return _chosen_font


def to_numpy(x: Any) -> np.ndarray:
    """把 torch 张量或任何数组转成 float64 的 numpy 数组(用于画图)。"""
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _format_cell(value: float, fmt: str) -> str:
    if np.isneginf(value):
        return "-∞"
    if np.isposinf(value):
        return "+∞"
    return fmt.format(value)


def show_heatmap(
    matrix: Any,
    *,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    title: str | None = None,
    xlabel: str = "键 Key",
    ylabel: str = "查询 Query",
    ax=None,
    fmt: str = "{:.2f}",
    cmap: str = "Reds",
    vmin: float | None = 0.0,
    vmax: float | None = None,
    annotate: bool = True,
    colorbar: bool = True,
):
    """画一张注意力分数热力图,每个格子里写上数值。

    Args:
        matrix: 2-D array (L, S): rows are queries, columns are keys (numpy or torch).
            ``-inf`` cells (masked logits) are drawn grey and labelled ``-∞``.
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

    setup_chinese_font()
    m = to_numpy(matrix)
    if m.ndim != 2:
        raise ValueError(f"show_heatmap needs a 2-D (L, S) matrix, got shape {m.shape}; pick one head with m[b, h]")
    L, S = m.shape
    for name, labels, n in (("row_labels", row_labels, L), ("col_labels", col_labels, S)):
        if labels is not None and len(labels) != n:
            raise ValueError(f"{name} has {len(labels)} labels for {n} {'rows' if name[0] == 'r' else 'columns'}")
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 + 0.75 * S, 0.8 + 0.6 * L))
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
        for i in range(L):
            for j in range(S):
                val = m[i, j]
                # white text on dark cells, black on light ones (by the cell colour's luminance)
                r, g, b, _ = cmap_obj(im.norm(val)) if np.isfinite(val) else (1, 1, 1, 1)
                dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
                ax.text(j, i, _format_cell(val, fmt), ha="center", va="center",
                        color="white" if dark else "black", fontsize=9)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return ax


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
    """把多张热力图排成一格一格(比如每个头一张)。

    Args:
        matrices: array (N, L, S) or a list of (L, S) matrices, e.g. ``scores[0]`` for the
            heads of the first batch element.
        titles: one title per matrix.
        row_labels, col_labels: shared tick labels.
        ncols: columns in the grid (default: all in one row, at most 4).
        suptitle: a title for the whole figure.
        **kwargs: passed on to ``show_heatmap``.

    Returns:
        The matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    setup_chinese_font()
    mats = [to_numpy(m) for m in matrices]
    n = len(mats)
    if n == 0:
        raise ValueError("show_heatmaps needs at least one matrix")
    if titles is not None and len(titles) != n:
        raise ValueError(f"got {len(titles)} titles for {n} matrices")
    ncols = ncols or min(n, 4)
    nrows = -(-n // ncols)
    L, S = mats[0].shape
    fig, axes = plt.subplots(nrows, ncols, figsize=(ncols * (1.2 + 0.7 * S), nrows * (1.0 + 0.55 * L)),
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
    """画一组分数的柱状图,柱顶写上数值(比如「它」分给 水 / 书 / 打翻 的比例)。

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

    setup_chinese_font()
    vals = to_numpy(values).reshape(-1)  # (...) -> (S,)
    if len(labels) != len(vals):
        raise ValueError(f"got {len(labels)} labels for {len(vals)} values")
    if ax is None:
        _, ax = plt.subplots(figsize=(1.2 + 0.9 * len(vals), 3.0))
    bars = ax.bar(range(len(vals)), vals, color=color)
    ax.set_xticks(range(len(vals)), labels=list(labels))
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    for b, v in zip(bars, vals):
        ax.annotate(_format_cell(v, fmt), (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=9)
    return ax
