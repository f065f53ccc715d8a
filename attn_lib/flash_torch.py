"""第 8 章（分块 FlashAttention 的前向，纯 torch，任何设备）：一块查询配一块一块的键，从不存下整张 L×S 分数矩阵。

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

Working in base 2 (``exp2`` with ``log2(e)`` multiplied into the scores) is the tutorial's
trick; on CPU torch's ``exp2`` is also about three times faster than ``exp``. The factor is
applied by the matrix product itself (``baddbmm``'s ``alpha``), not folded into Q first, so
a large ``scale`` with small ``q·k`` never overflows on the way.

CPU speed comes from doing every (B·H) head of a query block at once: the tile is
(B·H, BLOCK_M, BLOCK_N), the products are ``torch.baddbmm`` into preallocated buffers and the
softmax steps run in place, so Python iterates only ceil(L/BLOCK_M)·ceil(S/BLOCK_N) times.
With ``is_causal`` key blocks no query of the block may see are skipped, and within a block
only the queries that can see it are computed. ``causal_offset`` moves the diagonal: query i
sees key j iff ``j <= i + causal_offset`` (0: top-left, ``S - L``: bottom-right, as in
KV-cache decoding). Extra memory is the tile plus O(L·D) statistics: linear in the length.

The backward is chapter 9's ``attn_lib.flash_torch_backward``.
"""
from __future__ import annotations

import torch

from ._numerics import LN2, base2_factor, raise_if_overflowed, resolve_scale, work_dtype
from ._validate import check_attention_inputs, check_block, check_bool, check_key_padding_mask, check_no_grad_needed

DEFAULT_BLOCK_M = 512
DEFAULT_BLOCK_N = 256


def _forward_tiles(q, k, v, key_padding_mask, *, causal, scale, block_m, block_n, counter, causal_offset=0):
    """分块前向的主体（输入已检查过，scale 已是数）：返回 (out (B,H,L,Dv), lse (B,H,L))，不查溢出。"""
    (B, H, L, D), S, Dv = q.shape, k.shape[2], v.shape[3]
    work, dev, BH = work_dtype(q.dtype), q.device, B * H
    bm_max, bn_max = min(block_m, max(L, 1)), min(block_n, max(S, 1))
    Q = q.to(work).reshape(BH, L, D)  # (B,H,L,D) -> (BH,L,D)
    Kt = k.to(work).reshape(BH, S, D).transpose(1, 2)  # (B,H,S,D) -> (BH,D,S)
    V = v.to(work).reshape(BH, S, Dv)  # (B,H,S,Dv) -> (BH,S,Dv)
    out = torch.empty(BH, L, Dv, dtype=work, device=dev)  # (BH,L,Dv)
    lse = torch.empty(BH, L, dtype=work, device=dev)  # (BH,L)
    tiles = dict(
        qk_buf=torch.empty(BH * bm_max * bn_max, dtype=work, device=dev),  # the one score tile
        hidden=None if key_padding_mask is None
        else (~key_padding_mask).repeat_interleave(H, dim=0)[:, None, :],  # (B,S) -> (BH,1,S), True = absent
        # Diagonal tile of a causal block: row r may see columns 0..r.
        above_diag=torch.ones(bn_max, bn_max, dtype=torch.bool, device=dev).triu(1) if causal else None,
        factor=base2_factor(scale, work), causal=causal, offset=causal_offset, block_n=block_n, counter=counter)
    for m0 in range(0, L, block_m):
        m1 = min(m0 + block_m, L)
        acc_i, m_i, l_i = _forward_query_block(Q[:, m0:m1], Kt, V, m0, **tiles)  # (BH,bm,Dv), (BH,bm,1) x2
        # Normalise once per query block; rows that saw no key have l_i = 0 and acc = 0 -> output 0.
        seen = l_i > 0  # (BH,bm,1)
        torch.div(acc_i, torch.where(seen, l_i, torch.ones_like(l_i)), out=out[:, m0:m1])  # (BH,bm,Dv)
        lse[:, m0:m1] = ((m_i + torch.log2(l_i)) * LN2).squeeze(-1)  # (BH,bm,1) -> (BH,bm); l=0 -> -inf
        if counter is not None:
            counter.store("O", BH * (m1 - m0) * Dv)
            counter.store("lse", BH * (m1 - m0))
    return out.view(B, H, L, Dv).to(q.dtype), lse.view(B, H, L)  # (BH,L,Dv) -> (B,H,L,Dv), (BH,L) -> (B,H,L)


