"""第 5–13 章共用（书中不单独讲）：一次调用的设置——门口检查一次、解析成一个冻结的对象，之后每个内核、启动器和 autograd Function 都只读它。

Three classes and the rules that read them:

- ``Options``: the keyword arguments a public entry received, as they came (unchecked). The
  door (``attn_lib.checks``) checks them once and resolves them into
- ``AttentionSettings``: which keys each query sees (``band``, the causal rule, the window and
  the alignment in one, already normalised for these L and S), the score scale and its base-2
  factors, the working dtype, the key mask, whether to check for overflow, the backend and any
  block sizes the caller chose; or
- ``DecodeSettings`` for a decode step: no band (a plain ``is_causal``, always bottom-right, no
  window), no key mask (the cache lengths say which keys exist), no block sizes, and ``num_splits``.
- ``layer_settings`` builds a layer call's ``AttentionSettings``; ``rows_with_keys`` and
  ``raise_if_overflowed`` are the overflow rule on a row's log-sum-exp (the tiled and Triton paths;
  the naive path applies ``rows_with_keys`` to its row maximum).

Cores take ``(q, k, v[, mask | saved], settings)`` (some also an optional counter, target or block
sizes): nothing below a door re-derives a dtype, a scale or a band.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from .band import Band
from .names import NO_WINDOW
from .numerics import base2_factor, overflow_error, resolve_scale, work_dtype


@dataclass(frozen=True)
class Options:
    """一次调用收到的关键字参数，原样未检查；门口把它检查并解析成 AttentionSettings。"""

    is_causal: Any = False
    scale: Any = None
    window_size: Any = NO_WINDOW
    align: Any = "top-left"
    enable_gqa: Any = False
    check_finite: Any = True
    key_mask: Any = None
    backend: Any = "auto"
    block_m: Any = None
    block_n: Any = None
    cache_seqlens: Any = None
    num_splits: Any = None


@dataclass(frozen=True)
class AttentionSettings:
    """一次注意力调用解析好的设置（冻结）：看得见的带、缩放、工作精度、键掩码、溢出检查、后端、块大小。

    Attributes:
        band: query i sees key j iff ``band.lo <= j - i <= band.hi`` (``attn_lib.rules.band``).
        scale: multiplies q·k (the default 1 / sqrt(D) already filled in).
        work_dtype: float64 for float64 inputs, float32 for everything else.
        key_mask: None or bool (B, S), True = the key is present.
        check_overflow: raise the overflow error when a row that sees a key overflowed.
        backend: the resolved backend name.
        block_m, block_n: the caller's block sizes (None: the path's default).
    """

    band: Band
    scale: float
    work_dtype: torch.dtype
    key_mask: torch.Tensor | None = None
    check_overflow: bool = True
    backend: str = "reference"
    block_m: int | None = None
    block_n: int | None = None

    @property
    def qk_scale(self) -> tuple[float, float]:
        """以 2 为底算评分时乘的两个因子 (a, b)：a·b = scale·log2(e)（见 ``attn_lib.rules.numerics.base2_factor``）。"""
        return base2_factor(self.scale, self.work_dtype)

    def replace(self, **changes) -> "AttentionSettings":
        """A copy with some fields changed (the object itself is frozen)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class DecodeSettings:
    """一步解码（flash_decoding）解析好的设置：缩放、工作精度、每条序列的键数、是否因果、段数、后端、溢出检查。

    Attributes:
        scale, work_dtype, check_overflow, backend: as in ``AttentionSettings``.
        seqlens: None (every entry uses all S_max keys) or an integer tensor (B,): entry b uses
            keys 0 .. seqlens[b] - 1; the L queries are the last L of them.
        is_causal: query i of entry b sees key j iff ``j <= seqlens[b] - L + i`` (bottom-right);
            False: every query sees all ``seqlens[b]`` keys.
        num_splits: None (choose for the device) or an int >= 1.
    """

    scale: float
    work_dtype: torch.dtype
    seqlens: torch.Tensor | None = None
    is_causal: bool = False
    num_splits: int | None = None
    check_overflow: bool = True
    backend: str = "torch"


def layer_settings(layer, L: int, S: int, D: int, dtype, *, cached: bool = False) -> AttentionSettings:
    """一个层一次调用的设置（输入已检查过）：L 个查询、S 个键，带由层的 is_causal、window_size、align 合成。

    With a KV cache (``cached``) the L queries are the last L of the S keys: aligned bottom-right
    whatever the layer's ``align`` (which only matters without a cache, when L != S).

    Args:
        layer: a layer with ``is_causal``, ``window_size``, ``align``, ``check_finite`` and ``backend``.
        D: the head dim of q and k (the scale is 1 / sqrt(D)).
        dtype: the layer's parameter dtype.
    """
    offset = S - L if cached or layer.align == "bottom-right" else 0
    band = Band.resolve(L, S, is_causal=layer.is_causal, window_size=layer.window_size, offset=offset)
    return AttentionSettings(band=band, scale=resolve_scale(None, D), work_dtype=work_dtype(dtype),
                             check_overflow=layer.check_finite, backend=layer.backend)


def rows_with_keys(L: int, S: int, settings: AttentionSettings, device):
    """哪些查询行至少看得见一个键：（B 或 1, 1, L）布尔张量（只读带和键掩码，不读 q、k、v）。"""
    lo, hi, key_mask = settings.band.lo, settings.band.hi, settings.key_mask
    i = torch.arange(L, device=device)  # (L,)
    start = torch.zeros_like(i) if lo is None else (i + lo).clamp(0, S)  # (L,) first visible key
    end = torch.full_like(i, S) if hi is None else (i + hi + 1).clamp(0, S)  # (L,) sees keys < end
    if key_mask is None:
        return (end > start)[None, None, :]  # (L,) -> (1,1,L)
    present = torch.nn.functional.pad(key_mask.to(torch.int32).cumsum(-1), (1, 0))  # (B,S) -> (B,S+1)
    Bm = present.shape[0]
    seen = present.gather(1, end.expand(Bm, L)) - present.gather(1, start.expand(Bm, L))  # (B,S+1) -> (B,L)
    return ((seen > 0) & (end > start))[:, None, :]  # (B,L) -> (B,1,L)


def raise_if_overflowed(lse, L: int, S: int, settings: AttentionSettings) -> None:
    """溢出规则（分块和 Triton 路径）：看得见键的行，log-sum-exp 却是 ±inf 或 nan，就是评分溢出了。

    A row that sees no key has ``lse = -inf`` and a zero output: not an overflow. A row whose
    log-sum-exp is +inf or nan overflowed to +inf; one whose visible scores all became -inf has
    ``lse = -inf`` and overflowed to -inf. One reduction and one host sync.

    Raises:
        ValueError: ``overflow_error(settings.work_dtype, to)``.
    """
    if lse.numel() == 0:
        return
    bad = ~torch.isfinite(lse) & rows_with_keys(L, S, settings, lse.device)  # (B,H,L) & (B|1,1,L)
    if bool(bad.any()):
        up = bool((bad & ~torch.isneginf(lse)).any())  # +inf or nan: a score overflowed upwards
        raise overflow_error(settings.work_dtype, "+inf" if up else "-inf")


__all__ = ["Options", "AttentionSettings", "DecodeSettings", "layer_settings", "rows_with_keys", "raise_if_overflowed"]
