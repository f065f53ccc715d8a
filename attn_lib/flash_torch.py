"""第 8、9 章（分块 FlashAttention 的前向与反向，纯 torch，任何设备）：一块查询配一块一块的键，从不存下整张 L×S 分数矩阵。

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

The backward (``flash_attention_backward_torch``) is FlashAttention-2's, named as in the paper
and the tutorial: ``_attn_bwd_preprocess`` computes D_i = rowsum(dO_i ∘ O_i), then for each key
block ``_attn_bwd_dkdv`` recomputes P_ij = exp(S_ij − lse_i) from the saved log-sum-exp and
accumulates dV_j, dK_j (and dQ_i, which on a GPU is the separate ``_attn_bwd_dq`` pass):

    dV_j += P_ijᵀ dO_i,  dP_ij = dO_i V_jᵀ,  dS_ij = P_ij ∘ (dP_ij − D_i),
    dQ_i += dS_ij K_j · scale,  dK_j += dS_ijᵀ Q_i · scale
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
DEFAULT_BWD_BLOCK_M = 128  # backward: queries per block
DEFAULT_BWD_BLOCK_N = 256  # backward: keys per block


def check_key_padding_mask(key_padding_mask, B: int, S: int, device) -> None:
    """检查键填充掩码：必须是布尔张量，形状 (B, S)，True = 这个键存在。

    Args:
        key_padding_mask: None or a bool tensor (B, S).
        B, S: batch size and number of keys of ``k``.
        device: the device of q.
    """
    if key_padding_mask is None:
        return
    if not isinstance(key_padding_mask, torch.Tensor):
        raise TypeError(f"key_padding_mask must be a torch.Tensor or None, got {type(key_padding_mask).__name__}")
    if key_padding_mask.requires_grad:
        raise ValueError(
            "key_padding_mask requires grad, but it is not differentiable (a key is either present or not); "
            "pass a bool tensor (True = key present), e.g. key_padding_mask.detach() > 0.5"
        )
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


def check_no_grad_needed(fn_name: str, *tensors) -> None:
    """前向专用函数的检查：需要梯度的输入会被拒绝，并指出该用哪个可求导的函数。"""
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        raise ValueError(
            f"{fn_name} is forward-only (it writes into preallocated buffers, which autograd cannot follow), "
            "but q, k or v requires grad; to train, call attn_lib.flash_attention(q, k, v, backend='torch'), "
            "whose backward is the tiled FlashAttention-2 backward, or wrap this call in torch.no_grad()"
        )


def overflow_error(dtype) -> ValueError:
    """分数溢出到 +inf 时各条路径统一给出的 ValueError。"""
    name = str(dtype).replace("torch.", "")
    return ValueError(
        f"attention scores overflowed to +inf (|scale·q·k| exceeds the range of {name}); "
        "compute in float64 or use a smaller scale"
    )


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
        Output (B, H, L, Dv) in q's dtype; rows that see no key are zeros. Differentiable
        (plain autograd through the full matrix; a row that sees no key gets zero gradients).

    Raises:
        ValueError: a score overflows to +inf in q's dtype.
        TypeError: ``scale`` is a tensor that requires grad (not differentiable).
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
    if S:
        row_max = scores.detach().amax(-1)  # (B,H,L,S) -> (B,H,L); -inf for a row that sees no key
        if bool((torch.isposinf(row_max) | torch.isnan(row_max)).any()):
            raise overflow_error(q.dtype)
    probs = torch.softmax(scores, dim=-1, dtype=_work_dtype(q.dtype))  # (B,H,L,S) proportions
    if key_padding_mask is not None:
        # A query whose keys are all absent: zeros, as attn_lib.softmax. Out of place, so that
        # softmax's backward still finds the output it saved.
        probs = probs.nan_to_num(0.0)  # (B,H,L,S)
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
        Forward only: to train, use ``attn_lib.flash_attention`` (its backward is
        ``flash_attention_backward_torch``).

    Raises:
        ValueError: a score overflows to +inf in the working dtype (float32, or float64);
            q, k or v requires grad while grad mode is on; ``scale`` requires grad.
    """
    (B, H, L, S, D, Dv), scale = check_attention_inputs(q, k, v, None, scale)
    check_no_grad_needed("flash_attention_torch", q, k, v)
    check_key_padding_mask(key_padding_mask, B, S, q.device)
    block_m = DEFAULT_BLOCK_M if block_m is None else check_positive_int("block_m", block_m)
    block_n = DEFAULT_BLOCK_N if block_n is None else check_positive_int("block_n", block_n)
    check_bool("causal", causal)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out, lse = _forward_tiles(q, k, v, key_padding_mask, causal=causal, scale=scale, block_m=block_m,
                              block_n=block_n, counter=counter)
    # Overflow, checked once: a +inf score makes its row's max +inf and its lse nan (or +inf).
    # A row that sees no key has lse = -inf, which is not an overflow.
    if bool((torch.isnan(lse) | torch.isposinf(lse)).any()):
        raise overflow_error(_work_dtype(q.dtype))
    return out, lse


