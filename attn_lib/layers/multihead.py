"""第 6、7、10–13 章（多头注意力）：每个头通过自己的投影看全部输入；投影之后的 C 维切成 H 段（每头 D = C / H），各算一遍注意力再拼回来。

    qkv = x W_qkv            one (B, L, C) @ (C, 3C) matrix multiplication, then split
    q, k, v -> (B, H, L, D)  split the last axis into H heads of D
    out = attention(q, k, v) per head, all heads in one call
    out -> (B, L, C) @ W_o   merge the heads, output projection

``MultiHeadAttention`` is the fused version: ONE (3C, C) parameter for the three
projections of all heads. ``LoopedMultiHeadAttention`` is the teaching version with H
separate small projections per head and a Python loop over heads; the two compute the same
thing（"矩阵内积再拼接等同于拼接矩阵再内积"），which tests/layers/test_multihead_looped.py asserts.
Both have 4C² + 4C parameters (with bias) for every H, the same as a single head of width C.

Grouped-query attention (GQA, Llama 2 70B, Llama 3, Mistral): ``num_kv_heads=H_kv`` < H
key/value heads, each shared by H / H_kv query heads (query head h uses kv head
h // (H / H_kv); MQA is H_kv = 1). The fused projection shrinks to C + 2·H_kv·D outputs, the
KV cache to H_kv heads. ``window_size=(left, right)`` (flash-attn's meaning, -1 unbounded): a
sliding window, query i sees keys i - left .. i + right (right 0 or -1 with ``is_causal``).

Each forward checks its inputs once, at the door (``attn_lib.checks.layers.check_layer_call``),
which returns the call's settings; then ``_forward`` runs unchecked code: the projections and
the head split below, and ``attn_lib.layers.dispatch.attend``, the attention on the layer's
backend (``attn_lib.BACKENDS``); a KV-cache decode step goes through chapter 13's
``attn_lib.flash.decoding`` (FlashDecoding) where that computes exactly the same
(``attn_lib.layers.dispatch.decode_backend``). A model that checked its whole input at its own
door (``attn_lib.models.tiny_lm``) calls ``_forward`` directly.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..checks.heads import check_multihead_args
from ..checks.layers import check_heads_split, check_layer_call, check_sequence_layout
from ..device import triton_interprets
from ..rules.names import NO_WINDOW
from ..rules.settings import AttentionSettings, Options
from .dispatch import attend, layer_mask
from .kv_cache import KVCache


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """把 (B, L, C) 的最后一维切成 H 个头，返回 (B, H, L, D)，D = C / H。

    Args:
        x: (B, L, C).
        num_heads: H; must divide C.

    Returns:
        A (B, H, L, D) view-based tensor: head h holds channels ``h*D .. (h+1)*D - 1``.
    """
    return _split_heads(x, check_heads_split(x, num_heads))


def _split_heads(x: torch.Tensor, H: int) -> torch.Tensor:
    B, L, C = x.shape
    return x.view(B, L, H, C // H).transpose(1, 2)  # (B,L,C) -> (B,L,H,D) -> (B,H,L,D)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """split_heads 的逆操作：(B, H, L, D) → (B, L, C)，C = H·D，头按顺序首尾相接。

    Args:
        x: (B, H, L, D).

    Returns:
        (B, L, H*D).
    """
    check_sequence_layout(x, 4, "(B, H, L, D)")
    return _merge_heads(x)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    B, H, L, D = x.shape
    return x.transpose(1, 2).reshape(B, L, H * D)  # (B,H,L,D) -> (B,L,H,D) -> (B,L,C)


def _settings(layer, sizes: tuple, bias, options: Options) -> None:
    """多头类共用的构造参数检查（一次）：sizes = (d_model, num_heads, num_kv_heads)；设好 head_dim、d_model、num_heads、num_kv_heads、is_causal、window_size、align、backend、check_finite。"""
    check_multihead_args(layer, sizes, bias, options, even_head_dim=getattr(layer, "rotary", False))


def _repr(layer) -> str:
    """extra_repr of the multi-head classes: what differs from the defaults."""
    text = (f"d_model={layer.d_model}, num_heads={layer.num_heads}, head_dim={layer.head_dim}, "
            f"is_causal={layer.is_causal}")
    if layer.num_kv_heads != layer.num_heads:
        text += f", num_kv_heads={layer.num_kv_heads}"
    if layer.window_size != NO_WINDOW:
        text += f", window_size={layer.window_size}"
    if layer.align != "top-left":
        text += f", align={layer.align!r}"
    return text + (f", backend={layer.backend!r}" if layer.backend != "auto" else "")


class MultiHeadAttention(nn.Module):
    """多头注意力（融合版）：一个 (C + 2·H_kv·D, C) 的 QKV 投影 + H 个头并行 + 输出投影。

    Args:
        d_model: hidden size C（隐藏层维度）.
        num_heads: H; must divide ``d_model``（每个头的维度 D = C / H）.
        num_kv_heads: H_kv key/value heads (grouped-query attention, GQA); must divide H;
            query head h uses key/value head h // (H / H_kv). None (default) means H (no
            sharing); 1 is multi-query attention (MQA).
        window_size: None (default, no window) or ``(left, right)`` as in flash-attn: query i
            sees keys i + o - left .. i + o + right (-1 = unbounded on that side; o the
            alignment's offset); with ``is_causal`` right must be 0 or -1. With a ``kv_cache`` the
            rolling buffer keeps the last ``left`` positions between calls (a step's own keys
            join them: one window of left + 1). A config's ``sliding_window = W`` (Mistral,
            Hugging Face) counts the current position too: pass ``(W - 1, 0)``, not ``(W, 0)``.
        bias: give the QKV and output projections a bias.
        is_causal: hide later keys from each query; combined with any ``mask`` given to ``forward``.
        align: ``"top-left"`` (default, SDPA's ``is_causal``) or ``"bottom-right"`` (flash-attn's)
            for ``is_causal`` and ``window_size`` when L != S (cross-attention). Decoding with a
            ``kv_cache`` is always bottom-right: the new queries are the last L positions.
        backend: one of ``attn_lib.BACKENDS``: ``"auto"`` (default: the reference path when
            ``need_weights=True``, else torch's fused ``"sdpa"``, which computes the same output),
            ``"reference"`` (always the reference path), ``"sdpa"``, or the tiled FlashAttention
            paths ``"torch"`` / ``"triton"`` (key padding masks only, no scores).
        check_finite: scan the inputs for nan / inf and the output for overflow (default);
            ``False`` skips these checks and their host syncs on CUDA.

    Parameters: ``qkv`` (nn.Linear C → C + 2·H_kv·D, rows ordered [W_q; W_k; W_v]; with
    H_kv = H that is 3C, as ``torch.nn.MultiheadAttention.in_proj_weight``) and ``out_proj``
    (nn.Linear C → C): (C + 2·H_kv·D)(C + 1) + C² + C numbers with bias, 4C² + 4C when
    H_kv = H, whatever H is. No dropout.
    """

    rotary = False  # RotaryMultiHeadAttention (attn_lib.models.tiny_model) rotates q and k in `_positions`
    cache_type = KVCache  # what `kv_cache` takes (the door checks against it)

    def __init__(self, d_model: int, num_heads: int, *, num_kv_heads: int | None = None, window_size=None,
                 bias: bool = True, is_causal: bool = False, align: str = "top-left", backend: str = "auto",
                 check_finite: bool = True):
        super().__init__()
        _settings(self, (d_model, num_heads, num_kv_heads), bias,
                  Options(is_causal=is_causal, window_size=window_size, align=align, backend=backend,
                          check_finite=check_finite))
        C, C_kv = self.d_model, self.num_kv_heads * self.head_dim
        self.qkv = nn.Linear(C, C + 2 * C_kv, bias=bias)  # (C) -> (C + 2·H_kv·D) = [q | k | v]
        self.out_proj = nn.Linear(C, C, bias=bias)  # (C) -> (C)

    def _project(self, query, key, value):
        """Q、K、V 投影：自注意力时一次矩阵乘法再切开；交叉注意力时用同一参数的三段分别乘。"""
        C, C_kv = self.d_model, self.num_kv_heads * self.head_dim
        sizes = (C, C_kv, C_kv)
        if key is query and value is query:
            return self.qkv(query).split(sizes, dim=-1)  # (B,L,C) -> (B,L,C+2C_kv) -> (B,L,C), 2 x (B,L,C_kv)
        w_q, w_k, w_v = self.qkv.weight.split(sizes, dim=0)  # (C+2C_kv,C) -> (C,C), 2 x (C_kv,C)
        b = self.qkv.bias
        b_q, b_k, b_v = b.split(sizes) if b is not None else (None, None, None)  # (C+2C_kv,) -> (C,), 2 x (C_kv,)
        q = F.linear(query, w_q, b_q)  # (B,L,C) -> (B,L,C)
        if value is key:
            w_kv = self.qkv.weight[C:]  # (2C_kv,C): keys and values from one input, one matmul
            b_kv = b[C:] if b is not None else None
            k, v = F.linear(key, w_kv, b_kv).split(C_kv, dim=-1)  # (B,S,C) -> (B,S,2C_kv) -> 2 x (B,S,C_kv)
        else:
            k = F.linear(key, w_k, b_k)  # (B,S,C) -> (B,S,C_kv)
            v = F.linear(value, w_v, b_v)  # (B,S,C) -> (B,S,C_kv)
        return q, k, v

    def forward(self, query, key=None, value=None, *, mask=None, need_weights: bool = False, kv_cache=None):
        """多头注意力的前向计算。

        Args:
            query: (B, L, C).
            key: (B, S, C); default ``query`` (self-attention).
            value: (B, S, C); default ``key`` (so ``query`` when both are omitted).
            mask: optional bool (True = may attend) or additive float (``-inf`` hides):
                (L, S) or (S,) for one pattern for the whole batch; (B, L, S) one pattern per
                sequence, shared by every head (as in ``SelfAttention``); (B, H, L, S) one per
                head; any axis may be 1, e.g. ``attn_lib.padding_mask(lengths)`` (B, 1, 1, S)
                for key padding. Combined with ``is_causal``: a key is visible only if both allow it.
            need_weights: also return every head's attention scores (backends "auto" and
                "reference").
            kv_cache: optional ``attn_lib.KVCache`` (self-attention only; one cache serves one
                layer; it stores the H_kv key/value heads): the queries attend over every cached
                key and their own, and the new keys and values are stored once the call
                succeeded (a failed call leaves the cache as it was). With ``is_causal`` the
                queries are the last L positions (bottom-right aligned), so decoding in any
                chunks equals one causal forward over the whole sequence; without it each call's
                queries see everything cached so far and their own block (the rows of a full
                forward over the sequence so far). A sliding-window layer's cache keeps only the
                last ``left`` positions (``KVCache.seen`` counts all). ``mask`` then covers the
                ``len(kv_cache) + S`` keys attended, the stored ones and the new ones: absolute
                positions ``kv_cache.start`` .. ``kv_cache.seen + S - 1``. A step of at most 16 new
                queries with no mask and no scores (with a window: one that hides none of the
                keys the step attends, e.g. one query over a rolling cache) runs
                ``attn_lib.flash_decoding``'s core, the split-KV decode path, when autograd need not
                follow it (under ``torch.no_grad()``, or nothing requires grad) and the backend is not
                ``"reference"`` (nor ``"sdpa"`` on CUDA): ``attn_lib.layers.dispatch.decode_backend``.

        Returns:
            output (B, L, C), or ``(output, scores)`` with scores (B, H, L, S).
        """
        key, value, settings = check_layer_call(self, query, key, value, mask, need_weights, kv_cache,
                                                triton_interprets)
        return self._forward(query, key, value, mask, need_weights, kv_cache, settings)

    def _forward(self, query, key, value, mask, need_weights: bool, kv_cache, settings: AttentionSettings):
        """forward 的无检查内核（门已检查过全部输入，settings 是这次调用的设置）：投影、切头、注意力、缓存、输出投影。"""
        q, k, v = self._project(query, key, value)  # (B,L,C), (B,S,C_kv), (B,S,C_kv)
        q = _split_heads(q, self.num_heads)  # (B,L,C) -> (B,H,L,D)
        k = _split_heads(k, self.num_kv_heads)  # (B,S,C_kv) -> (B,H_kv,S,D)
        v = _split_heads(v, self.num_kv_heads)  # (B,S,C_kv) -> (B,H_kv,S,D)
        seen = kv_cache.seen if kv_cache is not None else 0  # the new tokens sit at positions seen ..
        q, k = self._positions(q, k, seen)  # unchanged here; RoPE rotates them in attn_lib.models.tiny_model
        if kv_cache is not None:  # generation with a KV cache (chapter 10, attn_lib.layers.kv_cache)
            k, v = kv_cache.joined(k, v)  # (B,H_kv,stored,D) + (B,H_kv,S,D) -> (B,H_kv,stored+S,D), same for v
        out, scores = attend(q, k, v, layer_mask(mask), settings, need_weights=need_weights,
                             decode=kv_cache is not None)  # (B,H,L,D), (B,H,L,S) or None
        if kv_cache is not None:  # only now: a call that raised left the cache as it was
            kv_cache.store(k, v, owner=self, new=query.shape[1], keep=self.window_size[0])
        out = self.out_proj(_merge_heads(out))  # (B,H,L,D) -> (B,L,C) -> (B,L,C)
        return (out, scores) if need_weights else out

    def _positions(self, q, k, past: int):
        """位置编码的钩子：这里原样返回 q (B,H,L,D) 和 k (B,H_kv,S,D)；带 RoPE 的子类在这里旋转它们。"""
        return q, k

    def extra_repr(self) -> str:
        return _repr(self)


def count_parameters(module: nn.Module) -> int:
    """数一个模块里可训练参数的个数（所有参数张量的元素个数之和）。

    Args:
        module: any ``torch.nn.Module``.

    Returns:
        The number of trainable numbers (int).
    """
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


__all__ = ["MultiHeadAttention", "split_heads", "merge_heads", "count_parameters"]
