"""第 13 章的示意图：屋顶线；拆分 KV（FlashDecoding）怎样把缓存切段、各段并行算、再合并；GPU 上有几个计算单元在干活。

Each function draws one diagram with Chinese labels and returns the ``Figure``; the figures
are at most 7 inches wide and no text is smaller than 9 pt, so they stay readable on a phone
(the same rules as ``attn_lib.figures.diagrams_heads``). They draw inside
``attn_lib.figures.plotting.book_style()`` and compute nothing but the layout (and the roofline's
height, min(peak, intensity × bandwidth)); the roofline's labels keep clear of its lines.
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
        _box(ax, (0.1, 4.45, 1.3, 0.9), "查询 $q$\n（1 行）", color="#F2F2F2", fontsize=10)
        x0, width = 2.0, 8.8
        seg = width / P
        for p in range(P):  # the cache, cut into P contiguous chunks of keys
            color = SPLIT_COLORS[p]
            x = x0 + p * seg
            _box(ax, (x, 5.0, seg, 0.55), f"K 第 {p + 1} 段", color=color, fontsize=9, text_color="white")
            _box(ax, (x, 4.4, seg, 0.55), f"V 第 {p + 1} 段", color=color, fontsize=9, text_color="white")
            cx = x + seg / 2
            _arrow(ax, (cx, 4.35), (cx, 3.35))
            _box(ax, (x + 0.12, 2.35, seg - 0.24, 0.95), f"$o_{{{p + 1}}}$，$\\mathrm{{lse}}_{{{p + 1}}}$", color=color,
                 fontsize=10, text_color="white")
            _arrow(ax, (cx, 2.3), (6.4, 1.55), color="grey")
        _arrow(ax, (1.45, 4.9), (1.95, 4.9))
        ax.text(x0 + width / 2, 5.75, f"KV 缓存：$S$ 个键和值，切成 {P} 段（每段一个程序实例，同时算）",
                ha="center", va="bottom", fontsize=10)
        ax.text(0.75, 3.0, "每段各做一遍\nSoftmax：\n段内归一化\n的输出 $o$ 和\n它的 $\\mathrm{lse}$", ha="center",
                va="center", fontsize=9)
        _box(ax, (3.2, 0.55, 6.4, 0.95), r"合并：$m = \max\ \mathrm{lse}_p$，$w_p = \exp(\mathrm{lse}_p - m)$" "\n"
             r"$\mathrm{out} = \Sigma\, w_p \cdot o_p \div \Sigma\, w_p$，$\mathrm{lse} = m + \log \Sigma\, w_p$",
             color="#FFF3D6", fontsize=9)
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


def draw_roofline(gpu, points):
    """画一块 GPU 的屋顶线（双对数坐标）和几个核函数的点：斜线段受限于带宽，水平段受限于算力。

    Args:
        gpu: the GPU, with ``name``, ``peak_tflops``, ``bandwidth_tb_s`` and ``balance_point``
            (an ``attn_lib.costs.decode_cost.GpuSpec``).
        points: up to three ``(label, intensity, colour)``: a kernel's arithmetic intensity in FLOP/byte.

    Returns:
        The matplotlib ``Figure`` (6.8 × 3.8 inches).
    """
    points = [(str(label), float(x), color) for label, x, color in points]
    if not 1 <= len(points) <= 3 or not all(x > 0 for _, x, _ in points):
        raise ValueError(f"points must be 1..3 (label, intensity > 0, colour), got {points!r}")
    import matplotlib.pyplot as plt
    import numpy as np

    peak, bandwidth, balance = gpu.peak_tflops, gpu.bandwidth_tb_s, gpu.balance_point
    xs = np.logspace(-0.5, 3.5, 200)  # FLOP/byte
    bottom, top = bandwidth * 10 ** -1.2, peak * 10.0  # room below the slope and above the flat part for labels
    with book_style():
        fig, ax = plt.subplots(figsize=(6.8, 3.8))
        ax.set_ylim(bottom, top)
        ax.loglog(xs, np.minimum(peak, xs * bandwidth), color="black", lw=1.5)
        ax.plot([balance, balance], [bottom, peak], color="grey", ls=":", lw=1)  # up to the corner only
        ax.text(balance * 1.1, bottom * 2, f"平衡点 ≈ {balance:.0f}", fontsize=9, color="grey")
        for label, x, color in points:
            y = min(peak, x * bandwidth)
            ax.plot([x], [y], "o", color=color, ms=7)
            # Below the slope and to the right of the point (nothing is drawn there); above the flat part.
            on_slope = x * bandwidth < peak
            ax.annotate(f"{label}\n{x:.0f} FLOP/字节，至多 {y:.4g} TFLOP/s", (x, y), textcoords="offset points",
                        xytext=(9, -7) if on_slope else (0, 9), ha="left" if on_slope else "center",
                        va="top" if on_slope else "bottom", fontsize=9, color=color)
        ax.set_xlabel("算术强度（FLOP/字节）")
        ax.set_ylabel("最多能跑出的 TFLOP/s")
        ax.set_title(f"{gpu.name} 的屋顶线：峰值 {peak:g} TFLOP/s，带宽 {bandwidth:g} TB/s", fontsize=10)
        fig.tight_layout()
    return fig


__all__ = ["draw_split_kv", "draw_busy_units", "draw_roofline", "SPLIT_COLORS", "MIN_FONT_PT"]
