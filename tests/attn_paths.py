"""The one module of shared test inputs: every attention path behind one calling convention,
hypothesis strategies for cases, seeded tensors and layers, and the float64 references
(outputs, log-sum-exp and gradients).

Used by the topic tests (tests/topics: edges, properties, alignment, doors ...), the FlashAttention
tests (tests/flash) and the module tests that need seeded inputs or weights. A *path* takes torch tensors q (B,H,L,D), k (B,H,S,D),
v (B,H,S,Dv), an optional mask, ``causal`` and ``scale`` and returns the output (B,H,L,Dv)
as a torch tensor in the input dtype. The float64 oracle is ``attn_lib.attention``
computed on the same (already rounded) inputs cast to float64.

The registry is unconditional: a path whose export disappears fails at import, it is not
silently dropped. A path that needs an optional package (Triton) is still registered and
its tests skip, with the reason, when the package is missing: use ``path_params``.
"""
from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch
from hypothesis import strategies as st

import attn_lib
from attn_lib.core import numpy_ref
from attn_lib.flash.tiled_forward import flash_attention_torch

# A difference larger than this tells two different answers apart (a test's own sanity margin,
# not a numeric tolerance: tolerances come from attn_lib.tolerances).
DISTINGUISHABLE = 1e-3

DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# Lengths: small ones, 1, and both sides of every power-of-two block size up to 128.
BLOCK_EDGES = [1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 129]


# ---------------------------------------------------------------------------------------------
# Seeded tensors and layers
# ---------------------------------------------------------------------------------------------
def randn64(*shape, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Seeded standard-normal values drawn in float64, then cast to ``dtype``."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def seed_weights(layer, seed: int = 0):
    """Overwrite a layer's parameters with seeded unit-scale values (randn / sqrt(fan_in)), in place."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():  # unit-scale outputs for unit-scale inputs
            fan_in = p.shape[-1] if p.ndim == 2 else 4
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) / math.sqrt(fan_in))
    return layer


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    B: int
    H: int
    L: int
    S: int
    D: int
    Dv: int
    dtype: str = "float32"
    causal: bool = False
    mask_kind: str = "none"  # "none" | "bool" | "additive" | "key_padding"
    mask_shape: tuple = ()
    keep_prob: float = 0.7
    scale: float | None = None
    seed: int = 0
    block_m: int | None = None  # block sizes, for the tiled paths (None = the path's default)
    block_n: int | None = None

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


def mask_shapes(B: int, H: int, L: int, S: int) -> list[tuple]:
    """Mask shapes that broadcast to (B, H, L, S), as readers write them."""
    return [(L, S), (S,), (B, 1, 1, S), (B, H, L, S), (1, H, 1, S), (B, 1, L, S), (1, 1, L, 1)]


def lengths(max_len: int) -> st.SearchStrategy[int]:
    edges = [n for n in BLOCK_EDGES if n <= max_len]
    return st.one_of(st.integers(1, max_len), st.sampled_from(edges))


@st.composite
def cases(draw, *, dtypes=("float32",), max_b=2, max_h=3, max_len=70, max_d=40,
          mask_kinds=("none", "bool", "additive"), causal=(False, True), scales=(None,),
          same_length=False, same_dv=False, blocks=None) -> Case:
    """A random attention problem: sizes, dtype, causal flag, mask kind and shape, scale, seed.

    ``scales`` are factors of the default 1/sqrt(D) (None = leave the default); ``blocks`` a
    strategy for block sizes (tiled paths)."""
    B, H = draw(st.integers(1, max_b)), draw(st.integers(1, max_h))
    L = draw(lengths(max_len))
    S = L if same_length else draw(lengths(max_len))
    D = draw(st.one_of(st.integers(1, max_d), st.sampled_from([1, 3, 5, max_d])))
    Dv = D if same_dv else draw(st.one_of(st.just(D), st.integers(1, max_d)))
    factor = draw(st.sampled_from(scales))  # scale = factor / sqrt(D): scores stay of unit size,
    scale = None if factor is None else factor / math.sqrt(D)  # the range the tolerances are for
    kind = draw(st.sampled_from(mask_kinds))
    shape = draw(st.sampled_from(mask_shapes(B, H, L, S))) if kind in ("bool", "additive") else ()
    if kind == "key_padding":
        shape = (B, S)
    return Case(B=B, H=H, L=L, S=S, D=D, Dv=Dv, dtype=draw(st.sampled_from(dtypes)),
                causal=draw(st.sampled_from(causal)), mask_kind=kind, mask_shape=shape,
                keep_prob=draw(st.sampled_from([0.3, 0.7, 0.95])), scale=scale,
                seed=draw(st.integers(0, 2**31 - 1)),
                block_m=draw(blocks) if blocks is not None else None,
                block_n=draw(blocks) if blocks is not None else None)


def make_inputs(case: Case, magnitude: float = 1.0):
    """Tensors for a case: q, k, v in the case's dtype and the mask (None, bool or additive)."""
    gen = torch.Generator().manual_seed(case.seed)
    dt = case.torch_dtype

    def randn(*shape):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * magnitude).to(dt)

    q = randn(case.B, case.H, case.L, case.D)
    k = randn(case.B, case.H, case.S, case.D)
    v = randn(case.B, case.H, case.S, case.Dv)
    mask = None
    if case.mask_kind != "none":
        keep = torch.rand(*case.mask_shape, generator=gen) < case.keep_prob
        if case.mask_kind in ("bool", "key_padding"):
            mask = keep
        else:  # additive: a random bias where visible, -inf where hidden
            bias = torch.randn(*case.mask_shape, generator=gen, dtype=torch.float64) * 2
            mask = bias.masked_fill(~keep, float("-inf")).to(dt)
    return q, k, v, mask


