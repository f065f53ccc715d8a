"""第 6、8、10、12 章（因果掩码、填充掩码、滑动窗口掩码）：决定每个查询可以看哪些键。布尔掩码 True = 可以看（与 torch 一致）。

Two forms of the same information, both accepted by ``attn_lib.attention``:

- **boolean** (``torch.bool``): ``True`` = this query may attend to this key. The same
  convention as ``torch.nn.functional.scaled_dot_product_attention(attn_mask=...)``.
  (Careful: ``torch.nn.MultiheadAttention``'s ``attn_mask`` / ``key_padding_mask`` use the
  opposite convention, ``True`` = hidden; pass ``~mask`` there.)
- **additive** (float): ``0`` where a key is visible and ``-inf`` where it is hidden; it is
  *added* to the scaled scores before the softmax, and ``exp(-inf) = 0`` removes the key.
  This turns "skip this key" (a branch) into one vectorised addition.

``bool_to_additive`` and ``additive_to_bool`` convert between the two. Shapes broadcast to
the scores' (B, H, L, S): ``(L, S)`` for one pattern shared by the whole batch (causal),
``(B, 1, 1, S)`` for key padding, ``(B, H, L, S)`` for anything else.
"""
from __future__ import annotations

import torch

from ..checks.sequences import (check_additive_mask, check_bool_mask, check_causal_args, check_lengths,
                                check_window_mask_args)
from ..rules.band import Band


def causal_mask(L: int, S: int | None = None, *, align: str = "top-left", device=None) -> torch.Tensor:
    """因果掩码：第 i 个查询只能看第 0..i 个键。返回布尔 (L, S)，True = 可以看。

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

    When the L queries are the *last* L of S positions, as in generation with a KV cache of
    earlier keys, use ``align="bottom-right"``: the diagonal ends at the bottom-right
    corner, query i sees keys 0 .. i + (S − L), i.e. ``ones(L, S).tril(diagonal=S - L)``
    = the bottom L rows of ``causal_mask(S)`` (torch calls it ``causal_lower_right``).
    L = 2, S = 4::

        key:   0 1 2 3
        q 0  [ T T T . ]
        q 1  [ T T T T ]

    (With L > S the first L − S rows see no key at all.)

    Args:
        L: number of queries.
        S: number of keys (default: ``L``).
        align: ``"top-left"`` (default, as torch's ``is_causal``) or ``"bottom-right"``
            (the queries are the last L positions; chapter 10's KV cache).
        device: torch device of the result.

    Returns:
        Bool tensor of shape (L, S).
    """
    L, S = check_causal_args(L, S, align)
    diagonal = 0 if align == "top-left" else S - L  # bottom-right: query i is position i + S - L
    return torch.ones(L, S, dtype=torch.bool, device=device).tril(diagonal)  # (L,S) lower triangle incl. diagonal


def sliding_window_mask(L: int, S: int | None = None, *, window_size, is_causal: bool = False,
                        align: str = "top-left", device=None) -> torch.Tensor:
    """滑动窗口掩码：第 i 个查询只看第 i - left .. i + right 个键（flash-attn 的 window_size）。返回布尔 (L, S)，True = 可以看。

    ``window_size=(left, right)``, -1 = unbounded on that side; ``is_causal`` forces right = 0
    (right must then be 0 or -1). With L = S = 4 and ``window_size=(1, 0)``::

        key:   0 1 2 3
        q 0  [ T . . . ]
        q 1  [ T T . . ]
        q 2  [ . T T . ]
        q 3  [ . . T T ]

    ``align`` as in ``causal_mask``: ``"top-left"`` (query i is position i, SDPA's
    ``is_causal`` and ``attn_lib.attention(..., window_size=...)``) or ``"bottom-right"``
    (query i is position i + S - L, KV-cache decoding; flash-attn always aligns this way).
    ``window_size=(-1, 0)`` is ``causal_mask``.

    Args:
        L: number of queries.
        S: number of keys (default: ``L``).
        window_size: ``(left, right)``, two ints >= -1 (a tuple or list).
        is_causal: no key after the query (right = 0).
        align: ``"top-left"`` or ``"bottom-right"``.
        device: torch device of the result.

    Returns:
        Bool tensor of shape (L, S).
    """
    L, S, is_causal, window_size = check_window_mask_args(L, S, (window_size, is_causal), align)
    band = Band.resolve(L, S, is_causal=is_causal, window_size=window_size, offset=0 if align == "top-left" else S - L)
    return band.mask(L, S, device=device)  # (L,S), True = lo <= j - i <= hi


def padding_mask(lengths, S: int | None = None, *, device=None) -> torch.Tensor:
    """键的填充掩码：第 b 句只有前 lengths[b] 个键是真的字，其余是填充。返回布尔 (B, 1, 1, S)。

    A batch holds sentences of different lengths padded to a common length S; the padding
    positions must not receive attention. With lengths = [3, 1] and S = 4 (one row per
    sentence, before the two broadcast axes)::

        key:     0 1 2 3
        b 0    [ T T T . ]
        b 1    [ T . . . ]

    The result has shape (B, 1, 1, S), so it broadcasts over heads and queries against the
    scores (B, H, L, S), and can be combined with a causal mask (``&``, or ``is_causal``).

    Args:
        lengths: sequence of B ints (or a 1-D integer tensor), each in 0..S.
        S: padded length, an int >= 0 (default: ``max(lengths)``).
        device: torch device of the result.

    Returns:
        Bool tensor of shape (B, 1, 1, S); True = a real token (may be attended to).
    """
    values, S = check_lengths(lengths, S)
    n = torch.tensor([int(v) for v in values], device=device)  # (B,)
    keep = torch.arange(S, device=device)[None, :] < n[:, None]  # (1,S) < (B,1) -> (B,S)
    return keep[:, None, None, :]  # (B,S) -> (B,1,1,S)


def bool_to_additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """布尔掩码 → 加性掩码：可以看的位置填 0，盖住的位置填 -inf。

    Args:
        mask: bool tensor of any shape, True = may attend.
        dtype: floating dtype of the result (use the scores' dtype).

    Returns:
        Float tensor of ``mask``'s shape: 0.0 where True, ``-inf`` where False.
    """
    check_bool_mask(mask, dtype)
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)  # same shape as mask
    return zeros.masked_fill(~mask, float("-inf"))  # hidden -> -inf, visible -> 0


def additive_to_bool(mask: torch.Tensor) -> torch.Tensor:
    """加性掩码 → 布尔掩码：-inf 的位置是 False（盖住），0 的位置是 True（可以看）。

    Only a pure 0 / ``-inf`` mask can be converted: a finite non-zero entry (a bias, e.g.
    a position penalty) carries information a boolean mask cannot hold, so it is refused.

    Args:
        mask: float tensor of any shape with entries 0 or ``-inf``.

    Returns:
        Bool tensor of ``mask``'s shape: True where the entry is 0.
    """
    hidden = check_additive_mask(mask)  # same shape as mask, True = -inf
    return ~hidden


__all__ = ["causal_mask", "sliding_window_mask", "padding_mask", "bool_to_additive", "additive_to_bool"]
