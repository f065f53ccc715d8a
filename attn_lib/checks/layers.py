"""第 5、7、10、12、13 章共用（书中不单独讲）：层的门——一次层调用只在这里检查一次，返回这次调用的设置，之后的代码不再检查。

One door per layer entry: ``check_self_attention_call`` (chapter 5's ``SelfAttention``) and
``check_layer_call`` (chapter 7's two multi-head classes and chapter 10's rotary one). Each
checks everything a call could get wrong, *before* anything changes (a KV cache is extended
only after the whole call succeeded), scans each distinct input for nan / inf at most once
(``check_finite``), and returns the call's ``AttentionSettings`` (``attn_lib.rules.settings.
layer_settings``); the shaping of masks and the choice of attention path are
``attn_lib.layers.dispatch``'s. The constructor's checks and the ``kv_cache`` argument's are in
``checks/heads.py``.
"""
from __future__ import annotations

import torch

from ..rules.numerics import projection_dtype
from ..rules.settings import AttentionSettings, layer_settings
from .flash import check_triton
from .heads import check_backend, check_kv_cache  # noqa: F401  (check_backend: re-exported)
from .shapes import check_mask_shape, check_rank
from .tensors import all_finite, check_mask
from .values import check_bool, check_divisible, check_last_dim

_NO_SCORES = ("sdpa", "torch", "triton")  # backends that never store the (L, S) scores


def check_need_weights(need_weights, backend: str) -> None:
    """need_weights 必须是 True / False；不存注意力分数的后端被要求返回它们时报错，并说明怎么办。"""
    check_bool("need_weights", need_weights)
    if need_weights and backend in _NO_SCORES:
        raise ValueError(
            f"need_weights=True needs the attention scores, which backend={backend!r} never stores; "
            "build the layer with backend='reference' or 'auto' (the default) to get them."
        )


def check_tensor_layout(name: str, x, layout: str) -> None:
    """x 必须是 torch 张量（报错里写出期望的布局）。"""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {layout}, got {type(x).__name__}")


def check_sequence_layout(x, rank: int, layout: str) -> None:
    """split_heads / merge_heads 的参数 x：torch 张量，正好 rank 维（布局 layout）。"""
    check_tensor_layout("x", x, layout)
    check_rank("x", x, rank, layout)


def check_heads_split(x, num_heads) -> int:
    """split_heads 的参数：x 是 (B, L, C) 张量，num_heads 整除 C；返回 int(num_heads)。"""
    check_sequence_layout(x, 3, "(B, L, C)")
    check_divisible(x.shape[-1], num_heads)
    return int(num_heads)


def check_sequence_input(name: str, x, d_model: int, dtype: torch.dtype, check_finite: bool = True) -> None:
    """检查 (B, L, C) 形状的输入：是张量、是 3 维、最后一维等于 d_model、精度与参数相同（autocast 时也收它的精度）。

    Args:
        name: the argument's name for the message, e.g. ``"query"``.
        x: (B, L, C) float tensor without nan / inf.
        d_model: the layer's C.
        dtype: the dtype of the layer's parameters.
        check_finite: also scan ``x`` for nan / inf (one reduction).
    """
    check_tensor_layout(name, x, "(B, L, C)")
    check_rank(name, x, 3, "(B, L, C)")
    check_last_dim(name, x, d_model, "the layer's d_model")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}; convert with {name}.to({dtype})")
    if x.dtype != dtype and x.dtype != projection_dtype(dtype, x.device):
        raise TypeError(
            f"{name} has dtype {x.dtype} but the layer's parameters are {dtype}; "
            f"convert one of them, e.g. layer.to({x.dtype}) or {name}.to({dtype})"
        )
    if check_finite and x.numel() and not all_finite(x):
        raise ValueError(f"{name} contains nan or inf; the layer would turn it into nan. Check what produced it.")


def check_layer_mask(mask, shape: tuple, device, backend: str, check_finite: bool) -> None:
    """检查层的 mask 参数：3 维一律是 (B, L, S)（各头共用），4 维是 (B, H, L, S)；分块后端只收键填充掩码。

    Args:
        mask: None, or a bool / additive float tensor: (S,) or (L, S) for the whole batch,
            (B, L, S) one pattern per sequence, (B, H, L, S) per head (any axis may be 1).
        shape: the scores' (B, H, L, S) (S counts every key, cached ones included).
        device: the inputs' device.
        backend: the layer's backend ("torch" / "triton" take only a bool key padding mask).
        check_finite: also look for nan / +inf in a float mask.
    """
    if mask is None:
        return
    B, H, L, S = shape
    if isinstance(mask, torch.Tensor) and mask.ndim == 4 and mask.shape[1] not in (1, H):
        raise ValueError(f"mask has {mask.shape[1]} heads on axis 1, expected {'1' if H == 1 else f'1 or {H}'}")
    if isinstance(mask, torch.Tensor) and mask.ndim == 3 and (mask.dtype == torch.bool or mask.is_floating_point()):
        try:
            check_mask_shape(mask, (B, L, S))
        except ValueError:
            raise ValueError(
                f"a 3-D mask means (B, L, S) = {(B, L, S)} (one pattern per sequence, shared by every head; "
                f"axes may be 1), got {tuple(mask.shape)}. For one mask per head pass 4-D (B, H, L, S) = "
                f"{(B, H, L, S)}; for one pattern for the whole batch pass 2-D (L, S)."
            ) from None
        mask = mask.unsqueeze(1)  # (B,L,S) -> (B,1,L,S): the shape it is checked as
    check_mask(mask, (B, H, L, S), device, check_finite=check_finite)
    if backend in ("torch", "triton"):
        shape = (1,) * (4 - mask.ndim) + tuple(mask.shape)  # as broadcast to (B,H,L,S)
        if mask.dtype != torch.bool or shape[1] != 1 or shape[2] != 1:
            raise ValueError(
                f"mask must be a bool key padding mask (B, 1, 1, S) or (B, 1, S) for backend={backend!r} "
                f"(e.g. attn_lib.padding_mask(lengths); is_causal is applied separately), got {mask.dtype} "
                f"of shape {tuple(mask.shape)}; use backend='sdpa' or 'reference' for other masks."
            )


