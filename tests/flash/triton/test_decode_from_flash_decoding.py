"""Moved verbatim from tests/kernels/test_flash_decoding.py (its Triton kernel tests), for the Triton tests
to merge into tests/flash/triton/test_decode.py; written for the old API (flash_decoding's old implicit
causal rule: add is_causal=True), not yet migrated.

flash_decoding (chapter 13, attn_lib.flash.decoding): the split-KV decode step against the float64 reference.

The answer key is ``attn_lib.core.reference.attention`` (float64) given a bool mask built here row by row
from the rule written out (entry b, query i sees keys 0 .. n_b - L + i), not from the code under test.
Cases: L in {1, 3}; S in {1, 17, 1000, 4099}; ragged cache_seqlens holding 0, 1 and S_max; num_splits
in {1, 2, 3, 8, more than there are key blocks}; GQA (6/2), MQA (8/1) and H_kv = H; float16 / bfloat16
within the 2x rule; merge_partials on numbers against one softmax; choose_num_splits' rule; every bad
input with its exception type and key words; the Triton backend's side of the interface (a stand-in
module records the call) and, once attn_lib.flash.triton.decode exists, the kernels themselves (interpreter).
"""
from __future__ import annotations

import importlib.util
import math
import re
import sys
import types

import pytest
import torch

pytest.skip("moved verbatim, written for the old API: to be merged into the Triton tests", allow_module_level=True)

import attn_lib
from attn_lib import flash_decoding, merge_partials
from attn_lib.rules.numerics import OVERFLOW_MESSAGE
from attn_lib.flash.decoding import DECODE_BLOCK_N, choose_num_splits, split_bounds
from attn_lib.costs.io_model import largest_tensor
from attn_lib.core.reference import attention
from attn_lib.tolerances import assert_close, assert_flash_rule

HAS_TRITON_DECODE = importlib.util.find_spec("triton") is not None and \
    importlib.util.find_spec("attn_lib.flash.triton.decode") is not None
D, DV = 8, 5


def _inputs(B, H, H_kv, L, S, *, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)  # (B,H,L,D)
    k = torch.randn(B, H_kv, S, D, generator=g, dtype=torch.float64)  # (B,H_kv,S,D)
    v = torch.randn(B, H_kv, S, DV, generator=g, dtype=torch.float64)  # (B,H_kv,S,Dv)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _answer_key(q, k, v, lengths):
    """float64 reference with the visible keys written out: entry b, query i sees keys 0 .. n_b - L + i."""
    B, H, L, _ = q.shape
    S = k.shape[2]
    mask = torch.zeros(B, 1, L, S, dtype=torch.bool)  # (B,1,L,S)
    for b, n in enumerate(lengths):
        for i in range(L):
            mask[b, 0, i, : max(n - L + i + 1, 0)] = True  # the last L of n positions, bottom-right
    out, _ = attention(q.double(), k.double(), v.double(), mask=mask, enable_gqa=True)
    return out  # (B,H,L,Dv); a row that sees no key: zeros


def _lengths(B, S):
    """Ragged lengths with 0, 1 and S_max (and one in between)."""
    return [0, 1, S, S // 2 + 1][:B]


@pytest.mark.skipif(not HAS_TRITON_DECODE, reason="attn_lib.flash.triton.decode (branch s18-dtr) is not merged yet")
@pytest.mark.parametrize("L,S,splits", [(1, 17, 2), (3, 300, 3)])
def test_triton_kernels_equal_the_reference(L, S, splits):
    q, k, v = _inputs(3, 6, 2, L, S, seed=4)
    lengths = _lengths(3, S)
    out = flash_decoding(q.float(), k.float(), v.float(), cache_seqlens=torch.tensor(lengths), num_splits=splits,
                         enable_gqa=True, backend="triton")
    assert out.dtype == torch.float32
    assert_close(out, _answer_key(q.float(), k.float(), v.float(), lengths), dtype=torch.float32)


@pytest.mark.skipif(not HAS_TRITON_DECODE, reason="attn_lib.flash.triton.decode (branch s18-dtr) is not merged yet")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_triton_overflow_raises_the_one_message():
    q, k, v = _inputs(2, 4, 2, 1, 40, seed=9, dtype=torch.float32)
    with pytest.raises(ValueError, match=re.escape(OVERFLOW_MESSAGE)):
        flash_decoding(q, k, v, cache_seqlens=torch.tensor([40, 0]), enable_gqa=True, scale=3e38, backend="triton")
