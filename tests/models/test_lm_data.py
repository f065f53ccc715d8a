"""attn_lib.models.lm_data: chapter 13's corpus: disjoint, deterministic splits that read as chapter 10's
templates, held-out completion prompts and their roles, the tokenizer, the encoding, which verbs fit."""
from __future__ import annotations

from collections import Counter

import torch

from attn_lib.models import it_data
from attn_lib.models import lm_data


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


def test_bigram_after_is_the_most_frequent_word_after_bei():
    train = lm_data.make_split("train", 3000)
    after = Counter(s.verb for s in train if s.form == "被")  # 被 is always followed by 它's verb
    verb = lm_data.bigram_after(train)
    assert after[verb] == max(after.values()) and verb in lm_data.VERBS
