"""Bad input table: every public function, each bad input, the error and the message it must give.

Each row: (id, call, exception type, regex the message must match). The messages name the
argument and show what was expected and what was found. This table is the one home of
bad-input checks: a new public function gets its rows here (test_every_public_function_has_a_row
says which are missing); a rule every layer or path keeps (flags are bools, every path refuses
nan) lives in test_layer_contract.py / test_edges.py instead.
"""
from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
import torch

import attn_lib
from attn_lib import (KVCache, LoopedMultiHeadAttention, MultiHeadAttention, SelfAttention, apply_rotary, causal_mask,
                      merge_heads, sinusoidal_positions, split_heads)
from attn_lib.costs import io_model
from attn_lib.models import it_data
from attn_lib.core import numpy_ref
from attn_lib.flash import splits
from attn_lib.figures import plotting
from attn_lib.models import tiny_model


def t(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype)


def a(*shape, dtype=np.float64):
    return np.zeros(shape, dtype=dtype)


Q = t(1, 1, 3, 4)
QN = a(1, 1, 3, 4)
META = torch.device("meta")  # a device other than the CPU that every machine has


def att(*args, **kw):
    return lambda: attn_lib.attention(*args, **kw)


def natt(*args, **kw):
    return lambda: numpy_ref.attention(*args, **kw)


def _nan(*shape, torch_=True):
    x = t(*shape) if torch_ else a(*shape)
    x[(0,) * len(shape)] = float("nan")
    return x


def _with_env(name, value, fn):
    """Call fn() with the environment variable ``name`` set to ``value``, then restore it."""
    import os

    def call():
        old = os.environ.get(name)
        os.environ[name] = value
        try:
            return fn()
        finally:
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
    return call


def _update(**bad):
    """online_softmax_update with m, l of shape (2,) and a piece (2, 3), one of them replaced."""
    args = {"m": t(2), "l": t(2), "piece": t(2, 3), **bad}
    return lambda: attn_lib.online_softmax_update(args["m"], args["l"], args["piece"])


def _inf(*shape, torch_=True):
    x = t(*shape) if torch_ else a(*shape)
    x[(0,) * len(shape)] = float("inf")
    return x


ROWS = [
    # --- attn_lib.attention (torch reference) -------------------------------------------------
    ("attention: q 2-D", att(t(3, 4), Q, Q), ValueError, r"q must be 4-D \(B, H, L, D\), got 2-D with shape \(3, 4\).*q\[None, None\]"),
    ("attention: k 3-D", att(Q, t(1, 3, 4), Q), ValueError, r"k must be 4-D \(B, H, S, D\), got 3-D.*unsqueeze\(1\)"),
    ("attention: v 5-D", att(Q, Q, t(1, 1, 1, 3, 4)), ValueError, r"v must be 4-D \(B, H, S, Dv\), got 5-D with shape \(1, 1, 1, 3, 4\)"),
    ("attention: D of q and k differ", att(Q, t(1, 1, 3, 5), Q), ValueError, r"same head dim D.*q has D=4, k has D=5"),
    ("attention: S of k and v differ", att(Q, Q, t(1, 1, 2, 4)), ValueError, r"same number of keys S.*k has S=3, v has S=2"),
    ("attention: heads differ", att(t(1, 2, 3, 4), Q, Q), ValueError,
     r"^k must have H=2 heads like q, got H_kv=1; pass enable_gqa=True to share each key/value head among "
     r"H // H_kv = 2 query heads \(grouped-query attention\)$"),
    ("attention: batch differs", att(Q, t(2, 1, 3, 4), t(2, 1, 3, 4)), ValueError, r"batch and head sizes.*k has \(2, 1\)"),
    ("attention: D = 0", att(t(1, 1, 3, 0), t(1, 1, 3, 0), Q), ValueError, r"head dim D=0; attention needs D >= 1"),
    ("attention: int dtype", att(*(t(1, 1, 3, 4, dtype=torch.int64),) * 3), TypeError, r"q must be a floating-point tensor .*got torch.int64"),
    ("attention: dtypes differ", att(Q, t(1, 1, 3, 4, dtype=torch.float64), Q), TypeError, r"q, k, v must have the same dtype, got q=torch.float32, k=torch.float64"),
    ("attention: numpy input", att(QN, QN, QN), TypeError,
     r"^q must be a torch.Tensor, got ndarray; for numpy arrays use attn_lib.core.numpy_ref.attention$"),
    ("attention: list input", att([[1.0]], Q, Q), TypeError, r"q must be a torch.Tensor, got list"),
    ("attention: k list", att(Q, [0.0], Q), TypeError, r"^k must be a torch.Tensor, got list"),
    ("attention: v list", att(Q, Q, [0.0]), TypeError, r"^v must be a torch.Tensor, got list"),
    ("attention: q, k, v on two devices", att(Q, Q.to(META), Q), ValueError, r"^q, k and v must be on one device, got cpu, meta, cpu; move them with \.to\(q\.device\)$"),
    ("attention: mask on another device", att(Q, Q, Q, mask=torch.ones(3, 3, dtype=torch.bool, device=META)), ValueError,
     r"^mask must be on q's device cpu, got meta; move it with mask\.to\(q\.device\)$"),
    ("attention: mask does not broadcast", att(Q, t(1, 1, 5, 4), t(1, 1, 5, 4), mask=torch.ones(3, 4, dtype=torch.bool)),
     ValueError, r"mask has shape \(3, 4\), which does not broadcast.*\(B, H, L, S\) = \(1, 1, 3, 5\)"),
    ("attention: mask too many axes", att(Q, Q, Q, mask=torch.ones(1, 1, 1, 3, 3, dtype=torch.bool)), ValueError,
     r"mask has shape \(1, 1, 1, 3, 3\) \(5-D\), more axes than the scores"),
    ("attention: mask int dtype", att(Q, Q, Q, mask=torch.ones(3, 3, dtype=torch.int64)), TypeError, r"mask must be bool .* got torch.int64.*mask.bool\(\)"),
    ("attention: mask numpy", att(Q, Q, Q, mask=np.ones((3, 3), dtype=bool)), TypeError, r"mask must be a torch.Tensor or None, got ndarray"),
    ("attention: mask nan", att(Q, Q, Q, mask=_nan(3, 3)), ValueError, r"additive float mask may contain -inf \(hidden\) but not nan or \+inf"),
    ("attention: mask +inf", att(Q, Q, Q, mask=_inf(3, 3)), ValueError, r"may contain -inf \(hidden\) but not nan or \+inf"),
    ("attention: scale 0", att(Q, Q, Q, scale=0.0), ValueError, r"scale must be finite and > 0, got 0.0"),
    ("attention: scale < 0", att(Q, Q, Q, scale=-1), ValueError, r"scale must be finite and > 0, got -1.0"),
    ("attention: scale nan", att(Q, Q, Q, scale=float("nan")), ValueError, r"scale must be finite and > 0, got nan"),
    ("attention: scale inf", att(Q, Q, Q, scale=float("inf")), ValueError, r"scale must be finite and > 0, got inf"),
    ("attention: scale str", att(Q, Q, Q, scale="big"), TypeError, r"scale must be a positive number or None, got 'big'"),
    ("attention: scale bool", att(Q, Q, Q, scale=True), TypeError, r"scale must be a positive number or None, got True"),
    ("attention: nan in q", att(_nan(1, 1, 3, 4), Q, Q), ValueError,
     r"^q contains nan or inf; attention would turn it into nan. Check the layer that produced it \(masks belong in `mask`, not in q/k/v\).$"),
    ("attention: inf in v", att(Q, Q, _inf(1, 1, 3, 4)), ValueError, r"v contains nan or inf"),
    ("attention: is_causal not bool", att(Q, Q, Q, is_causal="no"), TypeError, r"is_causal must be True or False, got 'no'"),
    ("attention: scale numeric str", att(Q, Q, Q, scale="0.5"), TypeError, r"scale must be a positive number or None, got '0.5' \(str\)"),
    ("attention: scale requires grad", att(Q, Q, Q, scale=torch.tensor(0.5, requires_grad=True)), TypeError,
     r"scale is not differentiable: got a tensor with requires_grad=True.*attention\(q \* s, k, v, scale=1.0\)"),
    ("attention: scale 2 elements", att(Q, Q, Q, scale=torch.tensor([0.5, 0.5])), TypeError, r"scale must be a positive number or None"),
    ("attention: check_finite not bool", att(Q, Q, Q, check_finite="no"), TypeError, r"check_finite must be True or False, got 'no'"),
    # --- numpy_ref.attention: the same rows, the same messages (numpy spelling) --------------------
    ("numpy attention: q 2-D", natt(a(3, 4), QN, QN), ValueError, r"q must be 4-D \(B, H, L, D\), got 2-D with shape \(3, 4\).*q\[None, None\]"),
    ("numpy attention: k 3-D", natt(QN, a(1, 3, 4), QN), ValueError, r"k must be 4-D \(B, H, S, D\), got 3-D.*unsqueeze\(1\)"),
    ("numpy attention: D of q and k differ", natt(QN, a(1, 1, 3, 5), QN), ValueError, r"same head dim D.*q has D=4, k has D=5"),
    ("numpy attention: S of k and v differ", natt(QN, QN, a(1, 1, 2, 4)), ValueError, r"same number of keys S.*k has S=3, v has S=2"),
    ("numpy attention: heads differ", natt(a(1, 2, 3, 4), QN, QN), ValueError,
     r"^k must have H=2 heads like q, got H_kv=1; this function has no enable_gqa: "
     r"use attn_lib\.attention\(q, k, v, enable_gqa=True\) for grouped-query attention$"),
    ("numpy attention: int dtype", natt(*(a(1, 1, 3, 4, dtype=np.int64),) * 3), TypeError, r"q must be a floating-point array .*got int64"),
    ("numpy attention: dtypes differ", natt(QN, a(1, 1, 3, 4, dtype=np.float32), QN), TypeError, r"q, k, v must have the same dtype, got q=float64, k=float32"),
    ("numpy attention: torch input", natt(Q, QN, QN), TypeError, r"q must be a numpy.ndarray, got Tensor"),
    ("numpy attention: mask does not broadcast", natt(QN, a(1, 1, 5, 4), a(1, 1, 5, 4), mask=np.ones((3, 4), dtype=bool)),
     ValueError, r"mask has shape \(3, 4\), which does not broadcast.*\(1, 1, 3, 5\)"),
    ("numpy attention: mask too many axes", natt(QN, QN, QN, mask=np.ones((1, 1, 1, 3, 3), dtype=bool)), ValueError, r"more axes"),
    ("numpy attention: mask int dtype", natt(QN, QN, QN, mask=np.ones((3, 3), dtype=np.int64)), TypeError, r"mask must be bool .*mask.astype\(bool\)"),
    ("numpy attention: mask nan", natt(QN, QN, QN, mask=_nan(3, 3, torch_=False)), ValueError, r"may contain -inf \(hidden\) but not nan or \+inf"),
    ("numpy attention: scale 0", natt(QN, QN, QN, scale=0.0), ValueError, r"scale must be finite and > 0, got 0.0"),
    ("numpy attention: scale < 0", natt(QN, QN, QN, scale=-1), ValueError, r"scale must be finite and > 0"),
    ("numpy attention: nan in q", natt(_nan(1, 1, 3, 4, torch_=False), QN, QN), ValueError, r"q contains nan or inf"),
    ("numpy attention: is_causal not bool", natt(QN, QN, QN, is_causal=1), TypeError, r"is_causal must be True or False, got 1"),
    ("numpy attention: scale numeric str", natt(QN, QN, QN, scale="0.5"), TypeError, r"scale must be a positive number or None, got '0.5'"),
    ("numpy causal_mask: L str", lambda: numpy_ref.causal_mask("3"), TypeError, r"L must be an int >= 0, got '3'"),
    ("numpy attention: inf in k", natt(QN, _inf(1, 1, 3, 4, torch_=False), QN), ValueError, r"k contains nan or inf"),
    # --- softmax (torch, numpy) ------------------------------------------------------------------
    ("softmax: list", lambda: attn_lib.softmax([1.0, 2.0]), TypeError, r"x must be a torch.Tensor, got list"),
    ("softmax: int tensor", lambda: attn_lib.softmax(torch.tensor([1, 2])), TypeError, r"x must be a floating-point tensor .*got torch.int64"),
    ("softmax: dim out of range", lambda: attn_lib.softmax(t(2, 3), dim=2), ValueError, r"dim=2 is out of range for a 2-D tensor"),
    ("softmax: nan", lambda: attn_lib.softmax(torch.tensor([0.0, float("nan")])), ValueError,
     r"x contains 1 nan and 0 \+inf entries.*Only -inf is allowed \(it means 'masked'\).$"),
    ("softmax: +inf", lambda: attn_lib.softmax(torch.tensor([0.0, float("inf")])), ValueError, r"x contains 0 nan and 1 \+inf entries"),
    ("softmax: dim float", lambda: attn_lib.softmax(t(2, 3), dim=0.5), TypeError, r"dim must be an int, got 0.5"),
    ("numpy softmax: dim float", lambda: numpy_ref.softmax(a(2, 3), dim=1.0), TypeError, r"dim must be an int, got 1.0"),
    ("naive_softmax: int tensor", lambda: attn_lib.naive_softmax(torch.tensor([1, 2])), TypeError, r"x must be a floating-point tensor"),
    ("numpy softmax: list", lambda: numpy_ref.softmax([1.0, 2.0]), TypeError, r"x must be a numpy.ndarray, got list"),
    ("numpy softmax: int array", lambda: numpy_ref.softmax(np.array([1, 2])), TypeError, r"x must be a floating-point array .*got int64"),
    ("numpy softmax: dim out of range", lambda: numpy_ref.softmax(a(2, 3), dim=-3), ValueError, r"dim=-3 is out of range for a 2-D array"),
    ("numpy softmax: nan", lambda: numpy_ref.softmax(np.array([0.0, np.nan])), ValueError, r"x contains 1 nan and 0 \+inf entries"),
    ("numpy softmax: +inf", lambda: numpy_ref.softmax(np.array([0.0, np.inf])), ValueError, r"x contains 0 nan and 1 \+inf entries"),
    ("numpy naive_softmax: int array", lambda: numpy_ref.naive_softmax(np.array([1, 2])), TypeError, r"x must be a floating-point array"),
    # --- masks -----------------------------------------------------------------------------------
    ("causal_mask: L < 0", lambda: attn_lib.causal_mask(-1), ValueError, r"L must be an int >= 0, got -1"),
    ("causal_mask: L float", lambda: attn_lib.causal_mask(2.5), TypeError, r"L must be an int >= 0, got 2.5"),
    ("causal_mask: S < 0", lambda: attn_lib.causal_mask(3, -2), ValueError, r"S must be an int >= 0, got -2"),
    ("numpy causal_mask: L < 0", lambda: numpy_ref.causal_mask(-1), ValueError, r"L must be an int >= 0, got -1"),
    ("numpy causal_mask: S float", lambda: numpy_ref.causal_mask(3, 1.5), TypeError, r"S must be an int >= 0, got 1.5"),
    ("padding_mask: negative length", lambda: attn_lib.padding_mask([3, -1]), ValueError, r"lengths must be >= 0, got \[3, -1\]"),
    ("padding_mask: length > S", lambda: attn_lib.padding_mask([3, 5], 4), ValueError, r"exceeds the padded length S=4: lengths=\[3, 5\]"),
    ("padding_mask: empty", lambda: attn_lib.padding_mask([]), ValueError, r"^lengths is empty: need one length per sentence in the batch$"),
    ("padding_mask: float length", lambda: attn_lib.padding_mask([1.5], 4), TypeError, r"lengths must contain ints, got 1.5 in \[1.5\]"),
    ("padding_mask: float tensor", lambda: attn_lib.padding_mask(torch.tensor([1.0, 2.0])), TypeError,
     r"^lengths must be a 1-D integer tensor or a list of ints, got dtype torch.float32; convert with lengths.long\(\)$"),
    ("padding_mask: bool tensor", lambda: attn_lib.padding_mask(torch.tensor([True])), TypeError,
     r"got dtype torch.bool; convert with lengths.long"),
    ("padding_mask: 2-D tensor", lambda: attn_lib.padding_mask(torch.ones(2, 2, dtype=torch.long)), ValueError,
     r"^lengths must be a 1-D integer tensor or a list of ints, got dtype torch.int64 and shape \(2, 2\)$"),
    ("padding_mask: a string", lambda: attn_lib.padding_mask("ab"), TypeError,
     r"^lengths must be a sequence of B ints \(one per sentence\), got 'ab'"),
    ("padding_mask: S 0", lambda: attn_lib.padding_mask([1], 0), ValueError, r"^a length exceeds the padded length S=0: lengths=\[1\]$"),
    ("padding_mask: a single int", lambda: attn_lib.padding_mask(3), TypeError, r"lengths must be a sequence of B ints .*got 3; for one sentence use \[3\]"),
    ("bool_to_additive: float mask", lambda: attn_lib.bool_to_additive(t(3)), TypeError, r"mask must be a bool tensor .*got torch.float32"),
    ("bool_to_additive: list", lambda: attn_lib.bool_to_additive([True]), TypeError,
     r"^mask must be a bool tensor \(True = may attend\), got list$"),
    ("bool_to_additive: int dtype", lambda: attn_lib.bool_to_additive(torch.ones(3, dtype=torch.bool), torch.int64), TypeError,
     r"dtype must be a floating dtype .*got torch.int64"),
    ("bool_to_additive: dtype str", lambda: attn_lib.bool_to_additive(torch.ones(3, dtype=torch.bool), "float32"), TypeError,
     r"dtype must be a floating dtype .*got float32"),
    ("additive_to_bool: bool mask", lambda: attn_lib.additive_to_bool(torch.ones(2, dtype=torch.bool)), TypeError, r"mask must be a floating tensor .*got torch.bool"),
    ("additive_to_bool: not 0/-inf", lambda: attn_lib.additive_to_bool(torch.tensor([0.0, 1.0])), ValueError,
     r"neither 0 nor -inf \(e.g. 1.0\).*such a bias cannot be expressed as a bool mask, pass the float mask to attention as it is$"),
    ("additive_to_bool: list", lambda: attn_lib.additive_to_bool([0.0]), TypeError, r"^mask must be a floating tensor of 0 and -inf, got list$"),
    # --- tolerances ------------------------------------------------------------------------------
    ("tolerance: unknown dtype", lambda: attn_lib.tolerance("int8"), KeyError, r"no output tolerance for dtype int8; known: \['bfloat16'"),
    # --- dictionary lookup and similarity (chapters 1-2) -------------------------------------------
    ("hard_lookup: missing key", lambda: attn_lib.hard_lookup("fruit", {"apple": 10}), KeyError, r"exact key.*'fruit'"),
    ("soft_lookup: sum != 1", lambda: attn_lib.soft_lookup([0.5, 0.4], [1.0, 2.0]), ValueError, r"sum to 1"),
    ("soft_lookup: negative", lambda: attn_lib.soft_lookup([1.5, -0.5], [1.0, 2.0]), ValueError, r">= 0"),
    ("soft_lookup: nan", lambda: attn_lib.soft_lookup([float("nan"), 0.5], [1.0, 2.0]), ValueError, r"proportions must be finite numbers, got \[nan, 0.5\]"),
    ("soft_lookup: values a number", lambda: attn_lib.soft_lookup([1.0], 3.0), TypeError, r"values must be a sequence or array of 1 values, got float"),
    ("soft_lookup: count", lambda: attn_lib.soft_lookup([0.5, 0.5], [1.0, 2.0, 3.0]), ValueError, r"got 2 proportions for 3 values"),
    ("dot: lengths differ", lambda: attn_lib.dot(torch.zeros(3), torch.zeros(4)), ValueError, r"same length D, got 3 and 4"),
    ("dot: list", lambda: attn_lib.dot([1.0, 2.0], torch.zeros(2)), TypeError, r"dot: a must be a numpy array or torch tensor, got list"),
    ("dot_query_keys: K 1-D", lambda: attn_lib.dot_query_keys(torch.zeros(3), torch.zeros(3)), ValueError, r"K of shape \(S, D\)"),
    ("euclidean_distance: lengths differ", lambda: attn_lib.euclidean_distance(torch.zeros(3), torch.zeros(2, 4)), ValueError,
     r"same length D, got 3 and 4"),
    ("euclidean_distance: Q 3-D", lambda: attn_lib.euclidean_distance(torch.zeros(2, 3, 4), torch.zeros(3, 4)), ValueError,
     r"expects Q \(L, D\) or \(D,\) and K \(S, D\) or \(D,\), got \(2, 3, 4\) and \(3, 4\)"),
    ("dot_all: Q 1-D", lambda: attn_lib.dot_all(torch.zeros(3), torch.zeros(2, 3)), ValueError, r"Q \(L, D\) and K \(S, D\)"),
    # --- plotting --------------------------------------------------------------------------------
    # --- device ----------------------------------------------------------------------------------
    ("try_gpu: ATTN_LIB_DEVICE not a device", _with_env("ATTN_LIB_DEVICE", "gpu", attn_lib.try_gpu), ValueError,
     r"ATTN_LIB_DEVICE='gpu' is not a torch device"),
    # --- plotting --------------------------------------------------------------------------------
    ("show_heatmap: 1-D", lambda: plotting.show_heatmap(a(3)), ValueError, r"show_heatmap needs a 2-D \(L, S\) matrix, got shape \(3,\)"),
    ("show_heatmap: 3-D", lambda: plotting.show_heatmap(a(2, 3, 4)), ValueError, r"got shape \(2, 3, 4\); pick one head"),
    ("show_heatmap: labels", lambda: plotting.show_heatmap(a(2, 3), row_labels=["x"]), ValueError, r"row_labels has 1 labels for 2 rows"),
    ("show_heatmaps: none", lambda: plotting.show_heatmaps([]), ValueError, r"at least one matrix"),
    ("show_heatmaps: titles", lambda: plotting.show_heatmaps(a(2, 2, 2), titles=["x"]), ValueError, r"got 1 titles for 2 matrices"),
    ("bar_scores: labels", lambda: plotting.bar_scores([1.0, 2.0], ["x"]), ValueError, r"got 1 labels for 2 values"),
]


