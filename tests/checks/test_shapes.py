"""attn_lib.checks.shapes: the (B, H, L, D) shapes of q, k, v and the grouped-query head rule.

Each refusal is compared with its whole message, written out here.
"""
import pytest
import torch

import attn_lib
from attn_lib.checks.shapes import check_qkv_shapes


def _t(*shape):
    return torch.zeros(*shape)


@pytest.mark.parametrize("Bk,Bv", [(1, 2), (2, 1), (1, 1)])
def test_a_batch_size_that_differs_in_k_or_v_is_refused(Bk, Bv):
    with pytest.raises(ValueError) as info:
        attn_lib.attention(_t(2, 2, 3, 4), _t(Bk, 2, 5, 4), _t(Bv, 2, 5, 4))
    assert str(info.value) == (f"q, k and v must share batch and head sizes (B, H): q has (2, 2), k has ({Bk}, 2), "
                               f"v has ({Bv}, 2).")


def test_keys_without_heads_are_refused_with_the_head_counts_that_would_fit():
    with pytest.raises(ValueError) as info:
        check_qkv_shapes(_t(1, 6, 3, 4), _t(1, 0, 5, 4), _t(1, 0, 5, 4), enable_gqa=True)
    assert str(info.value) == ("k must have a number of heads H_kv that divides q's H=6 (query head h uses key/value "
                               "head h // (H // H_kv)), got H_kv=0; use one of [1, 2, 3, 6] key/value heads")


def test_queries_without_heads_take_no_key_heads():
    with pytest.raises(ValueError) as info:
        check_qkv_shapes(_t(1, 0, 3, 4), _t(1, 1, 5, 4), _t(1, 1, 5, 4), enable_gqa=True)
    assert str(info.value) == ("k must have a number of heads H_kv that divides q's H=0 (query head h uses key/value "
                               "head h // (H // H_kv)), got H_kv=1; use one of [1] key/value heads")
