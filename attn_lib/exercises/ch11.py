"""第 11 章（证据、边界与可带走的）的练习。答案都由代码算出。"""
from __future__ import annotations

import torch

from ..reference import attention
from . import Exercise, register

SHORT, LONG = 1024, 4096


def _score_entries(L: int) -> int:
    """一个头的注意力分数矩阵有 L × L 个元素（L 个查询，每个对 L 个键）。"""
    return L * L


def _kv_cache_entries(L: int, num_layers: int = 12, num_heads: int = 12, head_dim: int = 64) -> int:
    """生成 L 个标记时 KV 缓存要存的数：每层、每个标记一份键和一份值。"""
    return num_layers * 2 * L * num_heads * head_dim


def _pooled_changes_when_reversed() -> bool:
    """不带掩码的自注意力：把三个词倒过来排，对位置求平均的句向量会不会变？"""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(1, 1, 3, 4, generator=g, dtype=torch.float64)  # (B,H,L,D): 我 喜欢 你
    w_q, w_k, w_v = (torch.randn(4, 4, generator=g, dtype=torch.float64) for _ in range(3))
    pooled = []
    for order in ([0, 1, 2], [2, 1, 0]):  # 我喜欢你 / 你喜欢我
        xs = x[:, :, order]  # (1,1,3,4) permuted along L
        out, _ = attention(xs @ w_q, xs @ w_k, xs @ w_v)  # (1,1,3,4)
        pooled.append(out.mean(dim=2))  # (1,1,3,4) -> (1,1,4)
    return not torch.allclose(pooled[0], pooled[1], rtol=1e-12, atol=1e-12)


register(Exercise(
    id="11-1",
    question=f"序列长度从 {SHORT} 变成 {LONG}，一个头的注意力分数矩阵的元素个数变成原来的几倍？",
    answer=_score_entries(LONG) // _score_entries(SHORT),
    hint="分数矩阵是 L × L：长度乘 4，行数和列数各乘 4。",
    wrong_example=LONG // SHORT,
))

register(Exercise(
    id="11-2",
    question=f"生成文字时，序列长度从 {SHORT} 变成 {LONG},KV 缓存要存的数变成原来的几倍？",
    answer=_kv_cache_entries(LONG) // _kv_cache_entries(SHORT),
    hint="KV 缓存给每个已生成的标记存一份键和一份值，长度乘几，它就乘几。",
    wrong_example=_score_entries(LONG) // _score_entries(SHORT),
))

register(Exercise(
    id="11-3",
    question="不带掩码的自注意力：把「我喜欢你」倒过来排成「你喜欢我」，对所有位置求平均得到的句向量会变吗？（填 True 或 False）",
    answer=_pooled_changes_when_reversed(),
    hint="打乱输入只会把输出按同样的方式打乱；求平均不看顺序。",
    wrong_example=not _pooled_changes_when_reversed(),
))
