"""Inputs and float64 references shared by the FlashAttention tests (torch tiled path and Triton)."""
import torch

import attn_lib


def make_inputs(B, H, L, S, D, Dv=None, *, seed=0, padding=False):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=gen, dtype=torch.float64)
    k = torch.randn(B, H, S, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H, S, Dv or D, generator=gen, dtype=torch.float64)
    kpm = None
    if padding:
        kpm = torch.rand(B, S, generator=gen) > 0.3  # True = key present
        kpm[0, 0] = False  # with causal, query 0 of sequence 0 then sees nothing
        if B > 1:
            kpm[-1] = False  # a sequence with no keys at all
    return q, k, v, kpm


def reference(q, k, v, kpm, causal, scale=None):
    mask = None if kpm is None else kpm[:, None, None, :]  # (B,S) -> (B,1,1,S)
    out, _ = attn_lib.attention(q, k, v, mask=mask, is_causal=causal, scale=scale)
    D = q.shape[-1]
    logits = (q @ k.transpose(-2, -1)) * (scale if scale is not None else D**-0.5)  # (B,H,L,S)
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    if causal:
        logits = logits.masked_fill(~attn_lib.causal_mask(q.shape[2], k.shape[2]), float("-inf"))
    return out, torch.logsumexp(logits, -1)  # (B,H,L,Dv), (B,H,L)
