"""The 「它」 data set (attn_lib.models.it_data) and the tiny model trained on it (attn_lib.models.tiny_model)."""
import os
import subprocess
import sys

import torch

from attn_lib import KVCache
from attn_lib.models import it_data
from attn_lib.models import tiny_model


def test_data_splits_are_disjoint_and_deterministic():
    train, test = it_data.make_split("train", 3000), it_data.make_split("test", 1000)
    assert len(train) == 3000 and len(test) == 1000
    assert {ex.frame for ex in train}.isdisjoint({ex.frame for ex in test})
    assert {ex.tokens for ex in train}.isdisjoint({ex.tokens for ex in test})
    assert {ex.frame for ex in test} == set(it_data.HELD_OUT_FRAMES)
    assert it_data.make_split("test", 50) == test[:50]  # same seed, same sentences
    train_words = {t for ex in train for t in ex.tokens}
    assert {t for ex in test for t in ex.tokens} <= train_words  # held-out frames recombine seen words


def test_data_labels_are_right_and_position_alone_fails():
    test = it_data.make_split("test", 1000)
    for ex in test:
        assert ex.tokens[ex.it_index] == "它"
        verb = ex.tokens[ex.it_index + (2 if ex.form == "被" else 1)]
        assert it_data.VERB_CLASS[verb] == it_data.CLASS_OF[ex.target] != it_data.CLASS_OF[ex.other]
        objects = [t for t in ex.tokens if t in it_data.CLASS_OF]
        assert ex.target in objects[:2] and ex.other in objects[:2]
    first = sum(ex.tokens[2] == ex.target for ex in test) / len(test)
    nearest = sum([t for t in ex.tokens[: ex.it_index] if t in it_data.CLASS_OF][-1] == ex.target
                  for ex in test) / len(test)
    assert 0.4 < first < 0.6 and nearest < 0.6  # "the first object", "the nearest noun": near chance


# Trains chapter 10's model as the chapters do (one thread, set by the caller) and prints a digest
# of the losses and weights; run in fresh processes started with 1 and with 2 threads.
_TRAIN_ONE_THREAD = r"""
import hashlib, torch
from attn_lib.models import it_data
from attn_lib.models import tiny_model
started_with = torch.get_num_threads()
torch.set_num_threads(1)
model = tiny_model.build_model("rope", seed=0)
losses = tiny_model.train(model, it_data.encode(it_data.make_split("train", 3000)), steps=60)
h = hashlib.sha256(repr(losses).encode())
for p in model.parameters():
    h.update(p.detach().numpy().tobytes())
print(started_with, torch.get_num_threads(), h.hexdigest())
"""


def test_training_with_one_thread_is_bit_identical_whatever_the_process_started_with():
    runs = {}
    for threads in (1, 2):
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        r = subprocess.run([sys.executable, "-c", _TRAIN_ONE_THREAD], env=env, capture_output=True, text=True,
                           timeout=600, check=True)
        started_with, during, digest = r.stdout.split()
        assert (started_with, during) == (str(threads), "1")
        runs[threads] = digest
    assert runs[1] == runs[2]  # bit-identical losses and weights


def test_tiny_model_learns_and_changes_no_thread_count():
    data = it_data.encode(it_data.make_split("train", 3000))
    test = it_data.encode(it_data.make_split("test", 1000))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # as the chapters do
        model = tiny_model.build_model("rope", seed=0)
        tiny_model.train(model, data)
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        assert tiny_model.accuracy(model, test) > 0.9
        assert tiny_model.accuracy(tiny_model.without_head(model, 0), test) < 0.8
        tiny_model.train(tiny_model.build_model("none", seed=1), data, steps=2)
        assert torch.get_num_threads() == 2  # train / predict leave the process's thread count alone
    finally:
        torch.set_num_threads(before)


def test_rotary_layer_keeps_no_state_between_calls():
    torch.manual_seed(3)
    layer = tiny_model.RotaryMultiHeadAttention(8, 2, is_causal=True).double()
    before = dict(vars(layer))
    cache = KVCache()
    layer(torch.randn(1, 2, 8, dtype=torch.float64), kv_cache=cache)
    layer(torch.randn(1, 1, 8, dtype=torch.float64), kv_cache=cache)
    assert vars(layer).keys() == before.keys() and not hasattr(type(layer), "_offset")
    assert all(vars(layer)[k] is v for k, v in before.items() if not isinstance(v, dict))


def test_tiny_model_trains_zero_steps():
    data = it_data.encode(it_data.make_split("train", 8))
    assert tiny_model.train(tiny_model.build_model("rope"), data, steps=0) == []
