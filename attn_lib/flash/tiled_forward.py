"""第 8 章（分块 FlashAttention 的前向，纯 torch，任何设备）：一块查询配一块一块的键，从不存下整张 L×S 分数矩阵。

The algorithm is FlashAttention-2's forward pass, written with the names of the Triton
fused-attention tutorial so the two read side by side (``attn_lib/flash/triton/forward.py``):

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

On CPU one pass over the tile is saved while the scores stay small: the weights only need
*some* per-row reference c with ``exp2(score - c)`` in range, not the exact maximum (the
normalisation divides c out again). While every score of a query block lies within ±60
(base 2) of 0 the reference is 0: ``p = exp2(qk)`` in place, nothing subtracted, nothing
rescaled. The first tile that leaves that range switches the block to the running maximum
above (``_tile_weights``); a row with no weight yet then starts from its own maximum. When
``scale·log2(e)·max|q|·max|k| <= 60`` (Cauchy–Schwarz) no score can leave the range, and the
tiles skip even the row maximum.

Working in base 2 (``exp2`` with ``log2(e)`` multiplied into the scores) is the tutorial's
trick; on CPU torch's ``exp2`` is also about three times faster than ``exp``. The factor is
applied by the matrix product itself (``baddbmm``'s ``alpha``), not folded into Q first, so
a large ``scale`` with small ``q·k`` never overflows on the way.

CPU speed comes from doing every (B·H) head of a query block at once: the tile is
(B·H, BLOCK_M, BLOCK_N), the products are ``torch.baddbmm`` into preallocated buffers and the
softmax steps run in place, so Python iterates only ceil(L/BLOCK_M)·ceil(S/BLOCK_N) times.
The causal rule and a sliding window (``window_size``) form one band of diagonals
(``attn_lib.rules.band``): key blocks no query of the block may see are skipped (``key_range``),
so a window of w keys costs O(L·w), not O(L·S); within a block only the queries that can see
it are computed. ``causal_offset`` moves the band: query i sees key j iff
``j <= i + causal_offset`` (0: top-left, ``S - L``: bottom-right, as in KV-cache decoding).
With grouped-query attention (k, v with H_kv heads) the G = H / H_kv query heads of a group
are rows of one tile against their shared key/value head, which is never repeated. Extra
memory is the tile plus O(L·D) statistics: linear in the length.

The backward is chapter 9's ``attn_lib.flash.tiled_backward``.
"""
from __future__ import annotations

import torch

from ..rules.band import NO_WINDOW, band, key_range, query_range
from ..rules.numerics import LN2, base2_factor, raise_if_overflowed, resolve_scale, work_dtype
from ..checks import (check_attention_inputs, check_block, check_bool, check_key_padding_mask, check_no_grad_needed,
                        check_window_size)

DEFAULT_BLOCK_M = 512
DEFAULT_BLOCK_N = 256


