"""分块 FlashAttention 前向（纯 torch，任何设备）：一块查询配一块一块的键，在线 softmax，从不存下整张 L×S 分数矩阵。

The algorithm is FlashAttention-2's forward pass, written with the names of the Triton
fused-attention tutorial so the two read side by side (``attn_lib/flash_triton.py``):

    for each block of queries Q_i (BLOCK_M rows):            # outer loop: stays "on chip"
        m_i = -inf, l_i = 0, acc = 0
        for each block of keys/values K_j, V_j (BLOCK_N rows): # inner loop: streams from HBM
            qk   = Q_i K_jᵀ · scale · log2(e)                  # (BLOCK_M, BLOCK_N) tile
            m_ij = max(m_i, rowmax(qk))
            p    = exp2(qk - m_ij)
            alpha = exp2(m_i - m_ij)                           # rescales the old statistics
            l_i  = l_i · alpha + rowsum(p)
            acc  = acc · alpha + p V_j
            m_i  = m_ij
        O_i = acc / l_i,   lse_i = (m_i + log2 l_i) · ln 2

Working in base 2 (``exp2`` with ``log2(e)`` folded into the scale) is the tutorial's trick;
on CPU torch's ``exp2`` is also about three times faster than ``exp``.

CPU speed comes from doing every (B·H) head of a query block at once: the tile is
(B·H, BLOCK_M, BLOCK_N), the products are ``torch.bmm``/``baddbmm`` into preallocated
buffers and the softmax steps run in place, so Python iterates only
ceil(L/BLOCK_M)·ceil(S/BLOCK_N) times. With ``causal=True`` key blocks after the query block
are skipped, and within a block only the queries that can see the key block are computed.
Extra memory is the tile plus O(L·D) statistics: linear in the sequence length.
"""
from __future__ import annotations

import math

import torch

from ._validate import check_bool, check_positive_int
from .masks import causal_mask
from .reference import check_attention_inputs

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2): natural log = log2 * LN2

DEFAULT_BLOCK_M = 512
DEFAULT_BLOCK_N = 256


def check_key_padding_mask(key_padding_mask, B: int, S: int, device) -> None:
    """检查键填充掩码：必须是布尔张量，形状 (B, S),True = 这个键存在。

    Args:
        key_padding_mask: None or a bool tensor (B, S).
        B, S: batch size and number of keys of ``k``.
        device: the device of q.
    """
    if key_padding_mask is None:
        return
    if not isinstance(key_padding_mask, torch.Tensor):
        raise TypeError(f"key_padding_mask must be a torch.Tensor or None, got {type(key_padding_mask).__name__}")
    if key_padding_mask.dtype != torch.bool:
        raise TypeError(
            f"key_padding_mask must be bool (True = key present), got {key_padding_mask.dtype}; "
            "for a 0/1 tensor use key_padding_mask.bool()"
        )
    if tuple(key_padding_mask.shape) != (B, S):
        raise ValueError(
            f"key_padding_mask must have shape (B, S) = {(B, S)} (one flag per key of each sequence), "
            f"got {tuple(key_padding_mask.shape)}"
        )
    if str(key_padding_mask.device) != str(torch.device(device)):
        raise ValueError(f"key_padding_mask is on {key_padding_mask.device} but q is on {device}")


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def naive_attention(q, k, v, *, causal: bool = False, scale: float | None = None, key_padding_mask=None):
    """朴素注意力：整张 (B, H, L, S) 分数矩阵在输入精度下算出、存下、再乘 V（基准测试和误差规则的对照）。

    Written the way a model does it without a fused kernel (and the way flash-attn's tests
    build their low-precision baseline): ``q @ kᵀ`` in the input dtype, softmax in float32,
    the proportions rounded back to the input dtype, then ``@ v``. The full score matrix and
    the proportions both live in memory, which is what makes it quadratic.

    Args:
        q, k, v: (B, H, L, D), (B, H, S, D), (B, H, S, Dv).
        causal, scale, key_padding_mask: as in ``flash_attention_torch``.

    Returns:
        Output (B, H, L, Dv) in q's dtype; rows that see no key are zeros.
    """
    (B, H, L, S, D, Dv), scale = check_attention_inputs(q, k, v, None, scale)
    check_key_padding_mask(key_padding_mask, B, S, q.device)
    check_bool("causal", causal)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    scores = (q * scale) @ k.transpose(-2, -1)  # (B,H,L,D) @ (B,H,D,S) -> (B,H,L,S)
    if causal:
        scores.masked_fill_(~causal_mask(L, S, device=q.device), float("-inf"))  # (B,H,L,S)
    if key_padding_mask is not None:
        scores.masked_fill_(~key_padding_mask[:, None, None, :], float("-inf"))  # (B,H,L,S)
    probs = torch.softmax(scores, dim=-1, dtype=_work_dtype(q.dtype))  # (B,H,L,S) proportions
    if key_padding_mask is not None:
        probs = probs.nan_to_num_(0.0)  # a query whose keys are all absent: zeros, as attn_lib.softmax
    return probs.to(q.dtype) @ v  # (B,H,L,S) @ (B,H,S,Dv) -> (B,H,L,Dv)