def _forward_tiles(q, k, v, key_padding_mask, *, causal, scale, block_m, block_n, counter, causal_offset=0):
    """flash_attention_torch 的主体（输入已检查过，scale 已是数）；causal 时查询 i 看见键 j 当且仅当 j <= i + causal_offset。"""
    (B, H, L, D), S, Dv = q.shape, k.shape[2], v.shape[3]
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
        # keys after the block's last query (+ offset) are invisible to all of it
        n_end = max(min(S, m1 + causal_offset), 0) if causal else S
        for n0 in range(0, n_end, block_n):
            n1 = min(n0 + block_n, n_end)
            bn = n1 - n0
            if counter is not None:
                counter.load("K", BH * bn * D)
                counter.load("V", BH * bn * Dv)
                if key_padding_mask is not None:
                    counter.load("mask", BH * bn)
            # Causal: queries i with i + offset < n0 see nothing in this block; start at row r0.
            r0 = max(n0 - causal_offset - m0, 0) if causal else 0
            rows = bm - r0
            qk = qk_buf[: BH * rows * bn].view(BH, rows, bn)  # (BH,rows,bn) score tile
            torch.bmm(Q_i[:, r0:], Kt[:, :, n0:n1], out=qk)  # (BH,rows,D) @ (BH,D,bn) -> (BH,rows,bn)
            if causal and n1 - 1 > m0 + r0 + causal_offset:
                # Rows whose query index + offset is < n1 - 1 see only part of the block (the diagonal).
                diag = min(rows, n1 - 1 - (m0 + r0 + causal_offset))  # rows that need the triangle
                off = (m0 + r0 + causal_offset) - n0  # column offset of the first such row's diagonal
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


def _check_saved(q, out, lse, dout, B: int, H: int, L: int, Dv: int) -> None:
    """检查反向传播的输入 out、lse、dout 的类型、形状、精度和设备。"""
    for name, t, shape in (("out", out, (B, H, L, Dv)), ("lse", lse, (B, H, L)), ("dout", dout, (B, H, L, Dv))):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if tuple(t.shape) != shape:
            raise ValueError(
                f"{name} must have shape {shape} (from q, k, v: B, H, L and Dv), got {tuple(t.shape)}; "
                "pass the out and lse that the forward returned for these q, k, v"
            )
        if str(t.device) != str(q.device):
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")


def _attn_bwd_preprocess(O, dO):
    """反向第 0 步：D_i = rowsum(dO_i ∘ O_i)，每个查询一个数，代替存下整张 P。

    ``D_i = Σ_j P_ij dP_ij`` because ``dP_ij = dO_i · v_j`` and ``O_i = Σ_j P_ij v_j``; one
    dot product per query instead of a row of L×S.

    Args:
        O: the forward's output, (BH, L, Dv).
        dO: the gradient of the loss with respect to it, (BH, L, Dv).

    Returns:
        D of shape (BH, L, 1).
    """
    return (dO * O).sum(-1, keepdim=True)  # (BH,L,Dv) ∘ (BH,L,Dv) -> (BH,L,1)


