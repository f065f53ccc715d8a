"""第 09 章（FlashAttention 的反向传播）的练习。参考答案是手算的字面值，旁边的独立计算（纯 Python，不用本库）核对它们。"""
from __future__ import annotations

from . import Exercise, register

# 09-1: one row of proportions P_i and of dP_i = dO_i · v_j.
_P = [0.5, 0.3, 0.2]
_dP = [1.0, 2.0, 4.0]
_D = sum(p * g for p, g in zip(_P, _dP))  # 0.5 + 0.6 + 0.8 = 1.9
assert abs(_D - 1.9) < 1e-12
assert abs(_P[0] * (_dP[0] - _D) - (-0.45)) < 1e-12

register(Exercise(
    id="09-1",
    question="一个查询对三个键的比例是 P = [0.5, 0.3, 0.2]，dP = dO·Vᵀ 的这一行是 [1, 2, 4]。"
             "第一个键的评分的梯度 dS_1 = P_1·(dP_1 − Δ) 是多少？（Δ = Σ_j P_j·dP_j；精确到 0.001）",
    answer=-0.45,
    hint="先算 Δ = 0.5·1 + 0.3·2 + 0.2·4，再算 0.5·(1 − Δ)。",
    atol=1e-3,
    wrong_example=0.5,  # forgot to subtract Δ: P_1 · dP_1
))

# 09-2: Δ_i from the output and its gradient only.
_O = [1.0, 2.0]
_dO = [3.0, -1.0]
assert sum(o * g for o, g in zip(_O, _dO)) == 1.0

register(Exercise(
    id="09-2",
    question="某个查询的输出是 O_i = [1, 2]，损失对它的梯度是 dO_i = [3, −1]。"
             "不看 P，只用这两个向量，Δ_i = rowsum(dO_i ∘ O_i) 是多少？",
    answer=1.0,
    hint="逐元素相乘再相加：1·3 + 2·(−1)。",
    atol=1e-9,
    wrong_example=5.0,  # summed the entries instead of multiplying them
))

# 09-3: what the backward would have to keep without recomputation, and what it keeps instead.
_N, _H = 4096, 8
_P_bytes = 1 * _H * _N * _N * 4  # float32 proportions (B, H, L, S)
_lse_bytes = 1 * _H * _N * 4  # float32 log-sum-exp (B, H, L)
assert _P_bytes // _lse_bytes == 4096

register(Exercise(
    id="09-3",
    question="B = 1、H = 8、长度 N = 4096、float32。不做重计算时，反向传播要存下比例矩阵 P (B, H, N, N)；"
             "FlashAttention 不存 P，代替它的是每个查询一个数的 log-sum-exp (B, H, N)。前者是后者的几倍？",
    answer=4096,
    hint="两者都乘了 B·H 和 4 字节；P 每个查询存 N 个数，lse 每个查询存 1 个数。",
    atol=0.0,
    wrong_example=4096 * 4096,
))
