"""第 13 章（逐字生成）：让小语言模型一个词一个词地写下去，带或不带 KV 缓存，结果一样。

    caches = [KVCache() for _ in model.blocks]
    logits = model(prompt, caches)            prefill: the whole prompt in one call
    for each new token:
        next = argmax(logits[:, -1])          greedy (or sampled at a temperature > 0)
        logits = model(next, caches)          decode step: one query per sequence, S cached keys

Without the cache every step reruns the whole sequence so far: L = S = t queries and keys at
step t, t² query·key products per head and layer, against t with the cache, which holds
2·B·H_kv·t·D numbers per layer instead. Both give the same logits up to rounding, hence the
same tokens (tests/models/test_generation.py). ``trace=`` records, per step, the counts taken
from the tensors of that step. ``generate`` checks its arguments once, at its door
(``attn_lib.checks.lm.check_generate_call``), and runs the model's unchecked forward
(``TinyLM._run``) at every step.
"""
from __future__ import annotations

import torch

from ..checks.lm import check_generate_call
from ..layers.kv_cache import KVCache
from .tiny_lm import TinyLM


def _next_token(logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    """logits (B, V) -> the next token ids (B, 1): argmax, or a draw from softmax(logits / T).

    The draw shifts each row by its maximum before dividing by T, in float64: the largest logit
    becomes exp(0) = 1, so a tiny T (1e-40) gives the argmax instead of inf / inf = nan.
    """
    if temperature == 0.0:
        return logits.argmax(-1, keepdim=True)  # (B,V) -> (B,1)
    z = logits.double()  # (B,V)
    probs = torch.softmax((z - z.amax(-1, keepdim=True)) / temperature, dim=-1)  # (B,V), every row finite
    return torch.multinomial(probs, 1, generator=generator)  # (B,V) -> (B,1)


def _record(trace, model, step: int, queries: int, keys: int, batch: int, caches) -> None:
    """Append one step's counts: query·key products (all blocks and heads) and cached numbers."""
    heads = sum(block.attn.num_heads for block in model.blocks)
    trace.append({"step": step, "queries": queries, "keys": keys,
                  "qk_products": batch * heads * queries * keys,
                  "cache_numbers": 0 if caches is None else sum(c.numel() for c in caches)})


@torch.no_grad()
def generate(model, prompt_ids: torch.Tensor, max_new_tokens: int, *, kv_cache: bool = True,
             temperature: float = 0.0, generator: torch.Generator | None = None, trace: list | None = None):
    """逐字生成：先把提示整段算一遍，再一步写一个词；默认贪心，temperature > 0 时按种子采样。

    Args:
        model: an ``attn_lib.models.tiny_lm.TinyLM``.
        prompt_ids: (B, L) or (L,) token ids, L >= 1 (``lm_data.encode_tokens``).
        max_new_tokens: number of tokens to write (int >= 0).
        kv_cache: keep one ``KVCache`` per block, so a step computes only the new token
            (prefill: the prompt in one call); False reruns the whole sequence every step.
        temperature: 0 (default) takes the most likely token; T > 0 draws from
            softmax(logits / T) with ``generator`` (seeded sampling).
        generator: a ``torch.Generator`` for the draws (None: torch's global one).
        trace: optional list; each step (the prefill is step 0) appends a dict with
            ``queries`` L and ``keys`` S of that forward, ``qk_products`` = B·(sum of H over
            the blocks)·L·S, the query·key dot products it computes, and ``cache_numbers``,
            the numbers all caches hold after it (0 without the cache).

    Returns:
        (B, L + max_new_tokens) token ids (or (L + max_new_tokens,) for a 1-D prompt): the
        prompt, then the new tokens.
    """
    ids, max_new_tokens, temperature = check_generate_call(model, TinyLM, prompt_ids, max_new_tokens, kv_cache,
                                                            temperature, generator, trace)  # ids (B,L) int64
    one = prompt_ids.ndim == 1
    caches = [KVCache() for _ in model.blocks] if kv_cache else None
    new = ids  # what the next forward reads: the prompt, then one token per step with the cache
    for step in range(max_new_tokens):
        logits = model._run(new if kv_cache else ids, caches)  # (B,l,V): l = len(new) or the whole length
        if trace is not None:
            keys = ids.shape[1] if caches is None else len(caches[0])  # the keys this step attended over
            _record(trace, model, step, logits.shape[1], keys, ids.shape[0], caches)
        new = _next_token(logits[:, -1], temperature, generator)  # (B,l,V) -> (B,V) -> (B,1)
        ids = torch.cat((ids, new), dim=1)  # (B,t) + (B,1) -> (B,t+1)
    return ids[0] if one else ids  # (B,L+N), or (L+N,)


__all__ = ["generate"]
