"""第 10、12、13 章（KV 缓存）：逐字生成时把算过的键和值存下来，下一步只算新字。

Generating token by token, step t needs the keys and values of positions 0 .. t. They do not
change once computed (causal attention: an earlier position never sees a later one), so a
``KVCache`` keeps them; each step computes q, k, v for the new token(s) only, appends k and v
and attends over everything cached::

    cache = KVCache()
    for t in range(N):
        out_t = layer(x[:, t:t+1], kv_cache=cache)   # (B,1,C), attends over the t+1 cached keys

With ``is_causal=True`` a block of L new queries is the *last* L of the S cached positions, so
the causal mask is aligned to the bottom-right corner (``causal_mask(L, S, align="bottom-right")``).
A layer given ``kv_cache=`` checks everything first, attends over the cached keys and its
own, and stores the new keys and values only once the call succeeded: a call that raised
leaves the cache as it was. The first layer that uses a cache owns it; another layer is
refused (its keys would be mixed with the first layer's) until ``reset()``.
Per step the work is one query against S keys and the cache holds 2·B·H·S·D numbers: both grow
linearly with the position; over N steps the total work grows as N².
The layer's attention over the cache in such a step is chapter 13's split-KV decode path
(``attn_lib.flash.decoding``, FlashDecoding) wherever that computes the same (``attn_lib.layers.dispatch``).

Grouped-query attention (GQA, ``MultiHeadAttention(num_kv_heads=H_kv)``): the cache stores the
H_kv shared key/value heads, not H: 2·B·H_kv·S·D numbers, H / H_kv times fewer.

Sliding windows (``window_size=(left, right)``): a later query never sees a key more than
``left`` positions back, so a windowed layer keeps only the last ``left`` positions after each
call, a rolling buffer as in Mistral 7B (kept in position order, so the alignment below stays
one offset). During a call of L new positions the attention reads at most left + L keys; after
any number of steps the cache holds at most ``left`` positions, whatever the sequence's length.
Mistral's buffer has W = left + 1 slots (its ``sliding_window`` W counts the current token, which
it writes into the buffer before attending); this one keeps the ``left`` earlier positions between
calls and joins the new token's keys during the call: the same window of left + 1 keys.
Two counts therefore differ:

- ``cache.seen``: positions seen since the last ``reset()`` (the absolute position of the next
  token: RoPE rotates the new queries and keys by ``seen, seen + 1, ...``);
- ``len(cache)``: positions stored (``keys.shape[2]``); they are the absolute positions
  ``cache.start = seen - len(cache)`` onwards. The new queries are aligned bottom-right on the
  stored keys: offset ``len(cache)`` (the positions before this step, relative to ``start``).

Without a window the two are equal and ``start`` is 0.
"""
from __future__ import annotations

import weakref

import torch

from ..checks.sequences import check_cache_append, check_cache_mask_args