# --- layers --------------------------------------------------------------------------------------
# (flags that must be bools and need_weights: tests/topics/test_layer_contract.py, for every layer)
X = t(2, 3, 8)

def mha(*args, layer=MultiHeadAttention, **kw):
    return lambda: layer(8, 2)(*args, **kw)

ROWS += [
    ("MultiHeadAttention: d_model % num_heads", lambda: MultiHeadAttention(10, 3), ValueError,
     r"d_model=10 is not divisible by num_heads=3.*e.g. 9 or 12"),
    ("MultiHeadAttention: num_heads 0", lambda: MultiHeadAttention(8, 0), ValueError, r"num_heads must be a positive int, got 0"),
    ("MultiHeadAttention: d_model 0", lambda: MultiHeadAttention(0, 1), ValueError, r"d_model must be a positive int, got 0"),
    ("MultiHeadAttention: d_model float", lambda: MultiHeadAttention(8.0, 2), TypeError,
     r"d_model must be a positive int, got 8.0 \(float\); use int\(8.0\)"),
    ("MultiHeadAttention: query 2-D", mha(t(3, 8)), ValueError, r"query must be 3-D \(B, L, C\), got 2-D with shape \(3, 8\).*unsqueeze\(0\)"),
    ("MultiHeadAttention: query 4-D", mha(t(1, 2, 3, 8)), ValueError, r"query must be 3-D \(B, L, C\), got 4-D"),
    ("MultiHeadAttention: last dim", mha(t(2, 3, 5)), ValueError, r"query has last dimension 5 \(shape \(2, 3, 5\)\), but the layer's d_model is 8"),
    ("MultiHeadAttention: key last dim", mha(X, t(2, 3, 6)), ValueError, r"key has last dimension 6"),
    ("MultiHeadAttention: dtype", mha(X.double()), TypeError, r"query has dtype torch.float64 but the layer's parameters are torch.float32"),
    ("MultiHeadAttention: numpy", mha(a(2, 3, 8)), TypeError, r"query must be a torch.Tensor of shape \(B, L, C\), got ndarray"),
    ("MultiHeadAttention: batch", mha(X, t(1, 3, 8)), ValueError, r"same batch size B, got 2, 1 and 1"),
    ("MultiHeadAttention: key/value S", mha(X, t(2, 4, 8), t(2, 5, 8)), ValueError, r"same length S \(axis 1\): key has S=4, value has S=5"),
    ("MultiHeadAttention: key batch", mha(X, t(1, 3, 8), X), ValueError, r"same batch size B, got 2, 1 and 2"),
    ("MultiHeadAttention: value batch", mha(X, X, t(1, 3, 8)), ValueError, r"same batch size B, got 2, 2 and 1"),
    ("MultiHeadAttention: value last dim", mha(X, X, t(2, 3, 5)), ValueError, r"^value has last dimension 5"),
    ("MultiHeadAttention: mask", mha(X, mask=torch.ones(4, 4, dtype=torch.bool)), ValueError,
     r"mask has shape \(4, 4\), which does not broadcast.*\(B, H, L, S\) = \(2, 2, 3, 3\)"),
    ("MultiHeadAttention: nan in query", mha(_nan(2, 3, 8)), ValueError, r"query contains nan or inf"),
    ("MultiHeadAttention: num_heads str", lambda: MultiHeadAttention(8, "2"), TypeError, r"num_heads must be a positive int, got '2' \(str\)"),
    ("MultiHeadAttention: backend name", lambda: MultiHeadAttention(8, 2, backend="cuda"), ValueError,
     r"backend must be one of \('auto', 'reference', 'sdpa', 'torch', 'triton'\), got 'cuda'"),
    ("MultiHeadAttention: backend type", lambda: MultiHeadAttention(8, 2, backend=1), TypeError, r"backend must be one of .*got 1 \(int\)"),
    ("MultiHeadAttention: need_weights with torch", lambda: MultiHeadAttention(8, 2, backend="torch")(X, need_weights=True), ValueError,
     r"need_weights=True needs the attention scores, which backend='torch' never stores.*backend='reference'"),
    ("MultiHeadAttention: torch with a causal-pattern mask", lambda: MultiHeadAttention(8, 2, backend="torch")(
        X, mask=torch.ones(3, 3, dtype=torch.bool)), ValueError, r"mask must be a bool key padding mask \(B, 1, 1, S\) or \(B, 1, S\) for backend='torch'"),
    ("MultiHeadAttention: 3-D mask shape", mha(X, mask=torch.ones(2, 3, 4, dtype=torch.bool)), ValueError,
     r"a 3-D mask means \(B, L, S\) = \(2, 3, 3\) .*got \(2, 3, 4\)"),
    ("MultiHeadAttention: check_finite str", lambda: MultiHeadAttention(8, 2, check_finite=1), TypeError,
     r"check_finite must be True or False, got 1"),
    ("MultiHeadAttention: mask list", mha(X, mask=[[True]]), TypeError, r"mask must be a torch.Tensor or None, got list"),
    ("MultiHeadAttention: mask nan", mha(X, mask=_nan(3, 3)), ValueError, r"additive float mask may contain -inf \(hidden\) but not nan"),
    ("SelfAttention: d_model float", lambda: SelfAttention(4.0), TypeError, r"d_model must be a positive int, got 4.0 \(float\)"),
    ("SelfAttention: backend name", lambda: SelfAttention(4, backend="fast"), ValueError, r"backend must be one of \('auto', 'reference', 'sdpa', 'torch', 'triton'\)"),
    ("SelfAttention: backend type", lambda: SelfAttention(8, backend=None), TypeError, r"backend must be one of .*got None \(NoneType\)"),
    ("SelfAttention: d_model 0", lambda: SelfAttention(0), ValueError, r"d_model must be a positive int, got 0"),
    ("LoopedMultiHeadAttention: d_model % num_heads", lambda: LoopedMultiHeadAttention(10, 4), ValueError,
     r"d_model=10 is not divisible by num_heads=4"),
    ("LoopedMultiHeadAttention: last dim", mha(t(2, 3, 5), layer=LoopedMultiHeadAttention), ValueError, r"query has last dimension 5"),
    ("LoopedMultiHeadAttention: mask heads", mha(X, mask=torch.ones(2, 3, 3, 3, dtype=torch.bool), layer=LoopedMultiHeadAttention),
     ValueError, r"mask has 3 heads on axis 1, expected 1 or 2"),
    ("SelfAttention: d_k 0", lambda: SelfAttention(4, 0), ValueError, r"d_k must be a positive int, got 0"),
    ("SelfAttention: mask heads", lambda: SelfAttention(4)(torch.randn(2, 3, 4), mask=torch.ones(2, 2, 3, 3, dtype=torch.bool)),
     ValueError, r"mask has 2 heads on axis 1, expected 1$"),  # one head: the one allowed size, named once
    ("SelfAttention: x 2-D", lambda: SelfAttention(4)(t(3, 4)), ValueError, r"x must be 3-D \(B, L, C\), got 2-D.*x.unsqueeze\(0\)"),
    ("SelfAttention: last dim", lambda: SelfAttention(4)(t(1, 3, 5)), ValueError, r"x has last dimension 5 .*d_model is 4"),
    ("SelfAttention: dtype", lambda: SelfAttention(4).double()(t(1, 5, 4)), TypeError,
     r"x has dtype torch.float32 but the layer's parameters are torch.float64"),
    ("SelfAttention: x list", lambda: SelfAttention(4)([[1.0]]), TypeError, r"x must be a torch.Tensor of shape \(B, L, C\), got list"),
    ("SelfAttention.from_matrices: rows differ", lambda: SelfAttention.from_matrices(t(3, 2), t(4, 2), t(3, 2)), ValueError,
     r"w_q, w_k, w_v must have the same number of rows C, got 3, 4, 3"),
    ("SelfAttention.from_matrices: d_k differ", lambda: SelfAttention.from_matrices(t(4, 3), t(4, 2), t(4, 3)), ValueError,
     r"w_q and w_k must have the same number of columns d_k, got 3 and 2"),
    ("split_heads: C % H", lambda: split_heads(X, 3), ValueError, r"d_model=8 is not divisible by num_heads=3"),
    ("split_heads: x 2-D", lambda: split_heads(t(3, 8), 2), ValueError, r"x must be 3-D \(B, L, C\), got 2-D"),
    ("split_heads: numpy", lambda: split_heads(a(2, 3, 8), 2), TypeError, r"x must be a torch.Tensor of shape \(B, L, C\), got ndarray"),
    ("merge_heads: list", lambda: merge_heads([[1.0]]), TypeError, r"x must be a torch.Tensor of shape \(B, H, L, D\), got list"),
    ("merge_heads: x 2-D", lambda: merge_heads(t(3, 8)), ValueError, r"x must be 4-D \(B, H, L, D\), got 2-D"),
]


# --- FlashAttention (forward, backward, both backends), online softmax, IO model ---------------
def fa(*args, fn=None, **kw):
    return lambda: (fn or attn_lib.flash_attention)(*args, **kw)

def _qkv(requires_grad=False):
    """q (1, 2, 5, 4), k and v (1, 2, 6, 4) in float32."""
    return tuple(t(1, 2, n, 4).requires_grad_(requires_grad) for n in (5, 6, 6))

def bwd(*args, fn=None, **kw):
    return lambda: (fn or attn_lib.flash_attention_triton_backward)(*args, **kw)

def tbwd(*args, **kw):  # the tiled torch backward with _qkv()'s q, k, v
    return lambda: attn_lib.flash_attention_torch_backward(*_qkv(), *args, **kw)

