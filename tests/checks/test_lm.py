"""attn_lib.checks.lm: the doors of ``TinyLM.forward`` and ``generate``.

Each refusal is compared with its whole message; what a door lets through is run and compared with the
model's own forward over the whole sequence.
"""
import pytest
import torch

from attn_lib import KVCache
from attn_lib.models import lm_data, tiny_lm
from attn_lib.models.generation import generate
from attn_lib.tolerances import assert_close


@pytest.fixture(scope="module")
def model():
    return tiny_lm.build_lm(seed=0)  # float64, two blocks


def _message(call):
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    return str(info.value)


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex64, torch.float32])
def test_token_ids_must_hold_integers(model, dtype):
    ids = torch.ones(1, 2, dtype=dtype)
    assert _message(lambda: model(ids)) == f"ids must hold integers, got dtype {dtype}; convert with ids.long()"


def test_token_ids_must_lie_in_the_vocabulary(model):
    V = model.vocab_size
    for ids, bad in (([[0, V]], V), ([[V - 1, -1]], -1), ([[0, V + 3, 2]], V + 3)):
        assert _message(lambda: model(torch.tensor(ids))) == (
            f"ids must be token ids in 0..{V - 1} (the model's vocabulary), got {bad}; encode words with "
            "lm_data.encode_tokens")
    assert model(torch.tensor([[0, V - 1]])).shape == (1, 2, V)


def test_an_empty_sequence_is_a_forward_and_a_one_token_prompt_a_generation(model):
    assert model(torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0, model.vocab_size)
    out = generate(model, torch.tensor([lm_data.BOS_ID]), 2)
    with torch.no_grad():
        first = model(out[None, :1])[0, -1].argmax()  # greedy: the most likely token after the prompt
    assert out.shape == (3,) and out[0] == lm_data.BOS_ID and out[1] == first
    assert _message(lambda: generate(model, torch.zeros(1, 0, dtype=torch.long), 2)) == (
        "prompt_ids must hold at least 1 token(s) per sequence, got shape (1, 0); start the prompt with lm_data.BOS_ID")


def test_need_weights_is_named_when_it_is_not_a_flag(model):
    assert _message(lambda: model(torch.tensor([[1, 2]]), need_weights="yes")) == (
        "need_weights must be True or False, got 'yes'")


def test_kv_caches_words_each_mistake(model):
    ids = torch.tensor([[1, 2]])
    assert _message(lambda: model(ids, KVCache())) == (
        "kv_caches must be a list of 2 attn_lib.KVCache (one per block) or None, got KVCache; "
        "e.g. kv_caches=[KVCache() for _ in model.blocks]")
    assert _message(lambda: model(ids, [KVCache()])) == (
        "kv_caches must be 2 distinct attn_lib.KVCache, one per block, got 1 with 1 distinct; "
        "e.g. kv_caches=[KVCache() for _ in model.blocks]")


def test_a_batch_decodes_with_its_caches_whatever_its_length(model):
    """The caches hold a batch of B = 2: the next tokens of those two sequences (one each, so L = 1 != B)
    continue them; a batch of one sequence is refused by the cache's batch rule."""
    ids = torch.tensor([[1, 5, 6], [1, 7, 8]])
    caches = [KVCache() for _ in model.blocks]
    with torch.no_grad():
        model(ids[:, :2], caches)
        step = model(ids[:, 2:], caches)  # (B,1,V)
        whole = model(ids)  # (B,3,V)
    assert_close(step, whole[:, 2:], dtype=torch.float64)
    assert _message(lambda: model(torch.tensor([[3]]), caches)).startswith(
        "the cache holds a batch of B=2 sequences but the new keys have B=1")
