"""第 06 章（因果掩码）的练习。参考答案是写死的数或用标准库 math 独立算出，不调用 attn_lib；写代码的练习拿 PyTorch 核对（见 code.py）。"""
from __future__ import annotations

import math

from ..core import worked_example as we
from . import Exercise, register


_EXP = [math.exp(x) for x in we.SOURCE_PRINTED["scaled"]]  # e^3.0, e^0.6, e^2.4
_W4 = [round(e / sum(_EXP), 4) for e in _EXP[:2]]  # unmasked shares of 水 and 书, rounded to 4 places

register(Exercise(
    id="06-1",
    question="主走查里把「打翻」盖住以后，「它」分给「水」的注意力分数精确到 4 位小数是多少？",
    answer=round(1 / (1 + math.exp(0.6 - 3.0)), 4),  # e^3.0 ÷ (e^3.0 + e^0.6) = 0.9168
    hint="评分 3.0 / 0.6 / -inf 做 Softmax：e^3.0 ÷ (e^3.0 + e^0.6)。原章的 0.92 是四舍五入到两位的结果。",
    atol=5e-5,  # 0.9168 (exactly 0.916827) passes; 0.9169, from rounding before dividing, does not
    wrong_example=round(_W4[0] / sum(_W4), 4),  # 0.9169: 0.6099 / (0.6099 + 0.0553)
))

register(Exercise(
    id="06-2",
    question="causal_mask(3, 5)（3 个查询、5 个键，左上角对齐）里一共有多少个 True？",
    answer=6,  # 1 + 2 + 3
    hint="第 i 个查询能看第 0..i 个键，共 i + 1 个。",
    wrong_example=12,  # 3 + 4 + 5: the bottom-right alignment
))


# ---------------------------------------------------------------- 06-3: write the code yourself
# The key is torch.tril; True = may look (the book's convention, as attn_lib.causal_mask).

import torch  # noqa: E402  (code exercises: the answer key is torch itself)

from .code import CodeExercise, Mistake, Probe, register_code  # noqa: E402


def _tril(L, diagonal=0):
    return torch.ones(L, L, dtype=torch.bool).tril(diagonal)  # (L,L)


def _upper(L):
    return torch.ones(L, L, dtype=torch.bool).triu()  # (L,L): sees itself and the future


def _strict_past(L):
    return torch.ones(L, L, dtype=torch.bool).tril(-1)  # (L,L): does not see itself


register_code(CodeExercise(
    id="06-3",
    name="causal_mask_bool",
    reference=_tril,
    probes=(Probe("长度 L = 5", lambda g: (5,)), Probe("长度 L = 1", lambda g: (1,)), Probe("长度 L = 8", lambda g: (8,))),
    mistakes=(
        Mistake("direction", _upper, "掩码方向反了：每个位置应看得见自己和前面的位置（下三角），看不见后面的。"),
        Mistake("diagonal", _strict_past, "对角线被盖住了：每个位置也要看得见它自己。"),
        Mistake("inverted", lambda L: ~_tril(L),
                "True 和 False 反了：本书的掩码里 True = 可以看（nn.MultiheadAttention 的 attn_mask 正相反）。"),
    ),
    wrong_solutions=((_upper, "direction"), (_strict_past, "diagonal"), (lambda L: _tril(L).float(), "dtype")),
    forbidden=("attn_lib.causal_mask",),
))