SCALE_GRAD = torch.tensor(0.5, requires_grad=True)
Q16, OUT16, LSE3 = t(1, 1, 3, 16), t(1, 1, 3, 16), t(1, 1, 3)

ROWS += [
    ("flash_attention: backend name", fa(Q, Q, Q, backend="cuda"), ValueError,
     r"backend must be one of \('auto', 'torch', 'triton'\), got 'cuda'"),
    ("flash_attention: backend not a string", fa(Q, Q, Q, backend=1), TypeError,
     r"^backend must be one of \('auto', 'torch', 'triton'\), got 1 \(int\)$"),
    ("flash_attention: q 2-D", fa(t(3, 4), Q, Q), ValueError, r"q must be 4-D \(B, H, L, D\), got 2-D"),
    ("flash_attention: D of q and k differ", fa(Q, t(1, 1, 3, 5), Q), ValueError, r"q has D=4, k has D=5"),
    ("flash_attention: S of k and v differ", fa(Q, Q, t(1, 1, 2, 4)), ValueError, r"k has S=3, v has S=2"),
    ("flash_attention: dtypes differ", fa(Q, Q.double(), Q), TypeError, r"same dtype, got q=torch.float32, k=torch.float64"),
    ("flash_attention: scale 0", fa(Q, Q, Q, scale=0), ValueError, r"scale must be finite and > 0, got 0.0"),
    ("flash_attention: is_causal not bool", fa(Q, Q, Q, is_causal="yes"), TypeError, r"is_causal must be True or False, got 'yes'"),
    ("flash_attention: key_mask shape", fa(Q, Q, Q, key_mask=torch.ones(1, 4, dtype=torch.bool)), ValueError,
     r"key_mask must have shape \(B, S\) = \(1, 3\).*got \(1, 4\)"),
    ("flash_attention: key_mask dtype", fa(Q, Q, Q, key_mask=torch.ones(1, 3)), TypeError,
     r"key_mask must be bool \(True = key present; torch\.nn\.MultiheadAttention's key_padding_mask is the "
     r"opposite, True = padding\), got torch.float32.*\.bool\(\)"),
    ("flash_attention: key_mask list", fa(Q, Q, Q, key_mask=[[True] * 3]), TypeError,
     r"key_mask must be a torch.Tensor or None, got list"),
    ("flash_attention: nan in k", fa(Q, _nan(1, 1, 3, 4), Q), ValueError, r"k contains nan or inf"),
    ("flash_attention_torch: block_m 0", fa(Q, Q, Q, fn=attn_lib.flash_attention_torch, block_m=0), ValueError,
     r"block_m must be a positive int, got 0"),
    ("flash_attention_torch: block_n < 0", fa(Q, Q, Q, fn=attn_lib.flash_attention_torch, block_n=-1), ValueError,
     r"block_n must be a positive int, got -1"),
    ("flash_attention_torch: block_m float", fa(Q, Q, Q, fn=attn_lib.flash_attention_torch, block_m=2.5), TypeError,
     r"block_m must be a positive int, got 2.5"),
    ("flash_attention_torch: block_n float", fa(Q, Q, Q, fn=attn_lib.flash_attention_torch, block_n=2.5), TypeError,
     r"block_n must be a positive int, got 2.5 \(float\)"),
    ("flash_attention_torch: is_causal not bool", fa(Q, Q, Q, fn=attn_lib.flash_attention_torch, is_causal="yes"), TypeError,
     r"is_causal must be True or False, got 'yes'"),
    ("flash_attention: scale requires grad", fa(*_qkv(True), scale=SCALE_GRAD, backend="torch"), TypeError,
     r"scale is not differentiable.*attention\(q \* s, k, v, scale=1.0\)"),
    ("flash_attention: scale requires grad, q, k, v do not", fa(*_qkv(), scale=SCALE_GRAD, backend="torch"), TypeError,
     r"scale is not differentiable"),
    ("naive_attention: scale requires grad", fa(*_qkv(True), fn=attn_lib.naive_attention, scale=SCALE_GRAD), TypeError,
     r"scale is not differentiable"),
    ("flash_attention_torch: scale requires grad", fa(*_qkv(), fn=attn_lib.flash_attention_torch, scale=SCALE_GRAD), TypeError,
     r"scale is not differentiable"),
    ("flash_attention: key_mask requires grad",
     fa(*_qkv(True), key_mask=torch.ones(1, 6, requires_grad=True), backend="torch"), ValueError,
     r"key_mask requires grad, but it is not differentiable"),
    ("flash_attention_torch: inputs that require grad", fa(*_qkv(True), fn=attn_lib.flash_attention_torch), ValueError,
     r"flash_attention_torch is forward-only.*attn_lib.flash_attention\(q, k, v, backend='torch'\)"),
    ("flash_attention_triton: block_m not a power of 2", fa(Q, Q, Q, fn=attn_lib.flash_attention_triton, block_m=24),
     ValueError, r"block_m must be a power of two >= 16 .*got 24"),
    ("flash_attention_triton: block_n 0", fa(Q, Q, Q, fn=attn_lib.flash_attention_triton, block_n=0), ValueError,
     r"block_n must be a positive int, got 0"),
    ("flash_attention_triton: float64", fa(Q.double(), Q.double(), Q.double(), fn=attn_lib.flash_attention_triton),
     TypeError, r"float16, bfloat16 or float32; for float64 use backend='torch'"),
    ("flash_attention_triton: head dim > 256", fa(t(1, 1, 2, 300), t(1, 1, 2, 300), t(1, 1, 2, 4), fn=attn_lib.flash_attention_triton),
     ValueError, r"head dims up to 256, got D=300"),
    ("flash_attention_triton: key_mask shape",
     fa(Q16, t(1, 1, 4, 16), t(1, 1, 4, 16), fn=attn_lib.flash_attention_triton, key_mask=torch.ones(1, 5, dtype=torch.bool)),
     ValueError, r"key_mask must have shape \(B, S\) = \(1, 4\)"),
    ("flash_attention_torch_backward: dout of the wrong shape",
     lambda: attn_lib.flash_attention_torch_backward(Q, Q, Q, Q, t(1, 1, 3), t(1, 1, 3, 5)), ValueError,
     r"dout must have shape \(1, 1, 3, 4\)"),
    ("flash_attention_torch_backward: lse of the wrong shape",
     lambda: attn_lib.flash_attention_torch_backward(Q, Q, Q, Q, t(1, 3), Q), ValueError,
     r"lse must have shape \(1, 1, 3\)"),
    ("flash_attention_torch_backward: out not a tensor", tbwd(None, t(1, 2, 5), t(1, 2, 5, 4)), TypeError,
     r"out must be a torch.Tensor, got NoneType"),
    ("flash_attention_torch_backward: block_m float", tbwd(t(1, 2, 5, 4), t(1, 2, 5), t(1, 2, 5, 4), block_m=2.0), TypeError,
     r"block_m must be a positive int"),
    ("flash_attention_torch_backward: is_causal not bool", tbwd(t(1, 2, 5, 4), t(1, 2, 5), t(1, 2, 5, 4), is_causal=1), TypeError,
     r"is_causal must be True or False"),
    ("flash_attention_triton_backward: block_m not a power of 2",
     lambda: attn_lib.flash_attention_triton_backward(Q, Q, Q, Q, t(1, 1, 3), Q, block_m=24), ValueError,
     r"block_m must be a power of two >= 16"),
    ("flash_attention_triton_backward: q not a tensor", bwd([0.0], Q16, Q16, OUT16, LSE3, OUT16), TypeError,
     r"q must be a torch.Tensor, got list"),
    ("flash_attention_triton_backward: float64", bwd(Q16.double(), Q16.double(), Q16.double(), OUT16.double(), LSE3, OUT16.double()),
     TypeError, r"float16, bfloat16 or float32; for float64 use backend='torch'"),
    ("flash_attention_triton_backward: k and v keys differ", bwd(Q16, Q16, t(1, 1, 2, 16), OUT16, LSE3, OUT16), ValueError,
     r"k has S=3, v has S=2"),
    ("flash_attention_triton_backward: out shape", bwd(Q16, Q16, Q16, t(1, 1, 3, 8), LSE3, OUT16), ValueError,
     r"out must have shape \(1, 1, 3, 16\), got \(1, 1, 3, 8\); pass what flash_attention_triton returned"),
    ("flash_attention_triton_backward: out dtype", bwd(Q16, Q16, Q16, OUT16.half(), LSE3, OUT16), TypeError,
     r"out must be torch.float32, got torch.float16"),
    ("flash_attention_triton_backward: dout shape", bwd(Q16, Q16, Q16, OUT16, LSE3, t(1, 1, 4, 16)), ValueError,
     r"dout must have shape \(1, 1, 3, 16\)"),
    ("flash_attention_triton_backward: lse float16", bwd(Q16, Q16, Q16, OUT16, LSE3.half(), OUT16), TypeError,
     r"lse must be torch.float32, got torch.float16"),
    ("flash_attention_triton_backward: lse shape", bwd(Q16, Q16, Q16, OUT16, t(1, 3), OUT16), ValueError,
     r"lse must have shape \(1, 1, 3\), got \(1, 3\)"),
    ("flash_attention_triton_backward: lse a list", bwd(Q16, Q16, Q16, OUT16, [0.0], OUT16), TypeError,
     r"lse must be a torch.Tensor, got list"),
    ("flash_attention_triton_backward: is_causal not bool", bwd(Q16, Q16, Q16, OUT16, LSE3, OUT16, is_causal=1), TypeError,
     r"is_causal must be True or False, got 1"),
    ("flash_attention_triton_backward: scale string", bwd(Q16, Q16, Q16, OUT16, LSE3, OUT16, scale="0.5"), TypeError,
     r"scale must be a positive number"),
    ("flash_attention_triton_backward: scale negative", bwd(Q16, Q16, Q16, OUT16, LSE3, OUT16, scale=-1.0), ValueError,
     r"scale must be finite and > 0"),
    ("flash_attention_triton_backward: block_n float", bwd(Q16, Q16, Q16, OUT16, LSE3, OUT16, block_n=16.0), TypeError,
     r"block_n must be a positive int"),
    ("flash_attention_triton_backward: key_mask shape",
     bwd(Q16, Q16, Q16, OUT16, LSE3, OUT16, key_mask=torch.ones(1, 4, dtype=torch.bool)), ValueError,
     r"key_mask must have shape \(B, S\) = \(1, 3\)"),
    ("flash_attention_triton_backward: key_mask float",
     bwd(Q16, Q16, Q16, OUT16, LSE3, OUT16, key_mask=torch.ones(1, 3)), TypeError, r"key_mask must be bool"),
    ("flash_attention_triton_backward: head dim > 256", bwd(t(1, 1, 3, 300), t(1, 1, 3, 300), Q16, OUT16, LSE3, OUT16),
     ValueError, r"head dims up to 256"),
    ("naive_attention: is_causal not bool", fa(Q, Q, Q, fn=attn_lib.naive_attention, is_causal="yes"), TypeError,
     r"is_causal must be True or False, got 'yes'"),
    ("naive_attention: S of k and v differ", fa(Q, Q, t(1, 1, 2, 4), fn=attn_lib.naive_attention), ValueError, r"k has S=3, v has S=2"),
    ("online_softmax: 0-D", lambda: attn_lib.online_softmax(torch.tensor(1.0), 2), ValueError,
     r"^x must have at least one axis \(the row to normalise is the last one\)$"),
    ("online_softmax: a zero piece", lambda: attn_lib.online_softmax(t(5), [2, 0, 3]), ValueError,
     r"^splits\[1\] must be a positive int, got 0$"),
    ("online_softmax: int tensor", lambda: attn_lib.online_softmax(torch.tensor([1, 2]), 1), TypeError,
     r"x must be a floating-point tensor .*got torch.int64"),
    ("online_softmax: pieces", lambda: attn_lib.online_softmax(t(5), [2, 2]), ValueError, r"piece lengths \[2, 2\] sum to 4, but the row has 5"),
    ("online_softmax: block str", lambda: attn_lib.online_softmax(t(5), "2"), TypeError, r"splits must be a positive int, got '2' \(str\)"),
    ("online_softmax: block float", lambda: attn_lib.online_softmax(t(5), 2.0), TypeError, r"splits must be a positive int, got 2.0 \(float\)"),
    ("flash_attention: scale numeric str", fa(Q, Q, Q, scale="0.5"), TypeError, r"scale must be a positive number or None, got '0.5'"),
    ("online_softmax: block 0", lambda: attn_lib.online_softmax(t(5), 0), ValueError, r"splits must be a positive int, got 0"),
    ("online_softmax: nan", lambda: attn_lib.online_softmax(torch.tensor([float("nan")]), 1), ValueError, r"x contains 1 nan"),
    ("online_max_and_sum: int", lambda: attn_lib.online_max_and_sum(torch.zeros(3, dtype=torch.long), 2), TypeError,
     r"x must be a floating-point tensor .*got torch.int64"),
    ("online_logsumexp: list", lambda: attn_lib.online_logsumexp([1.0], 2), TypeError, r"x must be a torch.Tensor, got list"),
    ("online_weighted_sum: v keys", lambda: attn_lib.online_weighted_sum(t(5), t(4, 2), 2), ValueError,
     r"v must have shape \(\.\.\., S, Dv\) with S = 5.*got \(4, 2\)"),
    ("online_weighted_sum: nan in v", lambda: attn_lib.online_weighted_sum(t(3), _nan(3, 2), 2), ValueError, r"v contains nan or inf"),
    ("online_weighted_sum: inf in v", lambda: attn_lib.online_weighted_sum(t(3), torch.full((3, 2), float("inf")), 2), ValueError,
     r"^v contains nan or inf; the weighted sum would be nan. Check what produced it.$"),
    ("online_weighted_sum: v list", lambda: attn_lib.online_weighted_sum(t(3), [[0.0]], 2), TypeError, r"^v must be a torch.Tensor, got list"),
    ("online_weighted_sum: two leading axes", lambda: attn_lib.online_weighted_sum(t(2, 4, 3), t(5, 3, 2), 2), ValueError,
     r"^v's leading axes \(5,\) do not broadcast with x's \(2, 4\) "),
    ("online_weighted_sum: leading axes", lambda: attn_lib.online_weighted_sum(t(2, 3), t(5, 3, 2), 2), ValueError,
     r"v's leading axes \(5,\) do not broadcast with x's \(2,\)"),
    ("online_softmax_update: nan piece", lambda: attn_lib.online_softmax_update(t(2), t(2), _nan(2, 4)), ValueError,
     r"piece contains 1 nan and 0 \+inf entries"),
    ("online_softmax_update: shapes", lambda: attn_lib.online_softmax_update(t(2), t(2), t(3, 4)), ValueError,
     r"^piece must have shape \(\.\.\., P\) with \.\.\. = m's shape; got piece \(3, 4\)"),
    ("online_softmax_update: m and l differ", lambda: attn_lib.online_softmax_update(t(2), t(3), t(2, 4)), ValueError,
     r"piece must have shape \(\.\.\., P\).*\(m and l must have the same shape\)"),
    ("online_softmax_update: 0-D piece", lambda: attn_lib.online_softmax_update(t(2), t(2), torch.zeros(())), ValueError,
     r"piece must have shape \(\.\.\., P\)"),
    *[(f"online_softmax_update: {name} {what}", _update(**{name: bad}), TypeError, rf"^{name} must be {message}")
      for name in ("m", "l", "piece")
      for what, bad, message in (("list", [0.0], "a torch.Tensor, got list"),
                                 ("int", torch.zeros(2, 3, dtype=torch.long) if name == "piece" else torch.zeros(2, dtype=torch.long),
                                  "a floating-point tensor"))],
    ("standard_attention_io: N 0", lambda: attn_lib.standard_attention_io(0, 4), ValueError, r"N must be a positive int, got 0"),
    ("flash_attention_io: M < d", lambda: attn_lib.flash_attention_io(16, 8, 4), ValueError, r"on-chip memory M=4 must hold .* d=8"),
    ("tiled_attention_io: block_m 0", lambda: attn_lib.tiled_attention_io(16, 16, 8, 0, 4), ValueError, r"block_m must be a positive int, got 0"),
    ("tiled_attention_io: L < 0", lambda: attn_lib.tiled_attention_io(-5, 16, 8, 4, 4), ValueError, r"L must be an int >= 0, got -5"),
    ("tiled_attention_io: S float", lambda: attn_lib.tiled_attention_io(5, 16.0, 8, 4, 4), TypeError, r"S must be an int >= 0, got 16.0"),
    ("io_model.score_matrix_bytes: L < 0", lambda: io_model.score_matrix_bytes(1, 1, -1, 3), ValueError, r"L must be"),
]


