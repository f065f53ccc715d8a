"""第 7 章（多头注意力，教学版）：每个头各有自己的小投影矩阵，用 Python 循环一个头一个头地算。

``LoopedMultiHeadAttention`` computes exactly what ``attn_lib.layers.multihead.MultiHeadAttention``
computes (tests/layers/test_multihead_looped.py asserts it), with H separate ``nn.Linear(C, D)`` for the
queries and H_kv for the keys and for the values instead of one fused matrix. With
grouped-query attention (``num_kv_heads=H_kv``) the loop shows the sharing in plain sight:
query head h reads key/value head ``h // (H / H_kv)``. It lives beside ``multihead.py`` to keep
each module short; ``attn_lib.LoopedMultiHeadAttention`` is the same class.
"""
from __future__ import annotations

import torch
from torch import nn

from ..checks.layers import check_layer_call
from ..device import triton_interprets
from ..rules.settings import Options
from .dispatch import attend, layer_mask
from .kv_cache import KVCache
from .multihead import MultiHeadAttention, _repr, _settings


class LoopedMultiHeadAttention(nn.Module):
    """多头注意力（教学版）：每个头各有三个小矩阵 (C → D)，用 Python 循环一个头一个头地算。

    Computes exactly what ``MultiHeadAttention`` computes, with H separate ``nn.Linear(C, D)``
    for the queries and H_kv for each of k and v instead of one fused matrix. Slower (many
    small matrix multiplications instead of one), the same parameter count.

    Args:
        d_model: hidden size C.
        num_heads: H; must divide ``d_model``.
        num_kv_heads: H_kv key/value heads (None = H); query head h uses kv head h // (H / H_kv).
        window_size: None or ``(left, right)``, as in ``MultiHeadAttention``.
        bias: give the projections a bias.
        is_causal, align: hide later keys from each query, aligned as in ``MultiHeadAttention``.
        backend, check_finite: as in ``MultiHeadAttention``.
    """

    cache_type = KVCache  # no kv_cache here; the door reads the attribute all the same

    def __init__(self, d_model: int, num_heads: int, *, num_kv_heads: int | None = None, window_size=None,
                 bias: bool = True, is_causal: bool = False, align: str = "top-left", backend: str = "auto",
                 check_finite: bool = True):
        super().__init__()
        _settings(self, (d_model, num_heads, num_kv_heads), bias,
                  Options(is_causal=is_causal, window_size=window_size, align=align, backend=backend,
                          check_finite=check_finite))
        C, D, H_kv = self.d_model, self.head_dim, self.num_kv_heads
        self.w_q = nn.ModuleList(nn.Linear(C, D, bias=bias) for _ in range(num_heads))  # H x (C -> D)
        self.w_k = nn.ModuleList(nn.Linear(C, D, bias=bias) for _ in range(H_kv))  # H_kv x (C -> D)
        self.w_v = nn.ModuleList(nn.Linear(C, D, bias=bias) for _ in range(H_kv))  # H_kv x (C -> D)
        self.out_proj = nn.Linear(C, C, bias=bias)  # (C) -> (C)

    @classmethod
    def from_fused(cls, fused: MultiHeadAttention) -> "LoopedMultiHeadAttention":
        """从融合版复制参数：把 (C + 2·H_kv·D, C) 的大矩阵按头切成 H + 2·H_kv 个 (D, C) 的小矩阵。

        Args:
            fused: a ``MultiHeadAttention``.

        Returns:
            A ``LoopedMultiHeadAttention`` with the same C, H, H_kv, window, bias, is_causal,
            dtype and weights, which computes the same output.
        """
        C, D, H_kv = fused.d_model, fused.head_dim, fused.num_kv_heads
        has_bias = fused.qkv.bias is not None
        window = None if fused.window_size == (-1, -1) else fused.window_size
        looped = cls(C, fused.num_heads, num_kv_heads=H_kv, window_size=window, bias=has_bias,
                     is_causal=fused.is_causal, align=fused.align, backend=fused.backend,
                     check_finite=fused.check_finite).to(fused.qkv.weight.dtype)
        firsts = (0, C, C + H_kv * D)  # where the rows of q, k and v start in (C + 2·H_kv·D, C)
        with torch.no_grad():
            for first, heads in zip(firsts, (looped.w_q, looped.w_k, looped.w_v)):
                for h, lin in enumerate(heads):
                    rows = slice(first + h * D, first + (h + 1) * D)  # head h of q / k / v
                    lin.weight.copy_(fused.qkv.weight[rows])  # (D,C)
                    if has_bias:
                        lin.bias.copy_(fused.qkv.bias[rows])  # (D,)
            looped.out_proj.load_state_dict(fused.out_proj.state_dict())
        return looped

    def forward(self, query, key=None, value=None, *, mask=None, need_weights: bool = False):
        """与 ``MultiHeadAttention.forward`` 相同的参数和返回值，只是一个头一个头地算。"""
        key, value, settings = check_layer_call(self, query, key, value, mask, need_weights, None, triton_interprets)
        mask = layer_mask(mask)  # None or 4-D, broadcastable to (B,H,L,S)
        if mask is not None and mask.shape[1] > 1:
            head_masks = [mask[:, h:h + 1] for h in range(self.num_heads)]  # (B,H,L,S) -> H x (B,1,L,S)
        else:
            head_masks = [mask] * self.num_heads
        keys = [w(key).unsqueeze(1) for w in self.w_k]  # H_kv x (B,S,C) -> (B,S,D) -> (B,1,S,D)
        values = [w(value).unsqueeze(1) for w in self.w_v]  # H_kv x (B,1,S,D)
        group = self.num_heads // self.num_kv_heads  # query heads per key/value head
        outs, all_scores = [], []
        for h in range(self.num_heads):
            q = self.w_q[h](query).unsqueeze(1)  # (B,L,C) -> (B,L,D) -> (B,1,L,D)
            k, v = keys[h // group], values[h // group]  # the shared key/value head of query head h
            out, scores = attend(q, k, v, head_masks[h], settings, need_weights=need_weights)  # (B,1,L,D), (B,1,L,S)
            outs.append(out.squeeze(1))  # (B,L,D)
            all_scores.append(scores)  # (B,1,L,S) or None
        out = self.out_proj(torch.cat(outs, dim=-1))  # H x (B,L,D) -> (B,L,C) -> (B,L,C)
        if not need_weights:
            return out
        return out, torch.cat(all_scores, dim=1)  # H x (B,1,L,S) -> (B,H,L,S)

    def extra_repr(self) -> str:
        return _repr(self)


__all__ = ["LoopedMultiHeadAttention"]
