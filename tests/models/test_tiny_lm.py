"""attn_lib.models.tiny_lm: chapter 13's tiny causal language model.

The model is trained once for the module (chapter 13's experiment, one thread, about 15 s); the corpus:
test_lm_data.py; generation with and without the cache: test_generation.py; bad input:
tests/topics/test_bad_input.py.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from attn_lib import KVCache, generate
from attn_lib.models import lm_data
from attn_lib.models import tiny_lm
from attn_lib.tolerances import assert_close

from attn_paths import DISTINGUISHABLE

PROMPT = ["<bos>", "桌上", "有", "一杯", "水", "和", "一本", "书", "，", "它", "被"]


@pytest.fixture(scope="module")
def experiment():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as the chapter does
    try:
        yield tiny_lm.run_lm_experiment(seed=0)
    finally:
        torch.set_num_threads(before)


def _ids(B=2, L=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, len(lm_data.VOCAB), (B, L), generator=g)  # (B,L)


# --- the model -----------------------------------------------------------------------------------

def test_shapes_and_parts():
    model = tiny_lm.build_lm(seed=0)
    ids = _ids(3, 9)
    logits, scores = model(ids, need_weights=True)
    assert logits.shape == (3, 9, len(lm_data.VOCAB)) and logits.dtype == torch.float64
    assert len(scores) == len(model.blocks) == 2
    for s in scores:
        assert s.shape == (3, model.blocks[0].attn.num_heads, 9, 9)
        assert_close(s.sum(-1), torch.ones(3, 4, 9, dtype=torch.float64), dtype="float64")
        assert (s.triu(1) == 0).all()  # causal: no weight on a later token
    assert_close(model(ids), logits, dtype="float64")
    assert torch.equal(model(ids.to(torch.int16)), model(ids))  # any integer dtype of token ids
    attn = model.blocks[0].attn
    assert attn.is_causal and attn.rotary and attn.num_kv_heads == 2
    x = torch.randn(2, 3, 32, dtype=torch.float64)
    expected = x / torch.sqrt((x * x).sum(-1, keepdim=True) / 32 + model.norm.eps)  # unit gain at initialisation
    assert_close(model.norm(x), expected, dtype="float64")
    assert model.norm.eps == 1e-6 and torch.equal(model.norm.weight, torch.ones(32, dtype=torch.float64))


def test_a_later_token_does_not_change_earlier_logits():
    model = tiny_lm.build_lm(seed=1)
    ids = _ids(2, 10, seed=1)
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 5) % len(lm_data.VOCAB)
    a, b = model(ids), model(changed)
    assert_close(a[:, :6], b[:, :6], dtype="float64")
    assert (a[:, 6:] - b[:, 6:]).abs().max() > DISTINGUISHABLE  # the changed positions do change


def test_a_block_is_the_pre_norm_residual_sum_of_its_parts():
    model = tiny_lm.build_lm(seed=3)
    block = model.blocks[0]
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        got, scores = block(x)
        h = x + block.attn(block.norm1(x))
        want = h + block.mlp.down(torch.nn.functional.gelu(block.mlp.up(block.norm2(h))))
    assert scores is None
    assert_close(got, want, dtype="float64")


def test_chunks_with_caches_equal_one_forward():
    model = tiny_lm.build_lm(seed=2)
    ids = _ids(2, 12, seed=2)
    full = model(ids)  # (B,L,V)
    caches = [KVCache() for _ in model.blocks]
    with torch.no_grad():  # decoding is inference (the decode steps refuse inputs that need gradients)
        parts = [model(ids[:, a:b], caches) for a, b in ((0, 5), (5, 6), (6, 7), (7, 12))]
    assert_close(torch.cat(parts, dim=1), full, dtype="float64")
    assert [c.seen for c in caches] == [12, 12]
    assert caches[0].keys.shape == (2, 2, 12, 8)  # the H_kv = 2 shared heads of D = 8


def test_a_bad_cache_leaves_every_cache_as_it_was():
    model, other = tiny_lm.build_lm(seed=0), tiny_lm.build_lm(seed=0)
    caches, foreign = [KVCache(), KVCache()], KVCache()
    with torch.no_grad():
        model(_ids(1, 3), caches)
        other(_ids(1, 2), [foreign, KVCache()])  # foreign now serves a layer of another model
        with pytest.raises(ValueError, match="kv_cache already serves another layer"):
            model(_ids(1, 1), [caches[0], foreign])
    assert [c.seen for c in caches] == [3, 3]  # block 0's cache did not grow before block 1 refused


def _fail_in_block_2(model, monkeypatch, how):
    """Make the second block's attention fail in the next forward (after block 1 stored its keys).

    Returns the error it raises, its message and a function that repairs the block.
    """
    attn = model.blocks[1].attn
    if how == "raises":
        def broken(*args):
            raise RuntimeError("block 2 failed")

        monkeypatch.setattr(attn, "_forward", broken)
        return RuntimeError, "block 2 failed", monkeypatch.undo
    saved = attn.qkv.weight.detach().clone()
    with torch.no_grad():
        attn.qkv.weight.mul_(1e160)  # q·k ~ 1e320: beyond float64
    return ValueError, "attention scores overflowed", lambda: attn.qkv.weight.data.copy_(saved)


@pytest.mark.parametrize("how", ["raises", "overflows"])
def test_a_forward_that_fails_in_block_2_leaves_every_cache_as_it_was(how, monkeypatch):
    model = tiny_lm.build_lm(seed=4)
    ids = _ids(2, 8, seed=4)
    caches = [KVCache() for _ in model.blocks]
    with torch.no_grad():
        model(ids[:, :5], caches)
        before = [(c.keys, c.values, c.seen, c.keys.clone(), c.values.clone()) for c in caches]
        error, message, repair = _fail_in_block_2(model, monkeypatch, how)
        with pytest.raises(error, match=message):
            model(ids[:, 5:7], caches)
        for c, (keys, values, seen, k_copy, v_copy) in zip(caches, before):
            assert c.keys is keys and c.values is values and c.seen == seen == 5  # block 1's store was undone
            assert torch.equal(c.keys, k_copy) and torch.equal(c.values, v_copy)
            assert c.owner is not None
        repair()
        retry = model(ids[:, 5:7], caches)  # the same input again, now that block 2 works
        full = model(ids[:, :7])
    assert_close(retry, full[:, 5:7], dtype="float64")
    assert [c.seen for c in caches] == [7, 7]


def test_baseline_rate_is_the_bigram_verbs_rate():
    train = lm_data.make_split("train", 3000)
    prompts = lm_data.completion_prompts("test", 500)
    verb, rate = tiny_lm.baseline_rate(train, prompts)
    assert verb == lm_data.bigram_after(train, "被")
    assert rate == sum(lm_data.fits(verb, p.objects) for p in prompts) / 500
    assert 0.4 < rate < 0.6  # the verb's class is one of the two listed classes about half of the time


# --- bfloat16 autocast --------------------------------------------------------------------------------

def test_generation_under_bfloat16_autocast_keeps_a_bfloat16_cache_and_the_same_tokens():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = tiny_lm.build_lm(seed=0)
        tiny_lm.train_lm(model, lm_data.encode(lm_data.make_split("train", 500)), steps=30)
    finally:
        torch.set_num_threads(before)
    model = model.float()
    ids = torch.tensor([lm_data.encode_tokens(PROMPT)] * 2)  # (B,L)
    L, N = ids.shape[1], 8
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cached = generate(model, ids, N)
        plain = generate(model, ids, N, kv_cache=False)
    assert torch.equal(cached, plain)
    caches = [KVCache() for _ in model.blocks]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        steps = [model(cached[:, :L], caches)[:, -1]] + [model(cached[:, t - 1:t], caches)[:, -1]
                                                          for t in range(L + 1, L + N)]
        full = model(cached[:, :-1])[:, L - 1:]  # (B,N,V): the logits that chose each new token
    steps = torch.stack(steps, dim=1)  # (B,N,V)
    assert steps.dtype == full.dtype == torch.bfloat16
    assert all(c.keys.dtype == c.values.dtype == torch.bfloat16 for c in caches)
    assert_close(steps, full, dtype=torch.bfloat16, what="cached logits under autocast")
    assert torch.equal(steps.argmax(-1), cached[:, L:])


# --- training and evaluation --------------------------------------------------------------------

def test_training_lowers_the_loss(experiment):
    losses = experiment["losses"]
    assert len(losses) == 300
    assert sum(losses[-20:]) / 20 < 0.3 * losses[0]


def test_completion_rate_beats_the_baseline_on_held_out_prompts(experiment):
    rate, base = experiment["rate"], experiment["baseline_rate"]
    assert rate > 0.9 and base < 0.6 and rate > base + 0.3
    prompts = experiment["prompts"]
    verbs = tiny_lm.complete_verbs(experiment["model"], prompts)
    assert set(verbs) <= set(lm_data.VERBS)  # after 被 the model writes a verb
    assert rate == sum(lm_data.fits(v, p.objects) for v, p in zip(verbs, prompts)) / len(prompts)
    for p, v in zip(prompts[:20], verbs):  # the batched completion is generate's first token, prompt by prompt
        assert lm_data.decode(generate(experiment["model"], torch.tensor(lm_data.encode_tokens(p.tokens)), 1))[-1] == v
    for distractor in (False, True):  # also when a third object with a fitting verb comes in between
        assert tiny_lm.completion_rate(experiment["model"], [p for p in prompts if p.distractor == distractor]) > 0.85


def test_verb_step_attention_is_the_last_row_of_the_scores(experiment):
    model, prompt = experiment["model"], experiment["prompts"][0]
    weights = tiny_lm.verb_step_attention(model, prompt)
    L = len(prompt.tokens)
    assert weights.shape == (2, 4, L)
    assert_close(weights.sum(-1), torch.ones(2, 4, dtype=torch.float64), dtype="float64")
    _, scores = model(torch.tensor([lm_data.encode_tokens(prompt.tokens)]), need_weights=True)
    assert torch.equal(weights[1], scores[1][0, :, -1])
    assert torch.equal(tiny_lm.verb_step_attention(model, list(prompt.tokens)), weights)


# Trains chapter 13's model for a few steps with one thread (set by the caller, as the chapter
# does), generates greedily and with seeded sampling, prints a digest, then generates again with
# the threads the process started with; run in fresh processes started with 1 and with 2 threads
# (two runs: also a rerun).
_TRAIN_AND_GENERATE = r"""
import hashlib, torch
from attn_lib import generate
from attn_lib.models import lm_data
from attn_lib.models import tiny_lm
started_with = torch.get_num_threads()
torch.set_num_threads(1)
model = tiny_lm.build_lm(seed=0)
losses = tiny_lm.train_lm(model, lm_data.encode(lm_data.make_split("train", 3000)), steps=20)
prompt = torch.tensor(lm_data.encode_tokens(lm_data.completion_prompts("test", 1)[0].tokens))
def tokens():
    g = torch.Generator().manual_seed(5)
    return [generate(model, prompt, 6).tolist(), generate(model, prompt, 6, temperature=1.0, generator=g).tolist()]