# --- positions, KV cache, the 「它」 data set, the tiny model ---------------------------------------
def _cache_with(B=2, dtype=torch.float32, device="cpu"):
    cache = KVCache()
    cache.append(torch.zeros(B, 2, 3, 4, dtype=dtype, device=device), torch.zeros(B, 2, 3, 4, dtype=dtype, device=device))
    return cache


def _kv(B=2, dtype=torch.float32, device="cpu"):
    return torch.zeros(B, 2, 1, 4, dtype=dtype, device=device), torch.zeros(B, 2, 1, 4, dtype=dtype, device=device)


def _cache_of_another_layer():
    """A cache used by one layer, then offered to a second one while the first is still alive (a cache
    holds its owner weakly: a layer that was garbage-collected owns nothing)."""
    cache, first = KVCache(), MultiHeadAttention(4, 2, is_causal=True)
    first(torch.zeros(1, 1, 4), kv_cache=cache)
    MultiHeadAttention(4, 2, is_causal=True)(torch.zeros(1, 1, 4), kv_cache=cache)


def _tiny(max_len=64):
    return tiny_model.TinyItModel(len(it_data.VOCAB), len(it_data.OBJECTS), positions="sinusoidal", max_len=max_len)


def _it_batch():
    return it_data.encode(it_data.make_split("train", 8))


ROWS += [
    ("apply_rotary: odd D", lambda: apply_rotary(torch.zeros(1, 1, 3, 5)), ValueError, r"even head dim D.*got D=5"),
    ("apply_rotary: 3-D x", lambda: apply_rotary(torch.zeros(1, 3, 4)), ValueError, r"x must be 4-D"),
    ("apply_rotary: int x", lambda: apply_rotary(torch.zeros(1, 1, 3, 4, dtype=torch.int64)), TypeError,
     r"floating-point"),
    ("apply_rotary: float positions", lambda: apply_rotary(torch.zeros(1, 1, 3, 4), torch.zeros(3)), TypeError,
     r"positions must hold integers"),
    ("apply_rotary: wrong number of positions", lambda: apply_rotary(torch.zeros(1, 1, 3, 4), [0, 1]), ValueError,
     r"positions must have shape \(L,\) = \(3,\)"),
    ("apply_rotary: base 0", lambda: apply_rotary(torch.zeros(1, 1, 3, 4), base=0), ValueError, r"base must be"),
    ("sinusoidal_positions: L float", lambda: sinusoidal_positions(3.0, 4), TypeError, r"L must be an int"),
    ("sinusoidal_positions: d_model 0", lambda: sinusoidal_positions(3, 0), ValueError, r"d_model must be a positive int, got 0"),
    ("sinusoidal_positions: base string", lambda: sinusoidal_positions(3, 4, base="1e4"), TypeError,
     r"base must be a positive number"),
    ("KVCache: another batch size", lambda: _cache_with(B=2).append(*_kv(B=3)), ValueError,
     r"batch of B=2 .* new keys have B=3.*reset"),
    ("KVCache: another dtype", lambda: _cache_with().append(*_kv(dtype=torch.float64)), TypeError,
     r"cache holds torch.float32 but the new keys are torch.float64"),
    ("KVCache: another device", lambda: _cache_with().append(*_kv(device="meta")), ValueError,
     r"cache is on cpu but the new keys are on meta"),
    ("KVCache: 3-D keys", lambda: KVCache().append(torch.zeros(1, 3, 4), torch.zeros(1, 3, 4)), ValueError,
     r"k must be 4-D"),
    ("KVCache: k and v differ", lambda: KVCache().append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 2, 4)),
     ValueError, r"k and v must share"),
    ("MultiHeadAttention: kv_cache not a KVCache", lambda: MultiHeadAttention(4, 2)(torch.zeros(1, 2, 4), kv_cache={}),
     TypeError, r"kv_cache must be an attn_lib.KVCache"),
    ("MultiHeadAttention: kv_cache with cross-attention",
     lambda: MultiHeadAttention(4, 2)(torch.zeros(1, 2, 4), torch.zeros(1, 3, 4), kv_cache=KVCache()),
     ValueError, r"self-attention only"),
    ("causal_mask: align unknown", lambda: causal_mask(2, 3, align="bottom-left"), ValueError,
     r'align must be "top-left" or "bottom-right", got \'bottom-left\''),
    ("causal_mask: align not a string", lambda: causal_mask(2, 3, align=True), TypeError, r"align must be the string"),
    ("it_data.make_split: unknown split", lambda: it_data.make_split("dev", 3), ValueError, r'split must be "train"'),
    ("tiny_model.TinyItModel: unknown positions", lambda: tiny_model.TinyItModel(5, 3, positions="alibi"), ValueError,
     r"positions must be one of"),
    ("KVCache: k and v dtypes differ", lambda: KVCache().append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4, dtype=torch.float64)),
     TypeError, r"k and v must have the same dtype, got k=torch.float32, v=torch.float64"),
    ("KVCache.attention_mask: L beyond the cache", lambda: KVCache().attention_mask(None, 1, True), ValueError,
     r"L must be at most the number of cached positions S=0"),
    ("KVCache.attention_mask: is_causal str", lambda: KVCache().attention_mask(None, 0, "no"), TypeError,
     r"is_causal must be True or False, got 'no'"),
    ("MultiHeadAttention: one kv_cache for two layers", lambda: _cache_of_another_layer(), ValueError,
     r"kv_cache already serves another layer; one cache serves one attention layer.*its own KVCache.*cache.reset\(\)"),
    ("MultiHeadAttention: float64 on triton", lambda: MultiHeadAttention(8, 2, backend="triton").double()(
        torch.zeros(1, 3, 8, dtype=torch.float64)), TypeError,
     r"the Triton kernel takes float16, bfloat16 or float32; for float64 use backend='torch' \(got torch\.float64\)$"),
    ("SelfAttention: head dim 300 on triton", lambda: SelfAttention(4, 300, backend="triton")(torch.zeros(1, 3, 4)),
     ValueError, r"the Triton kernel supports head dims up to 256, got D=300, Dv=300; use backend='torch'"),
    ("SelfAttention: the old backend name", lambda: SelfAttention(4, backend="flash"), ValueError,
     r"got 'flash'; the tiled FlashAttention path is now 'torch' \(or 'triton'\)"),
    ("padding_mask: bytes", lambda: attn_lib.padding_mask(b"\x03\x01"), TypeError, r"lengths must be a sequence of B ints"),
    ("tiny_model.RotaryMultiHeadAttention: odd head dim", lambda: tiny_model.RotaryMultiHeadAttention(6, 2), ValueError,
     r"head dim D = d_model / num_heads must be even for rotary positions.*D=3"),
    ("tiny_model.TinyItModel: longer than the position table", lambda: _tiny(max_len=4)(
        torch.zeros(2, 5, dtype=torch.int64), torch.tensor([5, 5]), torch.tensor([0, 1])), ValueError,
     r"ids has L=5 positions but the model's position table has max_len=4"),
    ("tiny_model.TinyItModel: float ids", lambda: _tiny()(torch.zeros(2, 5), torch.tensor([5, 5]), torch.tensor([0, 1])),
     TypeError, r"ids must hold integers, got dtype torch.float32"),
    ("tiny_model.train: batch_size 0", lambda: tiny_model.train(_tiny(), _it_batch(), batch_size=0), ValueError,
     r"batch_size must be a positive int, got 0"),
    ("tiny_model.train: steps float", lambda: tiny_model.train(_tiny(), _it_batch(), steps=2.5), TypeError,
     r"steps must be an int >= 0, got 2.5 \(float\)"),
]


# --- chapter 13: the LM corpus, the tiny language model, generate --------------------------------
def _lm():
    return attn_lib.models.tiny_lm.build_lm(seed=0)


def _lm_ids(*tokens):
    return torch.tensor([attn_lib.models.lm_data.encode_tokens(["<bos>", *tokens])])  # (1,L)


def _caches_of_two_lengths():
    model, caches = _lm(), [KVCache(), KVCache()]
    with torch.no_grad():
        model(_lm_ids("桌上"), caches)
    caches[1].reset()
    return lambda: model(_lm_ids(), caches)


def _foreign_cache():
    """Both caches of another model, of one length: only their owner is wrong."""
    model, other, foreign = _lm(), _lm(), [KVCache(), KVCache()]
    with torch.no_grad():
        other(_lm_ids(), foreign)
    return lambda owner=other: model(_lm_ids(), foreign)  # owner: the other model stays alive


def _gen(*args, **kw):
    model = kw.pop("model", None)
    return lambda: attn_lib.generate(_lm() if model is None else model, *args, **kw)


_LM_PROMPT = torch.tensor([[1, 2, 3]])

ROWS += [
    ("generate: model not a TinyLM", _gen(_LM_PROMPT, 3, model=MultiHeadAttention(4, 2)), TypeError,
     r"^model must be an attn_lib\.models\.tiny_lm\.TinyLM, got MultiHeadAttention; build one with tiny_lm\.build_lm\(\)$"),
    ("generate: prompt a list", _gen([[1, 2]], 3), TypeError,
     r"^prompt_ids must be a torch\.Tensor of shape \(B, L\), got list; "
     r"e\.g\. torch\.tensor\(\[lm_data\.encode_tokens\(tokens\)\]\)$"),
    ("generate: float prompt", _gen(torch.zeros(1, 3), 3), TypeError,
     r"^prompt_ids must hold integers, got dtype torch\.float32; convert with prompt_ids\.long\(\)$"),
    ("generate: 3-D prompt", _gen(torch.zeros(1, 1, 3, dtype=torch.int64), 3), ValueError,
     r"^prompt_ids must be 2-D \(B, L\), got 3-D with shape \(1, 1, 3\)\.$"),
    ("generate: empty prompt", _gen(torch.zeros(2, 0, dtype=torch.int64), 3), ValueError,
     r"^prompt_ids must hold at least 1 token\(s\) per sequence, got shape \(2, 0\); start the prompt with "
     r"lm_data\.BOS_ID$"),
    ("generate: a token beyond the vocabulary", _gen(torch.tensor([[1, 500]]), 3), ValueError,
     r"^prompt_ids must be token ids in 0\.\.73 \(the model's vocabulary\), got 500; "
     r"encode words with lm_data\.encode_tokens$"),
    ("generate: a negative token", _gen(torch.tensor([[1, -1]]), 3), ValueError, r"got -1; encode words"),
    ("generate: max_new_tokens -1", _gen(_LM_PROMPT, -1), ValueError, r"^max_new_tokens must be an int >= 0, got -1$"),
    ("generate: max_new_tokens float", _gen(_LM_PROMPT, 2.0), TypeError,
     r"^max_new_tokens must be an int >= 0, got 2\.0 \(float\); use int\(2\.0\)$"),
    ("generate: kv_cache a string", _gen(_LM_PROMPT, 2, kv_cache="yes"), TypeError,
     r"^kv_cache must be True or False, got 'yes'$"),
    ("generate: temperature a string", _gen(_LM_PROMPT, 2, temperature="hot"), TypeError,
     r"^temperature must be a number >= 0 \(0 = greedy\), got 'hot' \(str\)$"),
    ("generate: temperature negative", _gen(_LM_PROMPT, 2, temperature=-0.5), ValueError,
     r"^temperature must be finite and >= 0 \(0 = greedy\), got -0\.5$"),
    ("generate: temperature nan", _gen(_LM_PROMPT, 2, temperature=float("nan")), ValueError,
     r"^temperature must be finite and >= 0 \(0 = greedy\), got nan$"),
    ("generate: generator a seed", _gen(_LM_PROMPT, 2, temperature=1.0, generator=0), TypeError,
     r"^generator must be a torch\.Generator or None, got int; e\.g\. generator=torch\.Generator\(\)\.manual_seed\(0\)$"),
    ("generate: trace a dict", _gen(_LM_PROMPT, 2, trace={}), TypeError, r"^trace must be a list or None, got dict; e\.g\. trace=\[\]$"),
    ("tiny_lm.TinyLM: ids a list", lambda: _lm()([[1, 2]]), TypeError,
     r"^ids must be a torch\.Tensor of shape \(B, L\), got list; e\.g\. torch\.tensor"),
    ("tiny_lm.TinyLM: ids 1-D", lambda: _lm()(torch.tensor([1, 2])), ValueError, r"^ids must be 2-D \(B, L\), got 1-D"),
    ("tiny_lm.TinyLM: kv_caches one KVCache", lambda: _lm()(_LM_PROMPT, KVCache()), TypeError,
     r"^kv_caches must be a list of 2 attn_lib\.KVCache \(one per block\) or None, got KVCache; "
     r"e\.g\. kv_caches=\[KVCache\(\) for _ in model\.blocks\]$"),
    ("tiny_lm.TinyLM: one cache for both blocks", lambda: (lambda c: _lm()(_LM_PROMPT, [c, c]))(KVCache()), ValueError,
     r"^kv_caches must be 2 distinct attn_lib\.KVCache, one per block, got 2 with 1 distinct; "),
    ("tiny_lm.TinyLM: three caches for two blocks", lambda: _lm()(_LM_PROMPT, [KVCache() for _ in range(3)]), ValueError,
     r"^kv_caches must be 2 distinct attn_lib\.KVCache, one per block, got 3 with 3 distinct; "),
    ("tiny_lm.TinyLM: a cache that is not a KVCache", lambda: _lm()(_LM_PROMPT, [KVCache(), {}]), TypeError,
     r"^kv_cache must be an attn_lib\.KVCache or None, got dict$"),
    ("tiny_lm.TinyLM: a cache of another model", _foreign_cache(), ValueError, r"^kv_cache already serves another layer"),
    ("tiny_lm.TinyLM: caches of two lengths", _caches_of_two_lengths(), ValueError,
     r"^kv_caches must all hold the same positions \(one sequence, one cache per block\), got seen=\[0, 2\]; "
     r"reset them all before a new sequence$"),
    ("tiny_lm.TinyLM: odd head dim", lambda: attn_lib.models.tiny_lm.TinyLM(10, d_model=12, num_heads=4), ValueError,
     r"head dim D = d_model / num_heads must be even for rotary positions.*D=3"),
    ("tiny_lm.TinyLM: vocab_size 0", lambda: attn_lib.models.tiny_lm.TinyLM(0), ValueError, r"^vocab_size must be a positive int, got 0$"),
    ("tiny_lm.train_lm: lr 0", lambda: attn_lib.models.tiny_lm.train_lm(_lm(), {}, lr=0.0), ValueError, r"^lr must be finite and > 0, got 0\.0$"),
    ("tiny_lm.completion_rate: no prompts", lambda: attn_lib.models.tiny_lm.completion_rate(_lm(), []), ValueError,
     r"^prompts must be a non-empty list of lm_data\.Prompt, got \[\]; use lm_data\.completion_prompts\(\)$"),
    ("tiny_lm.completion_rate: prompts as strings", lambda: attn_lib.models.tiny_lm.completion_rate(_lm(), ["桌上有水"]),
     TypeError, r"^prompts must hold lm_data\.Prompt, got str; use lm_data\.completion_prompts\(\)$"),
    ("tiny_lm.verb_step_attention: a word not in the vocabulary", lambda: attn_lib.models.tiny_lm.verb_step_attention(
        _lm(), ["<bos>", "桌子"]), ValueError, r"^tokens must be words of lm_data\.VOCAB, got '桌子'; split the text"),
    ("lm_data.make_split: unknown split", lambda: attn_lib.models.lm_data.make_split("dev", 3), ValueError,
     r'^split must be "train" or "test", got \'dev\'$'),
    ("lm_data.completion_prompts: n 0", lambda: attn_lib.models.lm_data.completion_prompts("test", 0), ValueError,
     r"^n must be a positive int, got 0$"),
    ("lm_data.decode: an id beyond the vocabulary", lambda: attn_lib.models.lm_data.decode([1, 74]), ValueError,
     r"^ids must be token ids in 0\.\.73, got 74$"),
    ("lm_data.tokenize: a word not in the vocabulary", lambda: attn_lib.models.lm_data.tokenize("桌上有猫"), ValueError,
     r"^text must be made of the words of lm_data\.VOCAB, got '猫' at character 3; "
     r"e\.g\. lm_data\.make_split\('train', 1\)\[0\]\.text$"),
    ("lm_data.tokenize: the <bos> token spelled out", lambda: attn_lib.models.lm_data.tokenize("<bos>桌上"), ValueError,
     r"^text must be made of the words of lm_data\.VOCAB, got '<bos>桌上' at character 0"),
    ("lm_data.tokenize: not a str", lambda: attn_lib.models.lm_data.tokenize(["桌上"]), TypeError, r"^text must be a str, got list$"),
    ("lm_data.encode_text: a word not in the vocabulary", lambda: attn_lib.models.lm_data.encode_text("桌上有狗"), ValueError,
     r"^text must be made of the words of lm_data\.VOCAB, got '狗' at character 3"),
    ("lm_data.encode: no sentences", lambda: attn_lib.models.lm_data.encode([]), ValueError, r"^sentences is empty$"),
    ("lm_data.fits: not an object", lambda: attn_lib.models.lm_data.fits("打翻", ("水", "桌上")), ValueError,
     r"^objects must be objects of it_data\.OBJECTS, got '桌上'$"),
    ("lm_data.bigram_after: a token that never occurs", lambda: attn_lib.models.lm_data.bigram_after(
        attn_lib.models.lm_data.make_split("train", 5), "<pad>"), ValueError, r"^token must occur in the sentences, got '<pad>'$"),
]