def _attn_bwd_dkdv(Q_i, K_j, V_j, dO_i, neg_lse2_i, neg_delta_i, dK_j, dV_j, dQ_i, qk, dp, hide):
    """反向的一个块对 (i, j)：重算 P_ij，累加 dV_j、dK_j，顺带把 dS_ij K_j 加进 dQ_i。

    FlashAttention-2 / the Triton tutorial split the backward into ``_attn_bwd_dkdv`` (fixed
    key block j, loop over query blocks i) and ``_attn_bwd_dq`` (fixed query block i, loop
    over key blocks j), because on a GPU thousands of key blocks run at once and adding into
    one dQ_i from all of them would need atomics. On a CPU the loop runs in order, so the
    dQ_i update ``dQ_i += dS_ij K_j`` (what ``_attn_bwd_dq`` does) is done here too and P_ij
    is recomputed once instead of twice: five matrix products per tile instead of seven.

    All tensors are batched over the B·H heads (first axis). ``Q_i`` is pre-multiplied by
    ``scale·log2(e)`` and ``neg_lse2_i = −lse_i·log2(e)`` (BH, bm, 1), so
    ``exp2(Q_i K_jᵀ + neg_lse2_i) = P_ij``; ``neg_delta_i = −D_i`` (BH, bm, 1).
    Updates ``dK_j``, ``dV_j``, ``dQ_i`` in place (dK_j collects ``dS_ijᵀ Q_i`` with the scaled
    Q_i; the caller divides by log2(e) once at the end). ``qk`` and ``dp`` are preallocated
    (BH, bm, bn) buffers; ``hide`` is None or a bool mask broadcastable to them (True = hidden).
    """
    # S_ij - lse_i in one call: the matrix product added to -lse_i (saves a pass over the tile).
    torch.baddbmm(neg_lse2_i.expand_as(qk), Q_i, K_j.transpose(1, 2), out=qk)  # (BH,bm,D) @ (BH,D,bn) -> (BH,bm,bn)
    if hide is not None:
        qk.masked_fill_(hide, float("-inf"))  # (BH,bm,bn)
    p = qk.exp2_()  # P_ij = exp(S_ij - lse_i), (BH,bm,bn), in place
    dV_j.baddbmm_(p.transpose(1, 2), dO_i)  # += (BH,bn,bm) @ (BH,bm,Dv) -> (BH,bn,Dv)
    torch.baddbmm(neg_delta_i.expand_as(dp), dO_i, V_j.transpose(1, 2), out=dp)  # dP_ij - D_i: (BH,bm,Dv) @ (BH,Dv,bn) -> (BH,bm,bn)
    ds = dp.mul_(p)  # dS_ij = P_ij ∘ (dP_ij - D_i), (BH,bm,bn), in place
    dK_j.baddbmm_(ds.transpose(1, 2), Q_i)  # += (BH,bn,bm) @ (BH,bm,D) -> (BH,bn,D)
    dQ_i.baddbmm_(ds, K_j)  # += (BH,bm,bn) @ (BH,bn,D) -> (BH,bm,D)


@torch.no_grad()
def flash_attention_backward_torch(q, k, v, out, lse, dout, *, causal: bool = False, scale: float | None = None,
                                   key_padding_mask=None, block_m: int | None = None, block_n: int | None = None):
    """分块 FlashAttention-2 反向（纯 torch）：由 q、k、v、输出和 lse 重算 P，算出 dq、dk、dv，不存 L×S 矩阵。

    The backward of ``flash_attention_torch``: for each key block K_j, V_j and each query
    block Q_i that can see it, recompute ``P_ij = exp(S_ij − lse_i)`` from the saved
    log-sum-exp, then

        dV_j += P_ijᵀ dO_i,   dP_ij = dO_i V_jᵀ,   dS_ij = P_ij ∘ (dP_ij − D_i),
        dQ_i += dS_ij K_j · scale,   dK_j += dS_ijᵀ Q_i · scale,

    with ``D_i = rowsum(dO_i ∘ O_i)`` (``_attn_bwd_preprocess``). With ``causal=True`` query
    blocks entirely before a key block are skipped. A query that sees no key (``lse = -inf``)
    gets zero gradients. Any device; float64 stays float64 (``torch.autograd.gradcheck``
    runs on it), other dtypes are computed in float32. Extra memory: two (B·H, BLOCK_M,
    BLOCK_N) tiles and O((L + S)·D) accumulators.

    Args:
        q, k, v: (B, H, L, D), (B, H, S, D), (B, H, S, Dv), the forward's inputs.
        out: the forward's output (B, H, L, Dv).
        lse: the forward's log-sum-exp (B, H, L), natural log, ``-inf`` for rows that see no key.
        dout: gradient of the loss with respect to ``out``, (B, H, L, Dv).
        causal, scale, key_padding_mask: as in the forward.
        block_m: queries per block; ``None`` = 128.
        block_n: keys per block; ``None`` = 256.

    Returns:
        ``(dq, dk, dv)`` with the shapes and dtypes of q, k, v. Computed without building a
        graph (no gradients of gradients).
    """
    (B, H, L, S, D, Dv), scale = check_attention_inputs(q, k, v, None, scale)
    check_key_padding_mask(key_padding_mask, B, S, q.device)
    check_bool("causal", causal)
    _check_saved(q, out, lse, dout, B, H, L, Dv)
    block_m = DEFAULT_BWD_BLOCK_M if block_m is None else check_positive_int("block_m", block_m)
    block_n = DEFAULT_BWD_BLOCK_N if block_n is None else check_positive_int("block_n", block_n)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    return _backward_tiles(q, k, v, out, lse, dout, key_padding_mask, causal=causal, scale=scale,
                           block_m=block_m, block_n=block_n)


