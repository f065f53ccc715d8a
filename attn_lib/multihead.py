"""第 7、10 章（多头注意力）：每个头通过自己的投影看全部输入；投影之后的 C 维切成 H 段（每头 D = C / H），各算一遍注意力再拼回来。

    qkv = x W_qkv            one (B, L, C) @ (C, 3C) matrix multiplication, then split
    q, k, v -> (B, H, L, D)  split the last axis into H heads of D
    out = attention(q, k, v) per head, all heads in one call
    out -> (B, L, C) @ W_o   merge the heads, output projection

``MultiHeadAttention`` is the fused version: ONE (3C, C) parameter for the three
projections of all heads. ``LoopedMultiHeadAttention`` is the teaching version with H
separate small projections per head and a Python loop over heads; the two compute the same
thing（"矩阵内积再拼接等同于拼接矩阵再内积"），which tests/test_multihead.py asserts.
Both have 4C² + 4C parameters (with bias) for every H, the same as a single head of width C.

Each forward checks its inputs once, at the door (``attn_lib._validate.layers``), and then
runs unchecked code: the projections and the head split below, and
``attn_lib._dispatch.attend``, the attention on the layer's backend (``attn_lib.BACKENDS``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._dispatch import attend, layer_mask
from ._numerics import resolve_scale
from ._validate import check_divisible
from ._validate.layers import check_heads, check_layer_call, check_layer_settings, check_sequence_layout


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """把 (B, L, C) 的最后一维切成 H 个头，返回 (B, H, L, D)，D = C / H。

    Args:
        x: (B, L, C).
        num_heads: H; must divide C.

    Returns:
        A (B, H, L, D) view-based tensor: head h holds channels ``h*D .. (h+1)*D - 1``.
    """
    check_sequence_layout(x, 3, "(B, L, C)")
    check_divisible(x.shape[-1], num_heads)
    return _split_heads(x, int(num_heads))


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


def _settings(layer, d_model, num_heads, bias, is_causal, backend, check_finite) -> None:
    """两个多头类共用的构造参数检查：设好 head_dim、d_model、num_heads、is_causal、backend、check_finite。"""
    check_heads(layer, d_model, num_heads, even_head_dim=getattr(layer, "rotary", False))
    check_layer_settings(layer, bias, is_causal, backend, check_finite)


class MultiHeadAttention(nn.Module):
    """多头注意力（融合版）：一个 (3C, C) 的 QKV 投影 + H 个头并行 + 输出投影。

    Args:
        d_model: hidden size C（隐藏层维度）.
        num_heads: H; must divide ``d_model``（每个头的维度 D = C / H）.
        bias: give the QKV and output projections a bias.
        is_causal: hide later keys from each query (top-left aligned, ``attn_lib.causal_mask``);
            combined with any ``mask`` given to ``forward``.
        backend: one of ``attn_lib.BACKENDS``: ``"auto"`` (default: the reference path when
            ``need_weights=True``, else torch's fused ``"sdpa"``, which computes the same output),
            ``"reference"`` (always the reference path), ``"sdpa"``, or the tiled FlashAttention
            paths ``"torch"`` / ``"triton"`` (key padding masks only, no scores).
        check_finite: scan the inputs for nan / inf and the output for overflow (default);
            ``False`` skips these reductions (no host sync on CUDA).

    Parameters: ``qkv`` (nn.Linear C → 3C, rows ordered [W_q; W_k; W_v] as in
    ``torch.nn.MultiheadAttention.in_proj_weight``) and ``out_proj`` (nn.Linear C → C):
    4C² + 4C numbers with bias, whatever H is. No dropout.
    """

    rotary = False  # RotaryMultiHeadAttention (attn_lib.tiny_model) rotates q and k in `_positions`

    def __init__(self, d_model: int, num_heads: int, *, bias: bool = True, is_causal: bool = False,
                 backend: str = "auto", check_finite: bool = True):
        super().__init__()
        _settings(self, d_model, num_heads, bias, is_causal, backend, check_finite)
        d_model = self.d_model
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)  # (C) -> (3C) = [q | k | v]
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # (C) -> (C)

    def _project(self, query, key, value):
        """Q、K、V 投影：自注意力时一次矩阵乘法再切开；交叉注意力时用同一参数的三段分别乘。"""
        C = self.d_model
        if key is query and value is query:
            return self.qkv(query).split(C, dim=-1)  # (B,L,C) -> (B,L,3C) -> 3 x (B,L,C)
        w_q, w_k, w_v = self.qkv.weight.split(C, dim=0)  # (3C,C) -> 3 x (C,C)
        b = self.qkv.bias
        b_q, b_k, b_v = b.split(C) if b is not None else (None, None, None)  # (3C,) -> 3 x (C,)
        q = F.linear(query, w_q, b_q)  # (B,L,C) -> (B,L,C)
        if value is key:
            w_kv = self.qkv.weight[C:]  # (2C,C): keys and values from one input, one matmul
            b_kv = b[C:] if b is not None else None
            k, v = F.linear(key, w_kv, b_kv).split(C, dim=-1)  # (B,S,C) -> (B,S,2C) -> 2 x (B,S,C)
        else:
            k = F.linear(key, w_k, b_k)  # (B,S,C) -> (B,S,C)
            v = F.linear(value, w_v, b_v)  # (B,S,C) -> (B,S,C)
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
                layer): the queries attend over every cached key and their own, and the new keys
                and values are appended once the call succeeded (a failed call leaves the cache as
                it was). With ``is_causal`` the queries are the last L positions (bottom-right
                aligned), so decoding in any chunks equals one causal forward over the whole
                sequence; without it each call's queries see everything cached so far and their
                own block (the rows of a full forward over the sequence so far). ``mask`` then
                covers all S cached keys.

        Returns:
            output (B, L, C), or ``(output, scores)`` with scores (B, H, L, S).
        """
        key, value = check_layer_call(self, query, key, value, mask=mask, need_weights=need_weights,
                                      dtype=self.qkv.weight.dtype, kv_cache=kv_cache)
        H = self.num_heads
        q, k, v = self._project(query, key, value)  # (B,L,C), (B,S,C), (B,S,C)
        q = _split_heads(q, H)  # (B,L,C) -> (B,H,L,D)
        k = _split_heads(k, H)  # (B,S,C) -> (B,H,S,D)
        v = _split_heads(v, H)  # (B,S,C) -> (B,H,S,D)
        past = len(kv_cache) if kv_cache is not None else 0  # the new tokens sit at positions past ..
        q, k = self._positions(q, k, past)  # unchanged here; RoPE rotates them in attn_lib.tiny_model
        if kv_cache is not None:  # generation with a KV cache (chapter 10, attn_lib.kv_cache)
            k, v = kv_cache._joined(k, v)  # (B,H,past,D) + (B,H,S,D) -> (B,H,past+S,D), same for v
        out, scores = attend(q, k, v, layer_mask(mask), is_causal=self.is_causal, causal_offset=past,
                             scale=resolve_scale(None, self.head_dim), need_weights=need_weights,
                             backend=self.backend, check_finite=self.check_finite)  # (B,H,L,D), (B,H,L,S) or None
        if kv_cache is not None:
            kv_cache._store(k, v, owner=self)  # only now: a call that raised left the cache as it was
        out = self.out_proj(_merge_heads(out))  # (B,H,L,D) -> (B,L,C) -> (B,L,C)
        return (out, scores) if need_weights else out

    def _positions(self, q, k, past: int):
        """位置编码的钩子：这里原样返回 q (B,H,L,D) 和 k (B,H,S,D)；带 RoPE 的子类在这里旋转它们。"""
        return q, k

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"is_causal={self.is_causal}" + (f", backend={self.backend!r}" if self.backend != "auto" else ""))