def _forward_query_block(Q_i, Kt, V, m0, *, qk_buf, hidden, above_diag, factor, causal, offset, block_n, counter):
    """一块查询 Q_i 对它看得见的每一块键：返回未归一化的 acc_i、行最大值 m_i（以 2 为底）和指数和 l_i。"""
    BH, bm, D = Q_i.shape
    S, Dv = Kt.shape[2], V.shape[2]
    m_i = torch.full((BH, bm, 1), float("-inf"), dtype=Q_i.dtype, device=Q_i.device)  # running max (base 2)
    l_i = torch.zeros(BH, bm, 1, dtype=Q_i.dtype, device=Q_i.device)  # running sum of exp2
    acc_i = torch.zeros(BH, bm, Dv, dtype=Q_i.dtype, device=Q_i.device)  # running weighted sum of values
    if counter is not None:
        counter.load("Q", BH * bm * D)
    # keys after the block's last query (+ offset) are invisible to all of it
    n_end = max(min(S, m0 + bm + offset), 0) if causal else S
    for n0 in range(0, n_end, block_n):
        n1 = min(n0 + block_n, n_end)
        if counter is not None:
            _count_key_block(counter, BH, n1 - n0, D, Dv, hidden is not None)
        # Causal: queries i with i + offset < n0 see nothing in this block; start at row r0.
        r0 = max(n0 - offset - m0, 0) if causal else 0
        qk = qk_buf[: BH * (bm - r0) * (n1 - n0)].view(BH, bm - r0, n1 - n0)  # (BH,rows,bn) score tile
        torch.baddbmm(qk, Q_i[:, r0:], Kt[:, :, n0:n1], beta=0, alpha=factor[0], out=qk)  # (BH,rows,D) @ (BH,D,bn) -> (BH,rows,bn)
        if factor[1] != 1.0:  # scale·log2(e) does not fit the working dtype: second factor
            qk.mul_(factor[1])  # (BH,rows,bn)
        _mask_tile(qk, hidden, above_diag, m0 + r0 + offset, n0, n1, causal)
        m_old = m_i[:, r0:]  # (BH,rows,1)
        m_ij = torch.maximum(m_old, qk.amax(-1, keepdim=True))  # (BH,rows,1)
        # rows that have seen no (finite) score yet keep m = -inf: shift by 0
        m_use = torch.where(torch.isneginf(m_ij), torch.zeros_like(m_ij), m_ij)  # (BH,rows,1)
        p = qk.sub_(m_use).exp2_()  # (BH,rows,bn), in place
        alpha = (m_old - m_use).exp2_()  # (BH,rows,1)
        l_i[:, r0:].mul_(alpha).add_(p.sum(-1, keepdim=True))  # (BH,rows,1)
        if r0 == 0:
            acc_i.mul_(alpha).baddbmm_(p, V[:, n0:n1])  # += (BH,bm,bn) @ (BH,bn,Dv) -> (BH,bm,Dv)
        else:  # a row slice is not one contiguous batch: baddbmm_ would fall back to one matmul per head
            acc_i[:, r0:].mul_(alpha).add_(torch.bmm(p, V[:, n0:n1]))  # (BH,rows,bn) @ (BH,bn,Dv) -> (BH,rows,Dv)
        m_i[:, r0:] = m_ij
    return acc_i, m_i, l_i


