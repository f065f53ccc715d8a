"""第 07、09、10 章的示意图：多头注意力的数据流、反向传播的重计算、RoPE 的旋转（用 matplotlib 画）。

Each function draws one diagram with Chinese labels and returns the ``Figure``; the figures
are at most 7 inches wide and no text is smaller than 9 pt, so they stay readable on a phone.
They draw inside ``attn_lib.figures.plotting.book_style()`` (the Chinese font, no global setting
changed) and use nothing but boxes, arrows and text: no numbers are computed here.
"""
from __future__ import annotations

import math

from .plotting import book_style

HEAD_COLORS = ("#4C72B0", "#DD8452", "#55A868")  # one colour per head (at most 3 drawn)
MIN_FONT_PT = 9  # the smallest text in these diagrams
FIG_WIDTH_IN = 7.0


def _box(ax, rect, text="", *, color="#EEEEEE", fontsize=10, text_color="black", lw=1.0):
    """A rectangle rect = (x, y, w, h) with its text in the middle."""
    from matplotlib.patches import Rectangle

    x, y, w, h = rect
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="black", lw=lw))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color=text_color)


def _segmented(ax, x, y, w, h, colors, text="", *, fontsize=10):
    """一个按列分成几段的矩形（每段一个头的颜色），中间写字。"""
    seg = w / len(colors)
    for n, c in enumerate(colors):
        _box(ax, (x + n * seg, y, seg, h), color=c)
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color="white")


def _arrow(ax, start, end, text="", *, fontsize=9, text_offset=0.25, color="black"):
    """An arrow from start = (x0, y0) to end = (x1, y1), its text above the middle."""
    (x0, y0), (x1, y1) = start, end
    ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=dict(arrowstyle="->", lw=1.3, color=color))
    if text:
        ax.text((x0 + x1) / 2, (y0 + y1) / 2 + text_offset, text, ha="center", va="bottom", fontsize=fontsize,
                color=color)


def _figure(height_in):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(FIG_WIDTH_IN, height_in))
    ax.set_axis_off()
    return fig, ax


