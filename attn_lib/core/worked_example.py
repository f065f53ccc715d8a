"""第 1–9、11、12 章共用（主走查）：主走查的数据，全书唯一来源：「桌上有一杯水和一本书，它被打翻了」。

The query of 「它」 and the keys and values of 水, 书, 打翻, exactly as the source chapter
makes them up (4 numbers each, invented for the demonstration, not a real model's values).
Every chapter takes them from here.

``SOURCE_PRINTED`` holds the numbers the source chapter prints after its hand arithmetic
(rounded intermediate values). They are quotations to compare against, never results:
notebooks recompute every one of them and show where exact arithmetic differs.
"""
from __future__ import annotations

SENTENCE = "桌上有一杯水和一本书，它被打翻了。"
QUERY_TOKEN = "它"
KEY_TOKENS = ("水", "书", "打翻")

# d = 4 numbers per vector, as in the source.
QUERY = (1.0, 0.0, 1.0, 0.0)
KEYS = {
    "水": (3.0, 1.0, 3.0, 2.0),
    "书": (0.6, 2.0, 0.6, 1.0),
    "打翻": (2.0, 0.0, 2.8, 1.0),
}
VALUES = {
    "水": (2.0, 0.0, 4.0, 1.0),
    "书": (0.0, 3.0, 0.6, 0.0),
    "打翻": (1.0, 1.0, 0.0, 3.0),
}
# Positions in the sentence (character index of each token's first character), used by
# the causal-mask chapter: 打翻 comes after 它, so a causal layer hides it from 它.
POSITIONS = {tok: SENTENCE.index(tok) for tok in (*KEY_TOKENS, QUERY_TOKEN)}

NUM_HEADS_EXAMPLE = 2  # the source splits d=4 into 2 heads of 2

# Numbers the source prints (its hand arithmetic, rounded as printed). Quotations only.
SOURCE_PRINTED = {
    "dots": (6.0, 1.2, 4.8),
    "scaled": (3.0, 0.6, 2.4),
    "exp": (20.09, 1.82, 11.02),
    "exp_sum": 32.93,
    "weights": (0.61, 0.06, 0.33),
    "output": (1.55, 0.51, 2.48, 1.60),
    "masked_exp": (20.09, 1.82, 0.0),
    "masked_exp_sum": 21.91,
    "masked_weights": (0.92, 0.08, 0.00),
    "masked_output": (1.84, 0.24, 3.73, 0.92),
    "head_scaled": ((2.12, 0.42, 1.41), (2.12, 0.42, 1.98)),
    "head_weights": ((0.60, 0.11, 0.29), (0.49, 0.09, 0.42)),
    "sqrt_head_dim": 1.41,
}

# The dictionary analogy (source section 3).
DICTIONARY = {"apple": 10.0, "banana": 5.0, "chair": 2.0}
FRUIT_PROPORTIONS = {"apple": 0.6, "banana": 0.4, "chair": 0.0}
SOURCE_FRUIT_RESULT = 8  # printed by the source: 10×0.6 + 5×0.4 + 2×0 = 8


def key_matrix():
    """三个键向量按 水、书、打翻 的顺序堆成的列表，形状 (S=3, D=4)。"""
    return [list(KEYS[t]) for t in KEY_TOKENS]


def value_matrix():
    """三个值向量按 水、书、打翻 的顺序堆成的列表，形状 (S=3, Dv=4)。"""
    return [list(VALUES[t]) for t in KEY_TOKENS]


def as_arrays(dtype="float64"):
    """主走查数据的 numpy 版本：q (1,1,1,4)、k (1,1,3,4)、v (1,1,3,4)。

    Args:
        dtype: numpy dtype name.

    Returns:
        ``(q, k, v)`` numpy arrays in (B, H, L, D) layout with B = H = L = 1 and S = 3.
    """
    import numpy as np

    q = np.array(QUERY, dtype=dtype)[None, None, None, :]  # (D,) -> (1,1,1,D)
    k = np.array(key_matrix(), dtype=dtype)[None, None]  # (S,D) -> (1,1,S,D)
    v = np.array(value_matrix(), dtype=dtype)[None, None]  # (S,Dv) -> (1,1,S,Dv)
    return q, k, v


def as_tensors(dtype=None, device=None):
    """主走查数据的 torch 版本：q (1,1,1,4)、k (1,1,3,4)、v (1,1,3,4)，默认 float64。

    Args:
        dtype: torch dtype (default ``torch.float64``).
        device: torch device (default CPU).

    Returns:
        ``(q, k, v)`` tensors in (B, H, L, D) layout with B = H = L = 1 and S = 3.
    """
    import torch

    dtype = dtype or torch.float64
    q = torch.tensor(QUERY, dtype=dtype, device=device).view(1, 1, 1, 4)  # (D,) -> (1,1,1,D)
    k = torch.tensor(key_matrix(), dtype=dtype, device=device).view(1, 1, 3, 4)  # (S,D) -> (1,1,S,D)
    v = torch.tensor(value_matrix(), dtype=dtype, device=device).view(1, 1, 3, 4)  # (S,Dv) -> (1,1,S,Dv)
    return q, k, v
