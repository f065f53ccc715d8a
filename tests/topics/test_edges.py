"""Numerics at the edges, for every attention path (tests/attn_paths.py lists them).

Library decisions tested here (the same in every path):
- a query row that may see no key gets a zero output (and zero scores), never NaN;
- nan or +-inf in q, k or v raises ValueError (an additive float mask may hold -inf, which
  means "hidden", but not nan or +inf);
- L = 0 gives an empty output, S = 0 gives zeros;
- float16 / bfloat16 inputs are computed with float32 sums: no overflow or stuck sums where
  float32 would have none.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attn_lib
from attn_lib.core import numpy_ref
from attn_lib.tolerances import assert_close

from attn_paths import MODULES, PATHS, Case, make_inputs, module_inputs, path_params, reference64, run_path

PATH_NAMES = list(PATHS)
MODULE_NAMES = list(MODULES)


def _paths(dtype=None, mask_kind=None):
    return [n for n in PATH_NAMES
            if (dtype is None or dtype in PATHS[n].dtypes) and (mask_kind is None or mask_kind in PATHS[n].mask_kinds)]


# Small blocks, so that the tiled paths really tile (several query and key blocks, ragged ends).
EDGE_BLOCKS = {"tiled_cpu_flash": (4, 3), "triton_interpreter": (16, 16)}


def _case(name, **kw) -> Case:
    path = PATHS[name]
    bm, bn = EDGE_BLOCKS.get(name, (None, None)) if path.blocks is not None else (None, None)
    base = dict(B=2, H=2, L=min(9, path.max_len), S=min(11, path.max_len), D=min(8, path.max_d),
                Dv=min(5, path.max_d), seed=3, block_m=bm, block_n=bn)
    base.update(kw)
    return Case(**base)


def _dtype_params(names_for):
    return [(n, d) for d in ("float64", "float32", "float16", "bfloat16") for n in names_for(d)]


# ---------------------------------------------------------------------------------------------
# Magnitudes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,dtype", path_params(_dtype_params(lambda d: _paths(d) if d != "float64" else [])))
@pytest.mark.parametrize("causal", [False, True])
def test_huge_inputs_give_one_hot_rows(name, dtype, causal):
    """q, k ~ 1e4: scores ~ 1e8 * D, finite in float32 (float16 inputs of 1e4 still fit, their
    products do not: float32 sums keep them finite); each row's softmax is one-hot, so the
    output is the value of the best key, as in float64."""
    case = _case(name, dtype=dtype, causal=causal)
    q, k, v, _ = make_inputs(case, magnitude=1e4)
    v = v / 1e4  # unit-size values
    out = run_path(PATHS[name], case, q, k, v, None)
    assert torch.isfinite(out).all(), f"{name}: nan/inf for inputs of size 1e4"
    assert_close(out, reference64(case, q, k, v, None), dtype=dtype, what=f"{name} at 1e4")


@pytest.mark.parametrize("name", path_params(_paths("float16")))
def test_float16_scores_beyond_65504_do_not_overflow(name):
    """Each product q_d * k_d fits float16 (|x| <= 200 -> products <= 40000) but their sum over
    D = 16 reaches ~6e5 > 65504: with float32 sums the output is finite and right."""
    case = _case(name, dtype="float16", D=min(16, PATHS[name].max_d))
    gen = torch.Generator().manual_seed(0)
    q = (torch.rand(case.B, case.H, case.L, case.D, generator=gen) * 50 + 150).half()  # all in [150, 200]
    k = (torch.rand(case.B, case.H, case.S, case.D, generator=gen) * 50 + 150).half()
    v = torch.randn(case.B, case.H, case.S, case.Dv, generator=gen).half()
    assert (q.float() @ k.float().transpose(-2, -1)).max() > 65504  # the sum would overflow in float16
    out = run_path(PATHS[name], case, q, k, v, None)
    assert torch.isfinite(out).all(), f"{name}: float16 scores overflowed"
    assert_close(out, reference64(case, q, k, v, None), dtype="float16", what=f"{name}: large float16 scores")


@pytest.mark.parametrize("name,dtype", path_params([(n, d) for d, n_keys in (("float16", 2100), ("bfloat16", 300))
                                        for n in _paths(d)]))
def test_low_precision_sums_are_float32(name, dtype):
    """Equal scores over S keys: every weight is 1/S and the output is the mean value (1.0).
    A softmax denominator summed in float16 sticks at 2048 (bfloat16: 256) and would give ~S/2048."""
    S = 2100 if dtype == "float16" else 300
    case = _case(name, dtype=dtype, L=2, S=S, D=4, Dv=3)
    dt = case.torch_dtype
    q = torch.zeros(case.B, case.H, case.L, case.D, dtype=dt)
    k = torch.ones(case.B, case.H, case.S, case.D, dtype=dt)
    v = torch.ones(case.B, case.H, case.S, case.Dv, dtype=dt)
    out = run_path(PATHS[name], case, q, k, v, None)
    assert_close(out, torch.ones(out.shape, dtype=torch.float64), dtype=dtype, what=f"{name}: mean of {S} ones")


@pytest.mark.parametrize("name,dtype", path_params(_dtype_params(lambda d: _paths(d) if d != "float16" else [])))
def test_tiny_inputs(name, dtype):
    """q, k, v ~ 1e-30 (normal in float32/bfloat16): scores underflow to 0, weights are uniform,
    the output is the mean of v at the 1e-30 scale, with the dtype's relative tolerance."""
    case = _case(name, dtype=dtype)
    q, k, v, _ = make_inputs(case, magnitude=1e-30)
    out = run_path(PATHS[name], case, q, k, v, None)
    ref = reference64(case, q, k, v, None)
    assert (out != 0).any(), f"{name}: 1e-30 values were flushed to zero"
    assert_close(out.double() * 1e30, ref * 1e30, dtype=dtype, what=f"{name} at 1e-30 (scaled by 1e30)")