class KVCache:
    """KV 缓存：按 (B, H, S, D) 存已经算过的键和值，每一步把新的键和值接在后面。

    Attributes:
        keys, values: the cached (B, H, S, D) and (B, H, S, Dv) tensors (None while empty);
            H is the layer's number of key/value heads H_kv.
        seen: positions seen since the last ``reset()`` (``len(self)`` counts those stored;
            a sliding-window layer keeps only the last ``left`` of them, see the module docstring).

    One cache serves one attention layer and one batch: the first layer that uses it owns
    it (another layer gets a clear error), and every ``append`` must bring the same batch
    size, number of heads, head dims, dtype and device as the first one (a clear error
    otherwise). ``reset()`` empties it (and frees it for another layer or batch).

    A layer uses two methods: ``joined`` (the stored keys and values followed by new ones, the
    cache unchanged) and ``store`` (keep a result, once the whole call has succeeded); a model
    uses ``state`` / ``restore`` (a model whose later block fails puts every cache back). A
    pickled cache (``pickle``, ``torch.save``) keeps its keys, values and ``seen`` but not its
    owner (a layer is not part of a cache's data): the first layer to use the loaded copy owns it.
    """

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self._owner = None  # weakref to the layer that uses this cache
        self.seen = 0  # positions seen; len(self) of them are stored, the last ones

    def __len__(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[2])

    @property
    def length(self) -> int:
        """缓存里存着的位置数 S（滑动窗口层只留最后 left 个，见 ``seen``）。"""
        return len(self)

    @property
    def start(self) -> int:
        """缓存里第一个键的绝对位置：``seen - len(self)``（不加窗口时是 0）。"""
        return self.seen - len(self)

    @property
    def owner(self):
        """用这个缓存的层（还没有层用过、或者层已被回收时是 None）。"""
        return None if self._owner is None else self._owner()

    def numel(self) -> int:
        """缓存里存的数的个数（键和值合计，2·B·H·S·D）。"""
        return 0 if self.keys is None else self.keys.numel() + self.values.numel()

    def reset(self) -> None:
        """清空缓存（换一批序列或换一层时用）。"""
        self.keys = self.values = None
        self._owner = None
        self.seen = 0

    def append(self, k: torch.Tensor, v: torch.Tensor):
        """把新位置的键 k (B, H, S_new, D) 和值 v (B, H, S_new, Dv) 接到缓存后面，返回全部的键和值。

        Args:
            k: (B, H, S_new, D) keys of the new positions.
            v: (B, H, S_new, Dv) values of the new positions.

        Returns:
            ``(keys, values)``: (B, H, S_past + S_new, D) and (B, H, S_past + S_new, Dv).
        """
        check_cache_append(self, k, v)
        self.store(*self.joined(k, v), new=k.shape[2])
        return self.keys, self.values

    def joined(self, k, v):
        """已存的键和值后面接上 k、v（调用方已检查过它们）；缓存本身不变。返回 (keys, values)。"""
        if self.keys is None:
            return k, v
        keys = torch.cat((self.keys, k), dim=2)  # (B,H,S_past,D) + (B,H,S_new,D) -> (B,H,S_past+S_new,D)
        values = torch.cat((self.values, v), dim=2)  # (B,H,S_past,Dv) + (B,H,S_new,Dv) -> (B,H,S,Dv)
        return keys, values

    def store(self, keys, values, owner=None, *, new: int, keep: int = -1) -> None:
        """存下 ``joined`` 的结果（它以 ``new`` 个新位置结尾）；``keep`` >= 0 时只留最后 ``keep`` 个位置。

        A layer passes itself as ``owner`` (bound at first use) and, with a sliding window
        ``(left, right)``, ``keep=left``: a copy of the last ``left`` positions, so that the
        memory of the older ones is freed (a slice would keep the whole tensor alive). Nothing
        is checked: the layer's door checked the call before anything was computed.
        """
        self.seen += int(new)
        if 0 <= keep < keys.shape[2]:
            first = keys.shape[2] - keep
            keys = keys[:, :, first:].clone()  # (B,H,S,D) -> (B,H,keep,D)
            values = values[:, :, first:].clone()  # (B,H,S,Dv) -> (B,H,keep,Dv)
        self.keys, self.values = keys, values
        if owner is not None and self._owner is None:
            self._owner = weakref.ref(owner)

    def state(self):
        """缓存此刻的状态（只是几个引用，不复制张量）：交给 ``restore`` 就能回到这一刻。"""
        return self.keys, self.values, self._owner, self.seen

    def restore(self, state) -> None:
        """回到 ``state()`` 记下的那一刻（一次前向中途失败时，把每个块的缓存放回原样）。"""
        self.keys, self.values, self._owner, self.seen = state

    def __getstate__(self):
        # the owner is a layer, not data; so is the autograd history of keys cached in grad mode
        # (copy.deepcopy refuses a tensor that is not a graph leaf)
        keys, values = (None if t is None else t.detach() for t in (self.keys, self.values))
        return {"keys": keys, "values": values, "seen": self.seen}

    def __setstate__(self, state):
        self.keys, self.values, self.seen = state["keys"], state["values"], state["seen"]
        self._owner = None

    def __deepcopy__(self, memo):
        copy = KVCache()
        if self.keys is not None:
            copy.keys, copy.values = self.keys.detach().clone(), self.values.detach().clone()
        copy.seen = self.seen
        return copy

    def attention_mask(self, mask, L: int, is_causal: bool):
        """新来的 L 个查询是缓存里最后 L 个位置：因果时用右下角对齐的掩码，并与 mask 合并。

        Args:
            mask: None or a bool / additive float mask broadcastable to (B, H, L, S) over all
                S cached keys (e.g. ``padding_mask(lengths)[..., :S]``).
            L: number of new queries, 0 .. S (their keys are already cached).
            is_causal: whether the layer is causal (True or False).

        Returns:
            The mask to pass to ``attention`` (with ``is_causal=False``): ``mask`` unchanged
            when not causal, else combined with ``causal_mask(L, S, align="bottom-right")``.
        """
        L = check_cache_mask_args(self, L, is_causal)
        if not is_causal:
            return mask
        S = len(self)
        device = self.keys.device if self.keys is not None else getattr(mask, "device", None)
        tail = torch.ones(L, S, dtype=torch.bool, device=device).tril(S - L)  # (L,S) bottom-right causal
        if mask is None:
            return tail
        if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
            return mask & tail  # broadcast(mask) & (L,S)
        if isinstance(mask, torch.Tensor) and mask.is_floating_point():
            return mask.masked_fill(~tail, float("-inf"))  # broadcast(mask) -> (..,L,S), hidden -> -inf
        return mask  # not a tensor: attention() reports the error

    def __repr__(self) -> str:
        shape = None if self.keys is None else tuple(self.keys.shape)
        seen = f", seen={self.seen}" if self.seen != len(self) else ""  # a rolling window dropped the oldest
        return f"KVCache(length={len(self)}{seen}, keys={shape})"


__all__ = ["KVCache"]
