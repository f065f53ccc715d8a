"""第 13 章的示意图：拆分 KV（FlashDecoding）怎样把缓存切段、各段并行算、再合并；GPU 上有几个计算单元在干活。

Each function draws one diagram with Chinese labels and returns the ``Figure``; the figures
are at most 7 inches wide and no text is smaller than 9 pt, so they stay readable on a phone
(the same rules as ``attn_lib.figures.diagrams_heads``). They draw inside
``attn_lib.figures.plotting.book_style()`` and compute nothing but the layout.
"""
from __future__ import annotations

from .diagrams_heads import FIG_WIDTH_IN, MIN_FONT_PT, _arrow, _box
from .plotting import book_style

SPLIT_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B2", "#937860")  # one per split (<= 6)
IDLE_COLOR = "#EEEEEE"


def _check_splits(num_splits):
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 1 <= num_splits <= len(SPLIT_COLORS):
        raise ValueError(f"num_splits must be an int in 1..{len(SPLIT_COLORS)}, got {num_splits!r}; "
                         "the diagram draws at most six splits")
    return num_splits


def draw_split_kv(num_splits: int = 3):
    """画拆分 KV 的一次解码步：一个查询对 P 段缓存各算一份部分结果 (o_p, lse_p)，再按 log-sum-exp 合并。

    Args:
        num_splits: P, the splits drawn (1..6).

    Returns:
        The matplotlib ``Figure`` (7 × 4.6 inches).
    """
    P = _check_splits(num_splits)
    import matplotlib.pyplot as plt

    with book_style():
        fig, ax = plt.subplots(figsize=(FIG_WIDTH_IN, 4.6))
        ax.set_axis_off()
        ax.set_xlim(0, 11)
        ax.set_ylim(-0.2, 6.4)
        _box(ax, (0.1, 4.45, 1.3, 0.9), "查询 q\n（1 行）", color="#F2F2F2", fontsize=10)
        x0, width = 2.0, 8.8
        seg = width / P
        for p in range(P):  # the cache, cut into P contiguous chunks of keys
            color = SPLIT_COLORS[p]
            x = x0 + p * seg
            _box(ax, (x, 5.0, seg, 0.55), f"K 第 {p + 1} 段", color=color, fontsize=9, text_color="white")
            _box(ax, (x, 4.4, seg, 0.55), f"V 第 {p + 1} 段", color=color, fontsize=9, text_color="white")
            cx = x + seg / 2
            _arrow(ax, (cx, 4.35), (cx, 3.35))
            _box(ax, (x + 0.12, 2.35, seg - 0.24, 0.95), f"o{p + 1}，lse{p + 1}", color=color, fontsize=10,
                 text_color="white")
            _arrow(ax, (cx, 2.3), (6.4, 1.55), color="grey")
        _arrow(ax, (1.45, 4.9), (1.95, 4.9))
        ax.text(x0 + width / 2, 5.75, f"KV 缓存：S 个键和值，切成 {P} 段（每段一个程序实例，同时算）",
                ha="center", va="bottom", fontsize=10)
        ax.text(0.75, 3.0, "每段各做一遍\nSoftmax：\n段内归一化\n的输出 o 和\n它的 lse", ha="center",
                va="center", fontsize=9)
        _box(ax, (3.2, 0.55, 6.4, 0.95), "合并：m = max lse_p，w_p = exp(lse_p − m)\n"
             "out = Σ w_p·o_p ÷ Σ w_p，lse = m + log Σ w_p", color="#FFF3D6", fontsize=9)
        ax.text(1.6, 1.02, "与一遍读完\n整个缓存的\n结果相同", ha="center", va="center", fontsize=9)
        fig.tight_layout()
    return fig


def draw_busy_units(num_units: int, busy: tuple, labels: tuple, *, per_row: int = 22):
    """画 GPU 的计算单元（SM）里有几个在干活：每行一种做法，涂色的格子数 = 这种做法的程序实例数。

    Args:
        num_units: the streaming multiprocessors of the GPU (e.g. 132), 1..264.
        busy: for each row, how many units have work (a program instance each); at most num_units count.
        labels: one Chinese label per row (at most 3 rows).
        per_row: squares per line of a panel.

    Returns:
        The matplotlib ``Figure`` (7 inches wide).
    """
    if isinstance(num_units, bool) or not isinstance(num_units, int) or not 1 <= num_units <= 264:
        raise ValueError(f"num_units must be an int in 1..264, got {num_units!r}; pass the GPU's SM count")
    busy, labels = tuple(busy), tuple(labels)
    if not 1 <= len(busy) <= 3 or len(labels) != len(busy) or not all(
            isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in busy):
        raise ValueError(f"busy must be 1..3 ints >= 0 with one label each, got busy={busy!r}, labels={labels!r}; "
                         "e.g. busy=(8, 128) and two labels")
    import matplotlib.pyplot as plt

    lines = -(-num_units // per_row)
    with book_style():
        fig, axes = plt.subplots(len(busy), 1, figsize=(FIG_WIDTH_IN, 0.45 + len(busy) * (0.3 * lines + 0.55)))
        axes = [axes] if len(busy) == 1 else list(axes)
        for ax, n, label in zip(axes, busy, labels):
            ax.set_axis_off()
            ax.set_xlim(-0.1, per_row + 0.1)
            ax.set_ylim(-lines - 0.1, 0.1)
            used = min(n, num_units)
            for u in range(num_units):
                _box(ax, (u % per_row + 0.08, -(u // per_row) - 0.92, 0.84, 0.84),
                     color=SPLIT_COLORS[0] if u < used else IDLE_COLOR, lw=0.5)
            ax.set_title(f"{label}：{n} 个程序实例，{used} / {num_units} 个计算单元有活", fontsize=10)
        fig.tight_layout()
    return fig


__all__ = ["draw_split_kv", "draw_busy_units", "SPLIT_COLORS", "MIN_FONT_PT"]
