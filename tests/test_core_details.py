"""Details of the core modules that the mutation run (mutmut, see pyproject's [tool.mutmut])
found untested: each test asserts a behaviour a reader relies on, against an independent answer.
"""
from __future__ import annotations

import pytest
import torch

import attn_lib
from attn_lib.tolerances import assert_close


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# --- softmax.naive_softmax: the axis, on square and non-square inputs --------------------------
@pytest.mark.parametrize("shape,dim", [((3, 3), 0), ((3, 3), -1), ((3, 3), 1), ((2, 5), 0), ((2, 5), -1),
                                       ((4, 1, 3), 0), ((4, 1, 3), 1), ((4, 1, 3), -1)])
def test_naive_softmax_normalises_along_dim(shape, dim):
    x = _x(*shape)
    assert_close(attn_lib.naive_softmax(x, dim), torch.softmax(x, dim), dtype="float64", what="naive_softmax")
    assert_close(attn_lib.naive_softmax(x), torch.softmax(x, -1), dtype="float64", what="naive_softmax default dim")


# --- online_softmax_update: which argument is wrong, and every shape mismatch ------------------
@pytest.mark.parametrize("bad", ["m", "l", "piece"])
def test_online_softmax_update_names_the_bad_argument(bad):
    args = {"m": torch.zeros(2), "l": torch.zeros(2), "piece": torch.zeros(2, 3)}
    args[bad] = [0.0]
    with pytest.raises(TypeError, match=rf"^{bad} must be a torch.Tensor, got list"):
        attn_lib.online_softmax_update(args["m"], args["l"], args["piece"])
    args[bad] = torch.zeros(2, 3, dtype=torch.long) if bad == "piece" else torch.zeros(2, dtype=torch.long)
    with pytest.raises(TypeError, match=rf"^{bad} must be a floating-point tensor"):
        attn_lib.online_softmax_update(args["m"], args["l"], args["piece"])


@pytest.mark.parametrize("m,l,piece", [
    ((2,), (3,), (2, 4)),  # m and l differ, piece fits m
    ((2,), (2,), ()),  # a 0-D piece
    ((2,), (2,), (3, 4)),  # piece's leading axes differ from m
])
def test_online_softmax_update_refuses_every_shape_mismatch(m, l, piece):
    with pytest.raises(ValueError, match=r"piece must have shape \(\.\.\., P\)"):
        attn_lib.online_softmax_update(torch.zeros(m), torch.zeros(l), torch.zeros(piece))


def test_online_softmax_update_one_step_by_hand():
    m, l = torch.tensor([1.0, float("-inf")]), torch.tensor([2.0, 0.0])
    piece = torch.tensor([[3.0, 0.0], [float("-inf"), float("-inf")]])
    m_new, l_new = attn_lib.online_softmax_update(m, l, piece)
    assert torch.equal(m_new, torch.tensor([3.0, float("-inf")]))
    expected = 2.0 * torch.exp(torch.tensor(1.0 - 3.0)) + 1.0 + torch.exp(torch.tensor(-3.0))
    assert_close(l_new[0], expected, dtype="float32")
    assert l_new[1] == 0


# --- the layers' printed form (what chapter 05 and 07 print) -----------------------------------
def test_layer_repr_names_sizes_and_a_non_default_backend():
    mha = repr(attn_lib.MultiHeadAttention(8, 2, is_causal=True))
    assert "d_model=8, num_heads=2, head_dim=4, is_causal=True\n" in mha and "backend" not in mha
    looped = repr(attn_lib.LoopedMultiHeadAttention(8, 4, backend="flash"))
    assert "d_model=8, num_heads=4, head_dim=2, is_causal=False, backend='flash'\n" in looped
    single = repr(attn_lib.SelfAttention(6, 4, 2, backend="flash"))
    assert "d_model=6, d_k=4, d_v=2, is_causal=False, backend='flash'\n" in single
    assert "backend" not in repr(attn_lib.SelfAttention(6))
