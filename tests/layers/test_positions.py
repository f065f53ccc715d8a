"""attn_lib.layers.positions: the sinusoidal table and RoPE (``apply_rotary``, checked; ``rotate``, its unchecked core).

Every check compares against an answer computed independently: the sinusoidal formula with Python's math
module, RoPE as a multiplication of complex numbers. (RoPE inside a layer and a KV cache:
tests/models/test_tiny_model.py and tests/layers/test_kv_cache.py; bad input: tests/topics/test_bad_input.py.)
"""
from __future__ import annotations

import math

import pytest
import torch

import attn_lib
from attn_lib import apply_rotary, sinusoidal_positions
from attn_lib.layers.positions import rotate
from attn_lib.tolerances import assert_close, tolerance

from attn_paths import DISTINGUISHABLE

F64 = tolerance("float64")  # rtol / atol of float64 results against an exact float64 answer


def test_the_position_functions_are_exported():
    for name in ("sinusoidal_positions", "apply_rotary"):
        assert name in attn_lib.__all__ and hasattr(attn_lib, name)


# --- sinusoidal_positions -------------------------------------------------------------------

@pytest.mark.parametrize("L,d", [(1, 1), (7, 4), (50, 16), (9, 7)])
def test_sinusoidal_positions_match_the_formula(L, d):
    got = sinusoidal_positions(L, d, dtype=torch.float64)
    assert got.shape == (L, d)
    for pos in range(L):
        for col in range(d):
            i2 = col - col % 2  # 2i
            angle = pos / 10000.0 ** (i2 / d)
            want = math.sin(angle) if col % 2 == 0 else math.cos(angle)
            assert abs(float(got[pos, col]) - want) <= F64["atol"] + F64["rtol"] * abs(want), (pos, col)


def test_sinusoidal_positions_base_and_dtype():
    assert sinusoidal_positions(3, 4).dtype == torch.float32
    got = sinusoidal_positions(5, 2, base=100.0, dtype=torch.float64)
    # column 0: frequency 1 whatever the base
    assert_close(got[3, 0], torch.tensor(math.sin(3.0), dtype=torch.float64), dtype="float64")
    assert sinusoidal_positions(0, 4).shape == (0, 4)


def test_sinusoidal_positions_take_any_positive_base():
    got = sinusoidal_positions(3, 4, base=0.5, dtype=torch.float64)  # a base below 1 is finite and > 0
    for pos in range(3):
        angle = pos / 0.5 ** (2 / 4)  # column 2: 2i = 2 of d = 4
        assert abs(float(got[pos, 2]) - math.sin(angle)) <= F64["atol"] + F64["rtol"], pos
        assert abs(float(got[pos, 3]) - math.cos(angle)) <= F64["atol"] + F64["rtol"], pos


# --- apply_rotary and rotate ------------------------------------------------------------------