@pytest.mark.parametrize("name,dtype", path_params(_dtype_params(_paths)))
def test_equal_scores_give_uniform_weights(name, dtype):
    """Every key identical: all scores of a row are equal, the weights 1/S, the output mean(v)."""
    case = _case(name, dtype=dtype)
    q, k, v, _ = make_inputs(case)
    k = k[:, :, :1].expand_as(k).contiguous()  # (B,H,1,D) -> (B,H,S,D), every key the same
    out = run_path(PATHS[name], case, q, k, v, None)
    assert_close(out, v.double().mean(dim=2, keepdim=True).expand_as(out), dtype=dtype, what=f"{name}: mean(v)")


@pytest.mark.parametrize("lib", ["torch", "numpy"])
def test_equal_scores_weights_are_one_over_s(lib):
    q = np.zeros((1, 2, 3, 4))
    k = np.random.default_rng(0).standard_normal((1, 2, 7, 4))
    v = np.random.default_rng(1).standard_normal((1, 2, 7, 2))
    if lib == "torch":
        _, scores = attn_lib.attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v))
        scores = scores.numpy()
    else:
        _, scores = numpy_ref.attention(q, k, v)
    assert_close(scores, np.full(scores.shape, 1 / 7), dtype="float64", what=f"{lib}: weights of 7 equal scores")


# ---------------------------------------------------------------------------------------------
# Rows that may see no key
# ---------------------------------------------------------------------------------------------
def _dead_row_inputs(name, dtype, kind):
    """A mask that hides every key from some query rows (and nothing else special)."""
    case = _case(name, dtype=dtype, mask_kind=kind)
    q, k, v, _ = make_inputs(Case(**{**case.__dict__, "mask_kind": "none"}))
    if kind == "key_padding":
        mask = torch.ones(case.B, case.S, dtype=torch.bool)
        mask[0] = False  # (S,) batch element 0 may see no key at all
        dead = torch.zeros(case.B, case.H, case.L, dtype=torch.bool)
        dead[0] = True
    else:
        mask = torch.rand(case.B, case.H, case.L, case.S, generator=torch.Generator().manual_seed(1)) < 0.7
        mask[:, :, 1] = False  # query 1 of every (b, h) sees nothing
        mask[1, 0, 4] = False  # and one more row
        dead = ~mask.any(-1)  # (B,H,L)
        if kind == "additive":
            mask = torch.zeros(mask.shape, dtype=case.torch_dtype).masked_fill(~mask, float("-inf"))
    case = Case(**{**case.__dict__, "mask_shape": tuple(mask.shape)})
    return case, q, k, v, mask, dead


