"""Property-based tests (hypothesis): every attention path against the float64 reference.

Sizes, dtypes, causal flag, masks and seeds are drawn by hypothesis (profile "ci" by default,
HYPOTHESIS_PROFILE=long for a long local run; profiles are registered in conftest.py).
Tolerances come only from attn_lib.tolerances. The paths are listed in tests/attn_paths.py.
"""
from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

import attn_lib
from attn_lib.core import numpy_ref
from attn_lib.core.masks import causal_mask
from attn_lib.tolerances import assert_close

from attn_paths import (MODULES, PATHS, Case, cases, lse64, make_inputs, module_inputs, path_params, reference64,
                        reference_mask, run_path, run_path_with_lse)

PATH_NAMES = list(PATHS)
PATH_PARAMS = path_params(PATH_NAMES)
MODULE_NAMES = list(MODULES)
# The comparisons with the float64 reference run the profile's max_examples (200 in "ci");
# each invariant runs half as many (every path still gets 200 + 3 x 100 examples in "ci").
invariant = settings(max_examples=max(25, settings().max_examples // 2))
SCALES = (None, None, 0.5, 2.0)  # factors of the default scale 1/sqrt(D)


def _path_cases(path, **kw):
    opts = dict(dtypes=path.dtypes, mask_kinds=path.mask_kinds, max_len=path.max_len, max_d=path.max_d,
                scales=SCALES, blocks=path.blocks)
    opts.update(kw)
    return cases(**opts)


def _visible(case: Case, mask) -> torch.Tensor:
    """Bool (B, H, L, S): which key each query may see under the case's mask and causal flag."""
    vis = torch.ones(case.B, case.H, case.L, case.S, dtype=torch.bool)
    m = reference_mask(case, mask)
    if m is not None:
        vis = vis & (m if m.dtype == torch.bool else torch.isfinite(m))  # broadcast -> (B,H,L,S)
    if case.causal:
        vis = vis & causal_mask(case.L, case.S)  # (B,H,L,S) & (L,S)
    return vis


# ---------------------------------------------------------------------------------------------
# Every path against the float64 reference
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", PATH_PARAMS)
@given(data=st.data())
def test_path_matches_float64_reference(name, data):
    """Output (and, for the tiled paths, lse = log Σ_j exp(scale·q·k_j) over the visible keys,
    -inf if none) against float64, with the tolerance of the input dtype."""
    path = PATHS[name]
    case = data.draw(_path_cases(path), label="case")
    q, k, v, mask = make_inputs(case)
    if path.with_lse is not None:
        out, lse = run_path_with_lse(path, case, q, k, v, mask)
        assert lse.shape == (case.B, case.H, case.L)
        assert_close(lse, lse64(case, q, k, v, mask), dtype=lse.dtype, what=f"{name} log-sum-exp")
    else:
        out = run_path(path, case, q, k, v, mask)
    assert out.shape == (case.B, case.H, case.L, case.Dv)
    assert out.dtype == case.torch_dtype, f"{name} returned {out.dtype} for {case.dtype} input"
    assert_close(out, reference64(case, q, k, v, mask), dtype=case.dtype, what=f"{name} vs float64 reference")


@given(case=cases(dtypes=("float64",), scales=SCALES))
def test_reference_matches_torch_sdpa(case):
    """The oracle itself agrees with torch's own attention (mask and causal combined by hand)."""
    q, k, v, mask = make_inputs(case)
    vis = _visible(case, mask)
    bias = torch.zeros(vis.shape, dtype=torch.float64)
    if mask is not None and mask.is_floating_point():
        bias = bias + mask.masked_fill(torch.isinf(mask), 0.0)  # finite part of the additive mask
    attn_mask = bias.masked_fill(~vis, float("-inf"))  # (B,H,L,S)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=case.scale)
    expected = torch.nan_to_num(expected, nan=0.0)  # a query that sees nothing: ours is defined as 0
    out, scores = attn_lib.attention(q, k, v, mask=mask, is_causal=case.causal, scale=case.scale)
    assert_close(out, expected, dtype="float64", what="reference vs torch SDPA")
    assert torch.equal(scores > 0, vis & (scores > 0)), "a hidden key got a nonzero score"


# ---------------------------------------------------------------------------------------------
# Softmax
# ---------------------------------------------------------------------------------------------
_SOFTMAX_ELEMENTS = st.one_of(st.floats(-1e4, 1e4), st.floats(-30, 30), st.floats(-30, 30), st.just(-math.inf))


def _softmax_oracle(x64: np.ndarray, axis: int) -> np.ndarray:
    m = np.max(x64, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x64 - m)
    s = e.sum(axis=axis, keepdims=True)
    return e / np.where(s > 0, s, 1.0)


def _check_softmax(p: np.ndarray, x64: np.ndarray, axis: int, dtype: str) -> None:
    if x64.ndim == 0:  # a 0-D input is one row of length 1
        p, x64, axis = p.reshape(1), x64.reshape(1), 0
    assert p.shape == x64.shape
    assert np.isfinite(p).all() and (p >= 0).all()
    assert (p[np.isneginf(x64)] == 0).all(), "-inf must get proportion exactly 0"
    dead = np.isneginf(x64).all(axis=axis)
    sums = p.sum(axis=axis)
    assert (sums[dead] == 0).all(), "a row of only -inf must give all zeros"
    assert_close(sums[~dead], np.ones(sums[~dead].shape), dtype=dtype, what="rows that see a key sum to 1")
    assert_close(p, _softmax_oracle(x64, axis), dtype=dtype, what="softmax vs float64 oracle")


@given(x=arrays(np.float64, array_shapes(min_dims=0, max_dims=3, max_side=9), elements=_SOFTMAX_ELEMENTS),
       dtype=st.sampled_from(["float64", "float32", "float16", "bfloat16"]), data=st.data())
def test_torch_softmax_rows_sum_to_one_or_zero(x, dtype, data):
    dim = data.draw(st.integers(-max(x.ndim, 1), max(x.ndim, 1) - 1), label="dim")
    xt = torch.from_numpy(x).to(getattr(torch, dtype))
    p = attn_lib.softmax(xt, dim=dim)
    assert p.dtype == xt.dtype
    _check_softmax(p.double().numpy(), xt.double().numpy(), dim, dtype)


@given(x=arrays(np.float64, array_shapes(min_dims=0, max_dims=3, max_side=9), elements=_SOFTMAX_ELEMENTS),
       dtype=st.sampled_from(["float64", "float32", "float16"]), data=st.data())
def test_numpy_softmax_rows_sum_to_one_or_zero(x, dtype, data):
    dim = data.draw(st.integers(-max(x.ndim, 1), max(x.ndim, 1) - 1), label="dim")
    xn = x.astype(dtype)
    p = numpy_ref.softmax(xn, dim=dim)
    assert p.dtype == xn.dtype
    _check_softmax(p.astype(np.float64), xn.astype(np.float64), dim, dtype)


# ---------------------------------------------------------------------------------------------
# Online softmax: any split of the row gives the same result
# ---------------------------------------------------------------------------------------------
@st.composite
def splits_for(draw, n: int):
    """A block size (1 .. n + 2) or an explicit list of piece lengths summing to n."""
    if draw(st.booleans(), label="block size?"):
        return draw(st.integers(1, n + 2), label="block size")
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=n), label="cuts")) if n > 1 else []
    bounds = [0, *cuts, n] if n else []
    return [b - a for a, b in zip(bounds, bounds[1:])]


