"""第 9 章（分块 FlashAttention 的反向，纯 torch，任何设备）：由保存的 log-sum-exp 一块块重算 P，求 dq、dk、dv，不存 L×S 矩阵。

FlashAttention-2's backward, named as in the paper and the Triton tutorial:
``_attn_bwd_preprocess`` computes D_i = rowsum(dO_i ∘ O_i), then for each key block
``_attn_bwd_dkdv`` recomputes P_ij = exp(S_ij − lse_i) from the saved log-sum-exp and
accumulates dV_j, dK_j (and dQ_i, which on a GPU is the separate ``_attn_bwd_dq`` pass)::

    dV_j += P_ijᵀ dO_i,  dP_ij = dO_i V_jᵀ,  dS_ij = P_ij ∘ (dP_ij − D_i),
    dQ_i += dS_ij K_j · scale,  dK_j += dS_ijᵀ Q_i · scale

With grouped-query attention the G query heads of a group are rows of one tile against their
shared key/value head, so ``dK_j += dS_ijᵀ Q_i`` sums over the group inside the product (no
repeated K or V). With a sliding window, query blocks outside the band of a key block are
skipped (``attn_lib.rules.band.query_range``): the cost is O(L·window).

The forward is chapter 8's ``attn_lib.flash.tiled_forward``; ``attn_lib.flash_attention`` joins the
two into one differentiable function.
"""
from __future__ import annotations

import torch

from ..rules.band import NO_WINDOW, band, key_range, query_range
from ..rules.numerics import LOG2E, base2_factor, resolve_scale, work_dtype
from ..checks import (check_attention_inputs, check_block, check_bool, check_key_padding_mask, check_saved,
                        check_window_size)
from .tiled_forward import _group_rows, _ungroup_rows

DEFAULT_BWD_BLOCK_M = 128  # backward: queries per block
DEFAULT_BWD_BLOCK_N = 256  # backward: keys per block


def _attn_bwd_preprocess(O, dO):
    """反向第 0 步：D_i = rowsum(dO_i ∘ O_i)，每个查询一个数，代替存下整张 P。

    ``D_i = Σ_j P_ij dP_ij`` because ``dP_ij = dO_i · v_j`` and ``O_i = Σ_j P_ij v_j``; one
    dot product per query instead of a row of L×S. O, dO: (BH, L, Dv); returns (BH, L, 1).
    """
    return (dO * O).sum(-1, keepdim=True)  # (BH,L,Dv) ∘ (BH,L,Dv) -> (BH,L,1)


