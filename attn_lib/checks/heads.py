"""第 7、10 章和 GQA / 滑动窗口那一章共用（书中不单独讲）：多头层的头数、共享键值头（GQA）、滑动窗口和 KV 缓存的检查。

What a multi-head layer's constructor and its ``kv_cache`` argument can get wrong, worded as
every other check ("<argument> must be <expected>, got <found>; <remedy>"):

- ``check_heads``: num_heads divides d_model, num_kv_heads (GQA; None = num_heads) divides
  num_heads, RoPE needs an even head dim;
- ``check_layer_window``: a layer's ``window_size`` (None = no window) through the one window
  check every path shares (``attn_lib.checks.check_window_size``);
- ``check_kv_cache`` / ``check_cache_fits``: the cache is a ``KVCache`` that serves this layer
  and this batch, with the layer's H_kv heads (a GQA cache stores only the shared heads).
"""
from __future__ import annotations

import torch

from .values import check_divisible, check_positive_int


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def check_heads(layer, d_model, num_heads, num_kv_heads=None, *, even_head_dim: bool = False) -> None:
    """多头层的尺寸检查：num_heads 整除 d_model，num_kv_heads（默认等于 num_heads）整除 num_heads，RoPE 要求 D 是偶数。

    Sets ``layer.head_dim`` (D = d_model / num_heads), ``layer.d_model``, ``layer.num_heads``
    and ``layer.num_kv_heads`` (H_kv: query head h uses key/value head h // (H / H_kv)).
    """
    layer.head_dim = check_divisible(d_model, num_heads)
    layer.d_model, layer.num_heads = int(d_model), int(num_heads)
    H = layer.num_heads
    H_kv = H if num_kv_heads is None else check_positive_int("num_kv_heads", num_kv_heads)
    if H % H_kv:
        raise ValueError(
            f"num_kv_heads must divide num_heads={H} (each key/value head serves H / H_kv query heads), "
            f"got {H_kv}; choose one of {_divisors(H)}"
        )
    layer.num_kv_heads = H_kv
    if even_head_dim and layer.head_dim % 2:
        D = layer.head_dim
        raise ValueError(
            f"head dim D = d_model / num_heads must be even for rotary positions (RoPE rotates pairs of "
            f"channels), got D={D}; choose d_model and num_heads with an even D, e.g. d_model={num_heads * (D + 1)}"
        )


def check_layer_window(window_size, is_causal: bool) -> tuple[int, int]:
    """层的 window_size：None（不加窗口）或 flash-attn 的 (left, right)，-1 表示那一侧不限；返回 (left, right)。

    None becomes ``(-1, -1)``; anything else goes through the check every attention path
    shares (a pair of ints >= -1; with ``is_causal`` the right side must be 0 or -1).
    """
    if window_size is None:
        return -1, -1
    from . import check_window_size  # the shared check of attn_lib.attention / flash_attention

    left, right = check_window_size(window_size, is_causal)
    return int(left), int(right)


def check_kv_cache(cache, layer, self_attention: bool, B: int, dtype, device) -> int:
    """层的 kv_cache 参数：是 KVCache、只用于自注意力、只服务这一层、批大小 / 头 / 精度 / 设备与缓存一致；返回缓存里存着的位置数。"""
    from ..layers.kv_cache import KVCache

    if not isinstance(cache, KVCache):
        raise TypeError(f"kv_cache must be an attn_lib.KVCache or None, got {type(cache).__name__}")
    if not self_attention:
        raise ValueError("kv_cache works with self-attention only: leave key and value as None")
    owner = cache._owner() if cache._owner is not None else None
    if cache._owner is not None and owner is not layer:
        raise ValueError(
            "kv_cache already serves another layer; one cache serves one attention layer (its keys and "
            "values come from that layer's projections): give each layer its own KVCache, or call "
            "cache.reset() before reusing it"
        )
    H_kv, D = getattr(layer, "num_kv_heads", layer.num_heads), layer.head_dim
    check_cache_fits(cache, B, H_kv, D, D, dtype, device)
    return 0 if cache.keys is None else int(cache.keys.shape[2])  # positions stored, without leaving this package


def check_cache_fits(cache, B: int, H: int, D: int, Dv: int, dtype, device) -> None:
    """新的键和值能否接到缓存后面：批大小、头数、头维度、精度、设备都要与缓存里的一致。"""
    if cache.keys is None:
        return
    cB, cH, _, cD = cache.keys.shape
    cDv = cache.values.shape[-1]
    if B != cB:
        raise ValueError(
            f"the cache holds a batch of B={cB} sequences but the new keys have B={B}; "
            "one cache serves one batch: call cache.reset() (or use a new KVCache) for another batch"
        )
    if (H, D, Dv) != (cH, cD, cDv):
        raise ValueError(
            f"the cache holds H={cH} heads of D={cD} (values Dv={cDv}) but the new keys/values have "
            f"H={H}, D={D}, Dv={Dv}; one cache serves one attention layer"
        )
    if dtype != cache.keys.dtype:
        raise TypeError(
            f"the cache holds {cache.keys.dtype} but the new keys are {dtype}; keep one dtype for a whole "
            "generation (or cache.reset())"
        )
    if torch.device(device) != cache.keys.device:
        raise ValueError(
            f"the cache is on {cache.keys.device} but the new keys are on {device}; move the inputs to "
            f"{cache.keys.device} (or cache.reset())"
        )


__all__ = ["check_heads", "check_layer_window", "check_kv_cache", "check_cache_fits"]