@given(x=arrays(np.float64, array_shapes(min_dims=1, max_dims=3, max_side=12), elements=_SOFTMAX_ELEMENTS),
       dtype=st.sampled_from(["float64", "float32", "float16", "bfloat16"]), data=st.data())
def test_online_softmax_over_any_split_equals_softmax(x, dtype, data):
    osm = importlib.import_module("attn_lib.core.online")

    S = x.shape[-1]
    splits = data.draw(splits_for(S), label="splits")
    xt = torch.from_numpy(x).to(getattr(torch, dtype))
    x64 = xt.double()
    p = osm.online_softmax(xt, splits)
    assert p.dtype == xt.dtype
    _check_softmax(p.double().numpy(), x64.numpy(), -1, dtype)
    work = "float64" if dtype == "float64" else "float32"  # m, l are kept in float32 for 16-bit input
    assert_close(osm.online_logsumexp(xt, splits), torch.logsumexp(x64, -1), dtype=work, what="online log-sum-exp")
    gen = torch.Generator().manual_seed(S)
    v = torch.randn(*x.shape, 3, generator=gen, dtype=torch.float64)  # (..., S, 3)
    expected = torch.from_numpy(_softmax_oracle(x64.numpy(), -1)).unsqueeze(-2) @ v  # (...,1,S) @ (...,S,3)
    assert_close(osm.online_weighted_sum(x64, v, splits), expected.squeeze(-2), dtype="float64",
                 what="online softmax(x) @ v")


