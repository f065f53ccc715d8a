"""第 08 章（FlashAttention）的练习。参考答案是写死的数或用标准库 math 独立算出，不调用 attn_lib。"""
from __future__ import annotations

import math

from . import Exercise, register

_l1 = math.exp(2 - 2) + math.exp(1 - 2)  # after the first piece [2, 1]: m = 2
_l = _l1 * math.exp(2 - 3) + math.exp(3 - 3)  # after [3]: m = 3, the old sum rescaled by e^(2-3)

register(Exercise(
    id="08-1",
    question="一行评分 [2, 1, 3] 分两段读：先读 [2, 1]，再读 [3]。读完第二段后，「目前的指数和」ℓ 是多少？"
             "（此时 m = 3；精确到 0.001）",
    answer=_l,  # = e^(2-3) + e^(1-3) + e^(3-3) ≈ 1.503
    hint="第一段读完 m = 2，ℓ = e^0 + e^(1-2)；第二段把 m 抬到 3，旧的 ℓ 要先乘 e^(2-3) 再加上 e^(3-3)。",
    atol=1e-3,
    wrong_example=float(_l1) + 1.0,  # forgot to rescale the old sum
))

register(Exercise(
    id="08-2",
    question="一层注意力有 8 个头，序列长度 4096，评分用 float16（每个数 2 字节）存。批大小为 1 时，"
             "这一层的评分矩阵 (B, H, L, S) 占多少 MiB（1 MiB = 2^20 字节）？",
    answer=256.0,  # 1·8·4096·4096 个数 × 2 字节 ÷ 2^20
    hint="元素个数是 B·H·L·S = 1·8·4096·4096，再乘 2 字节，除以 2^20。也可以调用 attn_lib.costs.io_model.score_matrix_bytes。",
    atol=1e-6,
    wrong_example=8 * 4096 * 2 / 2**20,  # linear in the length: that is the size of one K row block, not the scores
))

register(Exercise(
    id="08-3",
    question="论文的 Algorithm 1 里，头的维度 d = 64，片上 SRAM 能放 M = 65536 个数，序列长度 N = 4096。"
             "外层循环一共走几趟（也就是整个 Q 从显存里被读了几遍）？",
    answer=16,  # Bc = ⌈65536 / 256⌉ = 256，Tc = ⌈4096 / 256⌉ = 16
    hint="Bc = ceil(M / 4d) = ceil(65536 / 256)；外层循环的趟数 Tc = ceil(N / Bc)。"
         "可以用 attn_lib.costs.io_model.flash_attention_io(4096, 64, 65536)['Tc'] 核对。",
    atol=0.0,
    wrong_example=1,
))