class LoopedMultiHeadAttention(nn.Module):
    """多头注意力（教学版）：每个头各有三个小矩阵 (C → D)，用 Python 循环一个头一个头地算。

    Computes exactly what ``MultiHeadAttention`` computes, with H separate ``nn.Linear(C, D)``
    for each of q, k, v instead of one fused (3C, C) matrix. Slower (3H small matrix
    multiplications instead of one), same parameter count 4C² + 4C (with bias).

    Args:
        d_model: hidden size C.
        num_heads: H; must divide ``d_model``.
        bias: give the projections a bias.
        is_causal: hide later keys from each query.
        backend, check_finite: as in ``MultiHeadAttention``.
    """

    def __init__(self, d_model: int, num_heads: int, *, bias: bool = True, is_causal: bool = False,
                 backend: str = "auto", check_finite: bool = True):
        super().__init__()
        _settings(self, d_model, num_heads, bias, is_causal, backend, check_finite)
        d_model, D = self.d_model, self.head_dim
        self.w_q = nn.ModuleList(nn.Linear(d_model, D, bias=bias) for _ in range(num_heads))  # H x (C -> D)
        self.w_k = nn.ModuleList(nn.Linear(d_model, D, bias=bias) for _ in range(num_heads))  # H x (C -> D)
        self.w_v = nn.ModuleList(nn.Linear(d_model, D, bias=bias) for _ in range(num_heads))  # H x (C -> D)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # (C) -> (C)

    @classmethod
    def from_fused(cls, fused: MultiHeadAttention) -> "LoopedMultiHeadAttention":
        """从融合版复制参数：把 (3C, C) 的大矩阵按头切成 3H 个 (D, C) 的小矩阵。

        Args:
            fused: a ``MultiHeadAttention``.

        Returns:
            A ``LoopedMultiHeadAttention`` with the same C, H, bias, is_causal, dtype and
            weights, which computes the same output.
        """
        C, H, D = fused.d_model, fused.num_heads, fused.head_dim
        has_bias = fused.qkv.bias is not None
        looped = cls(C, H, bias=has_bias, is_causal=fused.is_causal, backend=fused.backend,
                     check_finite=fused.check_finite).to(fused.qkv.weight.dtype)
        with torch.no_grad():
            for part, heads in enumerate((looped.w_q, looped.w_k, looped.w_v)):
                for h, lin in enumerate(heads):
                    rows = slice(part * C + h * D, part * C + (h + 1) * D)  # head h of q / k / v
                    lin.weight.copy_(fused.qkv.weight[rows])  # (D,C)
                    if has_bias:
                        lin.bias.copy_(fused.qkv.bias[rows])  # (D,)
            looped.out_proj.load_state_dict(fused.out_proj.state_dict())
        return looped

    def forward(self, query, key=None, value=None, *, mask=None, need_weights: bool = False):
        """与 ``MultiHeadAttention.forward`` 相同的参数和返回值，只是一个头一个头地算。"""
        key, value = check_layer_call(self, query, key, value, mask=mask, need_weights=need_weights,
                                      dtype=self.out_proj.weight.dtype)
        mask = layer_mask(mask)  # None or 4-D, broadcastable to (B,H,L,S)
        if mask is not None and mask.shape[1] > 1:
            head_masks = [mask[:, h:h + 1] for h in range(self.num_heads)]  # (B,H,L,S) -> H x (B,1,L,S)
        else:
            head_masks = [mask] * self.num_heads
        scale = resolve_scale(None, self.head_dim)
        outs, all_scores = [], []
        for h in range(self.num_heads):
            q = self.w_q[h](query).unsqueeze(1)  # (B,L,C) -> (B,L,D) -> (B,1,L,D)
            k = self.w_k[h](key).unsqueeze(1)  # (B,S,C) -> (B,1,S,D)
            v = self.w_v[h](value).unsqueeze(1)  # (B,S,C) -> (B,1,S,D)
            out, scores = attend(q, k, v, head_masks[h], is_causal=self.is_causal, scale=scale, need_weights=need_weights,
                                 backend=self.backend, check_finite=self.check_finite)  # (B,1,L,D), (B,1,L,S)
            outs.append(out.squeeze(1))  # (B,L,D)
            all_scores.append(scores)  # (B,1,L,S) or None
        out = self.out_proj(torch.cat(outs, dim=-1))  # H x (B,L,D) -> (B,L,C) -> (B,L,C)
        if not need_weights:
            return out
        return out, torch.cat(all_scores, dim=1)  # H x (B,1,L,S) -> (B,H,L,S)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"is_causal={self.is_causal}" + (f", backend={self.backend!r}" if self.backend != "auto" else ""))


def count_parameters(module: nn.Module) -> int:
    """数一个模块里可训练参数的个数（所有参数张量的元素个数之和）。

    Args:
        module: any ``torch.nn.Module``.

    Returns:
        The number of trainable numbers (int).
    """
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


__all__ = ["MultiHeadAttention", "LoopedMultiHeadAttention", "split_heads", "merge_heads", "count_parameters"]
