"""第 5、8、9 章（书中不单独讲）：函数式入口的门——每个公开函数每次调用只进这里一次，检查全部参数，返回一个解析好的设置对象。

One door per entry:

- ``check_attention_call``: ``attn_lib.attention`` (the reference);
- ``check_naive_call``: ``attn_lib.naive_attention``;
- ``check_flash_call``: ``attn_lib.flash_attention`` (chooses the backend);
- ``check_tiled_call`` / ``check_tiled_backward_call``: the tiled torch forward and backward;
- ``check_triton_call`` / ``check_triton_backward_call``: the Triton forward and backward.

Each checks every argument before anything runs (TypeError for a wrong type, ValueError for a
wrong value, "<argument> must be <expected>, got <found>; <remedy>") and returns an
``attn_lib.rules.settings.AttentionSettings``: the band of visible keys for these L and S
(``is_causal``, ``window_size`` and ``align`` in one), the scale and its base-2 factors, the
working dtype, the key mask, the overflow check, the backend and any block sizes.
"""
from __future__ import annotations

from ..rules.band import Band
from ..rules.names import FLASH_BACKENDS
from ..rules.numerics import resolve_scale, work_dtype
from ..rules.settings import AttentionSettings, Options
from .flash import (auto_backend, check_block, check_counter, check_key_mask, check_no_grad_needed, check_saved,
                    check_triton)
from .tensors import check_attention_inputs
from .values import check_align, check_bool, check_choice, check_window_size


def resolve_band(options: Options, L: int, S: int, *, window: bool = True) -> Band:
    """is_causal、window_size、align 三个参数检查后合成 L 个查询、S 个键的带（window=False：这个入口没有窗口）。"""
    is_causal = check_bool("is_causal", options.is_causal)
    window_size = check_window_size(options.window_size, is_causal) if window else (-1, -1)
    offset = S - L if check_align(options.align) == "bottom-right" else 0
    return Band.resolve(L, S, is_causal=is_causal, window_size=window_size, offset=offset)


def _settings(q, dims, scale, band, options: Options, **fields) -> AttentionSettings:
    return AttentionSettings(band=band, scale=resolve_scale(scale, dims[4]), work_dtype=work_dtype(q.dtype),
                             check_overflow=bool(options.check_finite), **fields)


def check_attention_call(q, k, v, mask, options: Options) -> AttentionSettings:
    """attention（参考实现）的门：q、k、v、mask、scale、is_causal、window_size、align、enable_gqa、check_finite。"""
    dims, scale = check_attention_inputs(q, k, v, mask, options, refuse_3d_mask=True)
    return _settings(q, dims, scale, resolve_band(options, dims[2], dims[3]), options, backend="reference")


def check_naive_call(q, k, v, options: Options) -> AttentionSettings:
    """naive_attention 的门：q、k、v（不分组）、scale、is_causal、align、key_mask（没有窗口）。"""
    dims, scale = check_attention_inputs(q, k, v, None, options, gqa_keyword=False)
    B, _, L, S, _, _ = dims
    band = resolve_band(options, L, S, window=False)
    check_key_mask(options.key_mask, B, S, q.device)
    return _settings(q, dims, scale, band, options, key_mask=options.key_mask, backend="naive")


def _checked_fast(q, k, v, options: Options, backend: str, triton_mode):
    """The checks the tiled and the Triton paths share; returns (dims, settings)."""
    dims, scale = check_attention_inputs(q, k, v, None, options)
    B, _, L, S, D, Dv = dims
    if backend == "triton":
        check_triton(q.dtype, q.device, (D, Dv), triton_mode)
    band = resolve_band(options, L, S)
    check_key_mask(options.key_mask, B, S, q.device)
    pow2 = backend == "triton"
    blocks = {name: check_block(name, getattr(options, name), power_of_two=pow2) for name in ("block_m", "block_n")}
    return dims, _settings(q, dims, scale, band, options, key_mask=options.key_mask, backend=backend, **blocks)


def check_flash_call(q, k, v, options: Options, triton_mode) -> AttentionSettings:
    """flash_attention 的门：选后端（auto：q 在 CUDA 上、有 Triton、核函数收得下时用 Triton，否则 torch 分块），再做那条路径的全部检查。

    Args:
        triton_mode: ``attn_lib.device.triton_interprets`` (called only for the Triton backend).
    """
    backend = check_choice("backend", options.backend, FLASH_BACKENDS)
    if backend == "auto":
        backend = auto_backend(q, k, v)
    return _checked_fast(q, k, v, options, backend, triton_mode)[1]


def check_tiled_call(q, k, v, options: Options, counter) -> AttentionSettings:
    """flash_attention_torch（分块前向，只有前向）的门：q、k、v 不求导、块大小、计数器，以及共用的检查。"""
    check_no_grad_needed("flash_attention_torch", q, k, v)
    check_counter(counter)
    return _checked_fast(q, k, v, options, "torch", None)[1]


def check_tiled_backward_call(q, k, v, saved, options: Options) -> AttentionSettings:
    """flash_attention_torch_backward 的门：saved = (out, lse, dout) 与 q、k、v 相合，以及共用的检查。"""
    (B, H, L, _, _, Dv), settings = _checked_fast(q, k, v, options, "torch", None)
    check_saved(q, saved, (B, H, L, Dv), forward="flash_attention_torch")
    return settings


def check_triton_call(q, k, v, options: Options, triton_mode) -> AttentionSettings:
    """flash_attention_triton（只有前向）的门：q、k、v 不求导，以及 Triton 路径的全部检查。"""
    settings = _checked_fast(q, k, v, options, "triton", triton_mode)[1]
    check_no_grad_needed("flash_attention_triton", q, k, v)
    return settings


def check_triton_backward_call(q, k, v, saved, options: Options, triton_mode) -> AttentionSettings:
    """flash_attention_triton_backward 的门：saved = (out, lse, dout) 的精度合核函数（out、dout 同 q，lse 是 float32）。"""
    (B, H, L, _, _, Dv), settings = _checked_fast(q, k, v, options, "triton", triton_mode)
    check_saved(q, saved, (B, H, L, Dv), forward="flash_attention_triton", same_dtype=True)
    return settings


__all__ = ["resolve_band", "check_attention_call", "check_naive_call", "check_flash_call", "check_tiled_call",
           "check_tiled_backward_call", "check_triton_call", "check_triton_backward_call"]