def reference_mask(case: Case, mask):
    """The mask as attn_lib.attention takes it: key padding (B, S) -> (B, 1, 1, S)."""
    if mask is not None and case.mask_kind == "key_padding":
        return mask[:, None, None, :]  # (B,S) -> (B,1,1,S)
    return mask


def reference64(case: Case, q, k, v, mask):
    """The float64 oracle: attn_lib.attention on the same inputs cast to float64."""
    m = reference_mask(case, mask)
    if m is not None and m.is_floating_point():
        m = m.double()
    out, _ = attn_lib.attention(q.double(), k.double(), v.double(), mask=m, is_causal=case.causal,
                                scale=case.scale)
    return out


# ---------------------------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------------------------
@dataclass
class Path:
    name: str
    call: Callable  # (q, k, v, mask, causal, scale, **blocks) -> output
    dtypes: tuple
    mask_kinds: tuple  # which Case.mask_kind values it takes
    max_len: int = 70
    max_d: int = 40
    blocks: Any = None  # strategy for block_m / block_n, for paths that take them
    with_lse: Callable | None = None  # same arguments -> (output, log-sum-exp (B, H, L))
    notes: str = ""
    requires: str | None = None  # an optional package the path needs ("triton")


def _torch_reference(q, k, v, mask, causal, scale):
    return attn_lib.attention(q, k, v, mask=mask, is_causal=causal, scale=scale)[0]


def _numpy_reference(q, k, v, mask, causal, scale):
    np_mask = None if mask is None else mask.numpy()
    out, _ = numpy_ref.attention(q.numpy(), k.numpy(), v.numpy(), mask=np_mask, is_causal=causal, scale=scale)
    return torch.from_numpy(out)


def _tiled(q, k, v, mask, causal, scale, **blocks):
    return flash_attention_torch(q, k, v, is_causal=causal, scale=scale, key_mask=mask, **blocks)


def _auto(q, k, v, mask, causal, scale):
    return attn_lib.flash_attention(q, k, v, is_causal=causal, scale=scale, key_mask=mask)


def _triton(q, k, v, mask, causal, scale, **blocks):
    # On CPU tensors attn_lib.flash.autograd runs the kernel under Triton's interpreter.
    return attn_lib.flash_attention_triton(q, k, v, is_causal=causal, scale=scale, key_mask=mask, **blocks)


def _decoding(q, k, v, mask, causal, scale):
    """flash_decoding behind the common convention: each query as a one-query decode step of its own batch
    entry (queries folded into the batch), with cache_seqlens = i + 1 (top-left causal) or S (no rule):
    so every case exercises ragged cache lengths, 0 and S_max included."""
    B, H, L, D = q.shape
    S, Dv = k.shape[2], v.shape[3]
    if S == 0:  # one all-zero key that no entry uses (n = 0): the step gives zeros, as a row that sees nothing
        k, v = k.new_zeros(B, k.shape[1], 1, D), v.new_zeros(B, v.shape[1], 1, Dv)
    seen = [min(i + 1, S) if causal else S for i in range(L)] * B  # (B*L,) keys of query i
    q1 = q.transpose(1, 2).reshape(B * L, H, 1, D)  # (B,H,L,D) -> (B*L,H,1,D)
    k1, v1 = k.repeat_interleave(L, 0), v.repeat_interleave(L, 0)  # (B*L,H,S,D): the oracle's copy, not the path's
    out = attn_lib.flash_decoding(q1, k1, v1, cache_seqlens=torch.tensor(seen, dtype=torch.long), scale=scale,
                                  backend="torch")  # (B*L,H,1,Dv)
    return out.reshape(B, L, H, Dv).transpose(1, 2)  # (B*L,H,1,Dv) -> (B,H,L,Dv)


