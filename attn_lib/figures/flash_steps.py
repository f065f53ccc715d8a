"""第 08 章（FlashAttention 分块示意图）：一步一格，画出显存里的 Q、K、V、O 块和此刻片上 SRAM 里的东西。

``show_flash_steps([(i, j, write_out), ...])`` stacks the steps top to bottom; each step is
drawn by ``draw_flash_step``: HBM on the left (dark red = read or written in this step, light
red = Q_i, already on chip since j = 0), SRAM on the right (Q_i, K_j, V_j, the small score
block S_ij, the running max and sum m_i, ℓ_i, the accumulator acc_i). Also importable from
``attn_lib.figures.plotting``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .plotting import MAX_WIDTH_IN, in_book_style


def _check_step(i, j, n, write_out) -> None:
    for name, value in (("i", i), ("j", j), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"draw_flash_step: {name} must be an int, got {type(value).__name__} {value!r}")
    if n < 1 or not (0 <= i < n and 0 <= j < n):
        raise ValueError(f"draw_flash_step: need 0 <= i, j < n with n >= 1, got i={i}, j={j}, n={n}")
    if not isinstance(write_out, bool):
        raise TypeError(f"draw_flash_step: write_out must be a bool, got {type(write_out).__name__} {write_out!r}")


def _draw_hbm(ax, i: int, j: int, n: int, write_out: bool) -> None:
    """The left box: Q, K, V, O in HBM, n blocks each."""
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((0.1, -0.3), 4.65, n + 1.2, fill=False, lw=1.5, ls="--", ec="tab:blue"))
    ax.text(2.4, n + 1.1, "显存（大、慢）", ha="center", color="tab:blue", fontsize=10)
    for name, x0 in {"Q": 0.3, "K": 1.45, "V": 2.6, "O": 3.75}.items():
        ax.text(x0 + 0.4, n + 0.2, name, ha="center", fontsize=11)
        for b in range(n):
            y = n - 1 - b
            active = (name == "Q" and b == i and j == 0) or (name in "KV" and b == j) or (name == "O" and b == i and write_out)
            kept = name == "Q" and b == i and j > 0  # 早已读进片上，这一步不再读
            ax.add_patch(Rectangle((x0, y), 0.8, 0.9, fc="tab:red" if active else ("#f4a6a0" if kept else "#e6e6e6"),
                                   ec="black", lw=0.8))
            ax.text(x0 + 0.4, y + 0.45, f"{name}{b}", ha="center", va="center", fontsize=8,
                    color="white" if active else "black")


def _draw_sram(ax, i: int, j: int, n: int) -> None:
    """The right box: what SRAM holds during the step."""
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((6.3, -0.3), 3.6, n + 1.2, fill=False, lw=1.5, ls="--", ec="tab:green"))
    ax.text(8.1, n + 1.1, "片上 SRAM（小、快）", ha="center", color="tab:green", fontsize=10)
    on_chip = [(f"Q{i}", 6.55, n - 1.2), (f"K{j}", 7.75, n - 1.2), (f"V{j}", 8.95, n - 1.2),
               (f"S{i}{j}\n小块评分", 6.55, n - 2.6), (f"m{i} ℓ{i}", 7.75, n - 2.6), (f"acc{i}", 8.95, n - 2.6)]
    for label, x0, y in on_chip:
        ax.add_patch(Rectangle((x0, y), 0.9, 0.9, fc="#fde0dd", ec="tab:red", lw=0.8))
        ax.text(x0 + 0.45, y + 0.45, label, ha="center", va="center", fontsize=7.5)


def draw_flash_step(ax, i: int, j: int, *, n: int = 4, write_out: bool = False):
    """在 ax 上画 FlashAttention 分块计算的一步（第 08 章）：显存里的 Q、K、V、O 块，和此刻片上 SRAM 里的东西。

    Args:
        ax: the matplotlib Axes to draw into.
        i: query block, 0 <= i < n.
        j: key/value block, 0 <= j < n.
        n: number of blocks per matrix.
        write_out: this is the last key block: O_i = acc_i / ℓ_i is written back to HBM.

    Returns:
        The Axes.
    """
    from matplotlib.patches import FancyArrowPatch

    _check_step(i, j, n, write_out)
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.5, n + 1.5)
    ax.axis("off")
    _draw_hbm(ax, i, j, n, write_out)
    _draw_sram(ax, i, j, n)
    read = "读 K、V" if j > 0 else "读 Q、K、V"
    ax.add_patch(FancyArrowPatch((4.85, n - 0.6), (6.2, n - 0.6), arrowstyle="-|>", mutation_scale=14,
                                 color="tab:red", lw=1.5))
    ax.text(5.52, n - 0.35, read, ha="center", fontsize=8, color="tab:red")
    if write_out:
        ax.add_patch(FancyArrowPatch((6.2, 0.4), (4.85, 0.4), arrowstyle="-|>", mutation_scale=14,
                                     color="tab:purple", lw=1.5))
        ax.text(5.52, 0.65, f"写 O{i}", ha="center", fontsize=8, color="tab:purple")
    title = f"查询块 i = {i}，键块 j = {j}" + (f"（最后一块）：O{i} = acc{i} / ℓ{i} 写回" if write_out else "")
    ax.set_title(title, fontsize=10)
    return ax


@in_book_style
def show_flash_steps(steps: Sequence[tuple[int, int, bool]], *, n: int = 4, suptitle: str | None = None):
    """把 FlashAttention 分块计算的几步上下排成一张图（第 08 章），每步一格，图宽 7 英寸。

    Args:
        steps: ``(i, j, write_out)`` per step, drawn top to bottom (see ``draw_flash_step``).
        n: number of blocks per matrix.
        suptitle: a title for the whole figure.

    Returns:
        The matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    steps = list(steps)
    if not steps:
        raise ValueError("show_flash_steps needs at least one (i, j, write_out) step")
    fig, axes = plt.subplots(len(steps), 1, figsize=(MAX_WIDTH_IN, 0.5 + 2.9 * len(steps)), squeeze=False)
    for ax, step in zip(axes[:, 0], steps):
        if len(step) != 3:
            raise ValueError(f"show_flash_steps: each step is (i, j, write_out), got {step!r}")
        i, j, write_out = step
        draw_flash_step(ax, i, j, n=n, write_out=write_out)
    if suptitle:
        fig.suptitle(suptitle, fontsize=11)
    fig.tight_layout()
    return fig


__all__ = ["draw_flash_step", "show_flash_steps"]
