"""第 8、9、12 章（分块 FlashAttention 的前向，纯 torch，任何设备）：一块查询配一块一块的键，从不存下整张 L×S 评分矩阵。

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
normalisation divides c out again). While the maximum score of every row of a query block
lies within ±60 (base 2) of 0 the reference is 0: ``p = exp2(qk)`` in place, nothing
subtracted, nothing rescaled; other scores of a row may lie far below -60 (their weights
underflow to 0, and the row's maximum keeps its sum away from 0). The first tile in which some
row's maximum leaves that range switches the block to the running maximum above
(``_tile_weights``); a row with no weight yet then starts from its own maximum. When
``scale·log2(e)·max|q|·max|k| <= 60`` (Cauchy–Schwarz) no score can leave the range, and the
tiles skip even the row maximum. Weights of up to 2^±60 are only safe while the values they
multiply keep their products in range: the reference 0 is used only when ``S·2^60·max|v|``
fits the working dtype and ``2^-60·min|v|`` stays a normal number (a value of 1e21 or 1e-29 in
float32 takes the running maximum from the first tile; ``_zero_ref_regime``).

Working in base 2 (``exp2`` with ``log2(e)`` multiplied into the scores) is the tutorial's
trick; on CPU torch's ``exp2`` is also about three times faster than ``exp``. The factor is
applied by the matrix product itself (``baddbmm``'s ``alpha``), not folded into Q first, so
a large ``scale`` with small ``q·k`` never overflows on the way.

CPU speed comes from doing every (B·H) head of a query block at once: the tile is
(B·H, BLOCK_M, BLOCK_N), the products are ``torch.baddbmm`` into preallocated buffers and the
softmax steps run in place, so Python iterates only ceil(L/BLOCK_M)·ceil(S/BLOCK_N) times.
The causal rule, a sliding window and the alignment form one band of diagonals
(``settings.band``, ``attn_lib.rules.band``): key blocks no query of the block may see are
skipped, so a window of w keys costs O(L·w), not O(L·S); within a block only the queries that
can see it are computed. With grouped-query attention (k, v with H_kv heads) the G = H / H_kv
query heads of a group are rows of one tile against their shared key/value head, which is
never repeated (``attn_lib.flash.tiles``). Extra memory is the tile plus O(L·D) statistics.

The backward is chapter 9's ``attn_lib.flash.tiled_backward``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..checks.doors import check_tiled_call
from ..rules.band import Band
from ..rules.names import NO_WINDOW
from ..rules.numerics import LN2, autocast_off
from ..rules.settings import AttentionSettings, Options, raise_if_overflowed
from .tiles import absent_keys, band_hidden, col_minus_row, group_rows

DEFAULT_BLOCK_M = 512
DEFAULT_BLOCK_N = 256
ZERO_REF_RANGE = 60.0  # |row maximum score| (base 2) below which exp2(score) needs no shift: 2^±60 and sums of them fit float32


def default_block_m(H: int, H_kv: int) -> int:
    """前向默认的查询块：一块评分 tile 总是 DEFAULT_BLOCK_M 行，GQA 时由一组的 G 个查询头分这些行。"""
    G = H // H_kv if H_kv else 1
    return max(DEFAULT_BLOCK_M // max(G, 1), 1)


@dataclass
class _Tiles:
    """一次调用里每块查询共用的东西（建一次）：键和值、两个缓冲区、缺席的键、j - i 网格、因子、带、每组头数、块大小、计数器、参考值的规则。"""

    Kt: torch.Tensor  # (B*H_kv, D, S)
    V: torch.Tensor  # (B*H_kv, S, Dv)
    qk_buf: torch.Tensor  # the one score tile
    acc_buf: torch.Tensor  # the one accumulator (a fresh one per block costs page faults on a CPU)
    absent: torch.Tensor | None  # (B*H_kv, 1, S), True = key absent
    grid: torch.Tensor  # (bm, bn): j - i of a tile
    factor: tuple  # base-2 factors (a, b)
    band: Band
    group: int  # G query heads per key/value head
    block_n: int
    counter: Any
    zero_ref: bool  # the values allow the reference 0
    bounded: bool  # Cauchy–Schwarz keeps every score within ±ZERO_REF_RANGE: no row maximum at all


@dataclass
class _BlockState:
    """一块查询走过键块时的状态：acc 里有没有值，参考值是否还是 0。"""

    started: bool = False
    zero_ref: bool = True


def flash_attention_torch(q, k, v, *, is_causal: bool = False, scale: float | None = None, key_mask=None,
                          block_m: int | None = None, block_n: int | None = None, counter=None, enable_gqa=False,
                          window_size=NO_WINDOW, align: str = "top-left"):
    """分块 FlashAttention 前向（纯 torch）：返回输出和每个查询的 log-sum-exp，不存整张评分矩阵。

    Same semantics as ``attn_lib.attention(q, k, v, is_causal=..., window_size=..., align=...,
    mask=key_mask[:, None, None, :])``.

    Args:
        q, k, v: queries (B, H, L, D), keys (B, H_kv, S, D), values (B, H_kv, S, Dv).
        is_causal, window_size, align, enable_gqa, scale: as in ``attn_lib.attention``; key
            blocks outside the band are skipped.
        key_mask: optional bool (B, S), True = key present (the opposite of
            ``torch.nn.MultiheadAttention``'s ``key_padding_mask``).
        block_m, block_n: queries / keys per block; ``None`` = 512 / G (``default_block_m``) / 256.
        counter: optional ``attn_lib.IOCounter`` (anything with ``load(name, n)`` and
            ``store(name, n)``): tallies the elements each block reads from and writes to
            slow memory, for comparison with ``attn_lib.costs.io_model.tiled_attention_io``.

    Returns:
        ``(out, lse)``: out (B, H, L, Dv) in q's dtype; lse (B, H, L) = log Σ_j exp(scale·q·k_j)
        over visible keys, float32 (float64 for float64 input). A query that sees no key gets
        a zero output and ``lse = -inf``. Forward only: to train, use ``attn_lib.flash_attention``.

    Raises:
        ValueError: a score overflows in the working dtype (float32, or float64); q, k or v
            requires grad while grad mode is on.
    """
    options = Options(is_causal=is_causal, scale=scale, window_size=window_size, align=align, enable_gqa=enable_gqa,
                      key_mask=key_mask, block_m=block_m, block_n=block_n)
    settings = check_tiled_call(q, k, v, options, counter)
    with autocast_off(q.device):
        out, lse = forward_core(q, k, v, settings, counter)  # (B,H,L,Dv), (B,H,L)
    if settings.check_overflow:
        raise_if_overflowed(lse, q.shape[2], k.shape[2], settings)
    return out, lse


def forward_core(q, k, v, settings: AttentionSettings, counter=None):
    """分块前向的无检查内核：返回 (out (B,H,L,Dv), lse (B,H,L))，不查溢出；k、v 可以只有 H_kv 个头。"""
    (B, H, L, D), (Hkv, S), Dv = q.shape, k.shape[1:3], v.shape[3]
    G, work, dev, BK = H // Hkv if Hkv else 1, settings.work_dtype, q.device, B * Hkv
    block_m = settings.block_m or default_block_m(H, Hkv)
    block_n = settings.block_n or DEFAULT_BLOCK_N
    bm_max, bn_max = min(block_m, max(L, 1)), min(block_n, max(S, 1))
    Q = group_rows(q.to(work), Hkv)  # (B,H,L,D) -> (B*H_kv,L*G,D)
    Kt = k.to(work).reshape(BK, S, D).transpose(1, 2)  # (B,H_kv,S,D) -> (B*H_kv,D,S)
    V = v.to(work).reshape(BK, S, Dv)  # (B,H_kv,S,Dv) -> (B*H_kv,S,Dv)
    # Written block by block straight into the (B, H, L) layout: no copy back from the grouped rows.
    out = torch.empty(BK, G, L, Dv, dtype=work, device=dev)  # (B*H_kv,G,L,Dv) = (B,H,L,Dv)
    lse = torch.empty(BK, G, L, dtype=work, device=dev)  # (B*H_kv,G,L) = (B,H,L)
    zero_ref, bounded = _zero_ref_regime(Q, Kt, V, settings.qk_scale, work)
    tiles = _Tiles(Kt=Kt, V=V, qk_buf=torch.empty(BK * bm_max * G * bn_max, dtype=work, device=dev),
                   acc_buf=torch.empty(BK * bm_max * G * Dv, dtype=work, device=dev),
                   absent=absent_keys(settings.key_mask, Hkv), grid=col_minus_row(bm_max, bn_max, dev),
                   factor=settings.qk_scale, band=settings.band, group=G, block_n=block_n, counter=counter,
                   zero_ref=zero_ref, bounded=bounded)
    for m0 in range(0, L, block_m):
        m1 = min(m0 + block_m, L)
        acc_i, m_i, l_i = _forward_query_block(Q[:, m0 * G:m1 * G], m0, tiles)  # (BK,bm*G,Dv), (BK,bm*G,1) x2
        # Normalise once per query block; rows that saw no key have l_i = 0 and acc = 0 -> output 0.
        bm = m1 - m0
        l_safe = torch.where(l_i > 0, l_i, torch.ones_like(l_i)).view(BK, bm, G, 1).transpose(1, 2)  # (BK,G,bm,1)
        torch.div(acc_i.view(BK, bm, G, Dv).transpose(1, 2), l_safe, out=out[:, :, m0:m1])  # (BK,G,bm,Dv)
        lse[:, :, m0:m1] = ((m_i + torch.log2(l_i)) * LN2).view(BK, bm, G).transpose(1, 2)  # (BK,bm*G,1) -> (BK,G,bm); l=0 -> -inf
        if counter is not None:
            counter.store("O", BK * G * bm * Dv)
            counter.store("lse", BK * G * bm)
    return out.view(B, H, L, Dv).to(q.dtype), lse.view(B, H, L)  # (B,H,L,Dv), (B,H,L)


def _zero_ref_regime(Q, Kt, V, factor, work) -> tuple[bool, bool]:
    """(may the reference be 0, can no score leave ±ZERO_REF_RANGE): one host sync for both.

    The reference 0 lets weights reach 2^±ZERO_REF_RANGE, so the values they multiply must keep
    ``S·2^R·max|v|`` below the dtype's largest number and ``2^-R·min|v|`` above its smallest normal
    one. The bound on the scores is Cauchy–Schwarz: |score| <= |a·b|·max‖q‖·max‖k‖.
    """
    if Q.numel() == 0 or Kt.numel() == 0:
        return True, True
    v_min, v_max = torch.aminmax(V.abs()) if V.numel() else (V.new_ones(()), V.new_ones(()))
    norms = torch.stack([torch.linalg.vector_norm(Q, dim=-1).amax(), torch.linalg.vector_norm(Kt, dim=1).amax(),
                         v_min, v_max])
    q_max, k_max, v_min, v_max = norms.double().tolist()
    info, span = torch.finfo(work), 2.0 ** ZERO_REF_RANGE
    zero_ref = v_max * Kt.shape[2] * span <= info.max and v_min / span >= info.tiny  # False for inf / nan
    return zero_ref, zero_ref and abs(factor[0] * factor[1]) * q_max * k_max <= ZERO_REF_RANGE


def _forward_query_block(Q_i, m0: int, tiles: _Tiles):
    """一块查询 Q_i（G 个头的行交错）对它看得见的每一块键：返回未归一化的 acc_i、参考值 m_i（以 2 为底）和指数和 l_i。

    ``exp2(score - m_i)`` are the weights, with ``m_i`` a per-row reference (base 2). While the
    maximum score of every row of the query block lies within ``±ZERO_REF_RANGE`` of 0 (and the
    values allow it) the reference stays 0 and a tile needs no shift at all (``_tile_weights``);
    otherwise it becomes the running row maximum.
    """
    BK, G, D = Q_i.shape[0], tiles.group, Q_i.shape[2]
    bm, (S, Dv), band = Q_i.shape[1] // G, (tiles.Kt.shape[2], tiles.V.shape[2]), tiles.band
    m_i = torch.zeros(BK, bm * G, 1, dtype=Q_i.dtype, device=Q_i.device)  # reference (base 2) per row
    l_i = torch.zeros(BK, bm * G, 1, dtype=Q_i.dtype, device=Q_i.device)  # running sum of exp2(score - m_i)
    acc_i = tiles.acc_buf[: BK * bm * G * Dv].view(BK, bm * G, Dv)  # running weighted sum of values
    state = _BlockState(zero_ref=tiles.zero_ref)
    if tiles.counter is not None:
        tiles.counter.load("Q", BK * bm * G * D)
    n_start, n_end = band.key_range(m0, m0 + bm, S)  # key blocks wholly outside the band are skipped
    for n0 in range(n_start, n_end, tiles.block_n):
        n1 = min(n0 + tiles.block_n, n_end)
        if tiles.counter is not None:
            _count_key_block(tiles.counter, BK, n1 - n0, (D, Dv), tiles.absent is not None)
        r0, r1 = band.query_range(n0, n1, m0 + bm)  # only the rows that see some key of the block
        r0, r1 = max(r0 - m0, 0) * G, max(r1 - m0, 0) * G
        if r1 <= r0:
            continue
        qk = tiles.qk_buf[: BK * (r1 - r0) * (n1 - n0)].view(BK, r1 - r0, n1 - n0)  # (BK,rows,bn) score tile
        torch.baddbmm(qk, Q_i[:, r0:r1], tiles.Kt[:, :, n0:n1], beta=0, alpha=tiles.factor[0], out=qk)  # (BK,rows,D) @ (BK,D,bn) -> (BK,rows,bn)
        if tiles.factor[1] != 1.0:  # scale·log2(e) does not fit the working dtype: second factor
            qk.mul_(tiles.factor[1])  # (BK,rows,bn)
        _mask_tile(qk, tiles, m0 + r0 // G, n0)
        p, alpha = _tile_weights(qk, m_i[:, r0:r1], l_i[:, r0:r1], state, tiles.bounded)  # (BK,rows,bn), (BK,rows,1) or None
        _accumulate(acc_i, p, tiles.V[:, n0:n1], alpha, (r0, r1, bm * G), state)
    return (acc_i if state.started else acc_i.zero_()), m_i, l_i


def _tile_weights(qk, m_old, l_old, state: _BlockState, bounded: bool):
    """评分块变成权重 exp2(score - m)（就地），并更新这些行的 m 和 l：返回 (p, alpha)，alpha 为 None 表示不必缩放。

    The fast case (every row's maximum within ``±ZERO_REF_RANGE`` of the reference 0, or a row
    with no visible key): ``exp2`` in place, nothing to subtract and nothing to rescale. Otherwise
    FlashAttention's update with the running maximum; a row that has no weight yet restarts from
    its own maximum (its reference 0 may lie far from its scores).
    """
    if bounded:  # Cauchy–Schwarz already keeps every score in range: not even a row maximum
        p = qk.exp2_()  # (BK,rows,bn), in place
        l_old.add_(p.sum(-1, keepdim=True))  # (BK,rows,1)
        return p, None
    r = qk.amax(-1, keepdim=True)  # (BK,rows,1)
    if state.zero_ref:
        finite = torch.where(torch.isneginf(r), 0.0, r)  # (BK,rows,1); a nan stays nan and fails the test
        if finite.numel() == 0 or bool(finite.abs().amax() <= ZERO_REF_RANGE):
            p = qk.exp2_()  # (BK,rows,bn), in place
            l_old.add_(p.sum(-1, keepdim=True))  # (BK,rows,1)
            return p, None
        state.zero_ref = False
    m_prev = torch.where(l_old > 0, m_old, float("-inf"))  # (BK,rows,1): rows without weight restart
    m_ij = torch.maximum(m_prev, r)  # (BK,rows,1)
    m_use = torch.where(torch.isneginf(m_ij), torch.zeros_like(m_ij), m_ij)  # rows that see nothing: shift by 0
    p = qk.sub_(m_use).exp2_()  # (BK,rows,bn), in place
    alpha = (m_prev - m_use).exp2_()  # (BK,rows,1)
    l_old.mul_(alpha).add_(p.sum(-1, keepdim=True))  # (BK,rows,1)
    m_old.copy_(m_use)
    return p, alpha


def _accumulate(acc_i, p, V_n, alpha, rows: tuple, state: _BlockState) -> None:
    """acc_i[r0:r1] = acc_i[r0:r1]·alpha + p V_n（rows = (r0, r1, rows_all)；alpha 为 None 时不缩放；第一块直接写入）。"""
    r0, r1, rows_all = rows
    if r1 - r0 == rows_all and not state.started:  # the first block: acc = P V, nothing to rescale or zero first
        torch.bmm(p, V_n, out=acc_i)  # (BK,rows,bn) @ (BK,bn,Dv) -> (BK,rows,Dv)
    elif r1 - r0 == rows_all:
        if alpha is not None:
            acc_i.mul_(alpha)  # (BK,rows,Dv)
        acc_i.baddbmm_(p, V_n)  # += (BK,rows,bn) @ (BK,bn,Dv) -> (BK,rows,Dv)
    else:  # a row slice is not one contiguous batch: baddbmm_ would fall back to one matmul per head
        if not state.started:
            acc_i.zero_()  # rows outside the slice must read 0 later
        part = acc_i[:, r0:r1]  # (BK,rows,Dv)
        if alpha is not None:
            part.mul_(alpha)
        part.add_(torch.bmm(p, V_n))  # (BK,rows,bn) @ (BK,bn,Dv) -> (BK,rows,Dv)
    state.started = True


def _mask_tile(qk, tiles: _Tiles, i0: int, n0: int) -> None:
    """把评分块里看不见的位置填成 -inf：带外的键（i0 = 块首行的查询号）和缺席的键。"""
    G = tiles.group
    BK, rows, bn = qk.shape[0], qk.shape[1] // G, qk.shape[2]
    hide = band_hidden(tiles.grid, i0, rows, n0, bn, tiles.band)  # None or (rows,bn)
    if hide is not None:
        # min(score, -inf / +inf): the same as masked_fill_ (also for a score that overflowed to +inf),
        # several times faster than masked_fill_ with a broadcast bool mask on a CPU.
        cap = torch.where(hide, float("-inf"), float("inf")).to(qk.dtype)  # (rows,bn)
        qk.view(BK, rows, G, bn).clamp_(max=cap[:, None, :])  # (BK,rows,G,bn) with (rows,1,bn)
    if tiles.absent is not None:
        qk.masked_fill_(tiles.absent[:, :, n0:n0 + bn], float("-inf"))  # (BK,rows*G,bn) with (BK,1,bn)


def _count_key_block(counter, BH: int, bn: int, head_dims: tuple, has_mask: bool) -> None:
    counter.load("K", BH * bn * head_dims[0])
    counter.load("V", BH * bn * head_dims[1])
    if has_mask:
        counter.load("mask", BH * bn)


__all__ = ["flash_attention_torch", "forward_core", "DEFAULT_BLOCK_M", "DEFAULT_BLOCK_N", "default_block_m"]