def _rope_complex(x, positions, base=10000.0):
    """Independent RoPE: pairs (2i, 2i+1) as complex numbers times e^{i m theta_i}."""
    B, H, L, D = x.shape
    z = torch.view_as_complex(x.double().reshape(B, H, L, D // 2, 2).contiguous())  # (B,H,L,D/2)
    theta = torch.tensor([base ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)  # (D/2,)
    pos = torch.as_tensor(positions, dtype=torch.float64)
    rot = torch.exp(1j * (pos[..., None] * theta).to(torch.complex128))  # (L,D/2) or (B,L,D/2)
    if rot.ndim == 3:
        rot = rot[:, None]  # (B,1,L,D/2)
    return torch.view_as_real(z * rot).reshape(B, H, L, D)


def test_apply_rotary_matches_complex_multiplication(rng):
    x = torch.randn(2, 3, 5, 8, generator=rng, dtype=torch.float64)
    assert_close(apply_rotary(x), _rope_complex(x, torch.arange(5)))
    pos = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    assert_close(apply_rotary(x, pos, base=500.0), _rope_complex(x, pos, base=500.0))


def test_rotate_is_the_same_rotation_without_the_checks(rng):
    x = torch.randn(2, 3, 5, 8, generator=rng, dtype=torch.float64)
    pos = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    assert_close(rotate(x, pos, 500.0), _rope_complex(x, pos, base=500.0))
    assert_close(rotate(x, None, 10000.0), _rope_complex(x, torch.arange(5)))  # None: positions 0 .. L-1
    x32 = x.float()
    got = rotate(x32, torch.arange(7, 12), 10000.0)
    assert got.dtype == torch.float32
    assert_close(got, _rope_complex(x32, torch.arange(7, 12)), dtype=torch.float32)


def test_apply_rotary_preserves_norms(rng):
    x = torch.randn(2, 2, 7, 6, generator=rng, dtype=torch.float64)
    y = apply_rotary(x, torch.arange(10, 17))
    assert_close(y.norm(dim=-1), x.norm(dim=-1), dtype=torch.float64)
    assert (y - x).abs().max() > DISTINGUISHABLE  # it did rotate


def test_apply_rotary_explicit_positions_equal_default(rng):
    x = torch.randn(1, 2, 6, 4, generator=rng)
    assert torch.equal(apply_rotary(x, list(range(6))), apply_rotary(x))
    assert torch.equal(apply_rotary(x, torch.arange(6)), apply_rotary(x))
    x64 = x.double()
    assert torch.equal(apply_rotary(x64, [0] * 6), x64)  # position 0: no rotation


@pytest.mark.parametrize("shift", [1, 5, 100])
def test_rotary_scores_depend_only_on_the_offset(rng, shift):
    q = torch.randn(1, 1, 1, 16, generator=rng, dtype=torch.float64)
    k = torch.randn(1, 1, 1, 16, generator=rng, dtype=torch.float64)
    for m, n in [(0, 0), (3, 1), (2, 7), (10, 4)]:
        s = (apply_rotary(q, [m]) * apply_rotary(k, [n])).sum()
        s_shifted = (apply_rotary(q, [m + shift]) * apply_rotary(k, [n + shift])).sum()
        assert_close(s_shifted, s, dtype="float64", what=f"score at ({m}, {n}) shifted by {shift}")
    # and it does depend on the offset
    s1 = (apply_rotary(q, [3]) * apply_rotary(k, [1])).sum()
    s2 = (apply_rotary(q, [3]) * apply_rotary(k, [2])).sum()
    assert abs(float(s1 - s2)) > DISTINGUISHABLE


@pytest.mark.parametrize("positions", [[2**63] * 5, [-2**53 - 1] * 5, torch.tensor([2**62] * 5)],
                         ids=["2**63 as ints", "just below -2**53", "2**62 as a tensor"])
def test_positions_beyond_what_float64_holds_exactly_are_refused(positions):
    with pytest.raises(ValueError, match=r"^positions must lie in -2\*\*53 \.\. 2\*\*53"):
        apply_rotary(torch.zeros(1, 1, 5, 4), positions)


def test_the_largest_exact_position_is_accepted():
    x = torch.randn(1, 1, 2, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert_close(apply_rotary(x, [2**53, -2**53]), _rope_complex(x, [2**53, -2**53]))


@pytest.mark.parametrize("positions", [
    [0, 1, 2],
    torch.tensor([0, 1, 2]),
    torch.tensor([[0, 1, 2], [5, 6, 7]], dtype=torch.int32),
], ids=["list", "tensor (L,)", "int32 tensor (B, L)"])
def test_apply_rotary_puts_the_positions_on_the_device_of_x(positions):
    meta = torch.device("meta")  # a device other than the CPU that every machine has
    x = torch.zeros(2, 1, 3, 4, device=meta)
    got = apply_rotary(x, positions)  # positions given on the CPU (or as a list)
    assert got.device == meta and got.shape == x.shape
