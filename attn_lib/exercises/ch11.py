"""第 11 章（证据与边界）的练习。参考答案是写死的数或独立的算术，不调用 attn_lib。"""
from __future__ import annotations

from . import Exercise, register

SHORT, LONG = 1024, 4096


def _score_entries(L: int) -> int:
    """一个头的注意力分数矩阵有 L × L 个元素（L 个查询，每个对 L 个键）。"""
    return L * L


def _kv_cache_entries(L: int, num_layers: int = 12, num_heads: int = 12, head_dim: int = 64) -> int:
    """生成 L 个标记时 KV 缓存要存的数：每层、每个标记一份键和一份值。"""
    return num_layers * 2 * L * num_heads * head_dim


register(Exercise(
    id="11-1",
    question=f"序列长度从 {SHORT} 变成 {LONG}，一个头的注意力分数矩阵的元素个数变成原来的几倍？",
    answer=_score_entries(LONG) // _score_entries(SHORT),
    hint="注意力分数矩阵是 L × L：长度乘 4，行数和列数各乘 4。",
    wrong_example=LONG // SHORT,
))

register(Exercise(
    id="11-2",
    question=f"生成文字时，序列长度从 {SHORT} 变成 {LONG}，KV 缓存要存的数变成原来的几倍？",
    answer=_kv_cache_entries(LONG) // _kv_cache_entries(SHORT),
    hint="KV 缓存给每个已生成的标记存一份键和一份值，长度乘几，它就乘几。",
    wrong_example=_score_entries(LONG) // _score_entries(SHORT),
))

register(Exercise(
    id="11-3",
    question="不带掩码的自注意力：把「我喜欢你」倒过来排成「你喜欢我」，对所有位置求平均得到的句向量会变吗（在 float64 容差内比较，如 torch.allclose）？（填 True 或 False）",
    answer=False,  # 不带掩码的自注意力对换序等变：输出只是跟着换序（只差舍入误差），求平均不看顺序
    hint="打乱输入只会把输出按同样的方式打乱；求平均不看顺序。",
    wrong_example=True,
))