@pytest.mark.parametrize("name,dtype,kind", path_params([(n, d, kd) for d in ("float32", "float16", "bfloat16")
                                             for n in _paths(d) for kd in PATHS[n].mask_kinds if kd != "none"]))
def test_fully_masked_rows_are_zero(name, dtype, kind):
    case, q, k, v, mask, dead = _dead_row_inputs(name, dtype, kind)
    out = run_path(PATHS[name], case, q, k, v, mask)
    assert not torch.isnan(out).any(), f"{name}: NaN for a query that sees no key"
    assert (out[dead] == 0).all(), f"{name}: a query that sees no key must output exactly 0"
    assert_close(out, reference64(case, q, k, v, mask), dtype=dtype, what=f"{name} with fully masked rows")


@pytest.mark.parametrize("name", path_params(sorted(set(_paths(mask_kind="bool")) | set(_paths(mask_kind="key_padding")))))
def test_fully_masked_row_by_mask_and_causal(name):
    """Causal alone never hides all keys (query 0 sees key 0); with key 0 also masked out, it does."""
    kind = "bool" if "bool" in PATHS[name].mask_kinds else "key_padding"
    case = _case(name, causal=True)
    case = Case(**{**case.__dict__, "mask_kind": kind, "mask_shape": (case.S,) if kind == "bool" else (case.B, case.S)})
    q, k, v, _ = make_inputs(Case(**{**case.__dict__, "mask_kind": "none"}))
    mask = torch.ones(case.mask_shape, dtype=torch.bool)
    mask[..., 0] = False
    out = run_path(PATHS[name], case, q, k, v, mask)
    assert (out[:, :, 0] == 0).all() and not torch.isnan(out).any()
    assert_close(out, reference64(case, q, k, v, mask), dtype=case.dtype, what=f"{name}: mask + causal")


@pytest.mark.parametrize("lib", ["torch", "numpy"])
def test_fully_masked_scores_are_zero(lib):
    keep = np.ones((3, 4), dtype=bool)
    keep[2] = False
    q, k, v = (np.random.default_rng(i).standard_normal((1, 1, n, 4)) for i, n in enumerate((3, 4, 4)))
    if lib == "torch":
        out, scores = attn_lib.attention(*(torch.from_numpy(x) for x in (q, k, v)), mask=torch.from_numpy(keep))
        out, scores = out.numpy(), scores.numpy()
    else:
        out, scores = numpy_ref.attention(q, k, v, mask=keep)
    assert (scores[0, 0, 2] == 0).all() and (out[0, 0, 2] == 0).all()
    assert_close(scores[0, 0, :2].sum(-1), np.ones(2), dtype="float64", what=f"{lib}: rows that see keys sum to 1")


# ---------------------------------------------------------------------------------------------
# nan / inf in the input: every path raises
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", path_params(PATH_NAMES))
@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "+inf", "-inf"])
def test_nan_or_inf_input_raises(name, where, bad):
    case = _case(name)
    q, k, v, _ = make_inputs(case)
    tensors = {"q": q, "k": k, "v": v}
    tensors[where][0, 0, 1, 0] = bad
    # flash_decoding calls its k, v the caches: "k_cache contains nan or inf in the positions the step reads"
    with pytest.raises(ValueError, match=f"^{where}(_cache)? contains nan or inf"):
        run_path(PATHS[name], case, q, k, v, None)


@pytest.mark.parametrize("name", path_params(_paths(mask_kind="additive")))
@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "+inf"])
def test_nan_or_plus_inf_in_additive_mask_raises(name, bad):
    case = _case(name, mask_kind="additive", mask_shape=(9, 11))
    q, k, v, _ = make_inputs(case)
    mask = torch.zeros(case.L, case.S)
    mask[2, 3] = bad
    with pytest.raises(ValueError, match="may contain -inf .* not nan or \\+inf"):
        run_path(PATHS[name], case, q, k, v, mask)


# ---------------------------------------------------------------------------------------------
# Empty sequences
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", path_params(PATH_NAMES))
@pytest.mark.parametrize("causal", [False, True])
def test_no_queries_gives_empty_output(name, causal):
    case = _case(name, L=0, causal=causal)
    q, k, v, _ = make_inputs(case)
    out = run_path(PATHS[name], case, q, k, v, None)
    assert out.shape == (case.B, case.H, 0, case.Dv) and out.dtype == q.dtype