def _attn_bwd_dkdv(Q_i, K_j, V_j, dO_i, neg_lse2_i, neg_delta_i, dK_j, dV_j, dQ_i, qk, dp, hide, factor):
    """反向的一个块对 (i, j)：重算 P_ij，累加 dV_j、dK_j，顺带把 dS_ij K_j 加进 dQ_i。

    FlashAttention-2 / the Triton tutorial split the backward into ``_attn_bwd_dkdv`` (fixed
    key block j, loop over query blocks i) and ``_attn_bwd_dq`` (fixed query block i), because
    on a GPU thousands of key blocks run at once and adding into one dQ_i from all of them
    would need atomics. On a CPU the loop runs in order, so ``dQ_i += dS_ij K_j`` is done here
    too and P_ij is recomputed once instead of twice: five matrix products per tile, not seven.

    All tensors are batched over the B·H heads (first axis). ``factor = (a, b)`` with
    ``a·b = scale·log2(e)`` and ``neg_lse2_i = −lse_i·log2(e)`` (BH, bm, 1), so
    ``exp2(Q_i K_jᵀ·a·b + neg_lse2_i) = P_ij``; ``neg_delta_i = −D_i`` (BH, bm, 1). Updates
    ``dK_j``, ``dV_j``, ``dQ_i`` in place without the scale (the caller multiplies once at
    the end). ``qk`` and ``dp`` are preallocated (BH, bm, bn) buffers; ``hide`` is None, a
    bool mask broadcastable to them (True = hidden) or a float cap (-inf hidden, +inf visible).
    """
    if factor[1] == 1.0:  # S_ij - lse_i in one call: the product added to -lse_i
        torch.baddbmm(neg_lse2_i.expand_as(qk), Q_i, K_j.transpose(1, 2), alpha=factor[0], out=qk)  # (BH,bm,D) @ (BH,D,bn) -> (BH,bm,bn)
    else:  # scale·log2(e) does not fit the working dtype: two factors, then -lse_i
        torch.baddbmm(qk, Q_i, K_j.transpose(1, 2), beta=0, alpha=factor[0], out=qk)  # (BH,bm,D) @ (BH,D,bn) -> (BH,bm,bn)
        qk.mul_(factor[1]).add_(neg_lse2_i)  # (BH,bm,bn)
    if hide is not None and hide.dtype == torch.bool:
        qk.masked_fill_(hide, float("-inf"))  # (BH,bm,bn)
    elif hide is not None:  # a float cap: -inf where hidden, +inf where visible
        qk.clamp_(max=hide)  # (BH,bm,bn)
    p = qk.exp2_()  # P_ij = exp(S_ij - lse_i), (BH,bm,bn), in place
    dV_j.baddbmm_(p.transpose(1, 2), dO_i)  # += (BH,bn,bm) @ (BH,bm,Dv) -> (BH,bn,Dv)
    torch.baddbmm(neg_delta_i.expand_as(dp), dO_i, V_j.transpose(1, 2), out=dp)  # dP_ij - D_i: (BH,bm,Dv) @ (BH,Dv,bn) -> (BH,bm,bn)
    ds = dp.mul_(p)  # dS_ij = P_ij ∘ (dP_ij - D_i), (BH,bm,bn), in place
    dK_j.baddbmm_(ds.transpose(1, 2), Q_i)  # += (BH,bn,bm) @ (BH,bm,D) -> (BH,bn,D)
    dQ_i.baddbmm_(ds, K_j)  # += (BH,bm,bn) @ (BH,bn,D) -> (BH,bm,D)