def _decoding_append(q, k, v, mask, causal, scale):
    """flash_decoding with new keys: as ``_decoding``, but each step's last key and value come as the new k, v
    (flash-attn's ``flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens)``). The cache holds the
    n_b - 1 earlier keys, then a wrong key and value in the slot the new ones must overwrite (their negation),
    then nan in the tail that the step must never read; cache_seqlens = n_b - 1."""
    B, H, L, D = q.shape
    S, Dv = k.shape[2], v.shape[3]
    if S == 0:  # no key to append
        return _decoding(q, k, v, mask, causal, scale)
    seen = torch.tensor([min(i + 1, S) if causal else S for i in range(L)] * B, dtype=torch.long)  # (B*L,) keys
    q1 = q.transpose(1, 2).reshape(B * L, H, 1, D)  # (B,H,L,D) -> (B*L,H,1,D)
    k1, v1 = k.repeat_interleave(L, 0), v.repeat_interleave(L, 0)  # (B*L,H,S,D): the path's own copy
    rows, last = torch.arange(B * L), seen - 1  # (B*L,): the slot of each step's new key
    k_new, v_new = k1[rows, :, last][:, :, None], v1[rows, :, last][:, :, None]  # (B*L,H,1,D), (B*L,H,1,Dv)
    k1[rows, :, last], v1[rows, :, last] = -k1[rows, :, last], -v1[rows, :, last]  # wrong until overwritten
    tail = torch.arange(S)[None, :] >= seen[:, None]  # (B*L,S): never read
    k1, v1 = k1.masked_fill(tail[:, None, :, None], float("nan")), v1.masked_fill(tail[:, None, :, None], float("nan"))
    out = attn_lib.flash_decoding(q1, k1, v1, k_new, v_new, cache_seqlens=last, scale=scale,
                                  backend="torch")  # (B*L,H,1,Dv)
    return out.reshape(B, L, H, Dv).transpose(1, 2)  # (B*L,H,1,Dv) -> (B,H,L,Dv)


PATHS: dict[str, Path] = {
    "torch_reference": Path("torch_reference", _torch_reference,
                            ("float64", "float32", "float16", "bfloat16"), ("none", "bool", "additive")),
    "numpy_reference": Path("numpy_reference", _numpy_reference,
                            ("float64", "float32", "float16"), ("none", "bool", "additive"),
                            notes="numpy has no bfloat16"),
    "tiled_cpu_flash": Path(
        "tiled_cpu_flash", lambda *a, **kw: _tiled(*a, **kw)[0], ("float64", "float32", "float16", "bfloat16"),
        ("none", "key_padding"), blocks=st.one_of(st.integers(2, 40), st.sampled_from([None, 1, 16, 64])),
        with_lse=_tiled, notes="attn_lib.flash.tiled_forward.flash_attention_torch, random block sizes"),
    "flash_attention": Path(
        "flash_attention", _auto, ("float64", "float32", "float16", "bfloat16"), ("none", "key_padding"),
        notes="the public entry, backend='auto' (on CPU tensors: the tiled torch path, default blocks)"),
    "triton_interpreter": Path(
        "triton_interpreter", lambda *a, **kw: _triton(*a, **kw)[0], ("float32", "float16", "bfloat16"),
        ("none", "key_padding"), max_len=34, max_d=9, blocks=st.sampled_from([None, 16, 32]), with_lse=_triton,
        notes="Triton kernel under the interpreter: small L, S, D", requires="triton"),
    "flash_decoding": Path(
        "flash_decoding", _decoding, ("float64", "float32", "float16", "bfloat16"), ("none",), max_len=40,
        notes="chapter 13's split-KV decode step, one query per step (ragged cache_seqlens), the torch path"),
    "flash_decoding_append": Path(
        "flash_decoding_append", _decoding_append, ("float64", "float32", "float16", "bfloat16"), ("none",),
        max_len=40, notes="the decode step given its last key and value as new k, v, written into the cache in "
                          "place at cache_seqlens (a wrong key there before, nan in the unread tail)"),
}


