"""第 5 章（自注意力）：同一个输入 x 乘三个不同的矩阵得到 Q、K、V，再做一次注意力（单头）。

    q = x W_q,  k = x W_k,  v = x W_v,  output = attention(q, k, v)

The three projections are what separates self-attention from the bare ``attention(x, x, x)``:
with ``W_q = W_k`` the score of token i for token j would always equal that of j for i;
three different matrices let "它 looks for 水" differ from "水 looks for 它".
There is no output projection here; ``attn_lib.multihead.MultiHeadAttention`` adds one.

The helpers below are shared with the multi-head layers (chapter 7): ``layer_mask`` gives a
mask one meaning in every layer (2-D (L, S) and 1-D (S,) for the whole batch, 3-D (B, L, S)
per sequence and shared by every head, 4-D (B, H, L, S) per head), and ``attend`` runs the
attention of a layer once its inputs are checked (no second check inside).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ._validate import (all_finite, check_bool, check_last_dim, check_mask_shape, check_positive_int, check_rank,
                        overflow_error)
from .masks import causal_mask
from .reference import _attention_core, check_mask

BACKENDS = ("reference", "flash")


def check_sequence_input(name: str, x, d_model: int, dtype: torch.dtype, check_finite: bool = True) -> None:
    """检查 (B, L, C) 形状的输入：是张量、是 3 维、最后一维等于 d_model、精度与参数相同。

    Args:
        name: the argument's name for the message, e.g. ``"query"``.
        x: (B, L, C) float tensor without nan / inf.
        d_model: the layer's C.
        dtype: the dtype of the layer's parameters.
        check_finite: also scan ``x`` for nan / inf (one reduction).
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
    if check_finite and x.numel() and not all_finite(x):
        raise ValueError(f"{name} contains nan or inf; the layer would turn it into nan. Check what produced it.")


def check_backend(backend) -> str:
    """检查层的 backend 参数："reference"（默认，可返回注意力分数）或 "flash"(attn_lib.flash_attention)。"""
    if not isinstance(backend, str):
        raise TypeError(f"backend must be one of {BACKENDS}, got {backend!r} ({type(backend).__name__})")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def layer_mask(mask, B: int, H: int, L: int, S: int, device, *, check_finite: bool = True):
    """把层的 mask 参数检查一遍并变成能广播到 (B, H, L, S) 的张量：3 维一律是 (B, L, S)，各头共用。

    Args:
        mask: None, or a bool / additive float tensor: (S,) or (L, S) for the whole batch,
            (B, L, S) one pattern per sequence shared by every head, (B, H, L, S) per head
            (any axis may be 1).
        B, H, L, S: the scores' sizes.
        device: the inputs' device.
        check_finite: also look for nan / +inf in a float mask.

    Returns:
        None, or the mask as a 4-D tensor that broadcasts to (B, H, L, S) with the meaning
        above ((B, L, S) -> (B, 1, L, S), (L, S) -> (1, 1, L, S), (S,) -> (1, 1, 1, S)).
    """
    if mask is None:
        return None
    if isinstance(mask, torch.Tensor) and mask.ndim == 3:
        if mask.dtype == torch.bool or mask.is_floating_point():
            try:
                check_mask_shape(mask, (B, L, S))
            except ValueError:
                raise ValueError(
                    f"a 3-D mask means (B, L, S) = {(B, L, S)} (one pattern per sequence, shared by every head; "
                    f"axes may be 1), got {tuple(mask.shape)}. For one mask per head pass 4-D (B, H, L, S) = "
                    f"{(B, H, L, S)}; for one pattern for the whole batch pass 2-D (L, S)."
                ) from None
        mask = mask.unsqueeze(1)  # (B,L,S) -> (B,1,L,S): the same for every head
    check_mask(mask, (B, H, L, S), device, check_finite=check_finite)
    return mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))  # -> 4-D, e.g. (L,S) -> (1,1,L,S)


def _key_padding(mask, B: int, S: int):
    """A layer mask as flash_attention's key_padding_mask (B, S), or a clear refusal."""
    if mask is None:
        return None
    m4 = mask  # 4-D from layer_mask, broadcastable to (B,H,L,S)
    if mask.dtype != torch.bool or m4.shape[1] != 1 or m4.shape[2] != 1:
        raise ValueError(
            f"backend='flash' takes only a key padding mask: bool, (B, 1, 1, S) or (B, 1, S) "
            f"(e.g. attn_lib.padding_mask(lengths)), got {mask.dtype} of shape {tuple(mask.shape)}. "
            "Use backend='reference' for other masks."
        )
    return m4[:, 0, 0, :].expand(B, S)  # (B or 1,S) -> (B,S)


def _may_overflow(q, k, scale: float) -> bool:
    """Whether some scale·q·k could leave the working dtype's range: |q·k| <= D·max|q|·max|k|."""
    work = q.dtype if q.dtype in (torch.float32, torch.float64) else torch.float32
    q_max, k_max = torch.stack([q.abs().amax(), k.abs().amax()]).double().tolist()  # one host sync
    return scale * q.shape[-1] * q_max * k_max >= torch.finfo(work).max


