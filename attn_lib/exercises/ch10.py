"""第 10 章（位置、训练好的小模型、KV 缓存）的练习。参考答案是字面值或独立的算式。"""
from __future__ import annotations

import math

from . import Exercise, register

register(Exercise(
    id="10-1",
    question="D = 2(θ₀ = 1)，q = (1, 0) 在位置 5，k = (1, 0) 在位置 3，都用 RoPE 转过以后，点积是多少？（精确到 0.001）",
    answer=math.cos(5 - 3),  # two unit vectors at angle 5 - 3 radians
    hint="q 转了 5 弧度，k 转了 3 弧度；两个单位向量的点积是夹角的余弦。",
    atol=1e-3,
    wrong_example=math.cos(5) * math.cos(3),  # multiplied the two cosines instead of taking the angle difference
))

register(Exercise(
    id="10-2",
    question="正余弦位置编码表 sinusoidal_positions(L, 4) 的第 0 行是哪 4 个数？",
    answer=[0.0, 1.0, 0.0, 1.0],  # sin 0, cos 0, sin 0, cos 0
    hint="位置 0 上所有角度都是 0；偶数列是正弦，奇数列是余弦。",
    atol=1e-6,
    wrong_example=[0.0, 0.0, 0.0, 0.0],
))

register(Exercise(
    id="10-3",
    question="H = 12 个头，KV 缓存里已有 1000 个位置，再生成 1 个字：这一步这一层一共做多少次查询和键的点积？",
    answer=12 * 1001,  # the new key joins the cache first: 1001 keys per head
    hint="新字的键先接进缓存，它的查询要和缓存里所有的键比较，包括它自己。",
    atol=0.0,
    wrong_example=12 * 1000,
))
