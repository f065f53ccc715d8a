"""第 05–06 章的示意图：自注意力里查询、键、值的投影流程，以及盖在接龙上的因果掩码。

Diagrams drawn by code (boxes, arrows, a grid), not data plots: ``draw_qkv_projection``
(chapter 05) and ``draw_causal_next_token`` (chapter 06). Like ``attn_lib.figures.plotting`` they are
at most ``MAX_WIDTH_IN`` (7) inches wide, use the CJK font inside ``book_style()`` (no global
setting changes), and no text is smaller than ``MIN_FONT_PT`` (9 pt), so that they stay
readable on a phone. Each returns its matplotlib Figure.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .plotting import MAX_WIDTH_IN, book_style

MIN_FONT_PT = 9.0

_BOX = {"input": "#dbe9f6", "proj": "#fde9c9", "score": "#e4f1e0", "out": "#efe1f3"}


def _box(ax, x, y, w, h, text, color, fontsize=10.5):
    """A rounded box with centred text; returns its anchor points (left, right, top, bottom)."""
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.12",
                                facecolor=color, edgecolor="#444444", linewidth=1.0))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, linespacing=1.35)
    return {"l": (x, y + h / 2), "r": (x + w, y + h / 2), "t": (x + w / 2, y + h), "b": (x + w / 2, y)}


def _arrow(ax, start, end, label=None, label_xy=None, fontsize=10):
    ax.annotate("", xy=end, xytext=start,
                arrowprops={"arrowstyle": "-|>", "color": "#333333", "lw": 1.2, "shrinkA": 2, "shrinkB": 2})
    if label:
        x, y = label_xy if label_xy else ((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.12)
        ax.text(x, y, label, ha="center", va="bottom", fontsize=fontsize, color="#7a3b00")


def draw_qkv_projection(width: float = MAX_WIDTH_IN):
    """画自注意力的数据流：同一个输入 X 乘三个矩阵得到 Q、K、V，再打分、Softmax、按比例混合。

    Args:
        width: figure width in inches (at most ``MAX_WIDTH_IN``).

    Returns:
        The matplotlib Figure (one Axes, no ticks).
    """
    if not 0 < width <= MAX_WIDTH_IN:
        raise ValueError(f"width must be in (0, {MAX_WIDTH_IN}] inches, got {width!r}; "
                         "a wider figure is shrunk on a phone and its text becomes unreadable")
    import matplotlib.pyplot as plt

    with book_style():
        fig, ax = plt.subplots(figsize=(width, width * 0.56))
        ax.set_xlim(0, 10.4)
        ax.set_ylim(0, 5.8)
        ax.axis("off")
        x_in = _box(ax, 0.1, 2.3, 1.9, 1.2, "输入 $X$\n(L × C)\n一行一个标记", _BOX["input"])
        q = _box(ax, 3.0, 4.3, 1.7, 0.9, "查询 $Q = XW_q$", _BOX["proj"], 10)
        k = _box(ax, 3.0, 2.45, 1.7, 0.9, "键 $K = XW_k$", _BOX["proj"], 10)
        v = _box(ax, 3.0, 0.6, 1.7, 0.9, "值 $V = XW_v$", _BOX["proj"], 10)
        for dst, name in ((q, "$W_q$"), (k, "$W_k$"), (v, "$W_v$")):
            _arrow(ax, x_in["r"], dst["l"], f"× {name}", ((x_in["r"][0] + dst["l"][0]) / 2, dst["l"][1] + 0.08))
        s = _box(ax, 5.6, 3.35, 2.0, 1.2, "评分 $QK^{\\top}/\\sqrt{d}$\n(L × L)", _BOX["score"])
        _arrow(ax, q["r"], (s["l"][0], s["l"][1] + 0.3))
        _arrow(ax, k["r"], (s["l"][0], s["l"][1] - 0.3))
        p = _box(ax, 5.6, 1.55, 2.0, 1.1, "注意力分数 $P$\n每行加起来等于 1", _BOX["score"], 10)
        _arrow(ax, s["b"], p["t"], "Softmax", (s["b"][0] + 0.62, (s["b"][1] + p["t"][1]) / 2 - 0.12))
        o = _box(ax, 8.4, 1.1, 1.9, 1.3, "输出 $PV$\n(L × $D_v$)\n每个标记一个\n新向量", _BOX["out"], 10)
        _arrow(ax, p["r"], (o["l"][0], o["l"][1] + 0.3))
        _arrow(ax, v["r"], (o["l"][0], o["l"][1] - 0.45), "按比例混合", (6.6, 0.68))
        ax.set_title("自注意力：同一个输入乘三个不同的矩阵", fontsize=11)
        fig.tight_layout()
    return fig


def draw_causal_next_token(inputs: Sequence[str], targets: Sequence[str], keep, width: float = MAX_WIDTH_IN):
    """把因果掩码盖在接龙上：第 i 行只看得见 keep[i] 为 True 的词，右边一列是它要猜的下一个词。

    Args:
        inputs: the L input tokens (the keys, also the rows' own tokens).
        targets: the L tokens to guess, ``targets[i]`` for row i.
        keep: (L, L) boolean mask, True = may look (``attn_lib.causal_mask(L)``).
        width: figure width in inches (at most ``MAX_WIDTH_IN``).

    Returns:
        The matplotlib Figure.
    """
    keep = np.asarray(keep.detach().cpu() if hasattr(keep, "detach") else keep)
    L = len(inputs)
    if keep.dtype != bool or keep.shape != (L, L):
        raise ValueError(f"keep must be a boolean ({L}, {L}) mask, got {keep.dtype} {tuple(keep.shape)}; "
                         "pass attn_lib.causal_mask(len(inputs))")
    if len(targets) != L:
        raise ValueError(f"targets must have {L} tokens (one per row), got {len(targets)}; "
                         "targets[i] is what row i guesses")
    if not 0 < width <= MAX_WIDTH_IN:
        raise ValueError(f"width must be in (0, {MAX_WIDTH_IN}] inches, got {width!r}; "
                         "a wider figure is shrunk on a phone and its text becomes unreadable")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    with book_style():
        fig, ax = plt.subplots(figsize=(width, 0.62 * L + 1.5))
        for i in range(L):
            for j in range(L):
                seen = bool(keep[i, j])
                ax.add_patch(Rectangle((j, L - 1 - i), 0.94, 0.9, facecolor="#cfe3f3" if seen else "#5a5a5a"))
                ax.text(j + 0.47, L - 0.55 - i, inputs[j] if seen else "盖住", ha="center", va="center",
                        fontsize=10, color="black" if seen else "white")
            ax.add_patch(Rectangle((L + 0.5, L - 1 - i), 1.2, 0.9, facecolor="#e4f1e0", edgecolor="#3c7a3c"))
            ax.text(L + 1.1, L - 0.55 - i, targets[i], ha="center", va="center", fontsize=10)
            ax.text(-0.12, L - 0.55 - i, f"第 {i} 行", ha="right", va="center", fontsize=10)
            ax.annotate("", xy=(L + 0.48, L - 0.55 - i), xytext=(L - 0.02, L - 0.55 - i),
                        arrowprops={"arrowstyle": "-|>", "color": "#3c7a3c", "lw": 1.0})
        ax.text(L / 2, L + 0.2, "键：这一行看得见哪些词", ha="center", va="bottom", fontsize=10)
        ax.text(L + 1.1, L + 0.2, "要猜的词", ha="center", va="bottom", fontsize=10, color="#3c7a3c")
        ax.set_xlim(-1.3, L + 1.9)
        ax.set_ylim(-0.2, L + 0.8)
        ax.axis("off")
        ax.set_title("因果掩码盖在接龙上：每一行只看自己和前面的词，猜下一个", fontsize=11)
        fig.tight_layout()
    return fig


__all__ = ["MIN_FONT_PT", "draw_causal_next_token", "draw_qkv_projection"]
