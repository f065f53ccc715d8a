"""Chapter 13's corpus (attn_lib.models.lm_data) and tiny causal language model (attn_lib.models.tiny_lm).

The model is trained once for the module (chapter 13's experiment, one thread, about 15 s);
generation with and without the cache: test_generate.py; bad input:
tests/contracts/test_bad_input.py.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest
import torch

from attn_lib import KVCache, generate
from attn_lib.models import it_data
from attn_lib.models import lm_data
from attn_lib.models import tiny_lm
from attn_lib.tolerances import assert_close


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


# --- the corpus ----------------------------------------------------------------------------------

def test_splits_use_disjoint_frames_and_are_deterministic():
    train, test = lm_data.make_split("train", 3000), lm_data.make_split("test", 500)
    assert len({s.tokens for s in train}) == 3000 and len({s.tokens for s in test}) == 500
    assert {s.frame for s in train} == set(it_data.TRAIN_FRAMES)
    assert {s.frame for s in test} == set(it_data.HELD_OUT_FRAMES)
    assert lm_data.make_split("test", 40) == test[:40]
    train_words = {t for s in train for t in s.tokens}
    assert {t for s in test for t in s.tokens} <= train_words  # held-out frames recombine seen words
    assert set(lm_data.MEASURE_WORDS.values()) <= train_words
    with_measure = sum(any(t in lm_data.MEASURE_WORDS.values() for t in s.tokens) for s in train) / len(train)
    assert 0.4 < with_measure < 0.6


def test_sentences_read_as_chapter_10s_templates():
    for s in lm_data.make_split("train", 500):
        assert s.tokens[0] == lm_data.BOS and s.tokens[-1] == "。"
        place, exist = s.tokens[1], s.tokens[2]
        assert (place, exist) == s.frame[:2] and s.frame[2] in s.tokens
        objects = [t for t in s.tokens if t in it_data.CLASS_OF]
        assert tuple(objects[:2]) == s.objects and len(objects) == 2 + s.distractor
        for i, t in enumerate(s.tokens):  # a measure word always stands right before its own object
            if t in set(lm_data.MEASURE_WORDS.values()):
                assert lm_data.MEASURE_WORDS[s.tokens[i + 1]] == t
        it = s.tokens.index("它")
        assert s.tokens[it + (2 if s.form == "被" else 1)] == s.verb
        assert lm_data.fits(s.verb, s.objects)
        if s.distractor:  # the third object never fits 它's verb
            assert not lm_data.fits(s.verb, objects[2:])


def test_prompts_are_held_out_sentence_starts():
    prompts = lm_data.completion_prompts("test", 300)
    train_prefixes = {s.tokens[:k] for s in lm_data.make_split("train", 3000) for k in range(1, len(s.tokens) + 1)}
    assert len({p.tokens for p in prompts}) == 300
    assert 0.35 < sum(p.distractor for p in prompts) / 300 < 0.65
    for p in prompts:
        assert p.tokens[0] == lm_data.BOS and p.tokens[-2:] == ("它", "被")
        assert tuple(t for t in p.tokens if t in it_data.CLASS_OF)[:2] == p.objects
        assert (p.tokens[1], p.tokens[2]) in {f[:2] for f in it_data.HELD_OUT_FRAMES}
        assert p.tokens not in train_prefixes  # a prompt the model never read
    assert prompts[0].text == "".join(prompts[0].tokens[1:])
    assert lm_data.completion_prompts("test", 10) == prompts[:10]


def test_prompt_roles_mark_the_objects_the_distractor_and_the_last_two_tokens():
    for p in lm_data.completion_prompts("test", 200):
        roles = lm_data.prompt_roles(p)
        assert len(roles) == len(p.tokens) and roles[-2:] == ["it", "bei"]
        assert tuple(t for t, r in zip(p.tokens, roles) if r == "object") == p.objects
        measure = [t for t, r in zip(p.tokens, roles) if r == "measure_word"]
        assert measure in ([], [lm_data.MEASURE_WORDS[o] for o in p.objects])
        distractor = [t for t, r in zip(p.tokens, roles) if r == "distractor"]
        assert len(distractor) == (2 + bool(measure) if p.distractor else 0)
        if p.distractor:  # its verb fits its own object, not the listed ones
            verb, obj = distractor[0], distractor[-1]
            assert lm_data.fits(verb, [obj]) and not lm_data.fits(verb, p.objects)
        assert set(roles) <= set(lm_data.PROMPT_ROLES)


def test_tokenize_splits_every_sentence_into_its_words():
    for s in lm_data.make_split("train", 1000) + lm_data.make_split("test", 300):
        assert lm_data.tokenize(s.text) == list(s.tokens[1:])
    assert lm_data.tokenize("桌上有一杯水和一本书，它被") == ["桌上", "有", "一杯", "水", "和", "一本", "书", "，", "它", "被"]
    assert lm_data.tokenize("") == []
    ids = lm_data.encode_text("桌上有一杯水和一本书，它被")
    assert ids.dtype == torch.int64 and lm_data.decode(ids) == ["<bos>", *lm_data.tokenize("桌上有一杯水和一本书，它被")]


def test_encode_decode_and_fits():
    tokens = ["<bos>", "桌上", "有", "一杯", "水", "和", "一本", "书", "，", "它", "被"]
    ids = lm_data.encode_tokens(tokens)
    assert lm_data.decode(ids) == tokens == lm_data.decode(torch.tensor(ids))
    assert len(set(lm_data.VOCAB)) == len(lm_data.VOCAB) and lm_data.VOCAB[:2] == ("<pad>", "<bos>")
    data = lm_data.encode(lm_data.make_split("train", 5))
    assert data["ids"].shape == (5, int(data["lengths"].max()))
    assert (data["ids"][:, 0] == lm_data.BOS_ID).all()
    assert lm_data.fits("打翻", ("水", "书")) and lm_data.fits("读完", ("水", "书"))
    assert not lm_data.fits("关掉", ("水", "书")) and not lm_data.fits("了", ("水", "书"))
    fitting = [v for v in lm_data.VERBS if lm_data.fits(v, ("水", "书"))]
    assert sorted(fitting) == sorted(["打翻", "洒", "读完", "撕破"])


def test_bigram_baseline_is_the_most_frequent_word_after_bei():
    train = lm_data.make_split("train", 3000)
    after = Counter(s.verb for s in train if s.form == "被")  # 被 is always followed by 它's verb
    verb = lm_data.bigram_after(train)
    assert after[verb] == max(after.values()) and verb in lm_data.VERBS
    prompts = lm_data.completion_prompts("test", 500)
    _, rate = tiny_lm.baseline_rate(train, prompts)
    assert rate == sum(lm_data.fits(verb, p.objects) for p in prompts) / 500
    assert 0.4 < rate < 0.6  # the verb's class is one of the two listed classes about half of the time


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
    assert (a[:, 6:] - b[:, 6:]).abs().max() > 1e-3  # the changed positions do change


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
