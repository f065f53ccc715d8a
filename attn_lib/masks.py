"""掩码:决定每个查询可以看哪些键。布尔掩码 True = 可以看(与 torch 一致)。"""
from __future__ import annotations

import torch

from ._validate import check_positive_int


def causal_mask(L: int, S: int | None = None, *, device=None) -> torch.Tensor:
    """因果掩码:第 i 个查询只能看第 0..i 个键。返回布尔 (L, S),True = 可以看。

    Same alignment as ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``:
    top-left, i.e. ``ones(L, S).tril(diagonal=0)``. With L = 3, S = 3::

        key:   0 1 2
        q 0  [ T . . ]
        q 1  [ T T . ]
        q 2  [ T T T ]

    When L != S the diagonal still starts at the top-left corner (query i sees keys 0..i),
    e.g. L = 2, S = 4::

        key:   0 1 2 3
        q 0  [ T . . . ]
        q 1  [ T T . . ]

    Args:
        L: number of queries.
        S: number of keys (default: ``L``).
        device: torch device of the result.

    Returns:
        Bool tensor of shape (L, S).
    """
    if not (isinstance(L, int) and not isinstance(L, bool) and L >= 0):
        raise ValueError(f"L must be an int >= 0, got {L!r}")
    S = L if S is None else S
    if not (isinstance(S, int) and not isinstance(S, bool) and S >= 0):
        raise ValueError(f"S must be an int >= 0, got {S!r}")
    return torch.ones(L, S, dtype=torch.bool, device=device).tril()  # (L,S) lower triangle incl. diagonal


__all__ = ["causal_mask", "check_positive_int"]
