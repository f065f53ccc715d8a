"""第 5、7、10 章共用（书中不单独讲）：层的入口检查——一次层调用只在这里检查一次，之后的代码不再检查。

One function per door: ``check_self_attention_call`` (chapter 5's ``SelfAttention``) and
``check_layer_call`` (chapter 7's two multi-head classes and chapter 10's rotary one; the KV
cache's own door ``KVCache.append`` is in ``_validate/sequences.py``; head counts, windows and the
layer's ``kv_cache`` argument in ``_validate/heads.py``). Each checks everything a call could get wrong,
*before* anything changes (a KV cache is extended only after the whole call succeeded), scans
each distinct input for nan / inf at most once (``check_finite``), and leaves the shaping of
masks and the choice of attention path to ``attn_lib.layers.dispatch``.
"""
from __future__ import annotations

import torch

from ..layers.dispatch import BACKENDS
from . import all_finite, check_bool, check_last_dim, check_mask, check_mask_shape, check_rank, check_triton_device
from .flash import MAX_HEAD_DIM
from .heads import check_cache_fits, check_heads, check_kv_cache, check_layer_window  # noqa: F401  (re-exported)

_NO_SCORES = ("sdpa", "torch", "triton")  # backends that never store the (L, S) scores


def check_backend(backend) -> str:
    """检查层的 backend 参数：必须是 attn_lib.BACKENDS 里的一个名字。"""
    if not isinstance(backend, str):
        raise TypeError(f"backend must be one of {BACKENDS}, got {backend!r} ({type(backend).__name__})")
    if backend not in BACKENDS:
        hint = "; the tiled FlashAttention path is now 'torch' (or 'triton')" if backend == "flash" else ""
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}{hint}")
    return backend


def check_layer_settings(layer, bias, is_causal, backend, check_finite) -> None:
    """所有层共用的构造参数检查：bias、is_causal、check_finite 是 True / False，backend 是已知名字。"""
    check_bool("bias", bias)
    layer.is_causal = check_bool("is_causal", is_causal)
    layer.backend = check_backend(backend)
    layer.check_finite = check_bool("check_finite", check_finite)


def check_need_weights(need_weights, backend: str) -> None:
    """need_weights 必须是 True / False；不存分数的后端要分数就报错并说明怎么办。"""
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


