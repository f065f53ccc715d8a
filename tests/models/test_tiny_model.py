"""attn_lib.models.tiny_model: chapter 10's tiny model (TinyItModel) and its RoPE attention layer
(RotaryMultiHeadAttention).

The rotary layer against plain torch written here (RoPE as complex multiplication, K/V repeated per query
head); decoding it with a KV cache equals one forward; the model trains bit-identically whatever thread
count the process started with, learns the task, and with shared key/value heads (``num_kv_heads``) keeps
chapter 10's default; ``without_head`` removes one query head's contribution.
"""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import attn_lib
from attn_lib import KVCache, count_parameters
from attn_lib.models import it_data
from attn_lib.models import tiny_model
from attn_lib.models.tiny_model import RotaryMultiHeadAttention
from attn_lib.tolerances import assert_close

from attn_paths import DISTINGUISHABLE, visible_band


@pytest.fixture
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _batch(n=16):
    return it_data.encode(it_data.make_split("train", n, seed=0))


def _rope_complex(x, base=10000.0):
    """RoPE at positions 0 .. L-1: pairs (2i, 2i+1) as complex numbers times e^{i m theta_i}."""
    B, H, L, D = x.shape
    z = torch.view_as_complex(x.double().reshape(B, H, L, D // 2, 2).contiguous())  # (B,H,L,D/2)
    theta = torch.tensor([base ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)  # (D/2,)
    rot = torch.exp(1j * (torch.arange(L, dtype=torch.float64)[:, None] * theta).to(torch.complex128))  # (L,D/2)
    return torch.view_as_real(z * rot).reshape(B, H, L, D).to(x.dtype)


def _rotary_oracle(layer, x, *, is_causal, window):
    """Plain torch: project, rotate q and k, repeat K/V per query head, softmax over the visible keys, merge."""
    C, H, H_kv, D = layer.d_model, layer.num_heads, layer.num_kv_heads, layer.head_dim
    W, b = layer.qkv.weight, layer.qkv.bias
    q = (x @ W[:C].T + b[:C]).unflatten(-1, (H, D)).transpose(1, 2)  # (B,H,L,D)
    k = (x @ W[C:C + H_kv * D].T + b[C:C + H_kv * D]).unflatten(-1, (H_kv, D)).transpose(1, 2)  # (B,H_kv,S,D)
    v = (x @ W[C + H_kv * D:].T + b[C + H_kv * D:]).unflatten(-1, (H_kv, D)).transpose(1, 2)  # (B,H_kv,S,D)
    q, k = _rope_complex(q), _rope_complex(k)
    k, v = k.repeat_interleave(H // H_kv, dim=1), v.repeat_interleave(H // H_kv, dim=1)  # (B,H,S,D)
    L = q.shape[2]
    logits = (q @ k.transpose(-2, -1) / D ** 0.5).masked_fill(~visible_band(L, L, is_causal, window), float("-inf"))
    p = torch.softmax(logits, -1)  # (B,H,L,S)
    return layer.out_proj((p @ v).transpose(1, 2).flatten(2)), p


# --- the rotary layer ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("H_kv, window", [(4, None), (2, (2, 0)), (1, None)])
def test_the_rotary_layer_equals_plain_torch_with_rope(H_kv, window):
    torch.manual_seed(0)
    layer = RotaryMultiHeadAttention(24, 4, num_kv_heads=H_kv, window_size=window, is_causal=True,
                                     backend="reference").double()
    x = torch.randn(2, 6, 24, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        out, scores = layer(x, need_weights=True)
        want, p = _rotary_oracle(layer, x, is_causal=True, window=window)
    assert_close(out, want, dtype=torch.float64, what="rope output")
    assert_close(scores, p, dtype=torch.float64, what="rope scores")


def test_the_rotary_layer_with_a_cache_equals_its_full_forward(rng):
    torch.manual_seed(3)
    layer = RotaryMultiHeadAttention(8, 2, is_causal=True).double()
    x = torch.randn(2, 9, 8, generator=rng, dtype=torch.float64)
    cache = KVCache()
    steps = [layer(x[:, t:t + 1], kv_cache=cache) for t in range(9)]
    assert_close(torch.cat(steps, dim=1), layer(x), dtype=torch.float64)


def test_rotary_layer_keeps_no_state_between_calls():
    torch.manual_seed(3)
    layer = RotaryMultiHeadAttention(8, 2, is_causal=True).double()
    before = dict(vars(layer))
    cache = KVCache()
    layer(torch.randn(1, 2, 8, dtype=torch.float64), kv_cache=cache)
    layer(torch.randn(1, 1, 8, dtype=torch.float64), kv_cache=cache)
    assert vars(layer).keys() == before.keys() and not hasattr(type(layer), "_offset")
    assert all(vars(layer)[k] is v for k, v in before.items() if not isinstance(v, dict))


def test_num_kv_heads_equal_to_num_heads_is_todays_rotary_layer():
    torch.manual_seed(0)
    today = RotaryMultiHeadAttention(24, 4, is_causal=True).double()
    torch.manual_seed(0)
    same = RotaryMultiHeadAttention(24, 4, num_kv_heads=4, window_size=None, is_causal=True).double()
    for (name, a), b in zip(same.state_dict().items(), today.state_dict().values()):
        assert torch.equal(a, b), name
    x = torch.randn(2, 5, 24, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(same(x), today(x))
    assert repr(same) == repr(today)


# --- the model: positions, training ------------------------------------------------------------------------

def _tiny(positions, max_len):
    torch.manual_seed(0)
    return tiny_model.TinyItModel(len(it_data.VOCAB), len(it_data.OBJECTS), positions=positions, max_len=max_len)


def test_tiny_model_takes_a_sentence_as_long_as_its_position_table():
    model = _tiny("sinusoidal", 5)
    scores, weights = model(torch.zeros(2, 5, dtype=torch.int64), torch.tensor([5, 4]), torch.tensor([0, 1]))
    assert scores.shape == (2, len(it_data.OBJECTS)) and weights.shape[-2:] == (5, 5)
    assert (weights[1, :, :, 4] == 0).all()  # the second sentence's padding gets no weight


def test_a_rope_tiny_model_has_no_position_table_to_outgrow():
    model = _tiny("rope", 4)  # max_len sizes only the sinusoidal table
    scores, weights = model(torch.zeros(2, 6, dtype=torch.int64), torch.tensor([6, 6]), torch.tensor([0, 1]))
    assert scores.shape == (2, len(it_data.OBJECTS)) and weights.shape[-2:] == (6, 6)


def test_train_takes_a_learning_rate_below_one_and_returns_one_loss_per_step():
    data = it_data.encode(it_data.make_split("train", 8))
    losses = tiny_model.train(_tiny("sinusoidal", 64), data, steps=2, batch_size=4, lr=0.5)
    assert len(losses) == 2 and all(isinstance(v, float) and math.isfinite(v) for v in losses)
    assert tiny_model.train(_tiny("sinusoidal", 64), data, steps=0, batch_size=1, lr=3) == []  # an int lr, no step


def test_the_model_modules_are_exported():
    assert {"it_data", "tiny_model"} <= set(attn_lib.__all__)
    assert attn_lib.tiny_model is tiny_model and attn_lib.it_data is it_data


def test_tiny_model_trains_zero_steps():
    data = it_data.encode(it_data.make_split("train", 8))
    assert tiny_model.train(tiny_model.build_model("rope"), data, steps=0) == []


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


# --- shared key/value heads and without_head -----------------------------------------------------------------

@pytest.mark.parametrize("positions", tiny_model.POSITION_KINDS)
def test_the_default_is_chapter_10s_model(positions, one_thread):
    today, same = tiny_model.build_model(positions), tiny_model.build_model(positions, num_kv_heads=2)
    assert today.attn.num_kv_heads == 2 == today.attn.num_heads
    for (name, a), b in zip(today.state_dict().items(), same.state_dict().values()):
        assert torch.equal(a, b), name
    data = _batch()
    with torch.no_grad():
        la, sa = today(data["ids"], data["lengths"], data["it_index"])
        lb, sb = same(data["ids"], data["lengths"], data["it_index"])
    assert torch.equal(la, lb) and torch.equal(sa, sb)


def test_one_shared_key_value_head_shrinks_the_projection_and_still_learns(one_thread):
    full, shared = tiny_model.build_model("rope"), tiny_model.build_model("rope", num_kv_heads=1)
    C, D = 32, 16
    assert shared.attn.qkv.weight.shape == (C + 2 * D, C)
    assert count_parameters(full) - count_parameters(shared) == 2 * D * (C + 1)  # one k and one v head fewer
    data = _batch(64)
    losses = tiny_model.train(shared, data, steps=40, batch_size=32)
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    _, scores = tiny_model.predict(shared, data)
    assert scores.shape[1] == 2  # two query heads, each with its own scores


def test_without_head_removes_one_query_heads_contribution_with_shared_heads(one_thread):
    model = tiny_model.build_model("rope", num_kv_heads=1)
    data = _batch()
    args = (data["ids"], data["lengths"], data["it_index"])
    with torch.no_grad():
        logits, scores = model(*args)
        one = tiny_model.without_head(model, 0)
        l1, s1 = one(*args)
        both = tiny_model.without_head(one, 1)
        l2, s2 = both(*args)
        constant = model.readout(model.attn.out_proj.bias)  # (n_objects,)
    assert torch.equal(s1, scores) and torch.equal(s2, scores)  # the scores are untouched
    assert (l1 - logits).abs().max() > DISTINGUISHABLE
    # with no head left, the attention output is out_proj's bias at every position: one answer for all
    assert_close(l2, constant.expand_as(l2), dtype=torch.float64, what="no head left")
    assert torch.equal(model.attn.out_proj.weight, tiny_model.build_model("rope", num_kv_heads=1).attn.out_proj.weight)


def test_without_head_is_the_same_either_way_when_nothing_is_shared(one_thread):
    """Zeroing a head's value rows (chapter 10) and zeroing its out_proj columns give the same logits."""
    model = tiny_model.build_model("rope")
    data = _batch()
    args = (data["ids"], data["lengths"], data["it_index"])
    by_columns = tiny_model.build_model("rope")
    with torch.no_grad():
        by_columns.attn.out_proj.weight[:, 16:] = 0.0  # head 1's columns
        assert_close(tiny_model.without_head(model, 1)(*args)[0], by_columns(*args)[0], dtype=torch.float64)


@pytest.mark.parametrize("head", [np.int64(0), torch.tensor(0)], ids=["numpy int64", "torch int"])
def test_without_head_takes_an_integral_scalar(head, one_thread):
    model = tiny_model.build_model("rope")
    data = _batch()
    args = (data["ids"], data["lengths"], data["it_index"])
    with torch.no_grad():
        assert torch.equal(tiny_model.without_head(model, head)(*args)[0], tiny_model.without_head(model, 0)(*args)[0])


@pytest.mark.parametrize("head, error, message", [
    (0.0, TypeError, r"^head must be an int >= 0, got 0\.0 \(float\); use int\(0\.0\)"),
    (True, TypeError, r"^head must be an int >= 0, got True \(bool\)"),
    (2, ValueError, r"^head must be an int in 0\.\.1 \(the model has 2 heads\), got 2"),
])
def test_without_head_refuses_what_is_not_a_head(head, error, message):
    with pytest.raises(error, match=message):
        tiny_model.without_head(tiny_model.build_model("rope"), head)
