"""第 3–13 章共用（书中不单独讲）：输入检查，每条报错都说清是哪个参数、期望什么、实际拿到什么、怎么改。

Shared by every attention path (numpy, torch reference, multi-head, tiled, Triton, decoding),
so the same bad input gets the same message whichever path a reader calls. Every message reads
``"<argument> must be <expected>, got <found>; <remedy>"``.

One rule for the exception types, in every function here:

- ``TypeError``: the argument has the wrong *type* (a str where a number belongs, a float
  where a size belongs, a non-bool flag, mismatched dtypes);
- ``ValueError``: the type is right but the *value* is not (a size < 1, a shape that does
  not fit, a scale <= 0, nan / inf, scores that overflow).

Every public entry point enters this package once per call, through its door, which checks
everything and returns the call's settings (``attn_lib.rules.settings``); the cores below a door
check nothing. The package imports only torch and ``attn_lib.rules``: a check that needs a
class (``KVCache``, ``TinyLM``) gets it from its caller.

- ``values``: flags, sizes, the scale, the sliding window, the alignment, choices, axes;
- ``shapes``: ranks, the (B, H, L, D) shapes of q, k, v (and the GQA head rule), dtypes, devices, mask shapes;
- ``tensors``: tensor and array types, nan / inf scans, the attention inputs as a whole;
- ``flash``: what the tiled and Triton paths add (key masks, saved tensors, blocks, Triton);
- ``doors``: the functional entries' doors (``attention``, ``flash_attention`` ...);
- ``heads``, ``layers``: a layer's constructor and its forward's door;
- ``sequences``: masks, positions, the KV cache, chapter 10's model;
- ``decoding``, ``lm``: chapter 13's decode step, language model and ``generate``.
"""
from __future__ import annotations

from .shapes import check_mask_shape, check_qkv_shapes, check_rank, check_same_device, check_same_dtype
from .tensors import (all_finite, check_all_finite, check_attention_arrays, check_attention_inputs, check_float_array,
                      check_float_tensor, check_mask, check_on_q_device, check_row_max, check_score_row,
                      check_scores_finite, check_softmax_array, check_softmax_input, check_tensor)
from .values import (check_align, check_bool, check_choice, check_counts, check_dim, check_divisible, check_int,
                     check_last_dim, check_positive_int, check_scale, check_window_size)

__all__ = [
    "check_align", "check_bool", "check_choice", "check_counts", "check_dim", "check_divisible", "check_int",
    "check_last_dim", "check_positive_int", "check_scale", "check_window_size",
    "check_mask_shape", "check_qkv_shapes", "check_rank", "check_same_device", "check_same_dtype",
    "all_finite", "check_all_finite", "check_attention_arrays", "check_attention_inputs", "check_float_array",
    "check_float_tensor", "check_mask", "check_on_q_device", "check_row_max", "check_score_row",
    "check_scores_finite", "check_softmax_array", "check_softmax_input", "check_tensor",
]