# --- messages pinned whole: the argument, the expected layout, what was found, the remedy ---------------
# (An id must not contain "triton": the mutation run deselects those with -k "not triton"; the
# Triton rows below raise at the door, before any kernel, so they run without a GPU.)
def _mask_nan(*shape):
    m = t(*shape)
    m[(0,) * len(shape)] = float("nan")
    return m


def _tiny_call(ids=None, lengths=None, it_index=None):
    ids = torch.zeros(2, 5, dtype=torch.int64) if ids is None else ids
    lengths = torch.tensor([5, 5]) if lengths is None else lengths
    it_index = torch.tensor([0, 1]) if it_index is None else it_index
    return lambda: _tiny()(ids, lengths, it_index)


def _train(**kw):
    return lambda: tiny_model.train(_tiny(), _it_batch(), steps=0, **kw)  # steps=0: only the checks run


ROWS += [
    ("SelfAttention.from_matrices: w_q 1-D", lambda: SelfAttention.from_matrices(t(3), t(3, 2), t(3, 2)), ValueError,
     r"^w_q must be 2-D \(C, d\), got 1-D with shape \(3,\)\.$"),
    ("SelfAttention.from_matrices: w_k 3-D", lambda: SelfAttention.from_matrices(t(3, 2), t(3, 2, 1), t(3, 2)), ValueError,
     r"^w_k must be 2-D \(C, d\), got 3-D with shape \(3, 2, 1\)\.$"),
    ("SelfAttention.from_matrices: w_v 1-D", lambda: SelfAttention.from_matrices(t(3, 2), t(3, 2), t(3)), ValueError,
     r"^w_v must be 2-D \(C, d\), got 1-D with shape \(3,\)\.$"),
    ("SelfAttention: need_weights with torch", lambda: SelfAttention(4, backend="torch")(t(1, 3, 4), need_weights=True),
     ValueError, r"^need_weights=True needs the attention scores, which backend='torch' never stores; build the layer "
                 r"with backend='reference' or 'auto' \(the default\) to get them\.$"),
    ("SelfAttention: nan in the float mask", lambda: SelfAttention(4)(t(1, 3, 4), mask=_mask_nan(1, 3, 3)), ValueError,
     r"^an additive float mask may contain -inf \(hidden\) but not nan or \+inf$"),
    ("SelfAttention: 3-D mask of another shape", lambda: SelfAttention(4)(t(2, 3, 4), mask=torch.ones(2, 2, 3, dtype=torch.bool)),
     ValueError, r"^a 3-D mask means \(B, L, S\) = \(2, 3, 3\) .*got \(2, 2, 3\)\. For one mask per head pass 4-D "
                 r"\(B, H, L, S\) = \(2, 1, 3, 3\); for one pattern for the whole batch pass 2-D \(L, S\)\.$"),
    ("SelfAttention: float64 on the GPU kernel", lambda: SelfAttention(4, backend="triton").double()(
        t(1, 3, 4, dtype=torch.float64)), TypeError,
     r"^the Triton kernel takes float16, bfloat16 or float32; for float64 use backend='torch' "
     r"\(got torch\.float64\)$"),
    ("SelfAttention: value head dim 300 on the GPU kernel", lambda: SelfAttention(4, 2, 300, backend="triton")(t(1, 3, 4)),
     ValueError, r"^the Triton kernel supports head dims up to 256, got D=2, Dv=300; use backend='torch'$"),
    ("SelfAttention: key head dim 300 on the GPU kernel", lambda: SelfAttention(4, 300, 2, backend="triton")(t(1, 3, 4)),
     ValueError, r"^the Triton kernel supports head dims up to 256, got D=300, Dv=2; use backend='torch'$"),
    ("MultiHeadAttention: kv_cache a dict", lambda: MultiHeadAttention(4, 2)(t(1, 2, 4), kv_cache={}),
     TypeError, r"^kv_cache must be an attn_lib\.KVCache or None, got dict$"),
    ("MultiHeadAttention: kv_cache with key and value", lambda: MultiHeadAttention(4, 2)(t(1, 2, 4), t(1, 3, 4), kv_cache=KVCache()),
     ValueError, r"^kv_cache works with self-attention only: leave key and value as None$"),
    ("MultiHeadAttention: kv_cache of another layer", lambda: _cache_of_another_layer(), ValueError,
     r"^kv_cache already serves another layer; one cache serves one attention layer \(its keys and values come from "
     r"that layer's projections\): give each layer its own KVCache, or call cache\.reset\(\) before reusing it$"),
    ("KVCache: a batch of another size", lambda: _cache_with(B=2).append(*_kv(B=3)), ValueError,
     r"^the cache holds a batch of B=2 sequences but the new keys have B=3; one cache serves one batch: call "
     r"cache\.reset\(\) \(or use a new KVCache\) for another batch$"),
    ("KVCache: another number of heads", lambda: _cache_with().append(t(2, 3, 1, 4), t(2, 3, 1, 4)), ValueError,
     r"^the cache holds H=2 heads of D=4 \(values Dv=4\) but the new keys/values have H=3, D=4, Dv=4; one cache "
     r"serves one attention layer$"),
    ("KVCache: keys of another dtype", lambda: _cache_with().append(*_kv(dtype=torch.float64)), TypeError,
     r"^the cache holds torch\.float32 but the new keys are torch\.float64; keep one dtype for a whole generation "
     r"\(the same autocast setting for every step too\), or cache\.reset\(\)$"),
    ("KVCache: k a list", lambda: KVCache().append([1], t(1, 2, 3, 4)), TypeError,
     r"^k must be a torch\.Tensor of shape \(B, H, S, D\), got list$"),
    ("KVCache: v a list", lambda: KVCache().append(t(1, 2, 3, 4), [1]), TypeError,
     r"^v must be a torch\.Tensor of shape \(B, H, S, D\), got list$"),
    ("KVCache: k 2-D", lambda: KVCache().append(t(2, 3), t(1, 2, 3, 4)), ValueError,
     r"^k must be 4-D \(B, H, S, D\), got 2-D with shape \(2, 3\)\."),
    ("KVCache: v 3-D", lambda: KVCache().append(t(1, 2, 3, 4), t(1, 2, 3)), ValueError,
     r"^v must be 4-D \(B, H, S, D\), got 3-D with shape \(1, 2, 3\)\."),
    ("KVCache: int values", lambda: KVCache().append(t(1, 2, 3, 4), t(1, 2, 3, 4, dtype=torch.int64)), TypeError,
     r"^v must be a floating-point tensor, got torch\.int64$"),
    ("KVCache.attention_mask: L float", lambda: KVCache().attention_mask(None, 1.0, True), TypeError,
     r"^L must be an int >= 0, got 1\.0 \(float\); use int\(1\.0\)$"),
    ("numpy attention: int keys", natt(QN, a(1, 1, 3, 4, dtype=np.int64), QN), TypeError,
     r"^k must be a floating-point array \(float16/float32/float64\), got int64; convert with k\.astype\(np\.float64\)$"),
    ("numpy attention: torch values", natt(QN, QN, Q), TypeError, r"^v must be a numpy\.ndarray, got Tensor; wrap it with np\.asarray$"),
    ("numpy attention: mask with a batch axis the scores lack",
     natt(*(a(1, 2, 3, 4),) * 3, mask=np.ones((2, 1, 3, 3), dtype=bool)), ValueError,
     r"^mask has shape \(2, 1, 3, 3\), which does not broadcast to the scores' shape \(B, H, L, S\) = \(1, 2, 3, 3\)\."),
    ("numpy attention: mask +inf", natt(QN, QN, QN, mask=_inf(3, 3, torch_=False)), ValueError,
     r"^an additive float mask may contain -inf \(hidden\) but not nan or \+inf$"),
    ("numpy attention: scale of two elements", natt(QN, QN, QN, scale=np.ones((2, 1))), TypeError,
     r"^scale must be a positive number or None, got array\(\[\[1\.\],\s+\[1\.\]\]\) \(ndarray\); e\.g\. scale=0\.125"),
    ("numpy attention: scale of no elements", natt(QN, QN, QN, scale=np.ones((0,))), TypeError,
     r"^scale must be a positive number or None, got array\(\[\], dtype=float64\) \(ndarray\)"),
    ("sinusoidal_positions: int dtype", lambda: sinusoidal_positions(3, 4, dtype=torch.int64), TypeError,
     r"^dtype must be a floating torch dtype, got torch\.int64$"),
    ("sinusoidal_positions: dtype a string", lambda: sinusoidal_positions(3, 4, dtype="float32"), TypeError,
     r"^dtype must be a floating torch dtype, got 'float32'$"),
    ("apply_rotary: x a list", lambda: apply_rotary([1]), TypeError,
     r"^x must be a torch\.Tensor of shape \(B, H, L, D\), got list$"),
    ("apply_rotary: x 3-D", lambda: apply_rotary(t(1, 3, 4)), ValueError,
     r"^x must be 4-D \(B, H, L, D\), got 3-D with shape \(1, 3, 4\)\. For a single head, add the head axis: x\.unsqueeze\(1\)\.$"),
    ("apply_rotary: D=5", lambda: apply_rotary(t(1, 1, 3, 5)), ValueError,
     r"^apply_rotary needs an even head dim D \(it rotates pairs of channels 2i, 2i\+1\), got D=5\. "
     r"Choose a head dim of 4 or 6\.$"),
    ("apply_rotary: D=1", lambda: apply_rotary(t(1, 1, 3, 1)), ValueError,
     r"got D=1\. Choose a head dim of 2\.$"),  # the smallest even head dim, named once
    ("apply_rotary: bool positions", lambda: apply_rotary(t(1, 1, 3, 4), torch.tensor([True, False, True])), TypeError,
     r"^positions must hold integers \(token indices\), got dtype torch\.bool; use torch\.arange\(L\) or positions\.long\(\)$"),
    ("apply_rotary: positions an int", lambda: apply_rotary(t(1, 1, 3, 4), 3), TypeError,
     r"^positions must be a 1-D sequence of L ints or an int tensor, got 3$"),
    ("apply_rotary: positions a string", lambda: apply_rotary(t(1, 1, 3, 4), "abc"), TypeError,
     r"^positions must be a 1-D sequence of L ints or an int tensor, got 'abc'$"),
    ("apply_rotary: a float among the positions", lambda: apply_rotary(t(1, 1, 3, 4), [0, 1.5, 2]), TypeError,
     r"^positions must contain ints, got 1\.5$"),
    ("apply_rotary: a bool among the positions", lambda: apply_rotary(t(1, 1, 3, 4), [0, True, 2]), TypeError,
     r"^positions must contain ints, got True$"),
    ("tiny_model.TinyItModel: ids a list", _tiny_call(ids=[[0] * 5] * 2), TypeError,
     r"^ids must be a torch\.Tensor of shape \(B, L\), got list$"),
    ("tiny_model.TinyItModel: ids 1-D", _tiny_call(ids=torch.zeros(5, dtype=torch.int64)), ValueError,
     r"^ids must be 2-D \(B, L\), got 1-D with shape \(5,\)\.$"),
    ("tiny_model.TinyItModel: lengths a list", _tiny_call(lengths=[5, 5]), TypeError,
     r"^lengths must be a torch\.Tensor of shape \(B,\), got list$"),
    ("tiny_model.TinyItModel: lengths 2-D", _tiny_call(lengths=torch.tensor([[5, 5]])), ValueError,
     r"^lengths must be 1-D \(B,\), got 2-D with shape \(1, 2\)\.$"),
    ("tiny_model.TinyItModel: float lengths", _tiny_call(lengths=torch.tensor([5.0, 5.0])), TypeError,
     r"^lengths must hold integers, got dtype torch\.float32; convert with lengths\.long\(\)$"),
    ("tiny_model.TinyItModel: it_index a list", _tiny_call(it_index=[0, 1]), TypeError,
     r"^it_index must be a torch\.Tensor of shape \(B,\), got list$"),
    ("tiny_model.TinyItModel: it_index 2-D", _tiny_call(it_index=torch.tensor([[0, 1]])), ValueError,
     r"^it_index must be 1-D \(B,\), got 2-D with shape \(1, 2\)\.$"),
    ("tiny_model.TinyItModel: bool it_index", _tiny_call(it_index=torch.tensor([False, True])), TypeError,
     r"^it_index must hold integers, got dtype torch\.bool; convert with it_index\.long\(\)$"),
    ("tiny_model.TinyItModel: it_index of another batch", _tiny_call(it_index=torch.tensor([0, 1, 1])), ValueError,
     r"^ids, lengths and it_index must have the same batch size B, got 2, 2 and 3$"),
    ("tiny_model.TinyItModel: lengths of another batch", _tiny_call(lengths=torch.tensor([5, 5, 5])), ValueError,
     r"^ids, lengths and it_index must have the same batch size B, got 2, 3 and 2$"),
    ("tiny_model.train: lr a string", _train(lr="0.1"), TypeError, r"^lr must be a positive number, got '0\.1' \(str\)$"),
    ("tiny_model.train: lr a bool", _train(lr=True), TypeError, r"^lr must be a positive number, got True \(bool\)$"),
    ("tiny_model.train: lr 0", _train(lr=0), ValueError, r"^lr must be finite and > 0, got 0$"),
    ("tiny_model.train: lr inf", _train(lr=float("inf")), ValueError, r"^lr must be finite and > 0, got inf$"),
    ("tiny_model.train: lr < 0", _train(lr=-0.5), ValueError, r"^lr must be finite and > 0, got -0\.5$"),
    ("naive_softmax: numpy input", lambda: attn_lib.naive_softmax(np.zeros(3)), TypeError,
     r"^x must be a torch\.Tensor, got ndarray; for numpy arrays use attn_lib\.core\.numpy_ref\.softmax$"),
    ("tiny_model.train: batch_size a float", _train(batch_size=2.0), TypeError,
     r"^batch_size must be a positive int, got 2\.0 \(float\)"),
]

