"""第 5、6 章（自注意力；第 6 章给它加上因果掩码）：同一个输入 x 乘三个不同的矩阵得到 Q、K、V，再做一次注意力（单头）。

    q = x W_q,  k = x W_k,  v = x W_v,  output = attention(q, k, v)

The three projections are what separates self-attention from the bare ``attention(x, x, x)``:
with ``W_q = W_k`` the score of token i for token j would always equal that of j for i;
three different matrices let "它 looks for 水" differ from "水 looks for 它".
There is no output projection here; ``attn_lib.layers.multihead.MultiHeadAttention`` adds one.

``forward`` checks its input once (``attn_lib.checks.layers.check_self_attention_call``, which
returns the call's settings), then runs the three projections below and hands q, k, v to
``attn_lib.layers.dispatch.attend``, which runs the attention on the layer's backend (one of
``attn_lib.BACKENDS``).
"""
from __future__ import annotations

import torch
from torch import nn

from ..checks.heads import check_self_attention_args
from ..checks.layers import check_matrices, check_self_attention_call
from ..device import triton_interprets
from ..rules.names import NO_WINDOW
from ..rules.settings import Options
from .dispatch import attend, layer_mask


class SelfAttention(nn.Module):
    """单头自注意力：x → 三个线性投影 → Q、K、V → attention。

    Args:
        d_model: size C of each input vector.
        d_k: size of each query and key vector (default: ``d_model``).
        d_v: size of each value vector, hence of the output (default: ``d_k``).
        bias: give the three projections a bias.
        is_causal: hide later positions from each query (see ``attn_lib.causal_mask``).
        window_size: None (default, no window) or ``(left, right)`` as in flash-attn: query i
            sees keys i - left .. i + right (-1 = unbounded); with ``is_causal`` right is 0 or -1.
        align: ``"top-left"`` or ``"bottom-right"``, as in ``attn_lib.attention`` (here L = S,
            so the two agree).
        backend: one of ``attn_lib.BACKENDS``: ``"auto"`` (default: the reference path when
            ``need_weights=True``, else torch's fused ``"sdpa"``), ``"reference"`` (always the
            reference path, the only one with scores), ``"sdpa"``, or the tiled FlashAttention
            paths ``"torch"`` / ``"triton"`` (key padding masks only, no scores).
        check_finite: scan each input for nan / inf and the result for overflow (default);
            ``False`` skips these checks and their host syncs on CUDA.

    Shapes: ``forward(x)`` takes x (B, L, C) and returns (B, L, d_v); with
    ``need_weights=True`` it returns ``(output, scores)`` with scores (B, L, L).
    """

    def __init__(self, d_model: int, d_k: int | None = None, d_v: int | None = None, *,
                 bias: bool = False, is_causal: bool = False, window_size=None, align: str = "top-left",
                 backend: str = "auto", check_finite: bool = True):
        super().__init__()
        check_self_attention_args(self, (d_model, d_k, d_v), bias,
                                  Options(is_causal=is_causal, window_size=window_size, align=align, backend=backend,
                                          check_finite=check_finite))  # sets d_model .. check_finite
        self.w_q = nn.Linear(self.d_model, self.d_k, bias=bias)  # (C) -> (d_k)
        self.w_k = nn.Linear(self.d_model, self.d_k, bias=bias)  # (C) -> (d_k)
        self.w_v = nn.Linear(self.d_model, self.d_v, bias=bias)  # (C) -> (d_v)

    @classmethod
    def from_matrices(cls, w_q, w_k, w_v, *, is_causal: bool = False) -> "SelfAttention":
        """用三个写成 ``x @ W`` 形式的矩阵造一个自注意力层（无偏置）。

        Args:
            w_q, w_k: (C, d_k) matrices, so that ``q = x @ w_q``.
            w_v: (C, d_v) matrix.
            is_causal: as in the constructor.

        Returns:
            A ``SelfAttention`` in ``w_q``'s dtype whose projections are exactly these matrices.
        """
        mats = [torch.as_tensor(w) for w in (w_q, w_k, w_v)]
        check_matrices(*mats)
        (C, d_k), (_, d_v) = mats[0].shape, mats[2].shape
        dtype = mats[0].dtype if mats[0].is_floating_point() else torch.float32
        layer = cls(C, d_k, d_v, bias=False, is_causal=is_causal).to(dtype)
        with torch.no_grad():
            for lin, w in zip((layer.w_q, layer.w_k, layer.w_v), mats):
                lin.weight.copy_(w.to(dtype).T)  # nn.Linear stores (out, in) = Wᵀ
        return layer

    def forward(self, x: torch.Tensor, *, mask=None, need_weights: bool = False):
        """对 x 做自注意力。

        Args:
            x: (B, L, C).
            mask: optional bool (True = may attend) or additive float mask: (L, L) for the
                whole batch, (B, L, L) per sequence, e.g. (B, 1, L) for key padding (the same
                meaning as in ``MultiHeadAttention``; 4-D (B, 1, L, L) also works).
            need_weights: also return the attention scores (backends "auto" and "reference").

        Returns:
            output (B, L, d_v), or ``(output, scores)`` with scores (B, L, L).
        """
        settings = check_self_attention_call(self, x, mask, need_weights, triton_interprets)
        q = self.w_q(x).unsqueeze(1)  # (B,L,C) -> (B,L,d_k) -> (B,1,L,d_k)
        k = self.w_k(x).unsqueeze(1)  # (B,L,C) -> (B,1,L,d_k)
        v = self.w_v(x).unsqueeze(1)  # (B,L,C) -> (B,1,L,d_v)
        out, scores = attend(q, k, v, layer_mask(mask), settings, need_weights=need_weights)  # (B,1,L,d_v), (B,1,L,L) or None
        out = out.squeeze(1)  # (B,1,L,d_v) -> (B,L,d_v)
        return (out, scores.squeeze(1)) if need_weights else out  # scores (B,1,L,L) -> (B,L,L)

    def extra_repr(self) -> str:
        window = f", window_size={self.window_size}" if self.window_size != NO_WINDOW else ""
        return (f"d_model={self.d_model}, d_k={self.d_k}, d_v={self.d_v}, is_causal={self.is_causal}{window}"
                + (f", backend={self.backend!r}" if self.backend != "auto" else ""))


__all__ = ["SelfAttention"]
