"""Chapter 10's tiny model with shared key/value heads (``num_kv_heads``).

The default is chapter 10's model, unchanged (the same weights from the same seed, the same
forward); ``num_kv_heads=1`` shares one key/value head between the two query heads, with a
smaller projection, and still learns; ``without_head`` removes one query head's contribution.
"""
import pytest
import torch

from attn_lib import count_parameters
from attn_lib.models import it_data
from attn_lib.models import tiny_model


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _batch(n=16):
    return it_data.encode(it_data.make_split("train", n, seed=0))


@pytest.mark.parametrize("positions", tiny_model.POSITION_KINDS)
def test_the_default_is_chapter_10s_model(positions):
    today, same = tiny_model.build_model(positions), tiny_model.build_model(positions, num_kv_heads=2)
    assert today.attn.num_kv_heads == 2 == today.attn.num_heads
    for (name, a), b in zip(today.state_dict().items(), same.state_dict().values()):
        assert torch.equal(a, b), name
    data = _batch()
    with torch.no_grad():
        la, sa = today(data["ids"], data["lengths"], data["it_index"])
        lb, sb = same(data["ids"], data["lengths"], data["it_index"])
    assert torch.equal(la, lb) and torch.equal(sa, sb)


def test_one_shared_key_value_head_shrinks_the_projection_and_still_learns():
    full, shared = tiny_model.build_model("rope"), tiny_model.build_model("rope", num_kv_heads=1)
    C, D = 32, 16
    assert shared.attn.qkv.weight.shape == (C + 2 * D, C)
    assert count_parameters(full) - count_parameters(shared) == 2 * D * (C + 1)  # one k and one v head fewer
    data = _batch(64)
    losses = tiny_model.train(shared, data, steps=40, batch_size=32)
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    _, scores = tiny_model.predict(shared, data)
    assert scores.shape[1] == 2  # two query heads, each with its own scores


def test_without_head_removes_one_query_heads_contribution_with_shared_heads():
    model = tiny_model.build_model("rope", num_kv_heads=1)
    data = _batch()
    args = (data["ids"], data["lengths"], data["it_index"])
    with torch.no_grad():
        logits, scores = model(*args)
        one = tiny_model.without_head(model, 0)
        l1, s1 = one(*args)
        both = tiny_model.without_head(one, 1)
        l2, s2 = both(*args)
    assert torch.equal(s1, scores) and torch.equal(s2, scores)  # the scores are untouched
    assert not torch.allclose(l1, logits)
    # with no head left, the attention output is out_proj's bias at every position: one answer for all
    constant = model.readout(model.attn.out_proj.bias)  # (n_objects,)
    assert torch.allclose(l2, constant.expand_as(l2))
    assert torch.equal(model.attn.out_proj.weight, tiny_model.build_model("rope", num_kv_heads=1).attn.out_proj.weight)


def test_without_head_is_the_same_either_way_when_nothing_is_shared():
    """Zeroing a head's value rows (chapter 10) and zeroing its out_proj columns give the same logits."""
    model = tiny_model.build_model("rope")
    data = _batch()
    args = (data["ids"], data["lengths"], data["it_index"])
    by_columns = tiny_model.build_model("rope")
    with torch.no_grad():
        by_columns.attn.out_proj.weight[:, 16:] = 0.0  # head 1's columns
        assert torch.allclose(tiny_model.without_head(model, 1)(*args)[0], by_columns(*args)[0],
                              rtol=1e-12, atol=1e-12)