def default_block_m(H: int, H_kv: int) -> int:
    """前向默认的查询块：一块分数 tile 总是 DEFAULT_BLOCK_M 行，GQA 时由一组的 G 个查询头分这些行。

    With G = H / H_kv query heads per key/value head, a block of ``block_m`` queries is a tile
    of ``G·block_m`` rows; ``DEFAULT_BLOCK_M // G`` keeps the tile (and so the cache it needs)
    the size it has without sharing.
    """
    G = H // H_kv if H_kv else 1
    return max(DEFAULT_BLOCK_M // max(G, 1), 1)


def _group_rows(x, Hkv: int):
    """(B, H, L, X) -> (B·H_kv, L·G, X)：同一组 G 个查询头的同一个查询挨在一起，一块查询对一个键值头是连续的行。"""
    B, H, L, X = x.shape
    G = H // Hkv if Hkv else 1
    if G == 1:
        return x.reshape(B * H, L, X)  # (B,H,L,X) -> (BH,L,X)
    return x.reshape(B, Hkv, G, L, X).transpose(2, 3).reshape(B * Hkv, L * G, X)  # (B,H,L,X) -> (B*H_kv,L*G,X)


def _ungroup_rows(x, B: int, Hkv: int, G: int, L: int):
    """_group_rows 的逆：(B·H_kv, L·G, X) -> (B, H, L, X)（X 可省略：(B·H_kv, L·G) -> (B, H, L)）。"""
    squeeze = x.ndim == 2
    x = x.unsqueeze(-1) if squeeze else x  # (B*H_kv,L*G) -> (B*H_kv,L*G,1)
    X = x.shape[2]
    y = x.view(B, Hkv, L, G, X).transpose(2, 3).reshape(B, Hkv * G, L, X)  # (B*H_kv,L*G,X) -> (B,H,L,X)
    return y.squeeze(-1) if squeeze else y  # (B,H,L,1) -> (B,H,L)


def _forward_tiles(q, k, v, key_padding_mask, *, causal, scale, block_m, block_n, counter, causal_offset=0,
                   window_size=NO_WINDOW):
    """分块前向的主体（输入已检查过，scale 已是数）：返回 (out (B,H,L,Dv), lse (B,H,L))，不查溢出。

    k, v may have H_kv heads (H_kv divides H): each key/value head is read once per query
    block and serves its G = H / H_kv query heads as G·BLOCK_M rows of one tile.
    """
    (B, H, L, D), (Hkv, S), Dv = q.shape, k.shape[1:3], v.shape[3]
    G = H // Hkv if Hkv else 1
    work, dev, BK = work_dtype(q.dtype), q.device, B * Hkv
    bm_max, bn_max = min(block_m, max(L, 1)), min(block_n, max(S, 1))
    Q = _group_rows(q.to(work), Hkv)  # (B,H,L,D) -> (B*H_kv,L*G,D)
    Kt = k.to(work).reshape(BK, S, D).transpose(1, 2)  # (B,H_kv,S,D) -> (B*H_kv,D,S)
    V = v.to(work).reshape(BK, S, Dv)  # (B,H_kv,S,Dv) -> (B*H_kv,S,Dv)
    # Written block by block straight into the (B, H, L) layout: no copy back from the grouped rows.
    out = torch.empty(BK, G, L, Dv, dtype=work, device=dev)  # (B*H_kv,G,L,Dv) = (B,H,L,Dv)
    lse = torch.empty(BK, G, L, dtype=work, device=dev)  # (B*H_kv,G,L) = (B,H,L)
    tiles = dict(
        qk_buf=torch.empty(BK * bm_max * G * bn_max, dtype=work, device=dev),  # the one score tile
        # the one accumulator, reused by every query block (a fresh one per block costs page faults on a CPU)
        acc_buf=torch.empty(BK * bm_max * G * Dv, dtype=work, device=dev),
        hidden=None if key_padding_mask is None
        else (~key_padding_mask).repeat_interleave(Hkv, dim=0)[:, None, :],  # (B,S) -> (B*H_kv,1,S), True = absent
        # j - i for every position of a tile (row r, column c): c - r, shifted per tile
        col_minus_row=torch.arange(bn_max, device=dev)[None, :] - torch.arange(bm_max, device=dev)[:, None],  # (bm,bn)
        factor=base2_factor(scale, work), band=band(causal, window_size, causal_offset), group=G,
        block_n=block_n, counter=counter)
    tiles["bounded"] = _scores_bounded(Q, Kt, tiles["factor"])
    for m0 in range(0, L, block_m):
        m1 = min(m0 + block_m, L)
        acc_i, m_i, l_i = _forward_query_block(Q[:, m0 * G:m1 * G], Kt, V, m0, **tiles)  # (BK,bm*G,Dv), (BK,bm*G,1) x2
        # Normalise once per query block; rows that saw no key have l_i = 0 and acc = 0 -> output 0.
        bm = m1 - m0
        l_safe = torch.where(l_i > 0, l_i, torch.ones_like(l_i)).view(BK, bm, G, 1).transpose(1, 2)  # (BK,G,bm,1)
        torch.div(acc_i.view(BK, bm, G, Dv).transpose(1, 2), l_safe, out=out[:, :, m0:m1])  # (BK,G,bm,Dv)
        lse[:, :, m0:m1] = ((m_i + torch.log2(l_i)) * LN2).view(BK, bm, G).transpose(1, 2)  # (BK,bm*G,1) -> (BK,G,bm); l=0 -> -inf
        if counter is not None:
            counter.store("O", BK * G * (m1 - m0) * Dv)
            counter.store("lse", BK * G * (m1 - m0))
    return out.view(B, H, L, Dv).to(q.dtype), lse.view(B, H, L)  # (B,H,L,Dv), (B,H,L)


def _scores_bounded(Q, Kt, factor) -> bool:
    """|score| <= factor·max|q|·max|k| (Cauchy–Schwarz): whether that bound keeps every score within ±ZERO_REF_RANGE."""
    if Q.numel() == 0 or Kt.numel() == 0:
        return True
    norms = torch.stack([torch.linalg.vector_norm(Q, dim=-1).amax(), torch.linalg.vector_norm(Kt, dim=1).amax()])
    q_max, k_max = norms.double().tolist()  # one host sync per call
    return abs(factor[0] * factor[1]) * q_max * k_max <= ZERO_REF_RANGE  # False for inf / nan


def _forward_query_block(Q_i, Kt, V, m0, *, qk_buf, acc_buf, hidden, col_minus_row, factor, band, group, block_n,
                         counter, bounded):
    """一块查询 Q_i（G 个头的行交错）对它看得见的每一块键：返回未归一化的 acc_i、参考值 m_i（以 2 为底）和指数和 l_i。

    ``exp2(score - m_i)`` are the weights, with ``m_i`` a per-row reference (base 2). While every
    score of the query block lies within ``±ZERO_REF_RANGE`` of 0 the reference stays 0 and a tile
    needs no shift at all (``_tile_weights``); otherwise it becomes the running row maximum.
    """
    BK, G, D = Q_i.shape[0], group, Q_i.shape[2]
    bm, (S, Dv), (lo, hi) = Q_i.shape[1] // G, (Kt.shape[2], V.shape[2]), band
    m_i = torch.zeros(BK, bm * G, 1, dtype=Q_i.dtype, device=Q_i.device)  # reference (base 2) per row
    l_i = torch.zeros(BK, bm * G, 1, dtype=Q_i.dtype, device=Q_i.device)  # running sum of exp2(score - m_i)
    acc_i = acc_buf[: BK * bm * G * Dv].view(BK, bm * G, Dv)  # running weighted sum of values
    # acc_i holds values; m_i is still 0 everywhere; no score can leave ±ZERO_REF_RANGE (no row maximum needed)
    state = {"started": False, "zero_ref": True, "bounded": bounded}
    if counter is not None:
        counter.load("Q", BK * bm * G * D)
    n_start, n_end = key_range(m0, m0 + bm, S, lo, hi)  # key blocks wholly outside the band are skipped
    for n0 in range(n_start, n_end, block_n):
        n1 = min(n0 + block_n, n_end)
        if counter is not None:
            _count_key_block(counter, BK, n1 - n0, D, Dv, hidden is not None)
        r0, r1 = query_range(n0, n1, m0 + bm, lo, hi)  # only the rows that see some key of the block
        r0, r1 = max(r0 - m0, 0) * G, max(r1 - m0, 0) * G
        if r1 <= r0:
            continue
        qk = qk_buf[: BK * (r1 - r0) * (n1 - n0)].view(BK, r1 - r0, n1 - n0)  # (BK,rows,bn) score tile
        torch.baddbmm(qk, Q_i[:, r0:r1], Kt[:, :, n0:n1], beta=0, alpha=factor[0], out=qk)  # (BK,rows,D) @ (BK,D,bn) -> (BK,rows,bn)
        if factor[1] != 1.0:  # scale·log2(e) does not fit the working dtype: second factor
            qk.mul_(factor[1])  # (BK,rows,bn)
        _mask_tile(qk, hidden, col_minus_row, m0 + r0 // G, n0, n1, lo, hi, G)
        p, alpha = _tile_weights(qk, m_i[:, r0:r1], l_i[:, r0:r1], state)  # (BK,rows,bn), (BK,rows,1) or None
        _accumulate(acc_i, p, V[:, n0:n1], alpha, r0, r1, bm * G, state)
    return (acc_i if state["started"] else acc_i.zero_()), m_i, l_i


ZERO_REF_RANGE = 60.0  # |score| (base 2) below which exp2(score) needs no shift: 2^±60 and sums of them fit float32


def _tile_weights(qk, m_old, l_old, state):
    """分数块变成权重 exp2(score - m)（就地），并更新这些行的 m 和 l：返回 (p, alpha)，alpha 为 None 表示不必缩放。

    The fast case (every row's maximum within ``±ZERO_REF_RANGE`` of the reference 0, or a row
    with no visible key): ``exp2`` in place, nothing to subtract and nothing to rescale. Otherwise
    FlashAttention's update with the running maximum; a row that has no weight yet restarts from
    its own maximum (its reference 0 may lie far from its scores).
    """
    if state["bounded"]:  # Cauchy–Schwarz already keeps every score in range: not even a row maximum
        p = qk.exp2_()  # (BK,rows,bn), in place
        l_old.add_(p.sum(-1, keepdim=True))  # (BK,rows,1)
        return p, None
    r = qk.amax(-1, keepdim=True)  # (BK,rows,1)
    if state["zero_ref"]:
        finite = torch.where(torch.isneginf(r), 0.0, r)  # (BK,rows,1); a nan stays nan and fails the test
        if finite.numel() == 0 or bool(finite.abs().amax() <= ZERO_REF_RANGE):
            p = qk.exp2_()  # (BK,rows,bn), in place
            l_old.add_(p.sum(-1, keepdim=True))  # (BK,rows,1)
            return p, None
        state["zero_ref"] = False
    m_prev = torch.where(l_old > 0, m_old, float("-inf"))  # (BK,rows,1): rows without weight restart
    m_ij = torch.maximum(m_prev, r)  # (BK,rows,1)
    m_use = torch.where(torch.isneginf(m_ij), torch.zeros_like(m_ij), m_ij)  # rows that see nothing: shift by 0
    p = qk.sub_(m_use).exp2_()  # (BK,rows,bn), in place
    alpha = (m_prev - m_use).exp2_()  # (BK,rows,1)
    l_old.mul_(alpha).add_(p.sum(-1, keepdim=True))  # (BK,rows,1)
    m_old.copy_(m_use)
    return p, alpha


def _accumulate(acc_i, p, V_n, alpha, r0: int, r1: int, rows_all: int, state) -> None:
    """acc_i[r0:r1] = acc_i[r0:r1]·alpha + p V_n（alpha 为 None 时不缩放；第一块直接写入）。"""
    if r1 - r0 == rows_all and not state["started"]:  # the first block: acc = P V, nothing to rescale or zero first
        torch.bmm(p, V_n, out=acc_i)  # (BK,rows,bn) @ (BK,bn,Dv) -> (BK,rows,Dv)
    elif r1 - r0 == rows_all:
        if alpha is not None:
            acc_i.mul_(alpha)  # (BK,rows,Dv)
        acc_i.baddbmm_(p, V_n)  # += (BK,rows,bn) @ (BK,bn,Dv) -> (BK,rows,Dv)
    else:  # a row slice is not one contiguous batch: baddbmm_ would fall back to one matmul per head
        if not state["started"]:
            acc_i.zero_()  # rows outside the slice must read 0 later
        part = acc_i[:, r0:r1]  # (BK,rows,Dv)
        if alpha is not None:
            part.mul_(alpha)
        part.add_(torch.bmm(p, V_n))  # (BK,rows,bn) @ (BK,bn,Dv) -> (BK,rows,Dv)
    state["started"] = True


def _mask_tile(qk, hidden, col_minus_row, i0: int, n0: int, n1: int, lo, hi, G: int) -> None:
    """把分数块里看不见的位置填成 -inf：带外的键（i0 = 块首行的查询号，lo <= j - i <= hi）和缺席的键。"""
    BK, rows, bn = qk.shape[0], qk.shape[1] // G, qk.shape[2]
    cut_lo = lo is not None and n0 - (i0 + rows - 1) < lo  # some key of the tile lies left of the band
    cut_hi = hi is not None and (n1 - 1) - i0 > hi  # some key of the tile lies right of the band
    if cut_lo or cut_hi:
        d = col_minus_row[:rows, :bn] + (n0 - i0)  # (rows,bn): j - i
        hide = (d < lo) if cut_lo else None  # (rows,bn)
        if cut_hi:
            hide = (d > hi) if hide is None else hide | (d > hi)  # (rows,bn)
        # min(score, -inf / +inf): the same as masked_fill_ (also for a score that overflowed to +inf),
        # several times faster than masked_fill_ with a broadcast bool mask on a CPU.
        cap = torch.where(hide, float("-inf"), float("inf")).to(qk.dtype)  # (rows,bn)
        qk.view(BK, rows, G, bn).clamp_(max=cap[:, None, :])  # (BK,rows,G,bn) with (rows,1,bn)
    if hidden is not None:
        qk.masked_fill_(hidden[:, :, n0:n1], float("-inf"))  # (BK,rows*G,bn) with (BK,1,bn)


def _count_key_block(counter, BH: int, bn: int, D: int, Dv: int, has_mask: bool) -> None:
    counter.load("K", BH * bn * D)
    counter.load("V", BH * bn * Dv)
    if has_mask:
        counter.load("mask", BH * bn)


def flash_attention_torch(q, k, v, *, is_causal: bool = False, scale: float | None = None, key_padding_mask=None,
                          block_m: int | None = None, block_n: int | None = None, counter=None, enable_gqa=False,
                          window_size=NO_WINDOW):
    """分块 FlashAttention 前向（纯 torch）：返回输出和每个查询的 log-sum-exp，不存整张分数矩阵。

    Same semantics as ``attn_lib.attention(q, k, v, is_causal=is_causal, mask=...)`` with a
    key padding mask given as ``mask = key_padding_mask[:, None, None, :]``.

    Args:
        q, k, v: queries (B, H, L, D), keys (B, H_kv, S, D), values (B, H_kv, S, Dv).
        is_causal: query i sees keys 0..i (top-left aligned, as ``attn_lib.causal_mask``).
        scale: multiplies ``q @ kᵀ``; default ``1 / sqrt(D)``.
        key_padding_mask: optional bool (B, S), True = key present.
        block_m, block_n: queries / keys per block; ``None`` = 512 / G (``default_block_m``) / 256.
        enable_gqa: k, v have H_kv heads (H % H_kv == 0), as ``attn_lib.attention``; each
            key/value head is read in place, never repeated.
        window_size: ``(left, right)``, query i sees keys i - left .. i + right (-1: no
            limit), as ``attn_lib.attention``; key blocks outside the window are skipped.
        counter: optional ``attn_lib.costs.io_model.IOCounter`` (anything with ``load(name, n)`` and
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
    (B, H, L, S, D, Dv), scale = check_attention_inputs(q, k, v, None, scale, enable_gqa=enable_gqa)
    check_no_grad_needed("flash_attention_torch", q, k, v)
    check_key_padding_mask(key_padding_mask, B, S, q.device)
    block_m = check_block("block_m", block_m, power_of_two=False) or default_block_m(H, k.shape[1])
    block_n = check_block("block_n", block_n, power_of_two=False) or DEFAULT_BLOCK_N
    window_size = check_window_size(window_size, check_bool("is_causal", is_causal))
    out, lse = _forward_tiles(q, k, v, key_padding_mask, causal=is_causal, scale=resolve_scale(scale, D),
                              block_m=block_m, block_n=block_n, counter=counter, window_size=window_size)
    raise_if_overflowed(lse, L, S, key_padding_mask, is_causal, 0, q.dtype, window_size=window_size)
    return out, lse


__all__ = ["flash_attention_torch", "DEFAULT_BLOCK_M", "DEFAULT_BLOCK_N", "default_block_m"]