def draw_multihead_flow(num_heads: int = 3):
    """画多头注意力的一路数据流：投影 → 切成 H 个头 → 每个头各算注意力 → 拼接 → 输出投影。

    Args:
        num_heads: how many heads to draw (1..3); the text says H in general.

    Returns:
        The matplotlib ``Figure`` (7 × 4.4 inches).
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or not 1 <= num_heads <= len(HEAD_COLORS):
        raise ValueError(f"num_heads must be an int in 1..{len(HEAD_COLORS)}, got {num_heads!r}; "
                         "the diagram draws at most three heads")
    colors = HEAD_COLORS[:num_heads]
    with book_style():
        fig, ax = _figure(4.4)
        ax.set_xlim(0, 11.2)
        ax.set_ylim(-0.9, 6.2)
        _box(ax, (0.1, 1.6, 0.9, 2.8), "输入 X\nL × C", fontsize=10)
        _arrow(ax, (1.05, 3.0), (2.15, 3.0))
        ax.text(1.6, 2.8, "乘 $W_q$、\n$W_k$、$W_v$", ha="center", va="top", fontsize=9)
        for row, name in enumerate(("Q", "K", "V")):  # the projections, cut into head-coloured columns
            _segmented(ax, 2.2, 4.2 - 1.45 * row, 1.8, 1.0, colors, f"{name}（L × C）")
        _arrow(ax, (4.05, 3.0), (4.95, 3.0), "按列切\n成 H 份", text_offset=0.1)
        h_row = 5.0 / num_heads
        for h, c in enumerate(colors):  # one attention per head, side by side
            y = 5.2 - (h + 1) * h_row + 0.15
            _box(ax, (5.0, y, 2.0, h_row - 0.3), f"头 {h + 1}：注意力\nq、k、v 各 L × D", color=c,
                 fontsize=9, text_color="white")
            _arrow(ax, (7.05, y + (h_row - 0.3) / 2), (7.75, 3.0))
        _segmented(ax, 7.8, 1.6, 1.2, 2.8, colors)
        ax.text(8.4, 1.35, "拼接\nL × C", ha="center", va="top", fontsize=10)
        _arrow(ax, (9.05, 3.0), (9.85, 3.0), "乘 $W_o$", text_offset=0.1)
        _box(ax, (9.9, 1.6, 1.2, 2.8), "输出\nL × C", fontsize=10)
        ax.text(5.6, 5.85, "每个头都看全部输入：被切开的是投影之后的 Q、K、V（C = H × D）",
                ha="center", va="center", fontsize=10)
        ax.text(5.6, -0.6, "颜色 = 头：第 h 个头拿每一行的第 (h−1)D+1 到第 hD 个数", ha="center", va="center",
                fontsize=9)
        fig.tight_layout()
    return fig


def draw_recompute():
    """画反向传播要用的东西：朴素实现存下整张 L × S 的比例表 P，FlashAttention 只存每行一个 lse、反向时分块重算 P。

    Returns:
        The matplotlib ``Figure`` (7 × 5.6 inches), two panels one above the other.
    """
    import matplotlib.pyplot as plt

    with book_style():
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(FIG_WIDTH_IN, 5.6))
        for ax, title in ((top, "朴素实现：前向存下整张比例表 P，反向直接读它"),
                          (bottom, "FlashAttention：除 Q、K、V、O 外只多存每个查询一个 lse，反向一块一块重算 P")):
            ax.set_axis_off()
            ax.set_xlim(0, 11)
            ax.set_ylim(0, 4.2)
            ax.set_title(title, fontsize=10)
            _box(ax, (0.1, 1.2, 1.6, 1.6), "前向", color="#DDE8F5", fontsize=10)
            _arrow(ax, (1.8, 2.0), (2.7, 2.0), "存下")
            _box(ax, (9.3, 1.2, 1.6, 1.6), "反向", color="#F5E1D9", fontsize=10)
        for n, name in enumerate(("Q", "K", "V", "O")):  # linear in L; autograd's naive path keeps no O
            for ax in ((top, bottom) if name != "O" else (bottom,)):
                _box(ax, (2.8 + 0.55 * n, 0.5, 0.45, 3.0), name, fontsize=9)
        _box(top, (5.2, 0.3, 3.4, 3.4), "P：L × S\n（随长度平方增长）", color="#F2B8B5", fontsize=10)
        _arrow(top, (8.7, 2.0), (9.25, 2.0))
        _box(bottom, (5.0, 0.5, 0.3, 3.0), color="#F2B8B5")
        bottom.text(5.15, 3.6, "lse：每个查询一个数", ha="center", va="bottom", fontsize=9)
        for i in range(3):  # the blocks recomputed on chip, one at a time
            for j in range(3):
                _box(bottom, (6.3 + 0.62 * j, 2.55 - 0.62 * i, 0.55, 0.55), color="#F2B8B5" if i == j else "#FBE3E1")
        bottom.text(7.2, 0.75, r"$P_{ij} = \exp(S_{ij} - \mathrm{lse}_i)$" "\n用完即弃", ha="center", va="center", fontsize=9)
        _arrow(bottom, (8.3, 2.0), (9.25, 2.0), "重算")
        fig.tight_layout()
    return fig


def draw_rotation(theta: float = 0.5, positions=(0, 1, 2, 3)):
    """画 RoPE 对一对数 (x₀, x₁) 做的事：位置 m 上把它转 m·θ 角；两个位置之间的夹角只看位置之差。

    Args:
        theta: the pair's angle step θ (radians).
        positions: the positions m to draw (at most 6).

    Returns:
        The matplotlib ``Figure`` (7 × 3.6 inches).
    """
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or not 0 < theta < math.pi / 2:
        raise ValueError(f"theta must be a number in (0, π/2), got {theta!r}; larger steps overlap in the drawing")
    positions = tuple(positions)
    if not 1 <= len(positions) <= 6 or not all(isinstance(m, int) and m >= 0 for m in positions):
        raise ValueError(f"positions must be 1..6 non-negative ints, got {positions!r}; "
                         "pass a few small positions such as (0, 1, 2, 3)")
    import matplotlib.pyplot as plt

    with book_style():
        fig, ax = plt.subplots(figsize=(FIG_WIDTH_IN, 3.6))
        ax.set_aspect("equal")
        ax.set_axis_off()
        base = math.radians(10)  # the pair (x0, x1) itself, before any rotation
        for n, m in enumerate(positions):
            angle = base + m * theta
            color = HEAD_COLORS[n % len(HEAD_COLORS)] if n < 3 else "grey"
            ax.annotate("", xy=(math.cos(angle), math.sin(angle)), xytext=(0, 0),
                        arrowprops=dict(arrowstyle="->", lw=1.6, color=color))
            turn = "不转" if m == 0 else ("转 θ" if m == 1 else f"转 {m}θ")
            ax.text(1.12 * math.cos(angle), 1.12 * math.sin(angle), f"位置 {m}：{turn}", fontsize=9,
                    ha="left" if math.cos(angle) >= 0 else "right", va="center", color=color)
        ax.plot([-1.1, 1.1], [0, 0], color="lightgrey", lw=0.8)
        ax.plot([0, 0], [-0.2, 1.15], color="lightgrey", lw=0.8)
        ax.set_xlim(-1.9, 2.4)
        ax.set_ylim(-0.3, 1.35)
        ax.set_title("RoPE：同一对数 (x₂ᵢ, x₂ᵢ₊₁) 放在位置 m 上就转 mθᵢ 角，长度不变", fontsize=10)
        fig.tight_layout()
    return fig


__all__ = ["draw_multihead_flow", "draw_recompute", "draw_rotation", "HEAD_COLORS", "MIN_FONT_PT"]