def _backward_tiles(q, k, v, out, lse, dout, key_padding_mask, *, causal, scale, block_m, block_n, causal_offset=0,
                    window_size=NO_WINDOW):
    """分块反向的主体（输入已检查过，scale 已是数）；因果规则和滑动窗口合成一条带（attn_lib.rules.band），k、v 可以只有 H_kv 个头。"""
    (B, H, L, D), (Hkv, S), Dv = q.shape, k.shape[1:3], v.shape[3]
    G = H // Hkv if Hkv else 1
    work, dev, BK = work_dtype(q.dtype), q.device, B * Hkv
    Q = _group_rows(q.to(work), Hkv)  # (B,H,L,D) -> (B*H_kv,L*G,D): a group's G heads interleaved
    K = k.to(work).reshape(BK, S, D)  # (B,H_kv,S,D) -> (B*H_kv,S,D)
    V = v.to(work).reshape(BK, S, Dv)  # (B,H_kv,S,Dv) -> (B*H_kv,S,Dv)
    dO = _group_rows(dout.to(work), Hkv)  # (B,H,L,Dv) -> (B*H_kv,L*G,Dv) (copies an expanded dout)
    neg_delta = _attn_bwd_preprocess(_group_rows(out.to(work), Hkv), dO).neg_()  # (B*H_kv,L*G,Dv) -> (BK,L*G,1), -D
    neg_lse2 = _group_rows((lse.to(work) * -LOG2E)[..., None], Hkv)  # (B,H,L) -> (B*H_kv,L*G,1), -lse in base 2
    # A row that sees no key: lse = -inf. Adding -inf instead of +inf makes its P row exactly 0.
    neg_lse2 = torch.where(torch.isposinf(neg_lse2), torch.full_like(neg_lse2, float("-inf")), neg_lse2)  # (BK,L*G,1)
    dK = torch.zeros(BK, S, D, dtype=work, device=dev)  # (B*H_kv,S,D): summed over the group
    dV = torch.zeros(BK, S, Dv, dtype=work, device=dev)  # (B*H_kv,S,Dv)
    # One contiguous accumulator per query block, so that baddbmm_ writes one batch of matrices.
    m_starts = list(range(0, L, block_m))
    dQ_blocks = [torch.zeros(BK, min(block_m, L - m0) * G, D, dtype=work, device=dev) for m0 in m_starts]  # (BK,bm*G,D)
    bm_max, bn_max = min(block_m, max(L, 1)), min(block_n, max(S, 1))
    lo, hi = band(causal, window_size, causal_offset)
    ctx = dict(Q=Q, dO=dO, neg_lse2=neg_lse2, neg_delta=neg_delta, dQ_blocks=dQ_blocks, m_starts=m_starts,
               block_m=block_m, band=(lo, hi), group=G, L=L, factor=base2_factor(scale, work),
               qk_buf=torch.empty(BK * bm_max * G * bn_max, dtype=work, device=dev),  # score / P tile
               dp_buf=torch.empty(BK * bm_max * G * bn_max, dtype=work, device=dev),  # dP / dS tile
               hidden=None if key_padding_mask is None
               else (~key_padding_mask).repeat_interleave(Hkv, dim=0)[:, None, :],  # (B,S) -> (B*H_kv,1,S), True = absent
               # j - i for every position of a tile (row r, column c): c - r, shifted per tile
               col_minus_row=torch.arange(bn_max, device=dev)[None, :] - torch.arange(bm_max, device=dev)[:, None])
    n_start, n_end = key_range(0, L, S, lo, hi)  # keys no query sees get zero gradients
    for n0 in range(n_start, n_end, block_n):
        n1 = min(n0 + block_n, n_end)
        dK[:, n0:n1], dV[:, n0:n1] = _backward_key_block(K[:, n0:n1], V[:, n0:n1], n0, **ctx)  # (BK,bn,D), (BK,bn,Dv)
    dQ = torch.cat(dQ_blocks, dim=1) if dQ_blocks else torch.zeros(BK, L * G, D, dtype=work, device=dev)  # (BK,L*G,D)
    dq = _ungroup_rows(dQ * scale, B, Hkv, G, L).to(q.dtype)  # (B*H_kv,L*G,D) -> (B,H,L,D)
    dk = (dK * scale).view(B, Hkv, S, D).to(k.dtype)  # (B*H_kv,S,D) -> (B,H_kv,S,D)
    dv = dV.view(B, Hkv, S, Dv).to(v.dtype)  # (B*H_kv,S,Dv) -> (B,H_kv,S,Dv)
    return dq, dk, dv


