"""The shared names (attn_lib.rules.names) mean what the public functions do with them: the alignments
against torch's two causal masks, NO_WINDOW as "no window", the backend lists as what the entries take."""
import pytest
import torch
from torch.nn.attention.bias import causal_lower_right

import attn_lib
from attn_lib.checks.values import check_align, check_window_size
from attn_lib.rules.band import Band
from attn_lib.rules.names import ALIGNMENTS, BACKENDS, DEVICE_ENV, FLASH_BACKENDS, NO_WINDOW


@pytest.mark.filterwarnings("ignore:Lower right causal bias")  # torch warns for L > S (rows with no key)
@pytest.mark.parametrize("L,S", [(2, 5), (5, 2), (4, 4)])
def test_the_alignments_are_sdpa_top_left_then_flash_attn_bottom_right(L, S):
    top_left, bottom_right = ALIGNMENTS
    assert torch.equal(attn_lib.causal_mask(L, S, align=top_left), torch.ones(L, S, dtype=torch.bool).tril())
    assert torch.equal(attn_lib.causal_mask(L, S, align=bottom_right), causal_lower_right(L, S)._materialize())
    assert torch.equal(attn_lib.causal_mask(L, S), attn_lib.causal_mask(L, S, align=top_left))  # the default


def test_every_alignment_is_accepted_and_nothing_else():
    assert [check_align(a) for a in ALIGNMENTS] == list(ALIGNMENTS)
    for other in ("lower-right", "top_left", "TOP-LEFT"):
        with pytest.raises(ValueError, match="align must be"):
            check_align(other)


@pytest.mark.parametrize("L,S", [(3, 3), (2, 7), (7, 2)])
def test_no_window_limits_nothing(L, S):
    assert check_window_size(None) == NO_WINDOW
    assert Band.resolve(L, S, window_size=NO_WINDOW).full
    for align in ALIGNMENTS:
        assert bool(attn_lib.sliding_window_mask(L, S, window_size=NO_WINDOW, align=align).all())


def test_the_backend_lists():
    assert attn_lib.BACKENDS == BACKENDS
    assert set(FLASH_BACKENDS) <= set(BACKENDS)
    assert BACKENDS[0] == FLASH_BACKENDS[0] == "auto"  # the default of every entry
    q = torch.zeros(1, 1, 2, 4)
    for backend in FLASH_BACKENDS:
        if backend != "triton":  # triton needs its package; the choice is checked before that
            attn_lib.flash_attention(q, q, q, backend=backend)
    with pytest.raises(ValueError, match="backend must be one of"):
        attn_lib.flash_attention(q, q, q, backend="reference")  # a layer's backend, not flash_attention's


def test_device_env_is_the_documented_variable():
    assert DEVICE_ENV == "ATTN_LIB_DEVICE"  # the name the book tells readers to set