@pytest.mark.parametrize("name", path_params(PATH_NAMES))
@pytest.mark.parametrize("causal", [False, True])
def test_no_keys_gives_zeros(name, causal):
    case = _case(name, S=0, causal=causal)
    q, k, v, _ = make_inputs(case)
    out = run_path(PATHS[name], case, q, k, v, None)
    assert out.shape == (case.B, case.H, case.L, case.Dv) and out.dtype == q.dtype
    assert (out == 0).all()


@pytest.mark.parametrize("lib", ["torch", "numpy"])
def test_softmax_of_empty_axis(lib):
    if lib == "torch":
        p = attn_lib.softmax(torch.zeros(3, 0))
        assert p.shape == (3, 0)
    else:
        p = numpy_ref.softmax(np.zeros((3, 0)))
        assert p.shape == (3, 0)


# ---------------------------------------------------------------------------------------------
# The same edges for the layers (multi-head fused / looped, self-attention)
# ---------------------------------------------------------------------------------------------
def _module_case(name, **kw) -> Case:
    heads = MODULES[name].heads
    base = dict(B=2, H=2 if heads else 1, L=6, S=6, D=4, Dv=4 if heads else 3, seed=5)
    base.update(kw)
    return Case(**base)


@pytest.mark.parametrize("name", MODULE_NAMES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_module_huge_inputs(name, dtype):
    case = _module_case(name, dtype=dtype, causal=True)
    layer = MODULES[name].build(case)
    xq, xk, xv = module_inputs(case, "self", magnitude=1e4)
    out = MODULES[name].forward(layer, xq, xk, xv, None)
    assert torch.isfinite(out).all()
    ref = MODULES[name].reference64(layer, xq, xk, xv, None)
    assert_close(out.double() / 1e4, ref / 1e4, dtype=dtype, what=f"{name} at 1e4 (divided by 1e4)")


@pytest.mark.parametrize("name", MODULE_NAMES)
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_module_fully_masked_rows(name, kind):
    """A query that may see no key: attention gives 0, the layer gives what its output
    projection makes of 0 (the bias), never NaN; the scores of that row are all 0."""
    case = _module_case(name)
    layer = MODULES[name].build(case)
    xq, xk, xv = module_inputs(case, "self")
    keep = torch.ones(case.L, case.S, dtype=torch.bool)
    keep[2] = False  # query 2 sees nothing
    mask = keep if kind == "bool" else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    with torch.no_grad():
        out, scores = layer(xq, mask=mask, need_weights=True)
    assert not torch.isnan(out).any() and (scores[..., 2, :] == 0).all()
    assert_close(out, MODULES[name].reference64(layer, xq, xk, xv, mask), dtype="float32", what=f"{name} masked row")


@pytest.mark.parametrize("name", MODULE_NAMES)
@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
def test_module_nan_or_inf_input_raises(name, bad):
    case = _module_case(name)
    layer = MODULES[name].build(case)
    xq, xk, xv = module_inputs(case, "self")
    xq[0, 1, 0] = bad
    with pytest.raises(ValueError, match="contains nan or inf"):
        MODULES[name].forward(layer, xq, xk, xv, None)


@pytest.mark.parametrize("name", MODULE_NAMES)
def test_module_no_queries(name):
    case = _module_case(name, L=0, S=0)
    layer = MODULES[name].build(case)
    xq, xk, xv = module_inputs(case, "self")
    out = MODULES[name].forward(layer, xq, xk, xv, None)
    assert out.shape[:2] == (case.B, 0) and out.dtype == xq.dtype


@pytest.mark.parametrize("name", [n for n in MODULE_NAMES if MODULES[n].cross])
def test_module_no_keys(name):
    """Cross-attention with S = 0: attention gives 0, the layer gives its output bias."""
    case = _module_case(name, S=0)
    layer = MODULES[name].build(case)
    xq, xk, xv = module_inputs(case, "cross_kv")
    out = MODULES[name].forward(layer, xq, xk, xv, None)
    assert out.shape == (case.B, case.L, case.H * case.D) and not torch.isnan(out).any()
    assert_close(out, MODULES[name].reference64(layer, xq, xk, xv, None), dtype="float32", what=f"{name} S=0")