def flash_attention_torch(q, k, v, *, causal: bool = False, scale: float | None = None, key_padding_mask=None,
                          block_m: int | None = None, block_n: int | None = None, counter=None):
    """分块 FlashAttention 前向（纯 torch）：返回输出和每个查询的 log-sum-exp，不存整张分数矩阵。

    Same semantics as ``attn_lib.attention(q, k, v, is_causal=causal, mask=...)`` with a key
    padding mask given as ``mask = key_padding_mask[:, None, None, :]``.

    Args:
        q: queries, shape (B, H, L, D).
        k: keys, shape (B, H, S, D).
        v: values, shape (B, H, S, Dv).
        causal: query i sees keys 0..i (top-left aligned, as ``attn_lib.causal_mask``).
        scale: multiplies ``q @ kᵀ``; default ``1 / sqrt(D)``.
        key_padding_mask: optional bool (B, S), True = key present.
        block_m: queries per block (BLOCK_M); ``None`` = 512.
        block_n: keys per block (BLOCK_N); ``None`` = 256.
        counter: optional ``attn_lib.io_model.IOCounter`` (anything with ``load(name, n)`` and
            ``store(name, n)``): tallies the elements each block reads from and writes to
            slow memory, for comparison with ``io_model.tiled_attention_io``.

    Returns:
        ``(out, lse)``: out (B, H, L, Dv) in q's dtype; lse (B, H, L) = log Σ_j exp(scale·q·k_j)
        over visible keys, float32 (float64 for float64 input). A query that sees no key gets
        a zero output and ``lse = -inf``. float16/bfloat16 are accumulated in float32.
    """
    (B, H, L, S, D, Dv), scale = check_attention_inputs(q, k, v, None, scale)
    check_key_padding_mask(key_padding_mask, B, S, q.device)
    block_m = DEFAULT_BLOCK_M if block_m is None else check_positive_int("block_m", block_m)
    block_n = DEFAULT_BLOCK_N if block_n is None else check_positive_int("block_n", block_n)
    check_bool("causal", causal)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    work = _work_dtype(q.dtype)
    BH = B * H
    bm_max, bn_max = min(block_m, max(L, 1)), min(block_n, max(S, 1))

    # Fold scale and log2(e) into Q once, so that exp2 of a score tile is exp of the scaled score.
    Q = (q.to(work) * (scale * LOG2E)).reshape(BH, L, D)  # (B,H,L,D) -> (BH,L,D)
    Kt = k.to(work).reshape(BH, S, D).transpose(1, 2)  # (B,H,S,D) -> (BH,D,S)
    V = v.to(work).reshape(BH, S, Dv)  # (B,H,S,Dv) -> (BH,S,Dv)
    out = torch.empty(BH, L, Dv, dtype=work, device=q.device)  # (BH,L,Dv)
    lse = torch.empty(BH, L, dtype=work, device=q.device)  # (BH,L)
    qk_buf = torch.empty(BH * bm_max * bn_max, dtype=work, device=q.device)  # the one score tile
    if key_padding_mask is not None:
        hidden = (~key_padding_mask).repeat_interleave(H, dim=0)[:, None, :]  # (B,S) -> (BH,1,S), True = absent
    # Diagonal tile of a causal block: row r may see columns 0..r.
    if causal:
        above_diag = torch.ones(bn_max, bn_max, dtype=torch.bool, device=q.device).triu(1)  # (BLOCK_N,BLOCK_N)

    for m0 in range(0, L, block_m):
        m1 = min(m0 + block_m, L)
        Q_i = Q[:, m0:m1]  # (BH,bm,D)
        bm = m1 - m0
        m_i = torch.full((BH, bm, 1), float("-inf"), dtype=work, device=q.device)  # running max (base 2)
        l_i = torch.zeros(BH, bm, 1, dtype=work, device=q.device)  # running sum of exp2
        acc_i = torch.zeros(BH, bm, Dv, dtype=work, device=q.device)  # running weighted sum of values
        if counter is not None:
            counter.load("Q", BH * bm * D)
        n_end = min(S, m1) if causal else S  # keys after the block's last query are invisible to all of it
        for n0 in range(0, n_end, block_n):
            n1 = min(n0 + block_n, n_end)
            bn = n1 - n0
            if counter is not None:
                counter.load("K", BH * bn * D)
                counter.load("V", BH * bn * Dv)
                if key_padding_mask is not None:
                    counter.load("mask", BH * bn)
            # Causal: queries before key n0 see nothing in this block; start at row r0.
            r0 = max(n0 - m0, 0) if causal else 0
            rows = bm - r0
            qk = qk_buf[: BH * rows * bn].view(BH, rows, bn)  # (BH,rows,bn) score tile
            torch.bmm(Q_i[:, r0:], Kt[:, :, n0:n1], out=qk)  # (BH,rows,D) @ (BH,D,bn) -> (BH,rows,bn)
            if causal and n1 > m0 + r0:
                # Rows whose query index is < n1 - 1 see only part of the block (the diagonal).
                diag = min(rows, n1 - 1 - (m0 + r0))  # rows that need the triangle
                off = (m0 + r0) - n0  # column offset of the first such row's diagonal
                qk[:, :diag].masked_fill_(above_diag[off:off + diag, :bn], float("-inf"))
            if key_padding_mask is not None:
                qk.masked_fill_(hidden[:, :, n0:n1], float("-inf"))  # (BH,rows,bn) with (BH,1,bn)
            m_old = m_i[:, r0:]  # (BH,rows,1)
            m_ij = torch.maximum(m_old, qk.amax(-1, keepdim=True))  # (BH,rows,1)
            if key_padding_mask is not None:  # rows that have seen no key yet keep m = -inf: shift by 0
                m_use = torch.where(torch.isneginf(m_ij), torch.zeros_like(m_ij), m_ij)
            else:
                m_use = m_ij
            p = qk.sub_(m_use).exp2_()  # (BH,rows,bn), in place
            alpha = (m_old - m_use).exp2_()  # (BH,rows,1)
            l_i[:, r0:].mul_(alpha).add_(p.sum(-1, keepdim=True))  # (BH,rows,1)
            if r0 == 0:
                acc_i.mul_(alpha).baddbmm_(p, V[:, n0:n1])  # += (BH,bm,bn) @ (BH,bn,Dv) -> (BH,bm,Dv)
            else:  # a row slice is not one contiguous batch: baddbmm_ would fall back to one matmul per head
                acc_i[:, r0:].mul_(alpha).add_(torch.bmm(p, V[:, n0:n1]))  # (BH,rows,bn) @ (BH,bn,Dv) -> (BH,rows,Dv)
            m_i[:, r0:] = m_ij
        # Normalise once per query block; rows that saw no key have l_i = 0 and acc = 0 -> output 0.
        seen = l_i > 0  # (BH,bm,1)
        torch.div(acc_i, torch.where(seen, l_i, torch.ones_like(l_i)), out=out[:, m0:m1])  # (BH,bm,Dv)
        lse[:, m0:m1] = ((m_i + torch.log2(l_i)) * LN2).squeeze(-1)  # (BH,bm,1) -> (BH,bm); l=0 -> -inf
        if counter is not None:
            counter.store("O", BH * bm * Dv)
            counter.store("lse", BH * bm)

    out = out.view(B, H, L, Dv).to(q.dtype)  # (BH,L,Dv) -> (B,H,L,Dv)
    lse = lse.view(B, H, L)  # (BH,L) -> (B,H,L)
    return out, lse


__all__ = ["flash_attention_torch", "naive_attention", "check_key_padding_mask", "DEFAULT_BLOCK_M", "DEFAULT_BLOCK_N"]
