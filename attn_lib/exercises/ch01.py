"""第 01 章（字典类比）的练习。参考答案是写死的数或不经 attn_lib 的独立计算（标准库 math）。"""
from __future__ import annotations

import math

from . import Exercise, register

# The chapter's made-up 3-d embeddings (dimensions: 能吃, 是水果, 是家具).
TOY_KEYS = {"apple": (1.0, 1.0, 0.0), "banana": (1.0, 0.8, 0.0), "chair": (-0.5, -1.0, 2.0)}
EDIBLE_QUERY = (1.0, 0.0, 0.0)


def _soft_lookup_for(query) -> float:
    # Independent of attn_lib: plain-Python dot products, softmax and weighted sum.
    values = (10.0, 5.0, 2.0)  # apple, banana, chair (the chapter's dictionary)
    dots = [sum(a * b for a, b in zip(query, TOY_KEYS[t])) for t in ("apple", "banana", "chair")]
    exps = [math.exp(x - max(dots)) for x in dots]
    return sum(e / sum(exps) * v for e, v in zip(exps, values))


register(Exercise(
    id="01-1",
    question="把比例换成 apple 0.5、banana 0.5、chair 0，软查找的结果是多少？",
    answer=7.5,  # 10×0.5 + 5×0.5 + 2×0
    hint="结果 = 10×比例_apple + 5×比例_banana + 2×比例_chair；可以直接调用 soft_lookup。",
    wrong_example=8.0,
))

register(Exercise(
    id="01-2",
    question="用本章编造的三维向量，查询换成「能吃的东西」[1, 0, 0]：先点积、再 softmax、再加权求和，结果是多少？",
    answer=_soft_lookup_for(EDIBLE_QUERY),
    hint="点积依次是 1、1、-0.5；把它们交给 attn_lib.softmax 得到比例，再用 soft_lookup 混合 10、5、2。",
    atol=1e-2,
    wrong_example=8.0,
))