# The layer door, once per mistake ("GPU kernel" = backend "triton"; see the note above on ids).
_KEYS3 = torch.tensor([True, True, False])
ROWS += [
    ("MultiHeadAttention: float64 on the GPU kernel", lambda: MultiHeadAttention(8, 2, backend="triton").double()(
        t(1, 3, 8, dtype=torch.float64)), TypeError,
     r"^the Triton kernel takes float16, bfloat16 or float32; for float64 use backend='torch' "
     r"\(got torch\.float64\)$"),
    ("MultiHeadAttention: head dim 300 on the GPU kernel", lambda: MultiHeadAttention(600, 2, backend="triton")(t(1, 3, 600)),
     ValueError, r"^the Triton kernel supports head dims up to 256, got D=300, Dv=300; use backend='torch'$"),
    ("MultiHeadAttention: a pattern mask on the GPU kernel", lambda: MultiHeadAttention(8, 2, backend="triton")(
        t(1, 3, 8), mask=torch.ones(3, 3, dtype=torch.bool)), ValueError,
     r"^mask must be a bool key padding mask \(B, 1, 1, S\) or \(B, 1, S\) for backend='triton' \(e\.g\. "
     r"attn_lib\.padding_mask\(lengths\); is_causal is applied separately\), got torch\.bool of shape \(3, 3\); "
     r"use backend='sdpa' or 'reference' for other masks\.$"),
    ("MultiHeadAttention: an additive key padding mask on the tiled path", lambda: MultiHeadAttention(8, 2, backend="torch")(
        t(1, 3, 8), mask=attn_lib.bool_to_additive(_KEYS3)[None, None, None]), ValueError,
     r"^mask must be a bool key padding mask .* for backend='torch' .*got torch\.float32 of shape \(1, 1, 1, 3\)"),
    ("MultiHeadAttention: a per-head key padding mask on the tiled path", lambda: MultiHeadAttention(8, 2, backend="torch")(
        t(1, 3, 8), mask=_KEYS3.expand(1, 2, 1, 3)), ValueError,
     r"^mask must be a bool key padding mask .* for backend='torch' .*got torch\.bool of shape \(1, 2, 1, 3\)"),
    ("MultiHeadAttention: kv_cache with another value", lambda: (lambda x: MultiHeadAttention(4, 2)(
        x, x, t(1, 2, 4), kv_cache=KVCache()))(t(1, 2, 4)), ValueError,
     r"^kv_cache works with self-attention only: leave key and value as None$"),
    ("MultiHeadAttention: int input", lambda: MultiHeadAttention(4, 2)(torch.zeros(1, 2, 4, dtype=torch.int64)), TypeError,
     r"^query must be a floating-point tensor, got torch\.int64; convert with query\.to\(torch\.float32\)$"),
    ("tiny_model.RotaryMultiHeadAttention: a key", lambda: tiny_model.RotaryMultiHeadAttention(8, 2)(t(1, 3, 8), t(1, 3, 8)),
     ValueError, r"^RotaryMultiHeadAttention is self-attention only: leave key and value as None$"),
    ("tiny_model.RotaryMultiHeadAttention: a value", lambda: tiny_model.RotaryMultiHeadAttention(8, 2)(t(1, 3, 8), None, t(1, 3, 8)),
     ValueError, r"^RotaryMultiHeadAttention is self-attention only: leave key and value as None$"),
    ("flash_attention_torch_backward: int out", lambda: attn_lib.flash_attention_torch_backward(
        t(1, 2, 5, 4), t(1, 2, 6, 4), t(1, 2, 6, 4), t(1, 2, 5, 4, dtype=torch.int64), t(1, 2, 5), t(1, 2, 5, 4)), TypeError,
     r"^out must be a floating-point tensor, got torch\.int64; pass what flash_attention_torch returned$"),
    ("flash_attention_torch_backward: lse on another device", lambda: attn_lib.flash_attention_torch_backward(
        t(1, 2, 5, 4), t(1, 2, 6, 4), t(1, 2, 6, 4), t(1, 2, 5, 4), t(1, 2, 5).to("meta"), t(1, 2, 5, 4)), ValueError,
     r"^lse must be on q's device cpu, got meta; move it with lse\.to\(q\.device\)$"),
    ("flash_attention_torch_backward: out shape, the whole message", lambda: attn_lib.flash_attention_torch_backward(
        t(1, 2, 5, 4), t(1, 2, 6, 4), t(1, 2, 6, 4), t(1, 2, 5, 3), t(1, 2, 5), t(1, 2, 5, 4)), ValueError,
     r"^out must have shape \(1, 2, 5, 4\), got \(1, 2, 5, 3\); pass what flash_attention_torch returned for these "
     r"q, k, v$"),
    ("flash_attention_torch: key_mask requires grad", lambda: attn_lib.flash_attention_torch(
        t(1, 2, 5, 4), t(1, 2, 6, 4), t(1, 2, 6, 4), key_mask=torch.ones(1, 6, requires_grad=True)), ValueError,
     r"^key_mask requires grad, but it is not differentiable \(a key is either present or not\); pass a bool "
     r"tensor \(True = key present\), e\.g\. key_mask\.detach\(\) > 0\.5$"),
    ("flash_attention_torch: key_mask float", lambda: attn_lib.flash_attention_torch(
        t(1, 2, 5, 4), t(1, 2, 6, 4), t(1, 2, 6, 4), key_mask=torch.ones(1, 6)), TypeError,
     r"^key_mask must be bool \(True = key present; torch\.nn\.MultiheadAttention's key_padding_mask is the "
     r"opposite, True = padding\), got torch\.float32; for a 0/1 tensor use key_mask\.bool\(\)$"),
    ("flash_attention_torch: key_mask on another device", lambda: attn_lib.flash_attention_torch(
        t(1, 2, 5, 4), t(1, 2, 6, 4), t(1, 2, 6, 4), key_mask=torch.ones(1, 6, dtype=torch.bool, device="meta")),
     ValueError, r"^key_mask must be on q's device cpu, got meta; move it with key_mask\.to\(q\.device\)$"),
    ("flash_attention_torch: inputs that require grad, the whole message", lambda: attn_lib.flash_attention_torch(
        t(1, 2, 5, 4).requires_grad_(), t(1, 2, 6, 4), t(1, 2, 6, 4)), ValueError,
     r"^flash_attention_torch is forward-only, but q, k or v requires grad \(expected: no autograd here\); to "
     r"train, call attn_lib\.flash_attention\(q, k, v, backend='torch'\), whose backward is the tiled "
     r"FlashAttention-2 backward \(attn_lib\.attention for the reference's\), or wrap this call in torch\.no_grad\(\)$"),
    ("MultiHeadAttention: backend unknown, the whole message", lambda: MultiHeadAttention(4, 2, backend="fast"), ValueError,
     r"^backend must be one of \('auto', 'reference', 'sdpa', 'torch', 'triton'\), got 'fast'$"),
    ("attention: mask of another shape, the whole message", lambda: attn_lib.attention(t(1, 1, 3, 4), t(1, 1, 5, 4), t(1, 1, 5, 4),
        mask=torch.ones(3, 4, dtype=torch.bool)), ValueError,
     r"^mask has shape \(3, 4\), which does not broadcast to the scores' shape \(B, H, L, S\) = \(1, 1, 3, 5\)\. Each "
     r"mask axis must equal the scores' axis or be 1; e\.g\. \(L, S\), \(B, 1, 1, S\) for key padding, or \(B, H, L, S\)\.$"),
    ("flash_attention_torch: only q requires grad", lambda: attn_lib.flash_attention_torch(
        t(1, 1, 3, 4).requires_grad_(), t(1, 1, 3, 4), t(1, 1, 3, 4)), ValueError, r"^flash_attention_torch is forward-only"),
    ("flash_attention_torch: only k requires grad", lambda: attn_lib.flash_attention_torch(
        t(1, 1, 3, 4), t(1, 1, 3, 4).requires_grad_(), t(1, 1, 3, 4)), ValueError, r"^flash_attention_torch is forward-only"),
    ("flash_attention_torch: only v requires grad", lambda: attn_lib.flash_attention_torch(
        t(1, 1, 3, 4), t(1, 1, 3, 4), t(1, 1, 3, 4).requires_grad_()), ValueError, r"^flash_attention_torch is forward-only"),
    ("flash_attention_torch: one score overflows", lambda: attn_lib.flash_attention_torch(
        torch.full((1, 1, 1, 1), 1e20), torch.full((1, 1, 1, 1), 1e20), torch.ones(1, 1, 1, 1), scale=1.0), ValueError,
     r"^attention scores overflowed to \+inf \(\|scale·q·k\| exceeds the range of float32\); compute in float64 or use a "
     r"smaller scale$"),
    ("flash_attention_torch: a float64 overflow names float64", lambda: attn_lib.flash_attention_torch(
        torch.full((1, 1, 2, 1), 1e200, dtype=torch.float64), torch.full((1, 1, 2, 1), 1e200, dtype=torch.float64),
        torch.ones(1, 1, 2, 1, dtype=torch.float64), scale=1.0), ValueError,
     r"^attention scores overflowed to \+inf \(\|scale·q·k\| exceeds the range of float64\)"),
    ("attention: k with other heads, the whole message", lambda: attn_lib.attention(t(1, 2, 3, 4), t(1, 3, 5, 4), t(1, 2, 5, 4)),
     ValueError, r"^q, k and v must share batch and head sizes \(B, H\): q has \(1, 2\), k has \(1, 3\), v has \(1, 2\)\.$"),
    ("attention: head dims differ, the whole message", lambda: attn_lib.attention(t(1, 1, 3, 4), t(1, 1, 5, 3), t(1, 1, 5, 4)),
     ValueError, r"^q and k must have the same head dim D \(last axis\): q has D=4, k has D=3\. Every query is compared "
                 r"with every key by a dot product, so their lengths must match\.$"),
    ("attention: key counts differ, the whole message", lambda: attn_lib.attention(t(1, 1, 3, 4), t(1, 1, 5, 4), t(1, 1, 4, 4)),
     ValueError, r"^k and v must have the same number of keys S \(axis 2\): k has S=5, v has S=4\. Each key needs exactly "
                 r"one value\.$"),
    ("attention: head dim 0, the whole message", lambda: attn_lib.attention(t(1, 1, 3, 0), t(1, 1, 5, 0), t(1, 1, 5, 4)),
     ValueError, r"^q and k have head dim D=0; attention needs D >= 1\.$"),
    ("attention: dtypes differ, the whole message", lambda: attn_lib.attention(t(1, 1, 3, 4), t(1, 1, 5, 4, dtype=torch.float64),
        t(1, 1, 5, 4)), TypeError,
     r"^q, k, v must have the same dtype, got q=torch\.float32, k=torch\.float64, v=torch\.float32\. Cast them first, "
     r"e\.g\. k = k\.to\(q\.dtype\)\.$"),
    ("attention: scale requires grad, the whole message", lambda: attn_lib.attention(t(1, 1, 3, 4), t(1, 1, 5, 4), t(1, 1, 5, 4), scale=torch.tensor(0.5, requires_grad=True)),
     TypeError, r"^scale is not differentiable: got a tensor with requires_grad=True, and its gradient would be silently "
                r"dropped\. Pass a plain number \(scale=float\(s\.detach\(\)\)\), or multiply q by the learnable factor "
                r"yourself \(attention\(q \* s, k, v, scale=1\.0\)\) so autograd sees it\.$"),
    ("attention: scale a string, the whole message", lambda: attn_lib.attention(t(1, 1, 3, 4), t(1, 1, 5, 4), t(1, 1, 5, 4), scale="x"), TypeError,
     r"^scale must be a positive number or None, got 'x' \(str\); e\.g\. scale=0\.125, or leave it as None for 1/sqrt\(D\)\.$"),
    ("flash_attention_torch: key_mask a list", lambda: attn_lib.flash_attention_torch(
        t(1, 1, 2, 4), t(1, 1, 2, 4), t(1, 1, 2, 4), key_mask=[[True, True]]), TypeError,
     r"^key_mask must be a torch\.Tensor or None, got list; convert it with torch\.as_tensor\(key_mask\)$"),
    ("causal_mask: L a fraction, no int() hint", lambda: causal_mask(2.5), TypeError, r"^L must be an int >= 0, got 2\.5 \(float\)$"),
    ("attention: scale a numpy string", lambda: attn_lib.attention(t(1, 1, 3, 4), t(1, 1, 5, 4), t(1, 1, 5, 4),
        scale=np.str_("0.5")), TypeError, r"^scale must be a positive number or None, got np\.str_\('0\.5'\) \(str_\)"),
    ("online_softmax_update: m a list, the remedy", lambda: attn_lib.online_softmax_update([0.0], t(1), t(1, 2)), TypeError,
     r"^m must be a torch\.Tensor, got list; convert it with torch\.as_tensor\(m\)$"),
    ("softmax: numpy input", lambda: attn_lib.softmax(np.zeros(3)), TypeError,
     r"^x must be a torch\.Tensor, got ndarray; for numpy arrays use attn_lib\.core\.numpy_ref\.softmax$"),
    ("softmax: dim out of range", lambda: attn_lib.softmax(t(2, 3), dim=2), ValueError,
     r"^dim=2 is out of range for a 2-D tensor; dim must be in \[-2, 1\]$"),
    ("padding_mask: S negative", lambda: attn_lib.padding_mask([2, 1], S=-1), ValueError, r"^S must be an int >= 0, got -1$"),
    ("tiny_model.RotaryMultiHeadAttention: odd head dim, the suggestion", lambda: tiny_model.RotaryMultiHeadAttention(6, 2),
     ValueError, r"^head dim D = d_model / num_heads must be even for rotary positions \(RoPE rotates pairs of "
                 r"channels\), got D=3; choose d_model and num_heads with an even D, e.g\. d_model=8$"),
]


# --- grouped-query attention (enable_gqa) and sliding windows (window_size), on every functional path -------
Q6, K4, K2, K1 = t(1, 6, 3, 4), t(1, 4, 3, 4), t(1, 2, 3, 4), t(1, 1, 3, 4)
WINDOW_EG = r"e\.g\. window_size=\(256, 0\) for 256 keys back and none ahead, or \(-1, -1\) for no window$"
NOT_DIVIDING = r"^k must have a number of heads H_kv that divides q's H=6 \(query head h uses key/value head h // \(H // H_kv\)\), got H_kv=4; use one of \[1, 2, 3, 6\] key/value heads$"


