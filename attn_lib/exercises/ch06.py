"""第 06 章（因果掩码）的练习。答案都由代码算出。"""
from __future__ import annotations

import torch

from .. import worked_example as we
from ..masks import causal_mask
from ..reference import attention
from . import Exercise, register


def _masked_water_weight() -> float:
    q, k, v = we.as_tensors()
    keep = torch.tensor([True, True, False])  # 打翻 comes after 它
    _, scores = attention(q, k, v, mask=keep)
    return round(float(scores[0, 0, 0, 0]), 4)


register(Exercise(
    id="06-1",
    question="主走查里把「打翻」盖住以后，「它」分给「水」的注意力分数精确到 4 位小数是多少？",
    answer=_masked_water_weight(),
    hint="分数 3.0 / 0.6 / -inf 做 Softmax:e^3.0 ÷ (e^3.0 + e^0.6)。原章的 0.92 是四舍五入到两位的结果。",
    atol=5e-4,
    wrong_example=we.SOURCE_PRINTED["masked_weights"][0],
))

register(Exercise(
    id="06-2",
    question="causal_mask(3, 5)（3 个查询、5 个键，左上角对齐）里一共有多少个 True?",
    answer=int(causal_mask(3, 5).sum()),
    hint="第 i 个查询能看第 0..i 个键，共 i + 1 个。",
    wrong_example=int(causal_mask(5)[-3:].sum()),  # the bottom-right alignment
))