# ---------------------------------------------------------------------------------------------
# Invariants, for every path that supports the needed inputs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", PATH_PARAMS)
@invariant
@given(data=st.data())
def test_permutation_equivariance(name, data):
    """Self-attention without a mask: permuting queries permutes outputs; permuting keys and
    values together changes nothing."""
    path = PATHS[name]
    dtypes = tuple(d for d in ("float64", "float32") if d in path.dtypes)
    case = data.draw(_path_cases(path, dtypes=dtypes, mask_kinds=("none",), causal=(False,), same_length=True),
                     label="case")
    q, k, v, _ = make_inputs(case)
    pq = torch.tensor(data.draw(st.permutations(range(case.L)), label="query permutation"), dtype=torch.long)
    pk = torch.tensor(data.draw(st.permutations(range(case.S)), label="key permutation"), dtype=torch.long)
    out = run_path(path, case, q, k, v, None)
    moved = run_path(path, case, q[:, :, pq], k[:, :, pk], v[:, :, pk], None)
    assert_close(moved, out[:, :, pq], dtype=case.dtype, what=f"{name}: permuted queries/keys")


@pytest.mark.parametrize("name", PATH_PARAMS)
@invariant
@given(data=st.data())
def test_hidden_keys_do_not_leak(name, data):
    """Changing the key and value at position j changes no output row that could not see j
    (causal: rows i < j; masks: rows whose mask hides j)."""
    path = PATHS[name]
    case = data.draw(_path_cases(path, dtypes=tuple(d for d in ("float64", "float32") if d in path.dtypes)),
                     label="case")
    assume(case.causal or case.mask_kind != "none")
    q, k, v, mask = make_inputs(case)
    hidden = ~_visible(case, mask)  # (B,H,L,S)
    candidates = [j for j in range(case.S) if bool(hidden[..., j].any())]  # keys some row cannot see
    assume(candidates)  # every example that runs tests at least one blind row
    j = data.draw(st.sampled_from(candidates), label="changed key")
    k2, v2 = k.clone(), v.clone()
    k2[:, :, j] = k2[:, :, j] * 3 + 1  # (B,H,D) changed key
    v2[:, :, j] = -v2[:, :, j] + 5  # (B,H,Dv) changed value
    blind = hidden[..., j]  # (B,H,L): rows that cannot see key j
    assert blind.any()
    out = run_path(path, case, q, k, v, mask)
    out2 = run_path(path, case, q, k2, v2, mask)
    assert_close(out2[blind], out[blind], dtype=case.dtype, what=f"{name}: rows blind to key {j}")


@pytest.mark.parametrize("name", path_params(n for n in PATH_NAMES if "additive" in PATHS[n].mask_kinds))
@invariant
@given(data=st.data())
def test_row_constant_shift_changes_nothing(name, data):
    """Adding one constant to every score of a row (additive mask (B, H, L, 1)) changes nothing,
    even for constants far beyond exp's range (-1e3 .. 1e3 in float64)."""
    path = PATHS[name]
    case = data.draw(_path_cases(path, dtypes=("float64",), mask_kinds=("none", "additive")), label="case")
    q, k, v, mask = make_inputs(case)
    c = data.draw(arrays(np.float64, (case.B, case.H, case.L, 1), elements=st.floats(-1e3, 1e3)), label="shift")
    shifted = torch.from_numpy(c) + (mask if mask is not None else 0.0)  # (B,H,L,1) + mask -> (B,H,L,S) or (B,H,L,1)
    shifted_case = Case(**{**case.__dict__, "mask_kind": "additive", "mask_shape": tuple(shifted.shape)})
    out = run_path(path, shifted_case, q, k, v, shifted)
    assert_close(out, reference64(case, q, k, v, mask), dtype="float64", what=f"{name}: row shift")


# ---------------------------------------------------------------------------------------------
# Layers (multi-head fused / looped, single-head self-attention) against float64 recomputation
# ---------------------------------------------------------------------------------------------
@st.composite
def module_cases(draw, mpath, *, dtypes=None, mask_kinds=("none", "bool", "additive"), causal=(False, True),
                 modes=None, scales=(None,)):
    modes = modes or (("self", "cross_kv", "cross_separate") if mpath.cross else ("self",))
    mode = draw(st.sampled_from(modes), label="mode")
    case = draw(cases(dtypes=dtypes or mpath.dtypes, max_h=4 if mpath.heads else 1, max_len=40, max_d=12,
                      mask_kinds=mask_kinds, causal=causal, scales=scales, same_length=(mode == "self"),
                      same_dv=mpath.heads), label="case")
    return case, mode