def _mask_tile(qk, hidden, above_diag, first_row_limit: int, n0: int, n1: int, causal: bool) -> None:
    """把分数块里看不见的位置填成 -inf：因果对角线（first_row_limit = 块首行的 i + offset）和缺席的键。"""
    rows, bn = qk.shape[1], qk.shape[2]
    if causal and n1 - 1 > first_row_limit:
        # Rows whose query index + offset is < n1 - 1 see only part of the block (the diagonal).
        diag = min(rows, n1 - 1 - first_row_limit)  # rows that need the triangle
        off = first_row_limit - n0  # column offset of the first such row's diagonal
        qk[:, :diag].masked_fill_(above_diag[off:off + diag, :bn], float("-inf"))  # (BH,diag,bn)
    if hidden is not None:
        qk.masked_fill_(hidden[:, :, n0:n1], float("-inf"))  # (BH,rows,bn) with (BH,1,bn)


def _count_key_block(counter, BH: int, bn: int, D: int, Dv: int, has_mask: bool) -> None:
    counter.load("K", BH * bn * D)
    counter.load("V", BH * bn * Dv)
    if has_mask:
        counter.load("mask", BH * bn)


def flash_attention_torch(q, k, v, *, is_causal: bool = False, scale: float | None = None, key_padding_mask=None,
                          block_m: int | None = None, block_n: int | None = None, counter=None):
    """分块 FlashAttention 前向（纯 torch）：返回输出和每个查询的 log-sum-exp，不存整张分数矩阵。

    Same semantics as ``attn_lib.attention(q, k, v, is_causal=is_causal, mask=...)`` with a
    key padding mask given as ``mask = key_padding_mask[:, None, None, :]``.

    Args:
        q, k, v: queries (B, H, L, D), keys (B, H, S, D), values (B, H, S, Dv).
        is_causal: query i sees keys 0..i (top-left aligned, as ``attn_lib.causal_mask``).
        scale: multiplies ``q @ kᵀ``; default ``1 / sqrt(D)``.
        key_padding_mask: optional bool (B, S), True = key present.
        block_m, block_n: queries / keys per block; ``None`` = 512 / 256.
        counter: optional ``attn_lib.io_model.IOCounter`` (anything with ``load(name, n)`` and
            ``store(name, n)``): tallies the elements each block reads from and writes to
            slow memory, for comparison with ``io_model.tiled_attention_io``.

    Returns:
        ``(out, lse)``: out (B, H, L, Dv) in q's dtype; lse (B, H, L) = log Σ_j exp(scale·q·k_j)
        over visible keys, float32 (float64 for float64 input). A query that sees no key gets
        a zero output and ``lse = -inf``. Forward only: to train, use ``attn_lib.flash_attention``.

    Raises:
        ValueError: a score overflows in the working dtype (float32, or float64); q, k or v
            requires grad while grad mode is on.
    """
    (B, H, L, S, D, Dv), scale = check_attention_inputs(q, k, v, None, scale)
    check_no_grad_needed("flash_attention_torch", q, k, v)
    check_key_padding_mask(key_padding_mask, B, S, q.device)
    block_m = check_block("block_m", block_m, power_of_two=False) or DEFAULT_BLOCK_M
    block_n = check_block("block_n", block_n, power_of_two=False) or DEFAULT_BLOCK_N
    check_bool("is_causal", is_causal)
    out, lse = _forward_tiles(q, k, v, key_padding_mask, causal=is_causal, scale=resolve_scale(scale, D),
                              block_m=block_m, block_n=block_n, counter=counter)
    raise_if_overflowed(lse, L, S, key_padding_mask, is_causal, 0, q.dtype)
    return out, lse


__all__ = ["flash_attention_torch", "DEFAULT_BLOCK_M", "DEFAULT_BLOCK_N"]
