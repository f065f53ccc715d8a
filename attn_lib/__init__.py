"""attn_lib：注意力机制可执行章节的配套库（第 1–13 章；每个子包和模块的文档字符串第一行写着它服务的章）。

Layout everywhere: (B, H, L, D) as in ``torch.nn.functional.scaled_dot_product_attention``
(B batch, H heads, L queries, S keys, D head dim). One concept per module, in subpackages that
follow the book: ``core`` (the maths), ``layers``, ``flash`` (the fast paths, ``flash/triton``
the kernels), ``models``, ``figures``, ``costs``, ``data``, ``exercises``; ``checks`` (the doors'
input checks) and ``rules`` (what every path agrees on) underneath. Every fast path is
tested against ``attn_lib.core.reference.attention`` with the tolerances in
``attn_lib.tolerances``. Importing attn_lib never touches CUDA.
"""
import re as _re

import torch as _torch

TORCH_MIN = "2.5"  # what the book prints needs it (see pyproject.toml's dependencies)
if tuple(int(p) for p in _re.findall(r"\d+", _torch.__version__)[:2]) < tuple(int(p) for p in TORCH_MIN.split(".")):
    raise ImportError(f"torch must be version {TORCH_MIN} or newer for attn_lib, got {_torch.__version__}; "
                      f"run pip install -U \"torch>={TORCH_MIN}\" and restart the kernel")
from .costs import io_model
from .models import it_data
from .models import lm_data
from .core import numpy_ref
from .models import tiny_lm
from .models import tiny_model
from .core import worked_example
from .rules.names import BACKENDS
from .flash.decoding import flash_decoding
from .flash.splits import merge_partials
from .device import cuda_available, default_device, try_gpu
from .flash.autograd import flash_attention
from .flash.triton.entry import flash_attention_triton, flash_attention_triton_backward
from .flash.tiled_forward import flash_attention_torch
from .models.generation import generate
from .flash.tiled_backward import flash_attention_torch_backward
from .flash.naive import naive_attention
from .layers.kv_cache import KVCache
from .costs.io_model import IOCounter, flash_attention_io, standard_attention_io, tiled_attention_io
from .core.lookup import hard_lookup, soft_lookup
from .core.masks import additive_to_bool, bool_to_additive, causal_mask, padding_mask, sliding_window_mask
from .layers.multihead import MultiHeadAttention, count_parameters, merge_heads, split_heads
from .layers.multihead_looped import LoopedMultiHeadAttention
from .layers.positions import apply_rotary, sinusoidal_positions
from .core.online import (online_logsumexp, online_max_and_sum, online_softmax, online_softmax_update,
                             online_weighted_sum)
from .core.reference import attention
from .layers.self_attention import SelfAttention
from .core.similarity import dot, dot_all, dot_query_keys, euclidean_distance
from .core.softmax import naive_softmax, softmax
from .tolerances import TOLERANCES, assert_close, tolerance

__version__ = "0.1.0"

__all__ = [
    # 全书共用 (every chapter): the worked example, devices, the tolerance table
    "worked_example",
    "cuda_available",
    "default_device",
    "try_gpu",
    "TOLERANCES",
    "tolerance",
    "assert_close",
    "BACKENDS",
    # 第 1 章 字典类比
    "hard_lookup",
    "soft_lookup",
    # 第 2 章 点积
    "dot",
    "dot_query_keys",
    "dot_all",
    "euclidean_distance",
    # 第 3 章 Softmax (torch and numpy)
    "softmax",
    "naive_softmax",
    "numpy_ref",
    # 第 5 章 自注意力 (the reference implementation every other path is tested against)
    "attention",
    "SelfAttention",
    # 第 6 章 掩码
    "causal_mask",
    "padding_mask",
    "bool_to_additive",
    "additive_to_bool",
    "sliding_window_mask",  # 滑动窗口那一章
    # 第 7 章 多头注意力
    "MultiHeadAttention",
    "LoopedMultiHeadAttention",
    "split_heads",
    "merge_heads",
    "count_parameters",
    # 第 8 章 FlashAttention: online softmax, the IO model, the tiled and Triton paths
    "online_softmax",
    "online_softmax_update",
    "online_max_and_sum",
    "online_logsumexp",
    "online_weighted_sum",
    "io_model",
    "IOCounter",
    "standard_attention_io",
    "flash_attention_io",
    "tiled_attention_io",
    "flash_attention",
    "flash_attention_torch",
    "flash_attention_triton",
    "naive_attention",
    # 第 9 章 FlashAttention 的反向传播 (flash_attention itself is differentiable)
    "flash_attention_torch_backward",
    "flash_attention_triton_backward",
    # 第 10 章 位置、训练一个小模型、KV 缓存
    "sinusoidal_positions",
    "apply_rotary",
    "KVCache",
    "it_data",
    "tiny_model",
    # 第 13 章 让模型写字：语料、小语言模型、带 KV 缓存的逐字生成、一步解码的 FlashDecoding（键轴切段、log-sum-exp 合并）
    "lm_data",
    "tiny_lm",
    "generate",
    "flash_decoding",
    "merge_partials",
]