def _backward_key_block(K_j, V_j, n0, *, Q, dO, neg_lse2, neg_delta, dQ_blocks, m_starts, block_m, band, group, L,
                        factor, qk_buf, dp_buf, hidden, col_minus_row):
    """一块键 K_j、V_j：让看得见它的每一块查询（带内的）流过，返回这块的 (dK_j, dV_j)（未乘 scale，已对组内各头求和）。"""
    BK, bn, D = K_j.shape
    G, (lo, hi), n1 = group, band, n0 + bn
    dK_j = torch.zeros(BK, bn, D, dtype=K_j.dtype, device=K_j.device)  # (BK,bn,D)
    dV_j = torch.zeros(BK, bn, V_j.shape[2], dtype=K_j.dtype, device=K_j.device)  # (BK,bn,Dv)
    m_start, m_end = query_range(n0, n1, L, lo, hi)  # query blocks wholly outside the band see none of K_j
    for i in range(m_start // block_m, -(-m_end // block_m)):
        m0 = m_starts[i]
        m1 = min(m0 + block_m, L)
        bm = m1 - m0
        hide = None if hidden is None else hidden[:, :, n0:n1]  # (BK,1,bn)
        band_hide = _band_hide(col_minus_row, m0, bm, n0, bn, lo, hi)  # None or (bm,bn)
        if band_hide is not None:
            band_hide = band_hide.repeat_interleave(G, dim=0) if G > 1 else band_hide  # (bm,bn) -> (bm*G,bn)
            if hide is None:  # a float cap: min(score, -inf / +inf) is masked_fill_, several times faster on a CPU
                hide = torch.where(band_hide, float("-inf"), float("inf")).to(qk_buf.dtype)  # (bm*G,bn)
            else:
                hide = hide | band_hide  # (BK,bm*G,bn)
        _attn_bwd_dkdv(Q[:, m0 * G:m1 * G], K_j, V_j, dO[:, m0 * G:m1 * G], neg_lse2[:, m0 * G:m1 * G],
                       neg_delta[:, m0 * G:m1 * G], dK_j, dV_j, dQ_blocks[i],
                       qk_buf[: BK * bm * G * bn].view(BK, bm * G, bn), dp_buf[: BK * bm * G * bn].view(BK, bm * G, bn),
                       hide, factor)
    return dK_j, dV_j


def _band_hide(col_minus_row, m0: int, bm: int, n0: int, bn: int, lo, hi):
    """一个 (bm, bn) 块里带外的位置（True = 看不见）；整块都在带内时返回 None。"""
    cut_lo = lo is not None and n0 - (m0 + bm - 1) < lo
    cut_hi = hi is not None and (n0 + bn - 1) - m0 > hi
    if not (cut_lo or cut_hi):
        return None
    d = col_minus_row[:bm, :bn] + (n0 - m0)  # (bm,bn): j - i
    if cut_lo and cut_hi:
        return (d < lo) | (d > hi)  # (bm,bn)
    return (d < lo) if cut_lo else (d > hi)  # (bm,bn)


@torch.no_grad()
def flash_attention_torch_backward(q, k, v, out, lse, dout, *, is_causal: bool = False, scale: float | None = None,
                                   key_padding_mask=None, block_m: int | None = None, block_n: int | None = None,
                                   enable_gqa=False, window_size=NO_WINDOW):
    """分块 FlashAttention-2 反向（纯 torch）：由 q、k、v、输出和 lse 重算 P，算出 dq、dk、dv，不存 L×S 矩阵。

    The backward of ``flash_attention_torch``: for each key block K_j, V_j and each query
    block Q_i that can see it, recompute ``P_ij = exp(S_ij − lse_i)`` from the saved
    log-sum-exp (see the module docstring for the formulas). With ``is_causal`` query blocks
    entirely before a key block are skipped. A query that sees no key (``lse = -inf``) gets
    zero gradients. Any device; float64 stays float64 (``torch.autograd.gradcheck`` runs on
    it), other dtypes are computed in float32. Extra memory: two (B·H, BLOCK_M, BLOCK_N) tiles
    and O((L + S)·D) accumulators.

    Args:
        q, k, v: (B, H, L, D), (B, H_kv, S, D), (B, H_kv, S, Dv), the forward's inputs.
        out: the forward's output (B, H, L, Dv).
        lse: the forward's log-sum-exp (B, H, L), natural log, ``-inf`` for rows that see no key.
        dout: gradient of the loss with respect to ``out``, (B, H, L, Dv).
        is_causal, scale, key_padding_mask, enable_gqa, window_size: as in the forward. With
            a window, query blocks outside it are skipped for each key block.
        block_m, block_n: queries / keys per block; ``None`` = 128 / 256.

    Returns:
        ``(dq, dk, dv)`` with the shapes and dtypes of q, k, v (dk, dv with H_kv heads,
        summed over the query heads of each group). Computed without building a
        graph (no gradients of gradients).
    """
    (B, H, L, S, D, Dv), scale = check_attention_inputs(q, k, v, None, scale, enable_gqa=enable_gqa)
    check_key_padding_mask(key_padding_mask, B, S, q.device)
    window_size = check_window_size(window_size, check_bool("is_causal", is_causal))
    check_saved(q, out, lse, dout, B, H, L, Dv, forward="flash_attention_torch")
    block_m = check_block("block_m", block_m, power_of_two=False) or DEFAULT_BWD_BLOCK_M
    block_n = check_block("block_n", block_n, power_of_two=False) or DEFAULT_BWD_BLOCK_N
    return _backward_tiles(q, k, v, out, lse, dout, key_padding_mask, causal=is_causal, scale=resolve_scale(scale, D),
                           block_m=block_m, block_n=block_n, window_size=window_size)


__all__ = ["flash_attention_torch_backward", "DEFAULT_BWD_BLOCK_M", "DEFAULT_BWD_BLOCK_N"]
