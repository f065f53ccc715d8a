"""第 06 章（因果掩码）的练习。参考答案是写死的数或用标准库 math 独立算出，不调用 attn_lib。"""
from __future__ import annotations

import math

from .. import worked_example as we
from . import Exercise, register


register(Exercise(
    id="06-1",
    question="主走查里把「打翻」盖住以后，「它」分给「水」的注意力分数精确到 4 位小数是多少？",
    answer=round(1 / (1 + math.exp(0.6 - 3.0)), 4),  # e^3.0 ÷ (e^3.0 + e^0.6) = 0.9168
    hint="分数 3.0 / 0.6 / -inf 做 Softmax：e^3.0 ÷ (e^3.0 + e^0.6)。原章的 0.92 是四舍五入到两位的结果。",
    atol=5e-4,
    wrong_example=we.SOURCE_PRINTED["masked_weights"][0],
))

register(Exercise(
    id="06-2",
    question="causal_mask(3, 5)（3 个查询、5 个键，左上角对齐）里一共有多少个 True？",
    answer=6,  # 1 + 2 + 3
    hint="第 i 个查询能看第 0..i 个键，共 i + 1 个。",
    wrong_example=12,  # 3 + 4 + 5: the bottom-right alignment
))