def _module_mask(case):
    return make_inputs(case)[3]


@pytest.mark.parametrize("name", MODULE_NAMES)
@given(data=st.data())
def test_module_matches_float64_reference(name, data):
    mpath = MODULES[name]
    case, mode = data.draw(module_cases(mpath))
    layer = mpath.build(case)
    xq, xk, xv = module_inputs(case, mode)
    mask = _module_mask(case)
    out = mpath.forward(layer, xq, xk, xv, mask)
    assert out.dtype == case.torch_dtype and out.shape[:2] == (case.B, case.L)
    assert_close(out, mpath.reference64(layer, xq, xk, xv, mask), dtype=case.dtype, what=f"{name} vs float64")


@pytest.mark.parametrize("name", MODULE_NAMES)
@invariant
@given(data=st.data())
def test_module_permutation_equivariance(name, data):
    """Self-attention without a mask: permuting the tokens permutes the outputs."""
    mpath = MODULES[name]
    case, mode = data.draw(module_cases(mpath, dtypes=("float64", "float32"), mask_kinds=("none",),
                                        causal=(False,), modes=("self",)))
    layer = mpath.build(case)
    x, _, _ = module_inputs(case, mode)
    perm = torch.tensor(data.draw(st.permutations(range(case.L)), label="permutation"), dtype=torch.long)
    out = mpath.forward(layer, x, None, None, None)
    assert_close(mpath.forward(layer, x[:, perm], None, None, None), out[:, perm], dtype=case.dtype,
                 what=f"{name}: permuted tokens")


@pytest.mark.parametrize("name", MODULE_NAMES)
@invariant
@given(data=st.data())
def test_module_hidden_keys_do_not_leak(name, data):
    """Changing token j's key/value input changes no output row that no head lets see j."""
    mpath = MODULES[name]
    case, mode = data.draw(module_cases(mpath, dtypes=("float64", "float32")))
    assume(case.causal or case.mask_kind != "none")
    layer = mpath.build(case)
    xq, xk, xv = module_inputs(case, mode)
    mask = _module_mask(case)
    blind_all = (~_visible(case, mask)).all(dim=1)  # (B,H,L,S) -> (B,L,S): blind in every head
    if mode == "self":  # token j changes its own query too: row j does not count
        blind_all = blind_all & ~torch.eye(case.L, case.S, dtype=torch.bool)
    candidates = [j for j in range(case.S) if bool(blind_all[..., j].any())]
    assume(candidates)  # every example that runs tests at least one blind row
    j = data.draw(st.sampled_from(candidates), label="changed token")
    blind = blind_all[..., j]  # (B,L)
    assert blind.any()
    if mode == "self":
        xq2, xk2, xv2 = xq.clone(), None, None
        xq2[:, j] = xq2[:, j] * 3 + 1  # token j changes its query too
    else:
        xq2, xk2 = xq, xk.clone()
        xk2[:, j] = xk2[:, j] * 3 + 1
        xv2 = None if xv is None else xv.clone()
        if xv2 is not None:
            xv2[:, j] = -xv2[:, j] + 5
    out = mpath.forward(layer, xq, xk, xv, mask)
    out2 = mpath.forward(layer, xq2, xk2, xv2, mask)
    assert_close(out2[blind], out[blind], dtype=case.dtype, what=f"{name}: rows blind to token {j}")


@pytest.mark.parametrize("name", MODULE_NAMES)
@invariant
@given(data=st.data())
def test_module_row_constant_shift_changes_nothing(name, data):
    mpath = MODULES[name]
    case, mode = data.draw(module_cases(mpath, dtypes=("float64",), mask_kinds=("none", "additive")))
    layer = mpath.build(case)
    xq, xk, xv = module_inputs(case, mode)
    mask = _module_mask(case)
    c = data.draw(arrays(np.float64, (case.B, case.H, case.L, 1), elements=st.floats(-1e3, 1e3)), label="shift")
    shifted = torch.from_numpy(c) + (mask if mask is not None else 0.0)  # (B,H,L,1) + mask
    assert_close(mpath.forward(layer, xq, xk, xv, shifted), mpath.reference64(layer, xq, xk, xv, mask),
                 dtype="float64", what=f"{name}: row shift")
