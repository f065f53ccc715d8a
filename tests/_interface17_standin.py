"""Stand-ins for issue 17's pieces that other branches own, used by the tests only until they merge.

Branch gqa-layers codes against /work/wt/INTERFACE17.md: ``attn_lib._dispatch`` calls
``reference._attention_core(..., window_size=, offset=)`` and
``flash._flash_unchecked(..., window_size=)`` with k, v of H_kv heads, and the layers call
``attn_lib._validate.check_window_size``. Branch gqa-paths provides them. Until then
``install()`` patches in a tiny private stand-in for each piece that is MISSING (checked by
signature / attribute); once the real pieces are merged it changes nothing, and the lead may
delete this file and the two conftest.py files that call it (tests/unit, tests/contracts).

The stand-ins repeat K/V (the real cores must not) and, for the tiled paths with a window,
compute through the stand-in reference core: before the merge the "torch" / "triton" rows with a
window test the dispatch and the cache, not the kernels; after it they test the kernels.
"""
from __future__ import annotations

import inspect

import torch

ACTIVE: list[str] = []  # which stand-ins are in use (empty once gqa-paths is merged)


def _has_kw(fn, name: str) -> bool:
    return name in inspect.signature(fn).parameters


def _check_window_size(window_size, is_causal=False):
    """The wording of gqa-paths' check_window_size (attn_lib/_validate/values.py on that branch), shortened."""
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or any(isinstance(w, bool) or not isinstance(w, int) for w in window_size)):
        raise TypeError(f"window_size must be a pair (left, right) of ints, as a tuple or list, got {window_size!r}")
    left, right = window_size
    if left < -1 or right < -1:
        raise ValueError(f"window_size must be a pair of ints >= -1 (-1: unbounded on that side), got {(left, right)!r}")
    if is_causal and right not in (-1, 0):
        raise ValueError(f"window_size's right side must be 0 or -1 with is_causal=True, got {(left, right)!r}")
    return int(left), int(right)


def install() -> None:
    import attn_lib._dispatch as dispatch
    import attn_lib._validate as validate
    from attn_lib import _band, flash, reference

    if not hasattr(validate, "check_window_size"):
        validate.check_window_size = _check_window_size
        ACTIVE.append("check_window_size")
    real_core = reference._attention_core
    if not _has_kw(real_core, "window_size"):
        def core(q, k, v, mask, is_causal, scale, *, check_overflow, window_size=(-1, -1), offset=0):
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # stand-in only
            lo, hi = _band.band(is_causal, tuple(window_size), offset)
            keep = _band.band_mask(q.shape[2], k.shape[2], lo, hi, q.device)  # (L,S)
            if mask is None:
                mask = keep
            elif mask.dtype == torch.bool:
                mask = mask & keep
            else:
                mask = mask.masked_fill(~keep, float("-inf"))
            return real_core(q, k, v, mask, False, scale, check_overflow=check_overflow)

        dispatch._attention_core = core
        ACTIVE.append("_attention_core")
    real_flash = flash._flash_unchecked
    if not _has_kw(real_flash, "window_size"):
        def tiled(q, k, v, *, is_causal, scale, key_padding_mask, backend, check_overflow, causal_offset=0,
                  window_size=(-1, -1)):
            if tuple(window_size) == (-1, -1):
                group = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # stand-in only
                return real_flash(q, k, v, is_causal=is_causal, scale=scale, key_padding_mask=key_padding_mask,
                                  backend=backend, check_overflow=check_overflow, causal_offset=causal_offset)
            mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
            return dispatch._attention_core(q, k, v, mask, is_causal, scale, check_overflow=check_overflow,
                                            window_size=window_size, offset=causal_offset)[0]

        flash._flash_unchecked = tiled
        ACTIVE.append("_flash_unchecked")