def _backward_tiles(q, k, v, out, lse, dout, key_padding_mask, *, causal, scale, block_m, block_n, causal_offset=0):
    """flash_attention_backward_torch 的主体（输入已检查过，scale 已是数）；causal_offset 同前向。"""
    (B, H, L, D), S, Dv = q.shape, k.shape[2], v.shape[3]
    work = _work_dtype(q.dtype)
    dev = q.device
    BH = B * H
    bm_max, bn_max = min(block_m, max(L, 1)), min(block_n, max(S, 1))

    Q = (q.to(work) * (scale * LOG2E)).reshape(BH, L, D)  # (B,H,L,D) -> (BH,L,D), scores in base 2
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
    qk_buf = torch.empty(BH * bm_max * bn_max, dtype=work, device=dev)  # score / P tile
    dp_buf = torch.empty(BH * bm_max * bn_max, dtype=work, device=dev)  # dP / dS tile
    hidden = None
    if key_padding_mask is not None:
        hidden = (~key_padding_mask).repeat_interleave(H, dim=0)[:, None, :]  # (B,S) -> (BH,1,S), True = absent
    if causal:  # col - row for every position of a tile: hidden where key index > query index
        col_minus_row = (torch.arange(bn_max, device=dev)[None, :]
                         - torch.arange(bm_max, device=dev)[:, None])  # (BLOCK_M,BLOCK_N)

    n_end = max(min(S, L + causal_offset), 0) if causal else S  # causal: keys no query sees get zero gradients
    for n0 in range(0, n_end, block_n):
        n1 = min(n0 + block_n, n_end)
        bn = n1 - n0
        K_j, V_j = K[:, n0:n1], V[:, n0:n1]  # (BH,bn,D), (BH,bn,Dv)
        dK_j = torch.zeros(BH, bn, D, dtype=work, device=dev)  # (BH,bn,D)
        dV_j = torch.zeros(BH, bn, Dv, dtype=work, device=dev)  # (BH,bn,Dv)
        # causal: query blocks ending before query n0 - offset see none of K_j
        first = max(n0 - causal_offset, 0) // block_m if causal else 0
        for i in range(first, len(m_starts)):
            m0 = m_starts[i]
            m1 = min(m0 + block_m, L)
            bm = m1 - m0
            hide = None if hidden is None else hidden[:, :, n0:n1]  # (BH,1,bn)
            if causal and n1 - 1 > m0 + causal_offset:  # some key of the block comes after some query: the diagonal
                diag = col_minus_row[:bm, :bn] > (m0 + causal_offset - n0)  # (bm,bn), True = key after query + offset
                hide = diag if hide is None else (hide | diag)  # (BH,bm,bn) or (bm,bn)
            _attn_bwd_dkdv(Q[:, m0:m1], K_j, V_j, dO[:, m0:m1], neg_lse2[:, m0:m1], neg_delta[:, m0:m1],
                           dK_j, dV_j, dQ_blocks[i],
                           qk_buf[: BH * bm * bn].view(BH, bm, bn), dp_buf[: BH * bm * bn].view(BH, bm, bn), hide)
        dK[:, n0:n1] = dK_j
        dV[:, n0:n1] = dV_j

    dQ = torch.cat(dQ_blocks, dim=1) if dQ_blocks else torch.zeros(BH, L, D, dtype=work, device=dev)  # (BH,L,D)
    dq = (dQ * scale).view(B, H, L, D).to(q.dtype)  # (BH,L,D) -> (B,H,L,D)
    dk = (dK * (1.0 / LOG2E)).view(B, H, S, D).to(k.dtype)  # dS^T (Q·scale·log2e) / log2e, (B,H,S,D)
    dv = dV.view(B, H, S, Dv).to(v.dtype)  # (BH,S,Dv) -> (B,H,S,Dv)
    return dq, dk, dv


__all__ = ["flash_attention_torch", "flash_attention_backward_torch", "naive_attention", "check_key_padding_mask",
           "overflow_error", "DEFAULT_BLOCK_M", "DEFAULT_BLOCK_N",
           "DEFAULT_BWD_BLOCK_M", "DEFAULT_BWD_BLOCK_N"]
