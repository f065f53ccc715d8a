"""第 10 章（KV 缓存）：逐字生成时把算过的键和值存下来，下一步只算新字。

Generating token by token, step t needs the keys and values of positions 0 .. t. They do not
change once computed (causal attention: an earlier position never sees a later one), so a
``KVCache`` keeps them; each step computes q, k, v for the new token(s) only, appends k and v
and attends over everything cached::

    cache = KVCache()
    for t in range(N):
        out_t = layer(x[:, t:t+1], kv_cache=cache)   # (B,1,C), attends over the t+1 cached keys

With ``is_causal=True`` a block of L new queries is the *last* L of the S cached positions, so
the causal mask is aligned to the bottom-right corner (``causal_mask(L, S, align="bottom-right")``).
Per step the work is one query against S keys and the cache holds 2·B·H·S·D numbers: both grow
linearly with the position; over N steps the total work grows as N².
"""
from __future__ import annotations

import torch

from ._validate import check_rank
from .masks import bool_to_additive, causal_mask


class KVCache:
    """KV 缓存：按 (B, H, S, D) 存已经算过的键和值，每一步把新的键和值接在后面。

    Attributes:
        keys, values: the cached (B, H, S, D) and (B, H, S, Dv) tensors (None while empty).

    One cache serves one attention layer and one batch: every ``append`` must bring the same
    batch size, number of heads, head dims, dtype and device as the first one (a clear error
    otherwise). ``reset()`` empties it for a new batch.
    """

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[2])

    @property
    def length(self) -> int:
        """缓存里已有的位置数 S。"""
        return len(self)

    def numel(self) -> int:
        """缓存里存的数的个数（键和值合计，2·B·H·S·D）。"""
        return 0 if self.keys is None else self.keys.numel() + self.values.numel()

    def reset(self) -> None:
        """清空缓存（换一批序列时用）。"""
        self.keys = self.values = None

    def append(self, k: torch.Tensor, v: torch.Tensor):
        """把新位置的键 k (B, H, S_new, D) 和值 v (B, H, S_new, Dv) 接到缓存后面，返回全部的键和值。

        Args:
            k: (B, H, S_new, D) keys of the new positions.
            v: (B, H, S_new, Dv) values of the new positions.

        Returns:
            ``(keys, values)``: (B, H, S_past + S_new, D) and (B, H, S_past + S_new, Dv).
        """
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor of shape (B, H, S, D), got {type(t).__name__}")
            check_rank(name, t, 4, "(B, H, S, D)")
            if not t.is_floating_point():
                raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if k.shape[:3] != v.shape[:3] or k.dtype != v.dtype or k.device != v.device:
            raise ValueError(
                f"k and v must share (B, H, S), dtype and device: k is {tuple(k.shape)} {k.dtype} on {k.device}, "
                f"v is {tuple(v.shape)} {v.dtype} on {v.device}"
            )
        if self.keys is not None:
            ck, cv = self.keys, self.values
            B, H, _, D = ck.shape
            Dv = cv.shape[-1]
            if k.shape[0] != B:
                raise ValueError(
                    f"the cache holds a batch of B={B} sequences but the new keys have B={k.shape[0]}; "
                    "one cache serves one batch: call cache.reset() (or use a new KVCache) for another batch"
                )
            if (k.shape[1], k.shape[3], v.shape[3]) != (H, D, Dv):
                raise ValueError(
                    f"the cache holds H={H} heads of D={D} (values Dv={Dv}) but the new keys/values have "
                    f"H={k.shape[1]}, D={k.shape[3]}, Dv={v.shape[3]}; one cache serves one attention layer"
                )
            if k.dtype != ck.dtype:
                raise TypeError(
                    f"the cache holds {ck.dtype} but the new keys are {k.dtype}; keep one dtype for a whole "
                    "generation (or cache.reset())"
                )
            if k.device != ck.device:
                raise ValueError(
                    f"the cache is on {ck.device} but the new keys are on {k.device}; move the inputs to "
                    f"{ck.device} (or cache.reset())"
                )
            self.keys = torch.cat((ck, k), dim=2)  # (B,H,S_past,D) + (B,H,S_new,D) -> (B,H,S_past+S_new,D)
            self.values = torch.cat((cv, v), dim=2)  # (B,H,S_past,Dv) + (B,H,S_new,Dv) -> (B,H,S,Dv)
        else:
            self.keys, self.values = k, v
        return self.keys, self.values

    def attention_mask(self, mask, L: int, is_causal: bool):
        """新来的 L 个查询是缓存里最后 L 个位置：因果时用右下角对齐的掩码，并与 mask 合并。

        Args:
            mask: None or a bool / additive float mask broadcastable to (B, H, L, S) over all
                S cached keys (e.g. ``padding_mask(lengths)[..., :S]``).
            L: number of new queries.
            is_causal: whether the layer is causal.

        Returns:
            The mask to pass to ``attention`` (with ``is_causal=False``): ``mask`` unchanged
            when not causal, else combined with ``causal_mask(L, S, align="bottom-right")``.
        """
        if not is_causal:
            return mask
        S = len(self)
        tail = causal_mask(L, S, align="bottom-right", device=self.keys.device)  # (L,S)
        if mask is None:
            return tail
        if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
            return mask & tail  # broadcast(mask) & (L,S)
        if isinstance(mask, torch.Tensor) and mask.is_floating_point():
            return mask + bool_to_additive(tail, mask.dtype)  # broadcast(mask) + (L,S)
        return mask  # not a tensor: attention() reports the error

    def __repr__(self) -> str:
        shape = None if self.keys is None else tuple(self.keys.shape)
        return f"KVCache(length={len(self)}, keys={shape})"


__all__ = ["KVCache"]
