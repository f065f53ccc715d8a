"""第 5、7、10、12、13 章共用（书中不单独讲）：层的构造参数（头数、GQA、滑动窗口、对齐、后端）和 kv_cache 参数的检查。

What a layer's constructor and its ``kv_cache`` argument can get wrong, worded as every other
check ("<argument> must be <expected>, got <found>; <remedy>"):

- ``check_heads``: num_heads divides d_model, num_kv_heads (GQA; None = num_heads) divides
  num_heads, RoPE needs an even head dim;
- ``check_layer_settings``: bias, is_causal, check_finite, backend, ``window_size`` (None = no
  window) and ``align``, through the same checks every path uses;
- ``check_kv_cache`` / ``check_cache_fits``: the cache is the layer's ``cache_type``
  (``attn_lib.KVCache``, passed by the layer, so this package imports no layer), it serves
  this layer and this batch, with the layer's H_kv heads (a GQA cache stores only the shared
  heads) in the dtype the projections produce (autocast's, while it is on).
"""
from __future__ import annotations

import torch

from ..rules.names import BACKENDS
from ..rules.numerics import projection_dtype
from .values import check_align, check_bool, check_divisible, check_positive_int, check_window_size


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


def check_backend(backend) -> str:
    """检查层的 backend 参数：必须是 attn_lib.BACKENDS 里的一个名字。"""
    if not isinstance(backend, str):
        raise TypeError(f"backend must be one of {BACKENDS}, got {backend!r} ({type(backend).__name__})")
    if backend not in BACKENDS:
        hint = "; the tiled FlashAttention path is now 'torch' (or 'triton')" if backend == "flash" else ""
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}{hint}")
    return backend


def check_layer_settings(layer, bias, options) -> None:
    """所有层共用的构造参数检查：bias、is_causal、check_finite 是 True / False，backend 是已知名字，window_size、align 合法。

    Sets ``layer.is_causal``, ``layer.window_size`` ((left, right), (-1, -1) = none),
    ``layer.align``, ``layer.backend`` and ``layer.check_finite``.

    Args:
        options: an ``attn_lib.rules.settings.Options`` with the constructor's is_causal,
            window_size, align, backend and check_finite.
    """
    check_bool("bias", bias)
    layer.is_causal = check_bool("is_causal", options.is_causal)
    layer.window_size = check_window_size(options.window_size, layer.is_causal)
    layer.align = check_align(options.align)
    layer.backend = check_backend(options.backend)
    layer.check_finite = check_bool("check_finite", options.check_finite)


def check_multihead_args(layer, sizes: tuple, bias, options, *, even_head_dim: bool = False) -> None:
    """多头层构造参数的门（一次）：sizes = (d_model, num_heads, num_kv_heads)，再加 bias 和 options 里的层设置。"""
    check_heads(layer, *sizes, even_head_dim=even_head_dim)
    check_layer_settings(layer, bias, options)


def check_self_attention_args(layer, dims: tuple, bias, options) -> None:
    """SelfAttention 构造参数的门（一次）：dims = (d_model, d_k, d_v)（d_k 默认 d_model，d_v 默认 d_k），再加层设置；设好 layer.d_model、d_k、d_v。"""
    d_model, d_k, d_v = dims
    layer.d_model = check_positive_int("d_model", d_model)
    layer.d_k = check_positive_int("d_k", d_k if d_k is not None else d_model)
    layer.d_v = check_positive_int("d_v", d_v if d_v is not None else layer.d_k)
    check_layer_settings(layer, bias, options)


def check_kv_cache(cache, layer, self_attention: bool, B: int, query) -> int:
    """层的 kv_cache 参数：是层的 cache_type（KVCache）、只用于自注意力、只服务这一层、批大小 / 头 / 精度 / 设备与缓存一致；返回缓存里存着的位置数。"""
    if not isinstance(cache, layer.cache_type):
        raise TypeError(f"kv_cache must be an attn_lib.KVCache or None, got {type(cache).__name__}")
    if not self_attention:
        raise ValueError("kv_cache works with self-attention only: leave key and value as None")
    owner = cache.owner
    if owner is not None and owner is not layer:
        raise ValueError(
            "kv_cache already serves another layer; one cache serves one attention layer (its keys and "
            "values come from that layer's projections): give each layer its own KVCache, or call "
            "cache.reset() before reusing it"
        )
    H_kv, D = layer.num_kv_heads, layer.head_dim  # check_heads set both on every layer that takes a cache
    dtype = projection_dtype(layer.out_proj.weight.dtype, query.device)
    check_cache_fits(cache, (B, H_kv, D, D), dtype, query.device)
    return len(cache)


def check_cache_fits(cache, shape: tuple, dtype, device) -> None:
    """新的键和值能否接到缓存后面：shape = (B, H, D, Dv)，批大小、头数、头维度、精度、设备都要与缓存里的一致。"""
    if cache.keys is None:
        return
    B, H, D, Dv = shape
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
            "generation (the same autocast setting for every step too), or cache.reset()"
        )
    if torch.device(device) != cache.keys.device:
        raise ValueError(
            f"the cache is on {cache.keys.device} but the new keys are on {device}; move the inputs to "
            f"{cache.keys.device} (or cache.reset())"
        )


__all__ = ["check_backend", "check_heads", "check_layer_settings", "check_multihead_args", "check_self_attention_args", "check_kv_cache", "check_cache_fits"]
