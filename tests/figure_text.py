"""Shared helpers for the figure-text tests: a subscript written as plain text (「H_kv」, 「lse_p」) instead
of matplotlib mathtext (「$H_{kv}$」, 「$\\mathrm{lse}_p$」), as the prose writes it with MathJax.

A plain subscript is a symbol of one to three Latin letters (or ℓ), an underscore and a subscript of one to
three letters or digits (or a braced group), standing alone: not part of a longer identifier such as
``window_size``, ``num_kv_heads`` or ``attn_lib``, which are code names and stay as they are. Text between
two unescaped ``$`` is mathtext and is not checked. Used by tests/figures (the Text artists of the figures
attn_lib draws) and tests/book/test_figure_text.py (the strings the chapters' code cells pass to figures).
"""
from __future__ import annotations

import re

SUBSCRIPT = re.compile(r"(?<![A-Za-z0-9_\\])[A-Za-zℓ]{1,3}_(?:\{[^{}]*\}|[A-Za-z0-9]{1,3})(?![A-Za-z0-9_{])")
MATH = re.compile(r"(?<!\\)\$(?:\\.|[^$\\])*\$")


def plain_subscripts(text: str) -> list[str]:
    """The plain-text subscripts in ``text`` outside its ``$...$`` spans."""
    return [m.group(0) for m in SUBSCRIPT.finditer(MATH.sub(" ", text))]


def drawn_texts(fig) -> list[str]:
    """Every visible, non-empty text of a figure once drawn: labels, titles, legends, annotations, tick labels."""
    from matplotlib.text import Text

    fig.canvas.draw()
    return [t.get_text() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def figure_subscript_problems(fig) -> list[str]:
    """「text: subscripts」 for each text of ``fig`` that writes a subscript as plain text."""
    return [f"{t!r}: {plain_subscripts(t)}" for t in drawn_texts(fig) if plain_subscripts(t)]


def assert_subscripts_in_mathtext(draw) -> None:
    """Draw a figure with ``draw()``, assert that none of its texts writes a plain subscript, close it."""
    import matplotlib.pyplot as plt

    fig = draw()
    try:
        problems = figure_subscript_problems(fig)
        assert problems == [], "plain-text subscripts (write them as $X_{y}$):\n" + "\n".join(problems)
    finally:
        plt.close(fig)
