"""第 3–9 章共用（书中不单独讲）：输入检查，每条报错都说清是哪个参数、期望什么、实际拿到什么、怎么改。

Shared by every attention path (numpy, torch reference, multi-head, tiled, Triton), so the
same bad input gets the same message whichever path a reader calls. Every message reads
``"<argument> must be <expected>, got <found>; <remedy>"``.

One rule for the exception types, in every function here:

- ``TypeError``: the argument has the wrong *type* (a str where a number belongs, a float
  where a size belongs, a non-bool flag, mismatched dtypes);
- ``ValueError``: the type is right but the *value* is not (a size < 1, a shape that does
  not fit, a scale <= 0, nan / inf, scores that overflow).

Public entry points check once, at the door, and then call unchecked cores
(``attn_lib.core.reference._attention_core``, ``attn_lib.flash.autograd._flash_unchecked`` ...), so nothing
below the door checks again. The helpers live in four small modules:

- ``values``: flags, sizes, the scale, choices, axes, the sliding window;
- ``shapes``: ranks, the (B, H, L, D) shapes of q, k, v (and the GQA head rule), dtypes, devices, mask shapes;
- ``tensors``: tensor and array types, nan / inf scans, the attention inputs as a whole;
- ``flash``: what the tiled and Triton paths add (key padding masks, saved tensors, blocks);
- ``decoding`` (chapter 13, imported from there): a decode step's ``cache_seqlens``, ``num_splits``,
  query count, and ``merge_partials``' inputs.
"""
from __future__ import annotations

from ..rules.numerics import OVERFLOW_MESSAGE, overflow_error
from .flash import (check_block, check_key_padding_mask, check_no_grad_needed, check_saved, check_triton_device,
                    check_triton_inputs)
from .shapes import check_mask_shape, check_qkv_shapes, check_rank, check_same_device, check_same_dtype
from .tensors import (all_finite, check_attention_arrays, check_all_finite, check_attention_inputs, check_float_array,
                      check_float_tensor, check_mask, check_row_max, check_score_row, check_scores_finite, check_tensor)
from .values import (check_bool, check_choice, check_counts, check_dim, check_divisible, check_int, check_last_dim,
                     check_positive_int, check_scale, check_window_size)

__all__ = [
    "OVERFLOW_MESSAGE", "overflow_error",
    "check_bool", "check_choice", "check_counts", "check_dim", "check_divisible", "check_int", "check_last_dim",
    "check_positive_int", "check_scale", "check_window_size",
    "check_mask_shape", "check_qkv_shapes", "check_rank", "check_same_device", "check_same_dtype",
    "all_finite", "check_all_finite", "check_attention_arrays", "check_attention_inputs", "check_float_array",
    "check_float_tensor", "check_mask", "check_row_max", "check_score_row", "check_scores_finite", "check_tensor",
    "check_block", "check_key_padding_mask", "check_no_grad_needed", "check_saved", "check_triton_device",
    "check_triton_inputs",
]