def attend(q, k, v, mask, *, is_causal: bool, need_weights: bool, backend: str, check_finite: bool):
    """层内部用的注意力（输入已检查过）：返回（输出 (B,H,L,Dv)，分数 (B,H,L,S) 或 None）。

    - ``need_weights=True``: ``attn_lib.reference``'s core, which also returns the scores;
    - ``need_weights=False``, backend "reference": torch's fused
      ``scaled_dot_product_attention`` with the library's conventions (mask and is_causal
      combined, rows that see no key give zeros), tested against the reference; it never
      stores the (L, S) scores. When ``D·max|q|·max|k|·scale`` could leave the dtype's range
      the reference core runs instead, so overflow raises exactly as in ``attention``;
    - backend "flash": ``attn_lib.flash_attention`` (key padding masks only).
    """
    B, H, L, D = q.shape
    S = k.shape[2]
    if backend == "flash":
        from .flash import flash_attention

        return flash_attention(q, k, v, is_causal=is_causal, key_padding_mask=_key_padding(mask, B, S)), None
    scale = 1.0 / math.sqrt(D)
    if need_weights or L == 0 or S == 0 or (check_finite and _may_overflow(q, k, scale)):
        return _attention_core(q, k, v, mask, is_causal, scale, check_overflow=check_finite)
    attn_mask = mask
    if attn_mask is not None and attn_mask.is_floating_point():
        attn_mask = attn_mask.to(q.dtype)
    if is_causal and attn_mask is not None:  # torch refuses mask + is_causal: combine them here
        keep = causal_mask(L, S, device=q.device)  # (L,S)
        attn_mask = attn_mask & keep if attn_mask.dtype == torch.bool else attn_mask.masked_fill(~keep, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale,
                                         is_causal=is_causal and attn_mask is None)  # (B,H,L,Dv)
    if attn_mask is not None:  # rows that see no key: zeros (torch leaves nan there)
        dead = ~attn_mask.any(-1, keepdim=True) if attn_mask.dtype == torch.bool else \
            torch.isneginf(attn_mask).all(-1, keepdim=True)  # (..,L or 1,1)
        if bool(dead.any()):
            out = out.masked_fill(dead, 0.0)  # (B,H,L,Dv)
    # An overflowing score makes its whole softmax row nan, and so every entry of that output
    # row: one entry per row tells (a strided read, not a scan of the output).
    if check_finite and out.numel() and bool(torch.isnan(out[..., 0]).any()):
        _attention_core(q, k, v, mask, is_causal, scale, check_overflow=True)  # raises if overflow is the cause
        raise overflow_error(q.dtype)
    return out, None


class SelfAttention(nn.Module):
    """单头自注意力：x → 三个线性投影 → Q、K、V → attention。

    Args:
        d_model: size C of each input vector.
        d_k: size of each query and key vector (default: ``d_model``).
        d_v: size of each value vector, hence of the output (default: ``d_k``).
        bias: give the three projections a bias.
        is_causal: hide later positions from each query (see ``attn_lib.causal_mask``).
        backend: ``"reference"`` (default; scores available with ``need_weights=True``) or
            ``"flash"`` (``attn_lib.flash_attention``: key padding masks only, no scores).
        check_finite: scan each input for nan / inf and the result for overflow (default);
            ``False`` skips these reductions (no host sync on CUDA).

    Shapes: ``forward(x)`` takes x (B, L, C) and returns (B, L, d_v); with
    ``need_weights=True`` it returns ``(output, scores)`` with scores (B, L, L).
    """

    def __init__(self, d_model: int, d_k: int | None = None, d_v: int | None = None, *,
                 bias: bool = False, is_causal: bool = False, backend: str = "reference", check_finite: bool = True):
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.d_k = check_positive_int("d_k", d_k if d_k is not None else d_model)
        self.d_v = check_positive_int("d_v", d_v if d_v is not None else self.d_k)
        check_bool("bias", bias)
        self.is_causal = check_bool("is_causal", is_causal)
        self.backend = check_backend(backend)
        self.check_finite = check_bool("check_finite", check_finite)
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
            mask: optional bool (True = may attend) or additive float mask: (L, L) for the
                whole batch, (B, L, L) per sequence, e.g. (B, 1, L) for key padding (the same
                meaning as in ``MultiHeadAttention``; 4-D (B, 1, L, L) also works).
            need_weights: also return the attention scores (not with backend "flash").

        Returns:
            output (B, L, d_v), or ``(output, scores)`` with scores (B, L, L).
        """
        check_need_weights(need_weights, self.backend)
        check_sequence_input("x", x, self.d_model, self.w_q.weight.dtype, self.check_finite)
        B, L, _ = x.shape
        mask = layer_mask(mask, B, 1, L, L, x.device, check_finite=self.check_finite)  # -> broadcasts to (B,1,L,L)
        q = self.w_q(x).unsqueeze(1)  # (B,L,C) -> (B,L,d_k) -> (B,1,L,d_k)
        k = self.w_k(x).unsqueeze(1)  # (B,L,C) -> (B,1,L,d_k)
        v = self.w_v(x).unsqueeze(1)  # (B,L,C) -> (B,1,L,d_v)
        out, scores = attend(q, k, v, mask, is_causal=self.is_causal, need_weights=need_weights,
                             backend=self.backend, check_finite=self.check_finite)  # (B,1,L,d_v), (B,1,L,L)
        out = out.squeeze(1)  # (B,1,L,d_v) -> (B,L,d_v)
        return (out, scores.squeeze(1)) if need_weights else out  # scores (B,1,L,L) -> (B,L,L)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_k={self.d_k}, d_v={self.d_v}, is_causal={self.is_causal}"
                + (f", backend={self.backend!r}" if self.backend != "reference" else ""))


def check_need_weights(need_weights, backend: str) -> None:
    """need_weights 必须是 True / False;flash 后端不存分数，要分数就报错并说明怎么办。"""
    check_bool("need_weights", need_weights)
    if need_weights and backend == "flash":
        raise ValueError(
            "need_weights=True needs the attention scores, which backend='flash' never stores; "
            "build the layer with backend='reference' (the default) to get them."
        )


__all__ = ["SelfAttention", "check_sequence_input", "layer_mask", "attend", "check_backend", "BACKENDS"]
