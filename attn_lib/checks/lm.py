"""第 13 章（书中不单独讲）：小语言模型和 generate 的门，与其他入口同一套措辞。

``check_lm_call`` is ``TinyLM.forward``'s door and ``check_generate_call`` ``attn_lib.generate``'s
(one entry per call each: the blocks and the steps below them run unchecked): token ids, the
per-block KV caches, the prompts of the evaluation and the arguments of ``generate``
("<argument> must be <expected>, got <found>; <remedy>"; TypeError for a wrong type,
ValueError for a wrong value). The classes they test against (``TinyLM``, ``lm_data.Prompt``,
the layers' ``cache_type``) are passed in, so this package imports no model.
"""
from __future__ import annotations

import math
import numbers

import torch

from .heads import check_kv_cache
from .shapes import check_rank
from .values import check_bool, check_int


def check_token_ids(name: str, ids, vocab_size: int, *, min_length: int = 0) -> None:
    """词编号：(B, L) 的整数张量，每个值在 0 .. vocab_size - 1 之间，L >= min_length。"""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (B, L), got {type(ids).__name__}; "
                        "e.g. torch.tensor([lm_data.encode_tokens(tokens)])")
    check_rank(name, ids, 2, "(B, L)")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{name} must hold integers, got dtype {ids.dtype}; convert with {name}.long()")
    if ids.shape[1] < min_length:
        raise ValueError(f"{name} must hold at least {min_length} token(s) per sequence, got shape {tuple(ids.shape)}; "
                         "start the prompt with lm_data.BOS_ID")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise ValueError(f"{name} must be token ids in 0..{vocab_size - 1} (the model's vocabulary), got {bad}; "
                         "encode words with lm_data.encode_tokens")


def check_kv_caches(kv_caches, num_layers: int) -> None:
    """kv_caches：None，或每个块一个、互不相同的 KVCache（列表或元组）。"""
    if kv_caches is None:
        return
    if not isinstance(kv_caches, (list, tuple)):
        raise TypeError(f"kv_caches must be a list of {num_layers} attn_lib.KVCache (one per block) or None, "
                        f"got {type(kv_caches).__name__}; e.g. kv_caches=[KVCache() for _ in model.blocks]")
    if len(kv_caches) != num_layers or len({id(c) for c in kv_caches}) != len(kv_caches):
        raise ValueError(f"kv_caches must be {num_layers} distinct attn_lib.KVCache, one per block, got "
                         f"{len(kv_caches)} with {len({id(c) for c in kv_caches})} distinct; "
                         "e.g. kv_caches=[KVCache() for _ in model.blocks]")


def check_caches_fit(model, ids, kv_caches) -> None:
    """每个块的缓存都能接上这批词：类型、归属、批大小、精度、设备（在任何一层改动缓存之前查完）。"""
    if kv_caches is None:
        return
    for block, cache in zip(model.blocks, kv_caches):
        check_kv_cache(cache, block.attn, True, ids.shape[0], ids)
    seen = {c.seen for c in kv_caches}
    if len(seen) > 1:
        raise ValueError(f"kv_caches must all hold the same positions (one sequence, one cache per block), got "
                         f"seen={sorted(seen)}; reset them all before a new sequence")


def check_lm_call(model, ids, kv_caches, need_weights) -> None:
    """TinyLM.forward 的门（唯一一处）：词编号、每块一个缓存且都接得上、need_weights 是开关。"""
    check_token_ids("ids", ids, model.vocab_size)
    check_bool("need_weights", need_weights)
    check_kv_caches(kv_caches, len(model.blocks))
    check_caches_fit(model, ids, kv_caches)  # all of them before any block appends


def check_prompts(prompts, prompt_type) -> None:
    """评估用的提示：非空的 ``lm_data.Prompt``（prompt_type）列表。"""
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError(f"prompts must be a non-empty list of lm_data.Prompt, got {prompts!r:.60}; "
                         "use lm_data.completion_prompts()")
    for p in prompts:
        if not isinstance(p, prompt_type):
            raise TypeError(f"prompts must hold lm_data.Prompt, got {type(p).__name__}; "
                            "use lm_data.completion_prompts()")


def check_generate_call(model, model_type, prompt_ids, max_new_tokens, kv_cache, temperature, generator, trace):
    """generate 的门（唯一一处）：模型是 model_type（TinyLM），提示是词编号，max_new_tokens >= 0，kv_cache 是开关，temperature >= 0 有限，generator、trace 类型对。

    Returns:
        ``(ids (B, L) int64, max_new_tokens, temperature)``, the prompt as a batch.
    """
    if not isinstance(model, model_type):
        raise TypeError(f"model must be an attn_lib.models.tiny_lm.TinyLM, got {type(model).__name__}; "
                        "build one with tiny_lm.build_lm()")
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 0)
    check_bool("kv_cache", kv_cache)
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a number >= 0 (0 = greedy), got {temperature!r} "
                        f"({type(temperature).__name__})")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {temperature}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}; "
                        "e.g. generator=torch.Generator().manual_seed(0)")
    if trace is not None and not isinstance(trace, list):
        raise TypeError(f"trace must be a list or None, got {type(trace).__name__}; e.g. trace=[]")
    ids = prompt_ids[None] if isinstance(prompt_ids, torch.Tensor) and prompt_ids.ndim == 1 else prompt_ids  # (L,) -> (1,L)
    check_token_ids("prompt_ids", ids, model.vocab_size, min_length=1)
    return ids.long(), max_new_tokens, float(temperature)


__all__ = ["check_token_ids", "check_kv_caches", "check_caches_fit", "check_lm_call", "check_prompts",
           "check_generate_call"]