def _missing(requires: str | None) -> str | None:
    if requires == "triton" and importlib.util.find_spec("triton") is None:
        return "the optional triton package is not installed (pip install -e '.[triton]')"
    return None


def path_params(names) -> list:
    """pytest parameters for path names (or tuples starting with one): a path whose optional
    package is missing is skipped with the reason, never an ImportError."""
    params = []
    for item in names:
        name = item[0] if isinstance(item, tuple) else item
        why = _missing(PATHS[name].requires) if name in PATHS else None
        values = item if isinstance(item, tuple) else (item,)
        params.append(pytest.param(*values, marks=pytest.mark.skipif(why is not None, reason=why or "")))
    return params


# ---------------------------------------------------------------------------------------------
# Module paths: layers that own their projections, (B, L, C) in and out
# ---------------------------------------------------------------------------------------------
@dataclass
class ModulePath:
    """A layer type. ``build(case)`` makes one with seeded weights in the case's dtype;
    ``forward(layer, xq, xk, xv, mask)`` runs it (xk/xv None = self-attention);
    ``reference64`` recomputes the same thing in float64 from the layer's weights, with
    plain matrix products and ``attn_lib.attention``."""

    name: str
    build: Callable
    forward: Callable
    reference64: Callable
    dtypes: tuple = ("float64", "float32", "float16", "bfloat16")
    cross: bool = True  # takes separate key / value inputs
    heads: bool = True  # masks broadcast to (B, H, L, S); False: single head


def _seeded_(layer, seed: int, dtype: torch.dtype):
    return seed_weights(layer, seed + 1).to(dtype)


def _mask64(mask):
    return mask.double() if mask is not None and mask.is_floating_point() else mask


def _linear64(x, w, b):
    y = x.double() @ w.double().T  # (B,L,C_in) @ (C_in,C_out) -> (B,L,C_out)
    return y + b.double() if b is not None else y