out = tokens()
h = hashlib.sha256(repr((losses, out)).encode())
for p in model.parameters():
    h.update(p.detach().numpy().tobytes())
during = torch.get_num_threads()
torch.set_num_threads(started_with)
print(started_with, during, h.hexdigest(), tokens() == out)  # the tokens also with the process's threads
"""


def test_training_and_generation_are_identical_over_reruns_and_thread_counts():
    runs = []
    for threads in (1, 2):
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        r = subprocess.run([sys.executable, "-c", _TRAIN_AND_GENERATE], env=env, capture_output=True, text=True,
                           timeout=600, check=True)
        started_with, during, digest, same_tokens = r.stdout.split()
        assert (started_with, during, same_tokens) == (str(threads), "1", "True")
        runs.append(digest)
    assert runs[0] == runs[1]  # bit-identical losses, weights and tokens


def test_attention_by_role_sums_the_verb_step_by_role(experiment):
    model, prompts = experiment["model"], experiment["prompts"][:60]
    by_role = tiny_lm.verb_step_attention_by_role(model, prompts)
    assert by_role.shape == (2, 4, len(lm_data.PROMPT_ROLES))
    assert_close(by_role.sum(-1), torch.ones(2, 4, dtype=torch.float64), dtype="float64")
    one = tiny_lm.verb_step_attention_by_role(model, prompts[:1])
    w, roles = tiny_lm.verb_step_attention(model, prompts[0]), lm_data.prompt_roles(prompts[0])
    objects = [j for j, r in enumerate(roles) if r == "object"]
    assert_close(one[..., lm_data.PROMPT_ROLES.index("object")], w[..., objects].sum(-1), dtype="float64")
    # the trained model: a head of the last block that writes the verb looks mostly at the two objects
    assert by_role[-1, :, lm_data.PROMPT_ROLES.index("object")].max() > 0.5
