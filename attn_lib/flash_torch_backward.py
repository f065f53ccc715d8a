"""第 9 章（分块 FlashAttention 的反向，纯 torch，任何设备）：由保存的 log-sum-exp 一块块重算 P，求 dq、dk、dv，不存 L×S 矩阵。

FlashAttention-2's backward, named as in the paper and the Triton tutorial:
``_attn_bwd_preprocess`` computes D_i = rowsum(dO_i ∘ O_i), then for each key block
``_attn_bwd_dkdv`` recomputes P_ij = exp(S_ij − lse_i) from the saved log-sum-exp and
accumulates dV_j, dK_j (and dQ_i, which on a GPU is the separate ``_attn_bwd_dq`` pass)::

    dV_j += P_ijᵀ dO_i,  dP_ij = dO_i V_jᵀ,  dS_ij = P_ij ∘ (dP_ij − D_i),
    dQ_i += dS_ij K_j · scale,  dK_j += dS_ijᵀ Q_i · scale

The forward is chapter 8's ``attn_lib.flash_torch``; ``attn_lib.flash_attention`` joins the
two into one differentiable function.
"""
from __future__ import annotations

import torch

from ._numerics import LOG2E, base2_factor, resolve_scale, work_dtype
from ._validate import check_attention_inputs, check_block, check_bool, check_key_padding_mask, check_saved

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
    the end). ``qk`` and ``dp`` are preallocated (BH, bm, bn) buffers; ``hide`` is None or a
    bool mask broadcastable to them (True = hidden).
    """
    if factor[1] == 1.0:  # S_ij - lse_i in one call: the product added to -lse_i
        torch.baddbmm(neg_lse2_i.expand_as(qk), Q_i, K_j.transpose(1, 2), alpha=factor[0], out=qk)  # (BH,bm,D) @ (BH,D,bn) -> (BH,bm,bn)
    else:  # scale·log2(e) does not fit the working dtype: two factors, then -lse_i
        torch.baddbmm(qk, Q_i, K_j.transpose(1, 2), beta=0, alpha=factor[0], out=qk)  # (BH,bm,D) @ (BH,D,bn) -> (BH,bm,bn)
        qk.mul_(factor[1]).add_(neg_lse2_i)  # (BH,bm,bn)
    if hide is not None:
        qk.masked_fill_(hide, float("-inf"))  # (BH,bm,bn)
    p = qk.exp2_()  # P_ij = exp(S_ij - lse_i), (BH,bm,bn), in place
    dV_j.baddbmm_(p.transpose(1, 2), dO_i)  # += (BH,bn,bm) @ (BH,bm,Dv) -> (BH,bn,Dv)
    torch.baddbmm(neg_delta_i.expand_as(dp), dO_i, V_j.transpose(1, 2), out=dp)  # dP_ij - D_i: (BH,bm,Dv) @ (BH,Dv,bn) -> (BH,bm,bn)
    ds = dp.mul_(p)  # dS_ij = P_ij ∘ (dP_ij - D_i), (BH,bm,bn), in place
    dK_j.baddbmm_(ds.transpose(1, 2), Q_i)  # += (BH,bn,bm) @ (BH,bm,D) -> (BH,bn,D)
    dQ_i.baddbmm_(ds, K_j)  # += (BH,bm,bn) @ (BH,bn,D) -> (BH,bm,D)


def _backward_tiles(q, k, v, out, lse, dout, key_padding_mask, *, causal, scale, block_m, block_n, causal_offset=0):
    """分块反向的主体（输入已检查过，scale 已是数）；causal 时查询 i 看见键 j 当且仅当 j <= i + causal_offset。"""
    (B, H, L, D), S, Dv = q.shape, k.shape[2], v.shape[3]
    work, dev, BH = work_dtype(q.dtype), q.device, B * H
    Q = q.to(work).reshape(BH, L, D)  # (B,H,L,D) -> (BH,L,D)
    K = k.to(work).reshape(BH, S, D)  # (B,H,S,D) -> (BH,S,D)
    V = v.to(work).reshape(BH, S, Dv)  # (B,H,S,Dv) -> (BH,S,Dv)
    dO = dout.to(work).reshape(BH, L, Dv)  # (B,H,L,Dv) -> (BH,L,Dv) (copies an expanded dout)
    neg_delta = _attn_bwd_preprocess(out.to(work).reshape(BH, L, Dv), dO).neg_()  # (BH,L,Dv) -> (BH,L,1), -D
    neg_lse2 = (lse.to(work) * -LOG2E).reshape(BH, L, 1)  # (B,H,L) -> (BH,L,1), -lse in base 2
    # A row that sees no key: lse = -inf. Adding -inf instead of +inf makes its P row exactly 0.
    neg_lse2 = torch.where(torch.isposinf(neg_lse2), torch.full_like(neg_lse2, float("-inf")), neg_lse2)  # (BH,L,1)
    dK = torch.zeros(BH, S, D, dtype=work, device=dev)  # (BH,S,D)
    dV = torch.zeros(BH, S, Dv, dtype=work, device=dev)  # (BH,S,Dv)
    # One contiguous accumulator per query block, so that baddbmm_ writes one batch of matrices.
    m_starts = list(range(0, L, block_m))
    dQ_blocks = [torch.zeros(BH, min(block_m, L - m0), D, dtype=work, device=dev) for m0 in m_starts]  # (BH,bm,D)
    bm_max, bn_max = min(block_m, max(L, 1)), min(block_n, max(S, 1))
    ctx = dict(Q=Q, dO=dO, neg_lse2=neg_lse2, neg_delta=neg_delta, dQ_blocks=dQ_blocks, m_starts=m_starts,
               block_m=block_m, causal=causal, offset=causal_offset, factor=base2_factor(scale, work),
               qk_buf=torch.empty(BH * bm_max * bn_max, dtype=work, device=dev),  # score / P tile
               dp_buf=torch.empty(BH * bm_max * bn_max, dtype=work, device=dev),  # dP / dS tile
               hidden=None if key_padding_mask is None
               else (~key_padding_mask).repeat_interleave(H, dim=0)[:, None, :],  # (B,S) -> (BH,1,S), True = absent
               # col - row for every position of a tile: hidden where key index > query index + offset
               col_minus_row=torch.arange(bn_max, device=dev)[None, :] - torch.arange(bm_max, device=dev)[:, None])
    n_end = max(min(S, L + causal_offset), 0) if causal else S  # causal: keys no query sees get zero gradients
    for n0 in range(0, n_end, block_n):
        n1 = min(n0 + block_n, n_end)
        dK[:, n0:n1], dV[:, n0:n1] = _backward_key_block(K[:, n0:n1], V[:, n0:n1], n0, **ctx)  # (BH,bn,D), (BH,bn,Dv)
    dQ = torch.cat(dQ_blocks, dim=1) if dQ_blocks else torch.zeros(BH, L, D, dtype=work, device=dev)  # (BH,L,D)
    dq = (dQ * scale).view(B, H, L, D).to(q.dtype)  # (BH,L,D) -> (B,H,L,D)
    dk = (dK * scale).view(B, H, S, D).to(k.dtype)  # (BH,S,D) -> (B,H,S,D)
    dv = dV.view(B, H, S, Dv).to(v.dtype)  # (BH,S,Dv) -> (B,H,S,Dv)
    return dq, dk, dv


def _backward_key_block(K_j, V_j, n0, *, Q, dO, neg_lse2, neg_delta, dQ_blocks, m_starts, block_m, causal, offset,
                        factor, qk_buf, dp_buf, hidden, col_minus_row):
    """一块键 K_j、V_j：让看得见它的每一块查询流过，返回这块的 (dK_j, dV_j)（未乘 scale）。"""
    BH, bn, D = K_j.shape
    L, n1 = Q.shape[1], n0 + bn
    dK_j = torch.zeros(BH, bn, D, dtype=K_j.dtype, device=K_j.device)  # (BH,bn,D)
    dV_j = torch.zeros(BH, bn, V_j.shape[2], dtype=K_j.dtype, device=K_j.device)  # (BH,bn,Dv)
    # causal: query blocks ending before query n0 - offset see none of K_j
    first = max(n0 - offset, 0) // block_m if causal else 0
    for i in range(first, len(m_starts)):
        m0 = m_starts[i]
        m1 = min(m0 + block_m, L)
        bm = m1 - m0
        hide = None if hidden is None else hidden[:, :, n0:n1]  # (BH,1,bn)
        if causal and n1 - 1 > m0 + offset:  # some key of the block comes after some query: the diagonal
            diag = col_minus_row[:bm, :bn] > (m0 + offset - n0)  # (bm,bn), True = key after query + offset
            hide = diag if hide is None else (hide | diag)  # (BH,bm,bn) or (bm,bn)
        _attn_bwd_dkdv(Q[:, m0:m1], K_j, V_j, dO[:, m0:m1], neg_lse2[:, m0:m1], neg_delta[:, m0:m1],
                       dK_j, dV_j, dQ_blocks[i], qk_buf[: BH * bm * bn].view(BH, bm, bn),
                       dp_buf[: BH * bm * bn].view(BH, bm, bn), hide, factor)
    return dK_j, dV_j


@torch.no_grad()
def flash_attention_torch_backward(q, k, v, out, lse, dout, *, is_causal: bool = False, scale: float | None = None,
                                   key_padding_mask=None, block_m: int | None = None, block_n: int | None = None):
    """分块 FlashAttention-2 反向（纯 torch）：由 q、k、v、输出和 lse 重算 P，算出 dq、dk、dv，不存 L×S 矩阵。

    The backward of ``flash_attention_torch``: for each key block K_j, V_j and each query
    block Q_i that can see it, recompute ``P_ij = exp(S_ij − lse_i)`` from the saved
    log-sum-exp (see the module docstring for the formulas). With ``is_causal`` query blocks
    entirely before a key block are skipped. A query that sees no key (``lse = -inf``) gets
    zero gradients. Any device; float64 stays float64 (``torch.autograd.gradcheck`` runs on
    it), other dtypes are computed in float32. Extra memory: two (B·H, BLOCK_M, BLOCK_N) tiles
    and O((L + S)·D) accumulators.

    Args:
        q, k, v: (B, H, L, D), (B, H, S, D), (B, H, S, Dv), the forward's inputs.
        out: the forward's output (B, H, L, Dv).
        lse: the forward's log-sum-exp (B, H, L), natural log, ``-inf`` for rows that see no key.
        dout: gradient of the loss with respect to ``out``, (B, H, L, Dv).
        is_causal, scale, key_padding_mask: as in the forward.
        block_m, block_n: queries / keys per block; ``None`` = 128 / 256.

    Returns:
        ``(dq, dk, dv)`` with the shapes and dtypes of q, k, v. Computed without building a
        graph (no gradients of gradients).
    """
    (B, H, L, S, D, Dv), scale = check_attention_inputs(q, k, v, None, scale)
    check_key_padding_mask(key_padding_mask, B, S, q.device)
    check_bool("is_causal", is_causal)
    check_saved(q, out, lse, dout, B, H, L, Dv, forward="flash_attention_torch")
    block_m = check_block("block_m", block_m, power_of_two=False) or DEFAULT_BWD_BLOCK_M
    block_n = check_block("block_n", block_n, power_of_two=False) or DEFAULT_BWD_BLOCK_N
    return _backward_tiles(q, k, v, out, lse, dout, key_padding_mask, causal=is_causal, scale=resolve_scale(scale, D),
                           block_m=block_m, block_n=block_n)


__all__ = ["flash_attention_torch_backward", "DEFAULT_BWD_BLOCK_M", "DEFAULT_BWD_BLOCK_N"]