def mha_reference64(layer, xq, xk=None, xv=None, mask=None):
    """float64 recomputation of a fused multi-head layer from its weights (plain matrix products and
    attn_lib.attention); xk / xv None = self-attention; mask as the layer takes it."""
    C, H = layer.d_model, layer.num_heads
    xk = xq if xk is None else xk
    xv = xk if xv is None else xv
    w_q, w_k, w_v = layer.qkv.weight.split(C, dim=0)  # (3C,C) -> 3 x (C,C)
    b_q, b_k, b_v = layer.qkv.bias.split(C) if layer.qkv.bias is not None else (None,) * 3

    def heads(y):  # (B,L,C) -> (B,H,L,D)
        return y.reshape(y.shape[0], y.shape[1], H, C // H).transpose(1, 2)

    q, k, v = heads(_linear64(xq, w_q, b_q)), heads(_linear64(xk, w_k, b_k)), heads(_linear64(xv, w_v, b_v))
    out, _ = attn_lib.attention(q, k, v, mask=_mask64(mask), is_causal=layer.is_causal)  # (B,H,L,D)
    merged = out.transpose(1, 2).reshape(xq.shape[0], xq.shape[1], C)  # (B,H,L,D) -> (B,L,C)
    return _linear64(merged, layer.out_proj.weight, layer.out_proj.bias)


def _looped_as_fused(layer):
    """The looped layer's 3H small matrices stacked into the fused layout [W_q; W_k; W_v]."""
    from types import SimpleNamespace

    parts = (layer.w_q, layer.w_k, layer.w_v)
    weight = torch.cat([lin.weight for heads in parts for lin in heads])  # 3H x (D,C) -> (3C,C)
    bias = None if layer.out_proj.bias is None else torch.cat([lin.bias for heads in parts for lin in heads])
    return SimpleNamespace(d_model=layer.d_model, num_heads=layer.num_heads, is_causal=layer.is_causal,
                           qkv=SimpleNamespace(weight=weight, bias=bias), out_proj=layer.out_proj)


def _mha_forward(layer, xq, xk, xv, mask):
    with torch.no_grad():
        return layer(xq, xk, xv, mask=mask)


def _self_attention_reference64(layer, xq, xk, xv, mask):
    q = _linear64(xq, layer.w_q.weight, layer.w_q.bias)[:, None]  # (B,L,C) -> (B,1,L,d_k)
    k = _linear64(xq, layer.w_k.weight, layer.w_k.bias)[:, None]  # (B,1,L,d_k)
    v = _linear64(xq, layer.w_v.weight, layer.w_v.bias)[:, None]  # (B,1,L,d_v)
    out, _ = attn_lib.attention(q, k, v, mask=_mask64(mask), is_causal=layer.is_causal)
    return out[:, 0]  # (B,1,L,d_v) -> (B,L,d_v)


def _self_attention_forward(layer, xq, xk, xv, mask):
    with torch.no_grad():
        return layer(xq, mask=mask)


MODULES: dict[str, ModulePath] = {
    "multihead": ModulePath(
        "multihead",
        lambda c: _seeded_(attn_lib.MultiHeadAttention(c.H * c.D, c.H, is_causal=c.causal), c.seed, c.torch_dtype),
        _mha_forward, mha_reference64),
    "multihead_reference": ModulePath(  # backend="reference": the reference core even without the scores
        "multihead_reference",
        lambda c: _seeded_(attn_lib.MultiHeadAttention(c.H * c.D, c.H, is_causal=c.causal, backend="reference"),
                           c.seed, c.torch_dtype),
        _mha_forward, mha_reference64),
    "multihead_looped": ModulePath(
        "multihead_looped",
        lambda c: attn_lib.LoopedMultiHeadAttention.from_fused(MODULES["multihead"].build(c)),
        _mha_forward, lambda layer, *a: mha_reference64(_looped_as_fused(layer), *a)),
    "self_attention": ModulePath(
        "self_attention",
        lambda c: _seeded_(attn_lib.SelfAttention(c.H * c.D, c.D, c.Dv, bias=True, is_causal=c.causal),
                           c.seed, c.torch_dtype),
        _self_attention_forward, _self_attention_reference64, cross=False, heads=False),
}


def module_inputs(case: Case, mode: str, magnitude: float = 1.0):
    """(B, L, C) inputs for a layer: xq and, for cross-attention, xk / xv (else None)."""
    gen = torch.Generator().manual_seed(case.seed + 7)
    C = case.H * case.D

    def randn(n):
        return (torch.randn(case.B, n, C, generator=gen, dtype=torch.float64) * magnitude).to(case.torch_dtype)

    xq = randn(case.L)
    if mode == "self":
        return xq, None, None
    xk = randn(case.S)
    return xq, xk, (randn(case.S) if mode == "cross_separate" else None)


def _block_kwargs(path: Path, case: Case) -> dict:
    return {"block_m": case.block_m, "block_n": case.block_n} if path.blocks is not None else {}


def run_path(path: Path, case: Case, q, k, v, mask):
    return path.call(q, k, v, mask, case.causal, case.scale, **_block_kwargs(path, case))


def run_path_with_lse(path: Path, case: Case, q, k, v, mask):
    return path.with_lse(q, k, v, mask, case.causal, case.scale, **_block_kwargs(path, case))


def logsumexp64(q, k, mask, causal: bool, scale: float | None = None) -> torch.Tensor:
    """float64 log Σ_j exp(scale · q·k_j) over the keys each query may see (B, H, L); -inf if none.

    ``mask``: None or a bool / additive mask broadcastable to (B, H, L, S)."""
    D = q.shape[-1]
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    logits = (q.double() @ k.double().transpose(-2, -1)) * scale  # (B,H,L,D) @ (B,H,D,S) -> (B,H,L,S)
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask.double()
    if causal:
        logits = logits.masked_fill(~attn_lib.causal_mask(q.shape[2], k.shape[2]), float("-inf"))  # (B,H,L,S)
    return torch.logsumexp(logits, dim=-1)  # (B,H,L,S) -> (B,H,L)


def lse64(case: Case, q, k, v, mask) -> torch.Tensor:
    """float64 log-sum-exp of a case (B, H, L); -inf for a query that sees no key."""
    return logsumexp64(q, k, reference_mask(case, mask), case.causal, case.scale)


# ---------------------------------------------------------------------------------------------
# Fixed FlashAttention inputs (the test_flash_*.py files)
# ---------------------------------------------------------------------------------------------
def flash_inputs(B, H, L, S, D, Dv=None, *, seed=0, padding=False):
    """float64 q, k, v and an optional key padding mask (B, S) (True = key present) with the
    two hard cases: query 0 of sequence 0 sees nothing under causal, the last sequence has no keys."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=gen, dtype=torch.float64)
    k = torch.randn(B, H, S, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H, S, Dv or D, generator=gen, dtype=torch.float64)
    kpm = None
    if padding:
        kpm = torch.rand(B, S, generator=gen) > 0.3  # True = key present
        kpm[0, 0] = False  # with causal, query 0 of sequence 0 then sees nothing
        if B > 1:
            kpm[-1] = False  # a sequence with no keys at all
    return q, k, v, kpm


def flash_reference(q, k, v, kpm, causal, scale=None):
    """float64 output (B, H, L, Dv) and log-sum-exp (B, H, L) for a key padding mask (B, S)."""
    mask = None if kpm is None else kpm[:, None, None, :]  # (B,S) -> (B,1,1,S)
    out, _ = attn_lib.attention(q, k, v, mask=mask, is_causal=causal, scale=scale)
    return out, logsumexp64(q, k, mask, causal, scale)  # (B,H,L,Dv), (B,H,L)


def reference_grads(q, k, v, dout, kpm=None, causal=False, scale=None):
    """dq, dk, dv of the float64 reference ``attn_lib.attention`` by autograd, for a key padding
    mask ``kpm`` (B, S) (True = key present) or None; the inputs are detached and cast to float64."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    mask = None if kpm is None else kpm[:, None, None, :]  # (B,S) -> (B,1,1,S)
    out, _ = attn_lib.attention(q, k, v, mask=mask, is_causal=causal, scale=scale)  # (B,H,L,Dv)
    return torch.autograd.grad(out, (q, k, v), dout.double())


TL, BR = "top-left", "bottom-right"
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
# The Triton forward and backward tests (tests/flash/triton) run the same cases:
# (B, H, H_kv, L, S), window, is_causal, align (an int: that offset, through the launcher), padding, dtype, blocks
TRITON_GQA_CASES = [
    ((1, 6, 2, 37, 29), (3, 2), False, TL, False, F32, (16, 16)),
    ((1, 8, 1, 19, 41), (5, 0), True, TL, True, F32, (16, 16)),  # MQA, L < S
    ((1, 4, 4, 33, 21), (-1, 4), False, TL, False, F32, (16, 32)),  # no GQA, L > S
    ((2, 6, 2, 23, 23), (0, 0), False, TL, True, F32, (16, 16)),  # a key sees only itself; padded keys hide rows
    ((1, 6, 2, 41, 23), (1, 0), True, TL, False, F32, (32, 16)),  # rows past S see one or no key
    ((1, 4, 2, 17, 45), (1, 0), True, BR, True, F32, (16, 16)),  # bottom-right (KV-cache decoding), offset 28
    ((1, 4, 2, 29, 19), (2, 3), False, BR, False, F32, (16, 16)),  # bottom-right with L > S: offset -10
    ((1, 8, 1, 21, 35), (100, 100), False, TL, False, F32, (16, 16)),  # wider than the sequence
    ((1, 4, 4, 29, 19), (2, 3), False, -12, False, F32, (16, 16)),  # offset hides the first rows entirely
    ((1, 6, 2, 37, 29), (3, 2), False, TL, True, F16, (16, 16)),
    ((1, 8, 1, 19, 41), (-1, 4), False, TL, False, F16, (32, 16)),
    ((1, 4, 4, 33, 33), (5, 0), True, TL, True, F16, (16, 32)),
    ((1, 4, 2, 19, 37), (4, 0), True, BR, True, F16, (16, 16)),
    ((1, 6, 2, 23, 19), (1, 0), True, TL, True, BF16, (16, 16)),  # bf16: every tl.dot in fp32 under the interpreter
]


def visible_band(L, S, is_causal, window, offset=0):
    """(L, S) bool written out from flash-attn's rule, in Python ints (any window, even 2**64): query i, at
    position p = i + offset among the keys, sees key j iff p - left <= j <= p + right (-1 = unbounded) and,
    with ``is_causal``, j <= p. Independent of attn_lib.rules.band."""
    left, right = window if window is not None else (-1, -1)

    def sees(i: int, j: int) -> bool:
        p = i + offset
        return (left < 0 or j >= p - left) and (right < 0 or j <= p + right) and (not is_causal or j <= p)

    return torch.tensor([[sees(i, j) for j in range(S)] for i in range(L)], dtype=torch.bool).reshape(L, S)
