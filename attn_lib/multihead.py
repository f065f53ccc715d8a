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

Each forward checks its inputs once (``check_sequence_input``, ``layer_mask``) and then runs
unchecked code: the head split below and ``attn_lib.self_attention.attend`` (with
``need_weights=False`` torch's fused attention, tested against the reference).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._validate import check_bool, check_divisible, check_rank
from .self_attention import attend, check_backend, check_need_weights, check_sequence_input, layer_mask


def _check_tensor(x, layout: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor of shape {layout}, got {type(x).__name__}")


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """把 (B, L, C) 的最后一维切成 H 个头，返回 (B, H, L, D),D = C / H。

    Args:
        x: (B, L, C).
        num_heads: H; must divide C.

    Returns:
        A (B, H, L, D) view-based tensor: head h holds channels ``h*D .. (h+1)*D - 1``.
    """
    _check_tensor(x, "(B, L, C)")
    check_rank("x", x, 3, "(B, L, C)")
    B, L, C = x.shape
    check_divisible(C, num_heads)
    return _split_heads(x, int(num_heads))


def _split_heads(x: torch.Tensor, H: int) -> torch.Tensor:
    B, L, C = x.shape
    return x.view(B, L, H, C // H).transpose(1, 2)  # (B,L,C) -> (B,L,H,D) -> (B,H,L,D)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """split_heads 的逆操作：(B, H, L, D) → (B, L, C),C = H·D，头按顺序首尾相接。

    Args:
        x: (B, H, L, D).

    Returns:
        (B, L, H*D).
    """
    _check_tensor(x, "(B, H, L, D)")
    check_rank("x", x, 4, "(B, H, L, D)")
    return _merge_heads(x)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    B, H, L, D = x.shape
    return x.transpose(1, 2).reshape(B, L, H * D)  # (B,H,L,D) -> (B,L,H,D) -> (B,L,C)


def _checked_inputs(query, key, value, d_model: int, dtype: torch.dtype, check_finite: bool):
    """key and value default to query (self-attention); check each distinct tensor once, return (key, value)."""
    key = query if key is None else key
    value = key if value is None else value
    seen = []
    for name, t in (("query", query), ("key", key), ("value", value)):
        again = any(t is u for u in seen)  # self-attention: one tensor, scanned once
        check_sequence_input(name, t, d_model, dtype, check_finite and not again)
        seen.append(t)
    _check_key_value(query, key, value)
    return key, value


def _check_key_value(query, key, value) -> None:
    B, L, _ = query.shape
    if key.shape[0] != B or value.shape[0] != B:
        raise ValueError(
            f"query, key and value must have the same batch size B, got {query.shape[0]}, "
            f"{key.shape[0]} and {value.shape[0]}"
        )
    if key.shape[1] != value.shape[1]:
        raise ValueError(
            f"key and value must have the same length S (axis 1): key has S={key.shape[1]}, "
            f"value has S={value.shape[1]}. Each key needs exactly one value."
        )


def _use_kv_cache(cache, self_attention: bool, q, k, v, mask, is_causal: bool):
    """Append k, v to the cache; return all cached keys/values and the mask for the new queries."""
    from .kv_cache import KVCache

    if not isinstance(cache, KVCache):
        raise TypeError(f"kv_cache must be an attn_lib.KVCache or None, got {type(cache).__name__}")
    if not self_attention:
        raise ValueError("kv_cache works with self-attention only: leave key and value as None")
    k, v = cache.append(k, v)  # (B,H,S_past,D) + (B,H,S_new,D) -> (B,H,S_all,D)
    return k, v, cache.attention_mask(mask, q.shape[2], is_causal), False


def _layer_settings(layer, d_model, num_heads, bias, is_causal, backend, check_finite) -> tuple[int, int]:
    """两个多头类共用的构造参数检查：设好 head_dim、d_model、num_heads、is_causal、backend、check_finite。"""
    layer.head_dim = check_divisible(d_model, num_heads)
    layer.d_model, layer.num_heads = int(d_model), int(num_heads)
    check_bool("bias", bias)
    layer.is_causal = check_bool("is_causal", is_causal)
    layer.backend = check_backend(backend)
    layer.check_finite = check_bool("check_finite", check_finite)
    return layer.d_model, layer.num_heads


class MultiHeadAttention(nn.Module):
    """多头注意力（融合版）：一个 (3C, C) 的 QKV 投影 + H 个头并行 + 输出投影。

    Args:
        d_model: hidden size C（隐藏层维度）.
        num_heads: H; must divide ``d_model``（每个头的维度 D = C / H）.
        bias: give the QKV and output projections a bias.
        is_causal: hide later keys from each query (top-left aligned, ``attn_lib.causal_mask``);
            combined with any ``mask`` given to ``forward``.
        backend: ``"reference"`` (default: the scores are available with ``need_weights=True``;
            without them torch's fused attention computes the same output) or ``"flash"``
            (``attn_lib.flash_attention``; key padding masks only, no scores).
        check_finite: scan the inputs for nan / inf and the output for overflow (default);
            ``False`` skips these reductions (no host sync on CUDA).

    Parameters: ``qkv`` (nn.Linear C → 3C, rows ordered [W_q; W_k; W_v] as in
    ``torch.nn.MultiheadAttention.in_proj_weight``) and ``out_proj`` (nn.Linear C → C):
    4C² + 4C numbers with bias, whatever H is. No dropout.
    """

    def __init__(self, d_model: int, num_heads: int, *, bias: bool = True, is_causal: bool = False,
                 backend: str = "reference", check_finite: bool = True):
        super().__init__()
        d_model, num_heads = _layer_settings(self, d_model, num_heads, bias, is_causal, backend, check_finite)
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
            need_weights: also return every head's attention scores (not with backend "flash").
            kv_cache: optional ``attn_lib.KVCache`` (self-attention only): the new keys and
                values are appended to it and the queries attend over everything cached; with
                ``is_causal`` the queries are the last L positions (bottom-right aligned mask).
                ``mask`` then covers all S cached keys.

        Returns:
            output (B, L, C), or ``(output, scores)`` with scores (B, H, L, S).
        """
        check_need_weights(need_weights, self.backend)
        key, value = _checked_inputs(query, key, value, self.d_model, self.qkv.weight.dtype, self.check_finite)
        H = self.num_heads
        q, k, v = self._project(query, key, value)  # (B,L,C), (B,S,C), (B,S,C)
        q = _split_heads(q, H)  # (B,L,C) -> (B,H,L,D)
        k = _split_heads(k, H)  # (B,S,C) -> (B,H,S,D)
        v = _split_heads(v, H)  # (B,S,C) -> (B,H,S,D)
        is_causal = self.is_causal
        if kv_cache is not None:  # generation with a KV cache (chapter 10, attn_lib.kv_cache)
            k, v, mask, is_causal = _use_kv_cache(kv_cache, key is query and value is query, q, k, v, mask,
                                                    is_causal)  # (B,H,S_all,D), (B,H,S_all,D)
        mask = layer_mask(mask, query.shape[0], H, query.shape[1], k.shape[2], query.device,
                          check_finite=self.check_finite)  # None or broadcastable to (B,H,L,S)
        out, scores = attend(q, k, v, mask, is_causal=is_causal, need_weights=need_weights,
                             backend=self.backend, check_finite=self.check_finite)  # (B,H,L,D), (B,H,L,S) or None
        out = self.out_proj(_merge_heads(out))  # (B,H,L,D) -> (B,L,C) -> (B,L,C)
        return (out, scores) if need_weights else out

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"is_causal={self.is_causal}" + (f", backend={self.backend!r}" if self.backend != "reference" else ""))


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
                 backend: str = "reference", check_finite: bool = True):
        super().__init__()
        d_model, num_heads = _layer_settings(self, d_model, num_heads, bias, is_causal, backend, check_finite)
        D = self.head_dim
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
        check_need_weights(need_weights, self.backend)
        key, value = _checked_inputs(query, key, value, self.d_model, self.out_proj.weight.dtype, self.check_finite)
        if isinstance(mask, torch.Tensor) and mask.ndim == 4 and mask.shape[1] not in (1, self.num_heads):
            raise ValueError(f"mask has {mask.shape[1]} heads on axis 1, expected 1 or {self.num_heads}")
        mask = layer_mask(mask, query.shape[0], self.num_heads, query.shape[1], key.shape[1], query.device,
                          check_finite=self.check_finite)  # None or broadcastable to (B,H,L,S)
        if mask is not None and mask.ndim == 4 and mask.shape[1] > 1:
            head_masks = [mask[:, h:h + 1] for h in range(self.num_heads)]  # (B,H,L,S) -> H x (B,1,L,S)
        else:
            head_masks = [mask] * self.num_heads
        outs, all_scores = [], []
        for h in range(self.num_heads):
            q = self.w_q[h](query).unsqueeze(1)  # (B,L,C) -> (B,L,D) -> (B,1,L,D)
            k = self.w_k[h](key).unsqueeze(1)  # (B,S,C) -> (B,1,S,D)
            v = self.w_v[h](value).unsqueeze(1)  # (B,S,C) -> (B,1,S,D)
            out, scores = attend(q, k, v, head_masks[h], is_causal=self.is_causal, need_weights=need_weights,
                                 backend=self.backend, check_finite=self.check_finite)  # (B,1,L,D), (B,1,L,S)
            outs.append(out.squeeze(1))  # (B,L,D)
            all_scores.append(scores)  # (B,1,L,S) or None
        out = self.out_proj(torch.cat(outs, dim=-1))  # H x (B,L,D) -> (B,L,C) -> (B,L,C)
        if not need_weights:
            return out
        return out, torch.cat(all_scores, dim=1)  # H x (B,1,L,S) -> (B,H,L,S)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"is_causal={self.is_causal}" + (f", backend={self.backend!r}" if self.backend != "reference" else ""))


def count_parameters(module: nn.Module) -> int:
    """数一个模块里可训练参数的个数（所有参数张量的元素个数之和）。

    Args:
        module: any ``torch.nn.Module``.

    Returns:
        The number of trainable numbers (int).
    """
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


__all__ = ["MultiHeadAttention", "LoopedMultiHeadAttention", "split_heads", "merge_heads", "count_parameters"]
