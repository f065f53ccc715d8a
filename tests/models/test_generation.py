"""attn_lib.models.generation (attn_lib.generate): with and without the KV cache, greedy and seeded sampling.

The model is chapter 13's, trained for a few steps only (its logits are far from uniform, so
ties cannot hide a difference); over reruns and thread counts: tests/models/test_tiny_lm.py; bad input:
tests/topics/test_bad_input.py.
"""
from __future__ import annotations

import copy

import pytest
import torch

from attn_lib import KVCache, generate
from attn_lib.models import lm_data
from attn_lib.models import tiny_lm
from attn_lib.tolerances import assert_close

PROMPT = ["<bos>", "桌上", "有", "一杯", "水", "和", "一本", "书", "，", "它", "被"]


@pytest.fixture(scope="module")
def model():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        m = tiny_lm.build_lm(seed=0)
        tiny_lm.train_lm(m, lm_data.encode(lm_data.make_split("train", 500)), steps=30)
        yield m
    finally:
        torch.set_num_threads(before)


def _prompt(B=1):
    return torch.tensor([lm_data.encode_tokens(PROMPT)] * B)  # (B,L)


def _uncached_greedy(model, ids, n):
    """Greedy generation written out: rerun the whole sequence, append the argmax."""
    for _ in range(n):
        ids = torch.cat((ids, model(ids)[:, -1].argmax(-1, keepdim=True)), dim=1)  # (B,t) -> (B,t+1)
    return ids


def test_greedy_with_and_without_the_cache_gives_the_same_tokens(model):
    ids = _prompt(2)
    cached, plain = generate(model, ids, 12), generate(model, ids, 12, kv_cache=False)
    assert cached.shape == (2, len(PROMPT) + 12)
    assert torch.equal(cached, plain) and torch.equal(cached, _uncached_greedy(model, ids, 12))
    assert torch.equal(cached[:, : len(PROMPT)], ids)  # the prompt comes back unchanged


def test_cached_steps_give_the_logits_of_a_full_forward(model):
    out = generate(model, _prompt(), 6)  # (1,L+6)
    caches, L = [KVCache() for _ in model.blocks], len(PROMPT)
    with torch.no_grad():  # decoding is inference
        steps = [model(out[:, :L], caches)[:, -1]] + [model(out[:, t - 1:t], caches)[:, -1]
                                                      for t in range(L + 1, L + 6)]
    full = model(out[:, :-1])[:, L - 1:]  # (1,6,V): the logits that chose each new token
    assert_close(torch.stack(steps, dim=1), full, dtype="float64")
    assert torch.equal(torch.stack(steps, dim=1).argmax(-1), out[:, L:])


def test_seeded_sampling_is_the_same_with_and_without_the_cache(model):
    ids = _prompt(3)
    runs = [generate(model, ids, 10, kv_cache=kv, temperature=1.0, generator=torch.Generator().manual_seed(7))
            for kv in (True, False, True)]
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])
    assert len({tuple(row.tolist()) for row in runs[0]}) > 1  # the three sequences differ: it samples
    other = generate(model, ids, 10, temperature=1.0, generator=torch.Generator().manual_seed(8))
    assert not torch.equal(other, runs[0])
    cold = generate(model, ids, 10, temperature=1e-4, generator=torch.Generator().manual_seed(7))
    assert torch.equal(cold, generate(model, ids, 10))  # a temperature near 0 samples the argmax


def test_sampling_draws_from_softmax_over_temperature(model):
    """Each step's draw is torch.multinomial on softmax(logits / T) with the given generator."""
    ids, T = _prompt(), 0.7
    out = generate(model, ids, 5, temperature=T, generator=torch.Generator().manual_seed(3))
    g, seq = torch.Generator().manual_seed(3), ids
    for _ in range(5):
        probs = torch.softmax(model(seq)[:, -1] / T, dim=-1)  # (1,V)
        seq = torch.cat((seq, torch.multinomial(probs, 1, generator=g)), dim=1)  # (1,t) -> (1,t+1)
    assert torch.equal(out, seq)


def test_a_1d_prompt_a_batch_and_zero_new_tokens(model):
    one = generate(model, _prompt()[0], 5)
    assert one.shape == (len(PROMPT) + 5,) and torch.equal(one, generate(model, _prompt(), 5)[0])
    other = torch.tensor([lm_data.encode_tokens(["<bos>", "柜子上", "有", "电脑", "跟", "饼干", "，", "它", "被",
                                                 "吃光", "了"])])
    both = generate(model, torch.cat((_prompt(), other)), 4)
    assert torch.equal(both[1:], generate(model, other, 4))  # each sequence of a batch as if alone
    assert torch.equal(generate(model, _prompt(), 0), _prompt())


def test_trace_counts_the_work_and_the_cache(model):
    L, N, B = len(PROMPT), 5, 2
    H = sum(b.attn.num_heads for b in model.blocks)
    H_kv, D = model.blocks[0].attn.num_kv_heads, model.blocks[0].attn.head_dim
    cached, plain = [], []
    generate(model, _prompt(B), N, trace=cached)
    generate(model, _prompt(B), N, kv_cache=False, trace=plain)
    assert [s["step"] for s in cached] == list(range(N))
    assert [(s["queries"], s["keys"]) for s in cached] == [(L, L)] + [(1, L + t) for t in range(1, N)]
    assert [(s["queries"], s["keys"]) for s in plain] == [(L + t, L + t) for t in range(N)]
    assert [s["qk_products"] for s in cached] == [B * H * L * L] + [B * H * (L + t) for t in range(1, N)]
    assert [s["qk_products"] for s in plain] == [B * H * (L + t) ** 2 for t in range(N)]
    layers = len(model.blocks)
    assert [s["cache_numbers"] for s in cached] == [layers * 2 * B * H_kv * (L + t) * D for t in range(N)]
    assert all(s["cache_numbers"] == 0 for s in plain)


def test_generate_leaves_the_model_unchanged(model):
    before = [p.detach().clone() for p in model.parameters()]
    generate(model, _prompt(), 3, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not model.training and torch.is_grad_enabled()  # no_grad only inside generate


@pytest.mark.parametrize("temperature", [1e-40, 1e-300])
def test_a_vanishing_temperature_in_float32_samples_the_argmax(model, temperature):
    """logits / T overflows for a tiny T (inf / inf = nan in a plain softmax): the draw still takes the argmax."""
    small = copy.deepcopy(model).float()
    ids = _prompt(2)
    cold = generate(small, ids, 8, temperature=temperature, generator=torch.Generator().manual_seed(7))
    greedy = generate(small, ids, 8)
    assert torch.equal(cold, greedy) and torch.equal(greedy, _uncached_greedy(small, ids, 8))
