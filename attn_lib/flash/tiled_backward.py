"""第 9 章（分块 FlashAttention 的反向，纯 torch，任何设备）：由保存的 log-sum-exp 一块块重算 P，求 dq、dk、dv，不存 L×S 矩阵。

FlashAttention-2's backward, with the paper's symbols and the Triton tutorial's names (without their
leading underscore):
``attn_bwd_preprocess`` computes D_i = rowsum(dO_i ∘ O_i), then for each key block
``attn_bwd_dkdv`` recomputes P_ij = exp(S_ij − lse_i) from the saved log-sum-exp and
accumulates dV_j, dK_j (and dQ_i, which on a GPU is the separate ``attn_bwd_dq`` pass)::

    dV_j += P_ijᵀ dO_i,  dP_ij = dO_i V_jᵀ,  dS_ij = P_ij ∘ (dP_ij − D_i),
    dQ_i += dS_ij K_j · scale,  dK_j += dS_ijᵀ Q_i · scale

With grouped-query attention the G query heads of a group are rows of one tile against their
shared key/value head, so ``dK_j += dS_ijᵀ Q_i`` sums over the group inside the product (no
repeated K or V). With a sliding window (or any band of ``settings.band``), query blocks
outside the band of a key block are skipped: the cost is O(L·window).

The forward is chapter 8's ``attn_lib.flash.tiled_forward``; ``attn_lib.flash_attention`` joins the
two into one differentiable function (``attn_lib.flash.autograd``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checks.doors import check_tiled_backward_call
from ..rules.band import Band
from ..rules.names import NO_WINDOW
from ..rules.numerics import LOG2E, autocast_off
from ..rules.settings import AttentionSettings, Options
from .tiles import absent_keys, band_hidden, col_minus_row, group_rows, ungroup_rows

DEFAULT_BWD_BLOCK_M = 128  # backward: queries per block
DEFAULT_BWD_BLOCK_N = 256  # backward: keys per block


def attn_bwd_preprocess(O, dO):
    """反向第 0 步：D_i = rowsum(dO_i ∘ O_i)，每个查询一个数，代替存下整张 P。

    ``D_i = Σ_j P_ij dP_ij`` because ``dP_ij = dO_i · v_j`` and ``O_i = Σ_j P_ij v_j``; one
    dot product per query instead of a row of L×S. O, dO: (BH, L, Dv); returns (BH, L, 1).
    """
    return (dO * O).sum(-1, keepdim=True)  # (BH,L,Dv) ∘ (BH,L,Dv) -> (BH,L,1)


@dataclass
class _Rows:
    """一块查询的行：Q_i、dO_i、−lse_i·log2(e)、−D_i（都是 (BK, bm·G, ·)），和它的 dQ_i 累加器。"""

    Q: torch.Tensor
    dO: torch.Tensor
    neg_lse2: torch.Tensor
    neg_delta: torch.Tensor
    dQ: torch.Tensor


def attn_bwd_dkdv(rows: _Rows, K_j, V_j, grads, tiles, hide, factor) -> None:
    """反向的一个块对 (i, j)：重算 P_ij，累加 dV_j、dK_j，顺带把 dS_ij K_j 加进 dQ_i。

    FlashAttention-2 / the Triton tutorial split the backward into ``attn_bwd_dkdv`` (fixed
    key block j, loop over query blocks i) and ``attn_bwd_dq`` (fixed query block i), because
    on a GPU thousands of key blocks run at once and adding into one dQ_i from all of them
    would need atomics. On a CPU the loop runs in order, so ``dQ_i += dS_ij K_j`` is done here
    too and P_ij is recomputed once instead of twice: five matrix products per tile, not seven.

    All tensors are batched over the B·H_kv heads (first axis). ``factor = (a, b)`` with
    ``a·b = scale·log2(e)``, so ``exp2(Q_i K_jᵀ·a·b − lse_i·log2(e)) = P_ij``. Updates
    ``grads = (dK_j, dV_j)`` and ``rows.dQ`` in place without the scale (the caller multiplies
    once at the end). ``tiles = (qk, dp)`` are preallocated (BK, bm·G, bn) buffers; ``hide`` is
    None, a bool mask broadcastable to them (True = hidden) or a float cap (-inf hidden, +inf visible).
    """
    (dK_j, dV_j), (qk, dp) = grads, tiles
    if factor[1] == 1.0:  # S_ij - lse_i in one call: the product added to -lse_i
        torch.baddbmm(rows.neg_lse2.expand_as(qk), rows.Q, K_j.transpose(1, 2), alpha=factor[0], out=qk)  # (BK,bm,D) @ (BK,D,bn) -> (BK,bm,bn)
    else:  # scale·log2(e) does not fit the working dtype: two factors, then -lse_i
        torch.baddbmm(qk, rows.Q, K_j.transpose(1, 2), beta=0, alpha=factor[0], out=qk)  # (BK,bm,D) @ (BK,D,bn) -> (BK,bm,bn)
        qk.mul_(factor[1]).add_(rows.neg_lse2)  # (BK,bm,bn)
    if hide is not None and hide.dtype == torch.bool:
        qk.masked_fill_(hide, float("-inf"))  # (BK,bm,bn)
    elif hide is not None:  # a float cap: -inf where hidden, +inf where visible
        qk.clamp_(max=hide)  # (BK,bm,bn)
    p = qk.exp2_()  # P_ij = exp(S_ij - lse_i), (BK,bm,bn), in place
    dV_j.baddbmm_(p.transpose(1, 2), rows.dO)  # += (BK,bn,bm) @ (BK,bm,Dv) -> (BK,bn,Dv)
    torch.baddbmm(rows.neg_delta.expand_as(dp), rows.dO, V_j.transpose(1, 2), out=dp)  # dP_ij - D_i: (BK,bm,Dv) @ (BK,Dv,bn) -> (BK,bm,bn)
    ds = dp.mul_(p)  # dS_ij = P_ij ∘ (dP_ij - D_i), (BK,bm,bn), in place
    dK_j.baddbmm_(ds.transpose(1, 2), rows.Q)  # += (BK,bn,bm) @ (BK,bm,D) -> (BK,bn,D)
    rows.dQ.baddbmm_(ds, K_j)  # += (BK,bm,bn) @ (BK,bn,D) -> (BK,bm,D)


@torch.no_grad()
def flash_attention_torch_backward(q, k, v, out, lse, dout, *, is_causal: bool = False, scale: float | None = None,
                                   key_mask=None, block_m: int | None = None, block_n: int | None = None,
                                   enable_gqa=False, window_size=NO_WINDOW, align: str = "top-left"):
    """分块 FlashAttention-2 反向（纯 torch）：由 q、k、v、输出和 lse 重算 P，算出 dq、dk、dv，不存 L×S 矩阵。

    The backward of ``flash_attention_torch``: for each key block K_j, V_j and each query
    block Q_i that can see it, recompute ``P_ij = exp(S_ij − lse_i)`` from the saved
    log-sum-exp (see the module docstring for the formulas). A query that sees no key
    (``lse = -inf``) gets zero gradients. Any device; float64 stays float64
    (``torch.autograd.gradcheck`` runs on it), other dtypes are computed in float32. Extra
    memory: two (B·H, BLOCK_M, BLOCK_N) tiles and O((L + S)·D) accumulators.

    Args:
        q, k, v: (B, H, L, D), (B, H_kv, S, D), (B, H_kv, S, Dv), the forward's inputs.
        out: the forward's output (B, H, L, Dv).
        lse: the forward's log-sum-exp (B, H, L), natural log, ``-inf`` for rows that see no key.
        dout: gradient of the loss with respect to ``out``, (B, H, L, Dv).
        is_causal, scale, key_mask, enable_gqa, window_size, align: as in the forward.
        block_m, block_n: queries / keys per block; ``None`` = 128 / 256.

    Returns:
        ``(dq, dk, dv)`` with the shapes and dtypes of q, k, v (dk, dv with H_kv heads,
        summed over the query heads of each group). Computed without building a
        graph (no gradients of gradients).
    """
    options = Options(is_causal=is_causal, scale=scale, window_size=window_size, align=align, enable_gqa=enable_gqa,
                      key_mask=key_mask, block_m=block_m, block_n=block_n)
    settings = check_tiled_backward_call(q, k, v, (out, lse, dout), options)
    with autocast_off(q.device):
        return backward_core(q, k, v, (out, lse, dout), settings)


def backward_core(q, k, v, saved, settings: AttentionSettings):
    """分块反向的无检查内核：saved = (out, lse, dout)；返回 (dq, dk, dv)，k、v 可以只有 H_kv 个头。"""
    out, lse, dout = saved
    (B, H, L, D), (Hkv, S), Dv = q.shape, k.shape[1:3], v.shape[3]
    G, work, dev, BK = H // Hkv if Hkv else 1, settings.work_dtype, q.device, B * Hkv
    block_m, block_n = settings.block_m or DEFAULT_BWD_BLOCK_M, settings.block_n or DEFAULT_BWD_BLOCK_N
    Q = group_rows(q.to(work), Hkv)  # (B,H,L,D) -> (B*H_kv,L*G,D): a group's G heads interleaved
    K = k.to(work).reshape(BK, S, D)  # (B,H_kv,S,D) -> (B*H_kv,S,D)
    V = v.to(work).reshape(BK, S, Dv)  # (B,H_kv,S,Dv) -> (B*H_kv,S,Dv)
    dO = group_rows(dout.to(work), Hkv)  # (B,H,L,Dv) -> (B*H_kv,L*G,Dv) (copies an expanded dout)
    neg_delta = attn_bwd_preprocess(group_rows(out.to(work), Hkv), dO).neg_()  # (B*H_kv,L*G,Dv) -> (BK,L*G,1), -D
    neg_lse2 = group_rows((lse.to(work) * -LOG2E)[..., None], Hkv)  # (B,H,L) -> (B*H_kv,L*G,1), -lse in base 2
    # A row that sees no key: lse = -inf. Adding -inf instead of +inf makes its P row exactly 0.
    neg_lse2 = torch.where(torch.isposinf(neg_lse2), torch.full_like(neg_lse2, float("-inf")), neg_lse2)  # (BK,L*G,1)
    blocks = [_Rows(Q[:, m0 * G:m1 * G], dO[:, m0 * G:m1 * G], neg_lse2[:, m0 * G:m1 * G],
                    neg_delta[:, m0 * G:m1 * G], torch.zeros(BK, (m1 - m0) * G, D, dtype=work, device=dev))
              for m0, m1 in ((m0, min(m0 + block_m, L)) for m0 in range(0, L, block_m))]  # one dQ_i per query block
    bm_max, bn_max = min(block_m, max(L, 1)), min(block_n, max(S, 1))
    ctx = _Context(blocks, block_m, L, settings.band, G, settings.qk_scale, col_minus_row(bm_max, bn_max, dev),
                   absent_keys(settings.key_mask, Hkv), torch.empty(2, BK * bm_max * G * bn_max, dtype=work, device=dev))
    dK = torch.zeros(BK, S, D, dtype=work, device=dev)  # (B*H_kv,S,D): summed over the group
    dV = torch.zeros(BK, S, Dv, dtype=work, device=dev)  # (B*H_kv,S,Dv)
    n_start, n_end = settings.band.key_range(0, L, S)  # keys no query sees get zero gradients
    for n0 in range(n_start, n_end, block_n):
        n1 = min(n0 + block_n, n_end)
        grads = (torch.zeros(BK, n1 - n0, D, dtype=work, device=dev),  # dK_j (BK,bn,D), contiguous for baddbmm_
                 torch.zeros(BK, n1 - n0, Dv, dtype=work, device=dev))  # dV_j (BK,bn,Dv)
        _backward_key_block(K[:, n0:n1], V[:, n0:n1], n0, grads, ctx)
        dK[:, n0:n1], dV[:, n0:n1] = grads
    dQ = torch.cat([r.dQ for r in blocks], dim=1) if blocks else torch.zeros(BK, 0, D, dtype=work, device=dev)  # (BK,L*G,D)
    dq = ungroup_rows(dQ * settings.scale, B, Hkv, G, L).to(q.dtype)  # (B*H_kv,L*G,D) -> (B,H,L,D)
    dk = (dK * settings.scale).view(B, Hkv, S, D).to(k.dtype)  # (B*H_kv,S,D) -> (B,H_kv,S,D)
    dv = dV.view(B, Hkv, S, Dv).to(v.dtype)  # (B*H_kv,S,Dv) -> (B,H_kv,S,Dv)
    return dq, dk, dv


@dataclass
class _Context:
    """反向的每个键块共用的东西：每块查询的行、块大小、查询数、带、每组头数、因子、j - i 网格、缺席的键、两个 tile 缓冲区。"""

    blocks: list
    block_m: int
    L: int
    band: Band
    group: int
    factor: tuple
    grid: torch.Tensor
    absent: torch.Tensor | None
    bufs: torch.Tensor  # (2, n): the score / P tile and the dP / dS tile


def _backward_key_block(K_j, V_j, n0: int, grads, ctx: _Context) -> None:
    """一块键 K_j、V_j：让看得见它的每一块查询（带内的）流过，把这块的 dK_j、dV_j（未乘 scale，已对组内各头求和）加进 grads。"""
    BK, bn, _ = K_j.shape
    G = ctx.group
    m_start, m_end = ctx.band.query_range(n0, n0 + bn, ctx.L)  # query blocks wholly outside the band see none of K_j
    for i in range(m_start // ctx.block_m, -(-m_end // ctx.block_m)):
        rows, m0 = ctx.blocks[i], i * ctx.block_m
        bm = rows.Q.shape[1] // G
        hide = None if ctx.absent is None else ctx.absent[:, :, n0:n0 + bn]  # (BK,1,bn)
        band_hide = band_hidden(ctx.grid, m0, bm, n0, bn, ctx.band)  # None or (bm,bn)
        if band_hide is not None:
            band_hide = band_hide.repeat_interleave(G, dim=0) if G > 1 else band_hide  # (bm,bn) -> (bm*G,bn)
            if hide is None:  # a float cap: min(score, -inf / +inf) is masked_fill_, several times faster on a CPU
                hide = torch.where(band_hide, float("-inf"), float("inf")).to(ctx.bufs.dtype)  # (bm*G,bn)
            else:
                hide = hide | band_hide  # (BK,bm*G,bn)
        n = BK * bm * G * bn
        tiles = (ctx.bufs[0, :n].view(BK, bm * G, bn), ctx.bufs[1, :n].view(BK, bm * G, bn))
        attn_bwd_dkdv(rows, K_j, V_j, grads, tiles, hide, ctx.factor)


__all__ = ["flash_attention_torch_backward", "backward_core", "attn_bwd_preprocess", "attn_bwd_dkdv",
           "DEFAULT_BWD_BLOCK_M", "DEFAULT_BWD_BLOCK_N"]
