"""第 08 章（FlashAttention）的练习。参考答案全部由代码算出。"""
from __future__ import annotations

import torch

from ..io_model import flash_attention_io, score_matrix_bytes
from ..online_softmax import online_max_and_sum
from . import Exercise, register

_row = torch.tensor([2.0, 1.0, 3.0], dtype=torch.float64)  # (S=3,)
_m, _l = online_max_and_sum(_row, [2, 1])
_m1, _l1 = online_max_and_sum(_row[:2], [2])  # after the first piece only

register(Exercise(
    id="08-1",
    question="一行分数 [2, 1, 3] 分两段读：先读 [2, 1]，再读 [3]。读完第二段后，「目前的指数和」ℓ 是多少？"
             "（此时 m = 3；精确到 0.001）",
    answer=float(_l),
    hint="第一段读完 m = 2,ℓ = e^0 + e^(1-2)；第二段把 m 抬到 3，旧的 ℓ 要先乘 e^(2-3) 再加上 e^(3-3)。",
    atol=1e-3,
    wrong_example=float(_l1) + 1.0,  # forgot to rescale the old sum
))

register(Exercise(
    id="08-2",
    question="一层注意力有 8 个头，序列长度 4096，分数用 float16（每个数 2 字节）存。batch 为 1 时，"
             "这一层的分数矩阵 (B, H, L, S) 占多少 MiB（1 MiB = 2^20 字节）？",
    answer=score_matrix_bytes(1, 8, 4096, 4096, bytes_per_element=2) / 2**20,
    hint="元素个数是 B·H·L·S = 1·8·4096·4096，再乘 2 字节，除以 2^20。也可以调用 attn_lib.io_model.score_matrix_bytes。",
    atol=1e-6,
    wrong_example=8 * 4096 * 2 / 2**20,  # linear in the length: that is the size of one K row block, not the scores
))

register(Exercise(
    id="08-3",
    question="论文的 Algorithm 1 里，头的维度 d = 64，片上内存 M = 65536 个数，序列长度 N = 4096。"
             "外层循环一共走几趟（也就是整个 Q 从显存里被读了几遍）？",
    answer=flash_attention_io(4096, 64, 65536)["Tc"],
    hint="Bc = ceil(M / 4d) = ceil(65536 / 256)；外层循环的趟数 Tc = ceil(N / Bc)。"
         "也可以看 attn_lib.io_model.flash_attention_io(4096, 64, 65536)['Tc']。",
    atol=0.0,
    wrong_example=1,
))
