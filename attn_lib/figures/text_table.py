"""全书共用（第 2–4、7–13 章印表）：纯文本表格，一个汉字按两列宽对齐。

``print(text_table(header, rows))`` prints a right-aligned table whose columns line up in a
terminal or a notebook's output, where a Han character (and any East Asian wide or
full-width character) takes two columns.
"""
from __future__ import annotations

import unicodedata
from typing import Sequence


def display_width(text: str) -> int:
    """字符串在等宽字体里占几列：东亚宽字符（汉字、全角标点）算 2 列，其余算 1 列。"""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in str(text))


def pad_right(text, width: int) -> str:
    """在右边补空格，让文字在等宽字体里占 width 列（汉字算两列）；已经够宽就原样返回。"""
    text = str(text)
    return text + " " * max(0, width - display_width(text))


def text_table(header: Sequence, rows: Sequence[Sequence], *, sep: str = "   ", align: str = "right") -> str:
    """把表头和若干行排成纯文本表格（按显示宽度对齐，汉字算两列）。

    Args:
        header: the column titles.
        rows: the rows, each as long as ``header``; cells are turned into ``str``.
        sep: the text between two columns.
        align: ``"right"`` (default, for numbers) or ``"left"``.

    Returns:
        The table as one string, lines joined by ``\\n``, trailing spaces removed.
    """
    if align not in ("right", "left"):
        raise ValueError(f"align must be 'right' or 'left', got {align!r}")
    table = [[str(c) for c in header], *[[str(c) for c in r] for r in rows]]
    if any(len(r) != len(table[0]) for r in table):
        raise ValueError(f"every row must have {len(table[0])} cells (as many as header), "
                         f"got lengths {sorted({len(r) for r in table})}")
    cols = [max(display_width(r[i]) for r in table) for i in range(len(table[0]))]

    def pad(cell: str, width: int) -> str:
        if align == "left":
            return pad_right(cell, width)
        return " " * (width - display_width(cell)) + cell

    return "\n".join(sep.join(pad(c, w) for c, w in zip(r, cols)).rstrip() for r in table)


__all__ = ["display_width", "pad_right", "text_table"]
