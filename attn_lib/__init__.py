"""attn_lib：注意力机制可执行章节的配套库。

Layout everywhere: (B, H, L, D) as in ``torch.nn.functional.scaled_dot_product_attention``
(B batch, H heads, L queries, S keys, D head dim). One module per concept; every fast path
is tested against ``attn_lib.reference.attention`` with the tolerances in
``attn_lib.tolerances``. Importing attn_lib never touches CUDA.
"""
from .device import cuda_available, default_device, try_gpu
from .lookup import hard_lookup, soft_lookup
from .masks import causal_mask
from .reference import attention
from .similarity import dot, dot_all, dot_query_keys, euclidean_distance
from .softmax import naive_softmax, softmax
from .tolerances import TOLERANCES, assert_close, tolerance
from . import numpy_ref, worked_example

__version__ = "0.1.0"

__all__ = [
    "attention",
    "softmax",
    "naive_softmax",
    "causal_mask",
    "dot",
    "dot_query_keys",
    "dot_all",
    "euclidean_distance",
    "hard_lookup",
    "soft_lookup",
    "cuda_available",
    "default_device",
    "try_gpu",
    "TOLERANCES",
    "tolerance",
    "assert_close",
    "numpy_ref",
    "worked_example",
]

# --- issue 3 (masks, self-attention, multi-head) adds its exports below this line ---
from .masks import additive_to_bool, bool_to_additive, padding_mask
from .multihead import LoopedMultiHeadAttention, MultiHeadAttention, count_parameters, merge_heads, split_heads
from .self_attention import SelfAttention

__all__ += [
    "padding_mask",
    "bool_to_additive",
    "additive_to_bool",
    "SelfAttention",
    "MultiHeadAttention",
    "LoopedMultiHeadAttention",
    "split_heads",
    "merge_heads",
    "count_parameters",
]

# --- issue 4 (FlashAttention) adds its exports below this line ---
from .flash import flash_attention, flash_attention_triton
from .flash_torch import flash_attention_torch, naive_attention
from .online_softmax import (online_logsumexp, online_max_and_sum, online_softmax, online_softmax_update,
                             online_weighted_sum)
from .io_model import IOCounter, flash_attention_io, standard_attention_io, tiled_attention_io
from . import io_model

__all__ += [
    "flash_attention",
    "flash_attention_torch",
    "flash_attention_triton",
    "naive_attention",
    "online_softmax",
    "online_softmax_update",
    "online_max_and_sum",
    "online_logsumexp",
    "online_weighted_sum",
    "IOCounter",
    "standard_attention_io",
    "flash_attention_io",
    "tiled_attention_io",
    "io_model",
]

# --- issue 11 (positions, KV cache, a trained tiny model) adds its exports below this line ---
from .positions import apply_rotary, sinusoidal_positions
from .kv_cache import KVCache
from . import it_data, tiny_model

__all__ += [
    "sinusoidal_positions",
    "apply_rotary",
    "KVCache",
    "it_data",
    "tiny_model",
]
