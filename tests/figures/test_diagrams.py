"""attn_lib.figures.diagrams: the chapter 05-06 diagrams fit a phone (<= 7 in wide, no text under 9 pt),
label in Chinese, and draw exactly the mask they are given."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from attn_lib.figures.diagrams import MIN_FONT_PT, draw_causal_next_token, draw_qkv_projection  # noqa: E402
from attn_lib.figures.plotting import MAX_WIDTH_IN  # noqa: E402

TOKENS = ["【BOS】", "I", "like", "you", "【EOS】"]


def _texts(fig):
    fig.canvas.draw()
    return [t for t in fig.findobj(matplotlib.text.Text) if t.get_text().strip()]


def _check_readable(fig):
    assert fig.get_size_inches()[0] <= MAX_WIDTH_IN
    texts = _texts(fig)
    assert texts, "the diagram has no text"
    small = [(t.get_text(), t.get_fontsize()) for t in texts if t.get_fontsize() < MIN_FONT_PT]
    assert not small, f"text under {MIN_FONT_PT} pt: {small}"
    assert any("\u4e00" <= ch <= "\u9fff" for t in texts for ch in t.get_text()), "no Chinese label"
    return [t.get_text() for t in texts]


def test_qkv_projection_names_every_stage():
    fig = draw_qkv_projection()
    labels = " ".join(_check_readable(fig))
    for part in ("输入", "查询", "键", "值", "Softmax", "注意力分数", "输出", "W_q", "W_k", "W_v"):
        assert part in labels, part
    plt.close(fig)


@pytest.mark.parametrize("L", [1, 4])
def test_causal_grid_draws_the_given_mask(L):
    keep = torch.ones(L, L, dtype=torch.bool).tril()  # (L,L) True = may look
    fig = draw_causal_next_token(TOKENS[:L], TOKENS[1:L + 1], keep)
    labels = _check_readable(fig)
    assert labels.count("盖住") == int((~keep).sum())
    for i in range(L):
        assert TOKENS[i + 1] in labels  # each row's target is shown
    plt.close(fig)


def test_causal_grid_follows_a_different_mask():
    keep = torch.ones(3, 3, dtype=torch.bool)
    keep[2, 0] = False  # not causal: the diagram draws what it is given, not a fixed picture
    fig = draw_causal_next_token(TOKENS[:3], TOKENS[1:4], keep)
    assert _check_readable(fig).count("盖住") == 1
    plt.close(fig)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="keep must be a boolean"):
        draw_causal_next_token(TOKENS[:3], TOKENS[1:4], torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="targets must have 3"):
        draw_causal_next_token(TOKENS[:3], TOKENS[1:3], torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="width must be"):
        draw_qkv_projection(width=9)