def _gqa_window_rows(name, call):
    """The same bad GQA heads and windows for one public function: ``call(q, k, v, **kw)`` returns the thunk."""
    return [
        (f"{name}: H not divisible by H_kv", call(Q6, K4, K4, enable_gqa=True), ValueError, NOT_DIVIDING),
        (f"{name}: more kv heads than query heads", call(K2, K4, K4, enable_gqa=True), ValueError,
         r"^k must have a number of heads H_kv that divides q's H=2 .*got H_kv=4; use one of \[1, 2\] key/value heads$"),
        (f"{name}: H_kv without enable_gqa", call(Q6, K2, K2), ValueError,
         r"^k must have H=6 heads like q, got H_kv=2; pass enable_gqa=True to share each key/value head among "
         r"H // H_kv = 3 query heads \(grouped-query attention\)$"),
        (f"{name}: k and v heads differ", call(Q6, K2, K1, enable_gqa=True), ValueError,
         r"^q, k and v must share batch and head sizes \(B, H\): q has \(1, 6\), k has \(1, 2\), v has \(1, 1\)\.$"),
        (f"{name}: enable_gqa not bool", call(Q, Q, Q, enable_gqa="yes"), TypeError,
         r"^enable_gqa must be True or False, got 'yes'$"),
        (f"{name}: enable_gqa None", call(Q, Q, Q, enable_gqa=None), TypeError,
         r"^enable_gqa must be True or False, got None$"),
        (f"{name}: window_size an int", call(Q, Q, Q, window_size=3), TypeError,
         r"^window_size must be a pair \(left, right\) of ints, as a tuple or list, or None, got 3 \(int\); " + WINDOW_EG),
        (f"{name}: window_size of three", call(Q, Q, Q, window_size=(1, 2, 3)), ValueError,
         r"^window_size must be a pair \(left, right\) of ints, got 3 values \(1, 2, 3\); " + WINDOW_EG),
        (f"{name}: window_size float", call(Q, Q, Q, window_size=(1.5, 0)), TypeError,
         r"^window_size must be a pair \(left, right\) of ints, got 1\.5 \(float\) in \(1\.5, 0\); " + WINDOW_EG),
        (f"{name}: window_size bool", call(Q, Q, Q, window_size=[True, 0]), TypeError,
         r"^window_size must be a pair \(left, right\) of ints, got True \(bool\) in \(True, 0\); " + WINDOW_EG),
        (f"{name}: window_size < -1", call(Q, Q, Q, window_size=(-2, 0)), ValueError,
         r"^window_size must be a pair of ints >= -1 \(-1: unbounded on that side\), got \(-2, 0\); " + WINDOW_EG),
        (f"{name}: causal window looks ahead", call(Q, Q, Q, is_causal=True, window_size=(2, 1)), ValueError,
         r"^window_size's right side must be 0 or -1 with is_causal=True \(a causal query sees no later key\), "
         r"got \(2, 1\); pass window_size=\(2, 0\), or is_causal=False for a window that looks ahead$"),
    ]


def _call(fn, **fixed):
    return lambda *args, **kw: (lambda: fn(*args, **fixed, **kw))


def _bwd_call(q, k, v, **kw):
    """flash_attention_torch_backward with out, lse, dout shaped for q and v."""
    B, H, L, _ = q.shape
    Dv = v.shape[-1]
    return lambda: attn_lib.flash_attention_torch_backward(q, k, v, t(B, H, L, Dv), t(B, H, L), t(B, H, L, Dv), **kw)


ROWS += _gqa_window_rows("attention", _call(attn_lib.attention))
ROWS += _gqa_window_rows("flash_attention", _call(attn_lib.flash_attention, backend="torch"))
ROWS += _gqa_window_rows("flash_attention_torch", _call(attn_lib.flash_attention_torch))
ROWS += _gqa_window_rows("flash_attention_torch_backward", _bwd_call)
ROWS += [
    ("flash_attention: triton window_size < -1", _call(attn_lib.flash_attention, backend="triton")(Q, Q, Q, window_size=(0, -3)),
     ValueError, r"^window_size must be a pair of ints >= -1 \(-1: unbounded on that side\), got \(0, -3\); " + WINDOW_EG),
    ("flash_attention: triton H not divisible by H_kv", _call(attn_lib.flash_attention, backend="triton")(Q6, K4, K4, enable_gqa=True),
     ValueError, NOT_DIVIDING),
    ("naive_attention: H_kv heads", lambda: attn_lib.naive_attention(Q6, K2, K2), ValueError,
     r"^k must have H=6 heads like q, got H_kv=2; this function has no enable_gqa: "
     r"use attn_lib\.attention\(q, k, v, enable_gqa=True\) for grouped-query attention$"),
    ("sliding_window_mask: window_size an int", lambda: attn_lib.sliding_window_mask(4, window_size=2), TypeError,
     r"^window_size must be a pair \(left, right\) of ints, as a tuple or list, or None, got 2 \(int\); " + WINDOW_EG),
    ("sliding_window_mask: window_size < -1", lambda: attn_lib.sliding_window_mask(4, window_size=(0, -5)), ValueError,
     r"^window_size must be a pair of ints >= -1 \(-1: unbounded on that side\), got \(0, -5\); " + WINDOW_EG),
    ("sliding_window_mask: causal window looks ahead", lambda: attn_lib.sliding_window_mask(4, window_size=(1, 1), is_causal=True),
     ValueError, r"^window_size's right side must be 0 or -1 with is_causal=True .*got \(1, 1\); pass window_size=\(1, 0\)"),
    ("sliding_window_mask: is_causal not bool", lambda: attn_lib.sliding_window_mask(4, window_size=(1, 0), is_causal=1),
     TypeError, r"^is_causal must be True or False, got 1$"),
    ("sliding_window_mask: L < 0", lambda: attn_lib.sliding_window_mask(-1, window_size=(1, 0)), ValueError,
     r"^L must be an int >= 0, got -1$"),
    ("sliding_window_mask: S float", lambda: attn_lib.sliding_window_mask(3, 2.0, window_size=(1, 0)), TypeError,
     r"^S must be an int >= 0, got 2\.0 \(float\); use int\(2\.0\)$"),
    ("sliding_window_mask: align", lambda: attn_lib.sliding_window_mask(3, window_size=(1, 0), align="bottom"), ValueError,
     r'^align must be "top-left" or "bottom-right", got \'bottom\'; "top-left" is SDPA\'s is_causal \(query i '
     r'sees keys up to i\), "bottom-right" flash-attn\'s \(up to i \+ S - L\)$'),
]

# --- chapter 13: the decode step: flash_decoding(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens=...),
# and the split rule of attn_lib.flash.splits (choose_num_splits, split_bounds, merge_partials)
_QD, _KD, _K1 = t(1, 2, 1, 4), t(1, 2, 5, 4), t(1, 2, 1, 4)  # one query, a cache of S_max = 5, one new key


def _nan_at(shape, where):
    x = t(*shape)
    x[where] = float("nan")
    return x


def _decode(*args, **kw):
    return lambda: attn_lib.flash_decoding(*args, **kw)


_READ_NAN = (r"^k_cache contains nan or inf in the positions the step reads \(keys 0 \.\. cache_seqlens\[b\] - 1; "
             r"the tail after them is never read\); attention would turn it into nan\. Check the layer that produced "
             r"it\.$")
ROWS += [
    ("flash_decoding: H not divisible by H_kv", _decode(t(1, 6, 1, 4), t(1, 4, 5, 4), t(1, 4, 5, 4), enable_gqa=True),
     ValueError, NOT_DIVIDING.replace("^k ", "^k_cache ")),
    ("flash_decoding: enable_gqa None", _decode(_QD, _KD, _KD, enable_gqa=None), TypeError,
     r"^enable_gqa must be True or False, got None$"),
    ("flash_decoding: is_causal not bool", _decode(_QD, _KD, _KD, is_causal=1), TypeError,
     r"^is_causal must be True or False, got 1$"),
    ("flash_decoding: backend name", _decode(_QD, _KD, _KD, backend="cuda"), ValueError,
     r"^backend must be one of \('auto', 'torch', 'triton'\), got 'cuda'$"),
    ("flash_decoding: backend not a string", _decode(_QD, _KD, _KD, backend=None), TypeError,
     r"^backend must be one of \('auto', 'torch', 'triton'\), got None \(NoneType\)$"),
    ("flash_decoding: cache_seqlens beyond S_max", _decode(_QD, _KD, _KD, cache_seqlens=torch.tensor([6])),
     ValueError, r"^cache_seqlens must hold lengths in 0 \.\. 5 \(entry b uses keys 0 \.\. cache_seqlens\[b\] - 1 "
                 r"of the cache, and new keys go after them\), got lengths from 6 to 6; clamp them with "
                 r"cache_seqlens\.clamp\(0, 5\) or pass a longer cache$"),
    ("flash_decoding: cache_seqlens negative", _decode(_QD, _KD, _KD, cache_seqlens=torch.tensor([-1])),
     ValueError, r"^cache_seqlens must hold lengths in 0 \.\. 5 .*got lengths from -1 to -1"),
    ("flash_decoding: cache_seqlens float", _decode(_QD, _KD, _KD, cache_seqlens=torch.tensor([5.0])),
     TypeError, r"^cache_seqlens must be an integer tensor"),
    ("flash_decoding: cache_seqlens of another batch", _decode(_QD, _KD, _KD, cache_seqlens=torch.tensor([1, 2])),
     ValueError, r"^cache_seqlens must have shape \(B,\) = \(1,\) \(one length per sequence\), got \(2,\)"),
    ("flash_decoding: num_splits negative", _decode(_QD, _KD, _KD, num_splits=-1), ValueError,
     r"^num_splits must be an int >= 0, got -1$"),  # 0 means "choose", as flash-attn's num_splits=0
    ("flash_decoding: num_splits float", _decode(_QD, _KD, _KD, num_splits=2.0), TypeError,
     r"^num_splits must be an int >= 0, got 2\.0 \(float\)"),
    ("flash_decoding: more queries than the cache", _decode(t(1, 2, 6, 4), _KD, _KD),
     ValueError, r"^q must have at most S_max=5 queries"),
    ("flash_decoding: inputs that require grad", _decode(_QD.clone().requires_grad_(), _KD, _KD),
     ValueError, r"^flash_decoding is forward-only"),
    ("flash_decoding: k without v", _decode(_QD, _KD, _KD, _K1, cache_seqlens=torch.tensor([4])), ValueError,
     r"^k and v must be given together \(the new keys and their values\), got only k; pass both, or neither to "
     r"attend over the cache as it is$"),
    ("flash_decoding: v without k", _decode(_QD, _KD, _KD, None, _K1, cache_seqlens=torch.tensor([4])), ValueError,
     r"^k and v must be given together .*got only v;"),
    ("flash_decoding: k and v without cache_seqlens", _decode(_QD, _KD, _KD, _K1, _K1), ValueError,
     r"^cache_seqlens must be given with new k and v \(they are written at positions cache_seqlens\[b\] \.\. "
     r"cache_seqlens\[b\] \+ S_new - 1\), got None; e\.g\. cache_seqlens=torch\.zeros\(B, dtype=torch\.int32\) "
     r"for empty caches$"),
    ("flash_decoding: no room for the new keys", _decode(_QD, _KD, _KD, t(1, 2, 2, 4), t(1, 2, 2, 4),
                                                         cache_seqlens=torch.tensor([4])), ValueError,
     r"^cache_seqlens must hold lengths in 0 \.\. 3 \(.*new keys go after them\), got lengths from 4 to 4"),
    ("flash_decoding: k of another head dim", _decode(_QD, _KD, _KD, t(1, 2, 1, 3), _K1, cache_seqlens=torch.tensor([4])),
     ValueError, r"^k must have shape \(B, H_kv, S_new, D\) = \(1, 2, 1, 4\) like k_cache's \(1, 2, 5, 4\), "
                 r"got \(1, 2, 1, 3\)$"),
    ("flash_decoding: k of another dtype", _decode(_QD, _KD, _KD, _K1.double(), _K1, cache_seqlens=torch.tensor([4])),
     TypeError, r"^k_cache, k, v must have the same dtype, got k_cache=torch\.float32, k=torch\.float64"),
    ("flash_decoding: nan inside the read part of the cache", _decode(
        _QD, _nan_at((1, 2, 5, 4), (0, 1, 2, 3)), _KD, cache_seqlens=torch.tensor([3])), ValueError, _READ_NAN),
    ("flash_decoding: nan in the values of a full cache", _decode(_QD, _KD, _nan_at((1, 2, 5, 4), (0, 0, 4, 0))),
     ValueError, r"^v_cache contains nan or inf"),
    ("flash_decoding: nan in the new keys", _decode(_QD, _KD, _KD, _nan_at((1, 2, 1, 4), (0, 0, 0, 0)), _K1,
                                                    cache_seqlens=torch.tensor([2])), ValueError,
     r"^k contains nan or inf"),
    ("merge_partials: shapes do not fit", lambda: attn_lib.merge_partials(t(2, 3, 4), t(2, 4)), ValueError,
     r"^outs must have shape \(\.\.\., P, Dv\) with lses of shape \(\.\.\., P\)"),
    ("merge_partials: nan in lses", lambda: attn_lib.merge_partials(t(2, 3), torch.tensor([0.0, float("nan")])),
     ValueError, r"^lses must be finite or -inf"),
    ("merge_partials: no split", lambda: splits.merge_partials(t(2, 0, 3), t(2, 0)), ValueError,
     r"^outs must hold at least one split \(P >= 1\), got P=0"),
    ("choose_num_splits: batch_heads negative", lambda: splits.choose_num_splits(-1, 8), ValueError,
     r"^batch_heads must be an int >= 0, got -1$"),
    ("choose_num_splits: S float", lambda: splits.choose_num_splits(4, 8.0), TypeError,
     r"^S must be an int >= 0, got 8\.0 \(float\); use int\(8\.0\)$"),
    ("choose_num_splits: workers 0", lambda: splits.choose_num_splits(4, 8, workers=0), ValueError,
     r"^workers must be a positive int, got 0$"),
    ("split_bounds: no split", lambda: splits.split_bounds(10, 0), ValueError,
     r"^num_splits must be a positive int, got 0$"),
    ("split_bounds: S negative", lambda: splits.split_bounds(-1, 2), ValueError, r"^S must be an int >= 0, got -1$"),
    ("split_bounds: block_n 0", lambda: splits.split_bounds(10, 2, 0), ValueError,
     r"^block_n must be a positive int, got 0$"),
]


# --- align: one check, one wording, on every entry that takes it (functions, masks, layer constructors) ------
ALIGN_VALUE = (r'^align must be "top-left" or "bottom-right", got \'middle\'; "top-left" is SDPA\'s is_causal '
               r'\(query i sees keys up to i\), "bottom-right" flash-attn\'s \(up to i \+ S - L\)$')
ALIGN_TYPE = (r'^align must be the string "top-left" or "bottom-right", got 1 \(int\); "top-left" is SDPA\'s '
              r'is_causal, "bottom-right" flash-attn\'s$')
_Q16B, _OUT16B, _LSE3B = t(1, 1, 3, 16), t(1, 1, 3, 16), t(1, 1, 3)
ALIGN_CALLS = {
    "attention": lambda align: attn_lib.attention(Q, Q, Q, is_causal=True, align=align),
    "naive_attention": lambda align: attn_lib.naive_attention(Q, Q, Q, is_causal=True, align=align),
    "flash_attention": lambda align: attn_lib.flash_attention(Q, Q, Q, is_causal=True, align=align, backend="torch"),
    "flash_attention_torch": lambda align: attn_lib.flash_attention_torch(Q, Q, Q, is_causal=True, align=align),
    "flash_attention_torch_backward": lambda align: _bwd_call(Q, Q, Q, is_causal=True, align=align)(),
    "flash_attention_triton": lambda align: attn_lib.flash_attention_triton(_Q16B, _Q16B, _Q16B, align=align),
    "flash_attention_triton_backward": lambda align: attn_lib.flash_attention_triton_backward(
        _Q16B, _Q16B, _Q16B, _OUT16B, _LSE3B, _OUT16B, align=align),
    "sliding_window_mask": lambda align: attn_lib.sliding_window_mask(2, 3, window_size=(1, 0), align=align),
    "causal_mask": lambda align: attn_lib.causal_mask(2, 3, align=align),
    "SelfAttention": lambda align: SelfAttention(4, align=align),
    "MultiHeadAttention": lambda align: MultiHeadAttention(8, 2, align=align),
    "LoopedMultiHeadAttention": lambda align: LoopedMultiHeadAttention(8, 2, align=align),
    "tiny_model.RotaryMultiHeadAttention": lambda align: tiny_model.RotaryMultiHeadAttention(8, 2, align=align),
}
for _name, _fn in ALIGN_CALLS.items():
    ROWS += [(f"{_name}: align 'middle'", (lambda f: lambda: f("middle"))(_fn), ValueError, ALIGN_VALUE),
             (f"{_name}: align 1", (lambda f: lambda: f(1))(_fn), TypeError, ALIGN_TYPE)]