def check_sequence_input(name: str, x, d_model: int, dtype: torch.dtype, check_finite: bool = True) -> None:
    """检查 (B, L, C) 形状的输入：是张量、是 3 维、最后一维等于 d_model、精度与参数相同。

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
    if x.dtype != dtype:
        raise TypeError(
            f"{name} has dtype {x.dtype} but the layer's parameters are {dtype}; "
            f"convert one of them, e.g. layer.to({x.dtype}) or {name}.to({dtype})"
        )
    if check_finite and x.numel() and not all_finite(x):
        raise ValueError(f"{name} contains nan or inf; the layer would turn it into nan. Check what produced it.")


def check_layer_mask(mask, B: int, H: int, L: int, S: int, device, *, backend: str, check_finite: bool) -> None:
    """检查层的 mask 参数：3 维一律是 (B, L, S)（各头共用），4 维是 (B, H, L, S)；分块后端只收键填充掩码。

    Args:
        mask: None, or a bool / additive float tensor: (S,) or (L, S) for the whole batch,
            (B, L, S) one pattern per sequence, (B, H, L, S) per head (any axis may be 1).
        B, H, L, S: the scores' sizes (S counts every key, cached ones included).
        device: the inputs' device.
        backend: the layer's backend ("torch" / "triton" take only a bool key padding mask).
        check_finite: also look for nan / +inf in a float mask.
    """
    if mask is None:
        return
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


def check_flash_inputs(backend: str, x, D: int, Dv: int) -> None:
    """Triton 后端的额外限制（与 flash_attention 同一措辞）：不收 float64，头维度不超过 256，张量在它能跑的设备上。

    Args:
        backend: the layer's backend (nothing to check unless "triton").
        x: the layer's input (its dtype and device are those of q, k, v).
        D, Dv: the head dims of q / k and of v.
    """
    if backend != "triton":
        return
    if x.dtype == torch.float64:
        raise TypeError("the Triton kernel takes float16, bfloat16 or float32; for float64 use backend='torch' "
                        f"(got the layer's dtype {x.dtype})")
    if max(D, Dv) > MAX_HEAD_DIM:
        raise ValueError(f"the Triton kernel supports head dims up to {MAX_HEAD_DIM}, got D={D}, Dv={Dv}; "
                         "use backend='torch'")
    from ..device import triton_interprets

    check_triton_device(x, triton_interprets())


def check_matrices(w_q, w_k, w_v) -> None:
    """SelfAttention.from_matrices 的参数：三个二维矩阵，行数 C 相同，w_q 与 w_k 的列数 d_k 相同。"""
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        check_rank(name, w, 2, "(C, d)")
    (C, d_k), (Ck, d_kk), (Cv, _) = (tuple(w.shape) for w in (w_q, w_k, w_v))
    if not C == Ck == Cv:
        raise ValueError(f"w_q, w_k, w_v must have the same number of rows C, got {C}, {Ck}, {Cv}")
    if d_k != d_kk:
        raise ValueError(f"w_q and w_k must have the same number of columns d_k, got {d_k} and {d_kk}")


def check_self_attention_call(layer, x, mask, need_weights) -> None:
    """SelfAttention.forward 的入口检查（唯一一处）：need_weights、x、mask、后端限制。"""
    check_need_weights(need_weights, layer.backend)
    check_sequence_input("x", x, layer.d_model, layer.w_q.weight.dtype, layer.check_finite)
    B, L, _ = x.shape
    check_layer_mask(mask, B, 1, L, L, x.device, backend=layer.backend, check_finite=layer.check_finite)
    check_flash_inputs(layer.backend, x, layer.d_k, layer.d_v)


def check_layer_call(layer, query, key, value, *, mask, need_weights, dtype, kv_cache=None):
    """多头层 forward 的入口检查（唯一一处），在任何东西被改动之前；返回补齐默认值的 (key, value)。

    Args:
        layer: the multi-head layer (its d_model, num_heads, head_dim, backend, check_finite,
            ``rotary``: RoPE layers are self-attention only).
        query, key, value: the forward's arguments (key, value may be None).
        mask, need_weights, kv_cache: the forward's arguments.
        dtype: the dtype of the layer's parameters.

    Returns:
        ``(key, value)``: ``key`` defaults to ``query``, ``value`` to ``key``.
    """
    check_need_weights(need_weights, layer.backend)
    if getattr(layer, "rotary", False) and (key is not None or value is not None):
        raise ValueError(f"{type(layer).__name__} is self-attention only: leave key and value as None")
    key = query if key is None else key
    value = key if value is None else value
    seen = []
    for name, t in (("query", query), ("key", key), ("value", value)):
        again = any(t is u for u in seen)  # self-attention: one tensor, scanned once
        check_sequence_input(name, t, layer.d_model, dtype, layer.check_finite and not again)
        seen.append(t)
    _check_key_value(query, key, value)
    B, L, _ = query.shape
    S = key.shape[1]
    if kv_cache is not None:
        S += check_kv_cache(kv_cache, layer, key is query and value is query, B, dtype, query.device)
    check_layer_mask(mask, B, layer.num_heads, L, S, query.device, backend=layer.backend,
                     check_finite=layer.check_finite)
    check_flash_inputs(layer.backend, query, layer.head_dim, layer.head_dim)
    return key, value


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


__all__ = ["check_backend", "check_layer_settings", "check_heads", "check_need_weights", "check_tensor_layout",
           "check_sequence_layout", "check_sequence_input", "check_layer_mask", "check_flash_inputs", "check_matrices",
           "check_self_attention_call", "check_layer_call", "check_kv_cache", "check_cache_fits",
           "check_layer_window"]
