"""attn_lib.figures.text_table: columns line up when a Han character takes two columns."""
import pytest

from attn_lib.figures.text_table import display_width, pad_right, text_table


def test_display_width_counts_han_as_two():
    assert display_width("abc") == 3
    assert display_width("注意力") == 6
    assert display_width("q·k，") == 5  # '·' is narrow, '，' is full-width


def test_columns_line_up_by_display_width():
    out = text_table(["名字", "n"], [["它", "1"], ["abc", "22"]])
    lines = out.split("\n")
    assert lines == ["名字    n", "  它    1", " abc   22"]
    assert len({display_width(line) for line in lines}) == 1


def test_left_alignment_and_bad_rows():
    assert text_table(["a", "b"], [["注意", "x"]], align="left").split("\n")[0] == "a      b"
    with pytest.raises(ValueError, match="every row must have 2 cells"):
        text_table(["a", "b"], [["x"]])
    with pytest.raises(ValueError, match="align must be"):
        text_table(["a"], [], align="center")


def test_pad_right_pads_by_display_width():
    assert pad_right("水", 4) == "水  "
    assert pad_right("打翻", 4) == "打翻"
    assert pad_right("abc", 4) == "abc "
    assert pad_right("打翻了", 4) == "打翻了"  # already wider: unchanged
