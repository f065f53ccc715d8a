"""自注意力：同一个输入 x 乘三个不同的矩阵得到 Q、K、V，再做一次注意力（单头）。

    q = x W_q,  k = x W_k,  v = x W_v,  output = attention(q, k, v)

The three projections are what separates self-attention from the bare ``attention(x, x, x)``:
with ``W_q = W_k`` the score of token i for token j would always equal that of j for i;
three different matrices let "它 looks for 水" differ from "水 looks for 它".
There is no output projection here; ``attn_lib.multihead.MultiHeadAttention`` adds one.
"""
from __future__ import annotations

import torch
from torch import nn

from ._validate import all_finite, check_last_dim, check_positive_int, check_rank
from .reference import attention


def check_sequence_input(name: str, x, d_model: int, dtype: torch.dtype) -> None:
    """检查 (B, L, C) 形状的输入：是张量、是 3 维、最后一维等于 d_model、精度与参数相同。

    Args:
        name: the argument's name for the message, e.g. ``"query"``.
        x: (B, L, C) float tensor without nan / inf.
        d_model: the layer's C.
        dtype: the dtype of the layer's parameters.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (B, L, C), got {type(x).__name__}")
    check_rank(name, x, 3, "(B, L, C)")
    check_last_dim(name, x, d_model, "the layer's d_model")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}; convert with {name}.to({dtype})")
    if x.dtype != dtype:
        raise TypeError(
            f"{name} has dtype {x.dtype} but the layer's parameters are {dtype}; "
            f"convert one of them, e.g. layer.to({x.dtype}) or {name}.to({dtype})"
        )
    if x.numel() and not all_finite(x):
        raise ValueError(f"{name} contains nan or inf; the layer would turn it into nan. Check what produced it.")


class SelfAttention(nn.Module):
    """单头自注意力：x → 三个线性投影 → Q、K、V → attention。

    Args:
        d_model: size C of each input vector.
        d_k: size of each query and key vector (default: ``d_model``).
        d_v: size of each value vector, hence of the output (default: ``d_k``).
        bias: give the three projections a bias.
        is_causal: hide later positions from each query (see ``attn_lib.causal_mask``).

    Shapes: ``forward(x)`` takes x (B, L, C) and returns (B, L, d_v); with
    ``need_weights=True`` it returns ``(output, scores)`` with scores (B, L, L).
    """

    def __init__(self, d_model: int, d_k: int | None = None, d_v: int | None = None, *,
                 bias: bool = False, is_causal: bool = False):
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.d_k = check_positive_int("d_k", d_k if d_k is not None else d_model)
        self.d_v = check_positive_int("d_v", d_v if d_v is not None else self.d_k)
        self.is_causal = bool(is_causal)
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
        for name, w in zip(("w_q", "w_k", "w_v"), mats):
            check_rank(name, w, 2, "(C, d)")
        (C, d_k), (Ck, d_kk), (Cv, d_v) = (tuple(w.shape) for w in mats)
        if not C == Ck == Cv:
            raise ValueError(f"w_q, w_k, w_v must have the same number of rows C, got {C}, {Ck}, {Cv}")
        if d_k != d_kk:
            raise ValueError(f"w_q and w_k must have the same number of columns d_k, got {d_k} and {d_kk}")
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
            mask: optional bool (True = may attend) or additive float mask, broadcastable
                to (B, L, L) — e.g. (L, L), or (B, 1, L) for key padding.
            need_weights: also return the attention scores.

        Returns:
            output (B, L, d_v), or ``(output, scores)`` with scores (B, L, L).
        """
        check_sequence_input("x", x, self.d_model, self.w_q.weight.dtype)
        q = self.w_q(x).unsqueeze(1)  # (B,L,C) -> (B,L,d_k) -> (B,1,L,d_k)
        k = self.w_k(x).unsqueeze(1)  # (B,L,C) -> (B,1,L,d_k)
        v = self.w_v(x).unsqueeze(1)  # (B,L,C) -> (B,1,L,d_v)
        if mask is not None and isinstance(mask, torch.Tensor) and mask.ndim == 3:
            mask = mask.unsqueeze(1)  # (B,L,L) -> (B,1,L,L)
        out, scores = attention(q, k, v, mask=mask, is_causal=self.is_causal)  # (B,1,L,d_v), (B,1,L,L)
        out, scores = out.squeeze(1), scores.squeeze(1)  # (B,L,d_v), (B,L,L)
        return (out, scores) if need_weights else out

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_k={self.d_k}, d_v={self.d_v}, is_causal={self.is_causal}"


__all__ = ["SelfAttention", "check_sequence_input"]