# --- the removed keyword, the counter, positions beyond float64's integers, the overflow's direction --------
_HUGE = torch.full((1, 1, 2, 1), 1e20)  # q·k = ±1e40: beyond float32 although every key is visible
OVERFLOW_UP = (r"^attention scores overflowed to \+inf \(\|scale·q·k\| exceeds the range of float32\); compute in "
               r"float64 or use a smaller scale$")
OVERFLOW_DOWN = (r"^attention scores overflowed to -inf \(\|scale·q·k\| exceeds the range of float32\); compute in "
                 r"float64 or use a smaller scale$")
ROWS += [
    *[(f"{name}: the removed keyword key_padding_mask", (lambda f: lambda: f(
        Q, Q, Q, key_padding_mask=torch.ones(1, 3, dtype=torch.bool)))(fn), TypeError,
       r"got an unexpected keyword argument 'key_padding_mask'")
      for name, fn in (("flash_attention", attn_lib.flash_attention),
                       ("flash_attention_torch", attn_lib.flash_attention_torch),
                       ("naive_attention", attn_lib.naive_attention))],
    ("flash_attention_torch: counter a string", lambda: attn_lib.flash_attention_torch(Q, Q, Q, counter="x"), TypeError,
     r"^counter must be None or have methods load\(name, n\) and store\(name, n\), got str; "
     r"e\.g\. counter=attn_lib\.IOCounter\(\)$"),
    ("flash_attention_torch: counter without store", lambda: attn_lib.flash_attention_torch(
        Q, Q, Q, counter=type("LoadsOnly", (), {"load": lambda self, name, n: None})()), TypeError,
     r"^counter must be None or have methods load\(name, n\) and store\(name, n\), got LoadsOnly"),
    ("apply_rotary: positions beyond 2**53", lambda: apply_rotary(t(1, 1, 5, 4), [2**63] * 5), ValueError,
     r"^positions must lie in -2\*\*53 \.\. 2\*\*53 \(float64 represents the angle p·θ exactly only there\), "
     r"got a position of magnitude 9223372036854775808; number the tokens from 0$"),
    ("apply_rotary: a tensor position below -2**53", lambda: apply_rotary(
        t(1, 1, 2, 4), torch.tensor([0, -2**53 - 1])), ValueError, r"^positions must lie in -2\*\*53 \.\. 2\*\*53"),
    ("attention: scores overflow to -inf", lambda: attn_lib.attention(_HUGE, -_HUGE, _HUGE, scale=1.0), ValueError,
     OVERFLOW_DOWN),
    ("attention: scores overflow to +inf", lambda: attn_lib.attention(_HUGE, _HUGE, _HUGE, scale=1.0), ValueError,
     OVERFLOW_UP),
    ("flash_attention_torch: scores overflow to -inf", lambda: attn_lib.flash_attention_torch(
        _HUGE, -_HUGE, _HUGE, scale=1.0), ValueError, OVERFLOW_DOWN),
    ("flash_attention: scores overflow to -inf", lambda: attn_lib.flash_attention(
        _HUGE, -_HUGE, _HUGE, scale=1.0, backend="torch"), ValueError, OVERFLOW_DOWN),
    ("flash_decoding: scores overflow to +inf", lambda: attn_lib.flash_decoding(_HUGE[:, :, :1], _HUGE, _HUGE, scale=1.0),
     ValueError, OVERFLOW_UP),
    ("MultiHeadAttention: scores overflow on the SDPA path", lambda: _identity_layer("sdpa")(torch.full((1, 3, 4), 1e20)),
     ValueError, OVERFLOW_UP),
]


def _identity_layer(backend):
    """One head, q = k = v = x: the scores are |x|², which overflow float32 for x = 1e20."""
    layer = MultiHeadAttention(4, 1, bias=False, backend=backend)
    with torch.no_grad():
        layer.qkv.weight.copy_(torch.eye(4).repeat(3, 1))  # (3C,C): [I; I; I]
    return layer


# --- the layers: shared key/value heads and sliding windows ---------
# (the window wording is the shared check_window_size's: the layers say what attention and
# flash_attention say)
def _gqa_layer(**kw):
    return lambda: MultiHeadAttention(24, 6, **kw)


def _cache_with_heads(H_kv):
    cache = KVCache()
    cache.append(torch.zeros(1, H_kv, 3, 4), torch.zeros(1, H_kv, 3, 4))
    return cache


ROWS += [
    ("MultiHeadAttention: num_kv_heads not dividing num_heads", _gqa_layer(num_kv_heads=4), ValueError,
     r"^num_kv_heads must divide num_heads=6 .*got 4; choose one of 1, 2, 3, 6$"),
    ("MultiHeadAttention: num_kv_heads 0", _gqa_layer(num_kv_heads=0), ValueError,
     r"num_kv_heads must be a positive int, got 0"),
    ("MultiHeadAttention: num_kv_heads float", _gqa_layer(num_kv_heads=2.0), TypeError,
     r"num_kv_heads must be a positive int, got 2.0"),
    ("MultiHeadAttention: num_kv_heads more than num_heads", _gqa_layer(num_kv_heads=12), ValueError,
     r"^num_kv_heads must divide num_heads=6 .*got 12"),
    ("MultiHeadAttention: window_size a string", _gqa_layer(window_size="full"), TypeError,
     r"^window_size must be a pair \(left, right\) of ints"),
    ("MultiHeadAttention: window_size of floats", _gqa_layer(window_size=(1.5, 0)), TypeError,
     r"^window_size must be a pair \(left, right\) of ints"),
    ("MultiHeadAttention: window_size below -1", _gqa_layer(window_size=(-2, 0)), ValueError,
     r"^window_size must be a pair of ints >= -1"),
    ("MultiHeadAttention: causal window looking right", _gqa_layer(window_size=(3, 2), is_causal=True), ValueError,
     r"^window_size's right side must be 0 or -1 with is_causal=True"),
    ("LoopedMultiHeadAttention: num_kv_heads not dividing num_heads",
     lambda: LoopedMultiHeadAttention(24, 6, num_kv_heads=4), ValueError, r"^num_kv_heads must divide num_heads=6"),
    ("LoopedMultiHeadAttention: causal window looking right",
     lambda: LoopedMultiHeadAttention(24, 6, window_size=(0, 1), is_causal=True), ValueError,
     r"^window_size's right side must be 0 or -1"),
    ("RotaryMultiHeadAttention: num_kv_heads not dividing num_heads",
     lambda: tiny_model.RotaryMultiHeadAttention(24, 4, num_kv_heads=3), ValueError,
     r"^num_kv_heads must divide num_heads=4 .*choose one of 1, 2, 4$"),
    ("SelfAttention: window_size below -1", lambda: SelfAttention(8, window_size=(0, -3)), ValueError,
     r"^window_size must be a pair of ints >= -1"),
    ("MultiHeadAttention: kv_cache of a layer with other kv heads",
     lambda: MultiHeadAttention(24, 6, num_kv_heads=3)(torch.zeros(1, 2, 24), kv_cache=_cache_with_heads(2)),
     ValueError, r"the cache holds H=2 heads of D=4 .* new keys/values have H=3, D=4"),
    ("tiny_model.TinyItModel: num_kv_heads not dividing num_heads",
     lambda: tiny_model.TinyItModel(5, 3, num_heads=2, num_kv_heads=3), ValueError, r"^num_kv_heads must divide num_heads=2"),
]


# The Triton entry points' door, whole messages. One test for all of them, not one per row: the
# mutation run deselects test ids that name the kernel (-k "not triton"), and these checks run before
# any kernel, so they belong in it. The last call goes through the door and runs (the interpreter on CPU).
_Q16, _OUT16, _LSE3 = t(1, 1, 3, 16), t(1, 1, 3, 16), t(1, 1, 3)
GPU_DOOR_ROWS = [
    ("inputs that require grad", lambda: attn_lib.flash_attention_triton(_Q16.clone().requires_grad_(), _Q16, _Q16),
     ValueError, r"^flash_attention_triton returns \(out, lse\) without a gradient, but q, k or v requires grad "
                 r"\(expected: no autograd here\); to train, use attn_lib\.flash_attention\(q, k, v, backend='triton'\), "
                 r"which runs flash_attention_triton_backward in its backward; or call this under torch\.no_grad\(\)$"),
    ("block_m 8", lambda: attn_lib.flash_attention_triton(_Q16, _Q16, _Q16, block_m=8), ValueError,
     r"^block_m must be a power of two >= 16 \(tl\.dot's smallest tile\), got 8$"),
    ("block_n 48", lambda: attn_lib.flash_attention_triton(_Q16, _Q16, _Q16, block_n=48), ValueError,
     r"^block_n must be a power of two >= 16 \(tl\.dot's smallest tile\), got 48$"),
    ("backward: lse float16", lambda: attn_lib.flash_attention_triton_backward(_Q16, _Q16, _Q16, _OUT16, _LSE3.half(), _OUT16),
     TypeError, r"^lse must be torch\.float32, got torch\.float16; pass what flash_attention_triton returned$"),
    ("backward: int out", lambda: attn_lib.flash_attention_triton_backward(
        _Q16, _Q16, _Q16, _OUT16.long(), _LSE3, _OUT16), TypeError,
     r"^out must be a floating-point tensor, got torch\.int64; pass what flash_attention_triton returned$"),
    ("backward: lse on another device", lambda: attn_lib.flash_attention_triton_backward(
        _Q16, _Q16, _Q16, _OUT16, _LSE3.to("meta"), _OUT16), ValueError,
     r"^lse must be on q's device cpu, got meta; move it with lse\.to\(q\.device\)$"),
]


def test_the_gpu_kernel_door_refuses_each_mistake_in_one_wording():
    for name, call, exc, pattern in GPU_DOOR_ROWS:
        try:
            call()
        except Exception as e:  # noqa: BLE001 (the row says which type it expects)
            assert isinstance(e, exc) and re.search(pattern, str(e)), f"{name}: {type(e).__name__}: {e}"
        else:
            pytest.fail(f"{name}: no error")
    out, lse = attn_lib.flash_attention_triton(_Q16, _Q16, _Q16, block_m=16, block_n=32)  # the smallest tile passes
    assert out.shape == (1, 1, 3, 16) and lse.shape == (1, 1, 3)
    q16 = _Q16.half()  # float16 inputs: out in float16, lse in float32, and the backward takes them as they are
    out16, lse16 = attn_lib.flash_attention_triton(q16, q16, q16)
    assert (out16.dtype, lse16.dtype) == (torch.float16, torch.float32)
    grads = attn_lib.flash_attention_triton_backward(q16, q16, q16, out16, lse16, torch.ones_like(out16))
    assert [g.dtype for g in grads] == [torch.float16] * 3


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_gives_clear_error(row):
    _, call, exc, pattern = row
    with pytest.raises(exc, match=pattern):
        call()


def test_every_public_function_has_a_row():
    """Each callable that attn_lib exports (and numpy_ref / plotting's public plotting
    functions) appears in the table."""
    ids = " ".join(r[0] for r in ROWS)
    public = [n for n in attn_lib.__all__ if callable(getattr(attn_lib, n)) and not isinstance(getattr(attn_lib, n), dict)]
    exempt = {"cuda_available", "default_device", "try_gpu", "assert_close", "count_parameters",
              "IOCounter"}  # nothing to get wrong / a tally with no inputs to check
    missing = [n for n in public if n not in exempt and f"{n}:" not in ids]
    missing += [f"numpy {n}" for n in ("attention", "softmax", "causal_mask") if f"numpy {n}:" not in ids]
    missing += [n for n in ("show_heatmap", "show_heatmaps", "bar_scores") if f"{n}:" not in ids]
    missing += [n for n in PUBLIC_SPLIT_RULES if f"{n}:" not in ids]
    missing += [f"{n}: align" for n in ALIGN_TAKERS if f"{n}: align 'middle'" not in ids]
    assert not missing, f"no bad-input row for: {missing}"


# The split rule of chapter 13 (attn_lib.flash.splits) is public API too, though only merge_partials is exported
# at the top; every entry whose signature has `align` gets the two align rows.
PUBLIC_SPLIT_RULES = ("choose_num_splits", "split_bounds", "merge_partials")
ALIGN_TAKERS = [n for n in attn_lib.__all__ if callable(getattr(attn_lib, n))
                and "align" in inspect.signature(getattr(attn_lib, n)).parameters]


def test_the_align_rows_cover_every_entry_that_takes_align():
    """The list of entries with `align` is read from their signatures, so it cannot miss one that gains it."""
    assert {"attention", "flash_attention", "flash_attention_torch", "flash_attention_torch_backward",
            "flash_attention_triton", "flash_attention_triton_backward", "naive_attention", "sliding_window_mask",
            "causal_mask", "SelfAttention", "MultiHeadAttention", "LoopedMultiHeadAttention"} <= set(ALIGN_TAKERS)
    assert set(ALIGN_TAKERS) <= set(ALIGN_CALLS)


WINDOW_CALLS = {  # every entry that takes window_size, called with it set
    "attention": lambda w: attn_lib.attention(Q, Q, Q, is_causal=True, window_size=w),
    "flash_attention": lambda w: attn_lib.flash_attention(Q, Q, Q, is_causal=True, window_size=w, backend="torch"),
    "flash_attention_torch": lambda w: attn_lib.flash_attention_torch(Q, Q, Q, is_causal=True, window_size=w),
    "flash_attention_torch_backward": lambda w: _bwd_call(Q, Q, Q, is_causal=True, window_size=w)(),
    "flash_attention_triton": lambda w: attn_lib.flash_attention_triton(_Q16B, _Q16B, _Q16B, is_causal=True,
                                                                        window_size=w),
    "flash_attention_triton_backward": lambda w: attn_lib.flash_attention_triton_backward(
        _Q16B, _Q16B, _Q16B, _OUT16B, _LSE3B, _OUT16B, is_causal=True, window_size=w),
    "sliding_window_mask": lambda w: attn_lib.sliding_window_mask(2, 3, window_size=w, is_causal=True),
    "SelfAttention": lambda w: SelfAttention(4, is_causal=True, window_size=w)(t(1, 3, 4)),
    "MultiHeadAttention": lambda w: MultiHeadAttention(8, 2, is_causal=True, window_size=w)(t(1, 3, 8)),
    "LoopedMultiHeadAttention": lambda w: LoopedMultiHeadAttention(8, 2, is_causal=True, window_size=w)(t(1, 3, 8)),
}


@pytest.mark.parametrize("name", sorted(WINDOW_CALLS))
@pytest.mark.parametrize("window", [None, (2**64, 0), (2**64, -1)], ids=["None", "left 2**64", "left 2**64 unbounded"])
def test_no_window_and_a_window_wider_than_any_sequence_are_not_errors(name, window):
    """window_size=None means no window everywhere; a side wider than the sequence (even beyond int64) limits
    nothing and is not a mistake (tests/topics/test_path_rules.py checks that the answer is the unbounded one)."""
    out = WINDOW_CALLS[name](window)
    out = out[0] if isinstance(out, tuple) else out
    assert isinstance(out, torch.Tensor) and out.numel() > 0


def test_sizes_are_checked_alike():
    """One wording for one mistake: a float size, in causal_mask and in sinusoidal_positions."""
    assert attn_lib.sinusoidal_positions(torch.tensor(3), 4).shape == (3, 4)  # a 0-d int tensor, as elsewhere
    messages = []
    for call in (lambda: attn_lib.causal_mask(2.0), lambda: attn_lib.sinusoidal_positions(2.0, 4)):
        with pytest.raises(TypeError) as info:
            call()
        messages.append(str(info.value))
    assert messages[0] == messages[1] == "L must be an int >= 0, got 2.0 (float); use int(2.0)"
