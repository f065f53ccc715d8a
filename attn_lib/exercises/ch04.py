"""第 04 章（缩放与完整走查）的练习。参考答案全部由代码算出。"""
from __future__ import annotations

import math

import torch

from .. import worked_example as we
from ..reference import attention
from ..scaling import softmax_grad_norm
from ..softmax import softmax
from . import Exercise, register

_dots = torch.tensor(we.SOURCE_PRINTED["dots"], dtype=torch.float64)  # (S=3,)

register(Exercise(
    id="04-1",
    question="向量还是主走查那几个，但假装 d = 16（除以 √16 = 4 而不是 2）：「水」分到的比例是多少？（精确到 0.001）",
    answer=float(softmax(_dots / math.sqrt(16))[0]),
    hint="三个点积 6.0、1.2、4.8 各除以 4，再做 softmax，取第一个。除数越大，比例越平均。",
    atol=1e-3,
    wrong_example=0.61,
))

register(Exercise(
    id="04-2",
    question="4 个分数完全相等时，softmax 的雅可比矩阵 diag(p) − ppᵀ 的 Frobenius 范数是多少？（精确到 0.001）",
    answer=float(softmax_grad_norm(torch.zeros(4, dtype=torch.float64))),
    hint="p = [0.25, 0.25, 0.25, 0.25]；对角线上是 0.25 − 0.0625，其余是 −0.0625；平方、求和、开根。"
         "也可以调用 attn_lib.scaling.softmax_grad_norm。",
    atol=1e-3,
    wrong_example=0.0,
))

_q2 = torch.tensor([0.0, 1.0, 0.0, 1.0], dtype=torch.float64).view(1, 1, 1, 4)  # (B,H,L,D)
_, _k, _v = we.as_tensors()

register(Exercise(
    id="04-3",
    question="把「它」的查询换成 [0, 1, 0, 1]，完整走一遍缩放点积注意力，「它」的新表示是什么？（长度为 4 的列表，精确到 0.001）",
    answer=attention(_q2, _k, _v)[0].reshape(4).tolist(),
    hint="点积是 3、3、1，除以 2,softmax，再按比例混合三个值向量；或者调用 attn_lib.attention。",
    atol=1e-3,
    wrong_example=list(we.SOURCE_PRINTED["output"]),
))