def check_matrices(w_q, w_k, w_v) -> None:
    """SelfAttention.from_matrices 的参数：三个二维矩阵，行数 C 相同，w_q 与 w_k 的列数 d_k 相同。"""
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        check_rank(name, w, 2, "(C, d)")
    (C, d_k), (Ck, d_kk), (Cv, _) = (tuple(w.shape) for w in (w_q, w_k, w_v))
    if not C == Ck == Cv:
        raise ValueError(f"w_q, w_k, w_v must have the same number of rows C, got {C}, {Ck}, {Cv}")
    if d_k != d_kk:
        raise ValueError(f"w_q and w_k must have the same number of columns d_k, got {d_k} and {d_kk}")


def _check_triton_layer(layer, x, dtype, head_dims: tuple, triton_mode) -> None:
    """The Triton backend's limits (worded as flash_attention's) on what the projections give: float16 /
    bfloat16 / float32, head dims <= 256, tensors on a device Triton runs on in this process."""
    if layer.backend == "triton":
        check_triton(projection_dtype(dtype, x.device), x.device, head_dims, triton_mode)


def check_self_attention_call(layer, x, mask, need_weights, triton_mode) -> AttentionSettings:
    """SelfAttention.forward 的门（唯一一处）：need_weights、x、mask、后端限制；返回这次调用的设置。

    Args:
        triton_mode: ``attn_lib.device.triton_interprets`` (called only for the Triton backend).
    """
    check_need_weights(need_weights, layer.backend)
    dtype = layer.w_q.weight.dtype
    check_sequence_input("x", x, layer.d_model, dtype, layer.check_finite)
    B, L, _ = x.shape
    check_layer_mask(mask, (B, 1, L, L), x.device, layer.backend, layer.check_finite)
    _check_triton_layer(layer, x, dtype, (layer.d_k, layer.d_v), triton_mode)
    return layer_settings(layer, L, L, layer.d_k, dtype)


def check_layer_call(layer, query, key, value, mask, need_weights, kv_cache, triton_mode):
    """多头层 forward 的门（唯一一处），在任何东西被改动之前；返回 (key, value, settings)，key、value 补齐了默认值。

    Args:
        layer: the multi-head layer (its d_model, num_heads, head_dim, backend, check_finite,
            ``rotary``: RoPE layers are self-attention only; ``cache_type``: the KV cache class).
        query, key, value, mask, need_weights, kv_cache: the forward's arguments (key, value may be None).
        triton_mode: ``attn_lib.device.triton_interprets`` (called only for the Triton backend).

    Returns:
        ``(key, value, settings)``: ``key`` defaults to ``query``, ``value`` to ``key``; settings
        for L queries against the stored keys and the new ones (bottom-right with a cache).
    """
    check_need_weights(need_weights, layer.backend)
    if getattr(layer, "rotary", False) and (key is not None or value is not None):
        raise ValueError(f"{type(layer).__name__} is self-attention only: leave key and value as None")
    key = query if key is None else key
    value = key if value is None else value
    dtype = layer.out_proj.weight.dtype
    seen = []
    for name, t in (("query", query), ("key", key), ("value", value)):
        again = any(t is u for u in seen)  # self-attention: one tensor, scanned once
        check_sequence_input(name, t, layer.d_model, dtype, layer.check_finite and not again)
        seen.append(t)
    _check_key_value(query, key, value)
    (B, L, _), S = query.shape, key.shape[1]
    if kv_cache is not None:
        S += check_kv_cache(kv_cache, layer, key is query and value is query, B, query)
    check_layer_mask(mask, (B, layer.num_heads, L, S), query.device, layer.backend, layer.check_finite)
    _check_triton_layer(layer, query, dtype, (layer.head_dim, layer.head_dim), triton_mode)
    return key, value, layer_settings(layer, L, S, layer.head_dim, dtype, cached=kv_cache is not None)


def _check_key_value(query, key, value) -> None:
    if key.shape[0] != query.shape[0] or value.shape[0] != query.shape[0]:
        raise ValueError(
            f"query, key and value must have the same batch size B, got {query.shape[0]}, "
            f"{key.shape[0]} and {value.shape[0]}"
        )
    if key.shape[1] != value.shape[1]:
        raise ValueError(
            f"key and value must have the same length S (axis 1): key has S={key.shape[1]}, "
            f"value has S={value.shape[1]}. Each key needs exactly one value."
        )


__all__ = ["check_backend", "check_heads_split", "check_need_weights", "check_tensor_layout", "check_sequence_layout", "check_sequence_input",
           "check_layer_mask", "check_matrices", "check_self_attention_call", "check_layer_call"]
