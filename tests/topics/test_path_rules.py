"""One rule on every functional attention path (reference, numpy twin, tiled torch, Triton):
second-order gradients refused by name, overflow raised (never hidden as zeros) and named by its
direction, a large scale with small scores not mistaken for overflow, one scale rule, 3-D masks
refused with a remedy, ``check_finite`` reaching the core, checks run once at the door, a window
wider than the sequence giving the unbounded answer, and no package attribute shadowing a submodule.

The Triton cases run under Triton's interpreter without a GPU (float32).
"""
import importlib
import importlib.util
import os
import pkgutil
import re
import sys

import numpy as np
import pytest
import torch

import attn_lib
from attn_lib.core import numpy_ref
from attn_lib.rules.numerics import OVERFLOW_MESSAGE
from attn_lib.tolerances import assert_close
from attn_paths import mha_reference64, randn64, seed_weights
from package_graph import modules

DEVICE = torch.device(os.environ.get("ATTN_LIB_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu"))
HAS_TRITON = importlib.util.find_spec("triton") is not None
BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed"))]


def _qkv(L=5, S=6, D=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, n, D, generator=gen).to(DEVICE) for n in (L, S, S))


@pytest.mark.parametrize("backend", BACKENDS)
def test_second_order_gradients_are_refused_by_name(backend):
    q, k, v = _qkv()
    qg = q.clone().requires_grad_()
    out = attn_lib.flash_attention(qg, k, v, backend=backend)
    with pytest.raises(RuntimeError, match=r"second-order.*attn_lib\.attention"):
        torch.autograd.grad(out.sum(), qg, create_graph=True)
    # first-order gradients are untouched
    out = attn_lib.flash_attention(qg, k, v, backend=backend)
    (g,) = torch.autograd.grad(out.sum(), qg)
    assert g.shape == q.shape and bool(torch.isfinite(g).all())


def _overflow_inputs():
    # q·k = -1e40 for every key: -inf in float32 although every key is visible.
    q = torch.full((1, 1, 2, 1), 1e20, device=DEVICE)
    k = torch.full((1, 1, 3, 1), -1e20, device=DEVICE)
    v = torch.ones(1, 1, 3, 1, device=DEVICE)
    return q, k, v


@pytest.mark.filterwarnings("ignore:overflow encountered in matmul:RuntimeWarning")  # Triton's interpreter (numpy)
@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_scores_overflowing_to_minus_inf_raise_on_every_path(backend, padding):
    """Every visible score of a row fell to -inf: an overflow (not a row that sees nothing), named as downward."""
    q, k, v = _overflow_inputs()
    kpm = torch.tensor([[True, True, False]], device=DEVICE) if padding else None
    down = re.escape(OVERFLOW_MESSAGE + " to -inf (|scale·q·k| exceeds the range of float32)")
    with pytest.raises(ValueError, match=down):
        attn_lib.attention(q, k, v, scale=1.0, mask=None if kpm is None else kpm[:, None, None, :])
    with pytest.raises(ValueError, match=down):
        attn_lib.flash_attention(q, k, v, scale=1.0, key_mask=kpm, backend=backend)
    with pytest.raises(ValueError, match=down):
        with torch.no_grad():
            forward = attn_lib.flash_attention_torch if backend == "torch" else attn_lib.flash_attention_triton
            forward(q, k, v, scale=1.0, key_mask=kpm)


@pytest.mark.filterwarnings("ignore:overflow encountered in matmul:RuntimeWarning")  # Triton's interpreter (numpy)
@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")  # inf - inf in its numpy ops
@pytest.mark.parametrize("backend", BACKENDS)
def test_scores_overflowing_to_plus_inf_are_named_upward_on_every_path(backend):
    q, _, v = _overflow_inputs()
    k = torch.full((1, 1, 3, 1), 1e20, device=DEVICE)  # q·k = +1e40
    up = re.escape(OVERFLOW_MESSAGE) + " to {} " + re.escape("(|scale·q·k| exceeds the range of float32)")
    # The Triton decode kernel returns no log-sum-exp: it sees only the nan an overflow leaves, hence "±inf".
    decode_sign = r"\+inf" if backend == "torch" else "±inf"
    with torch.no_grad():
        forward = attn_lib.flash_attention_torch if backend == "torch" else attn_lib.flash_attention_triton
        for call, sign in ((lambda: attn_lib.attention(q, k, v, scale=1.0), r"\+inf"),
                           (lambda: attn_lib.flash_attention(q, k, v, scale=1.0, backend=backend), r"\+inf"),
                           (lambda: forward(q, k, v, scale=1.0), r"\+inf"),
                           (lambda: attn_lib.flash_decoding(q, k, v, scale=1.0, backend=backend), decode_sign)):
            with pytest.raises(ValueError, match=up.format(sign)):
                call()


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_that_see_no_key_still_give_zeros(backend):
    q, k, v = _qkv(L=4, S=4)
    kpm = torch.tensor([[False, False, True, True]], device=DEVICE)  # query 0, 1 see nothing under is_causal
    out = attn_lib.flash_attention(q, k, v, is_causal=True, key_mask=kpm, backend=backend)
    assert bool((out[:, :, :2] == 0).all())
    ref, _ = attn_lib.attention(q.double(), k.double(), v.double(), is_causal=True, mask=kpm[:, None, None, :])
    assert_close(out, ref, dtype=torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_huge_scale_with_tiny_scores_is_not_an_overflow(backend):
    # scale = 3e38 is a valid float32; with q·k ~ 1e-39 the scaled scores are O(1).
    q, k, v = _qkv(L=3, S=4, D=16)
    q = q * 1e-20
    k = k * 1e-19
    ref, _ = attn_lib.attention(q.double(), k.double(), v.double(), scale=3e38)
    out = attn_lib.flash_attention(q, k, v, scale=3e38, backend=backend)
    assert_close(out, ref, dtype=torch.float32)
    qg = q.clone().requires_grad_()
    attn_lib.flash_attention(qg, k, v, scale=3e38, backend=backend).sum().backward()
    assert bool(torch.isfinite(qg.grad).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_0d_tensor_scale_works_on_every_backend(backend):
    q, k, v = _qkv()
    as_float = attn_lib.flash_attention(q, k, v, scale=0.3, backend=backend)
    as_tensor = attn_lib.flash_attention(q, k, v, scale=torch.tensor(0.3), backend=backend)
    assert torch.equal(as_float, as_tensor)


def test_a_3d_mask_is_refused_with_the_remedy():
    q, k, v = (torch.randn(2, 3, 4, 8) for _ in range(3))
    mask = torch.ones(3, 4, 4, dtype=torch.bool)  # (H, L, S) or (B, L, S)? ambiguous
    pattern = r"mask must be 2-D \(L, S\) or 4-D.*got 3-D.*mask\.unsqueeze\(1\).*mask\[None\]"
    with pytest.raises(ValueError, match=pattern):
        attn_lib.attention(q, k, v, mask=mask)
    with pytest.raises(ValueError, match=pattern):
        numpy_ref.attention(q.numpy(), k.numpy(), v.numpy(), mask=mask.numpy())
    # both remedies run
    attn_lib.attention(q, k, v, mask=mask[None])  # (1, H, L, S)
    attn_lib.attention(q, k, v, mask=torch.ones(2, 4, 4, dtype=torch.bool).unsqueeze(1))  # (B, 1, L, S)


@pytest.mark.parametrize("backend", BACKENDS)
def test_check_finite_false_reaches_the_core(backend, monkeypatch):
    q, k, v = _qkv()
    q[0, 0, 1, 0] = float("nan")
    with pytest.raises(ValueError, match="q contains nan or inf"):
        attn_lib.flash_attention(q, k, v, backend=backend)
    checks = importlib.import_module("attn_lib.checks.tensors")
    scans = []
    monkeypatch.setattr(checks, "all_finite", lambda t: scans.append(t) or True)
    out = attn_lib.flash_attention(q, k, v, backend=backend, check_finite=False)
    assert scans == []  # no nan scan anywhere below the door
    assert bool(torch.isnan(out[0, 0, 1]).all()) and bool(torch.isfinite(out[0, 1]).all())
    ref, _ = attn_lib.attention(q, k, v, check_finite=False)
    assert bool(torch.isnan(ref[0, 0, 1]).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_checks_run_once_per_flash_attention_call(backend, monkeypatch):
    q, k, v = _qkv()
    checks = importlib.import_module("attn_lib.checks.tensors")
    calls = {"scale": 0, "scan": 0}
    real_scale, real_scan = checks.check_scale, checks.all_finite

    def count_scale(s):
        calls["scale"] += 1
        return real_scale(s)

    def count_scan(t):
        calls["scan"] += 1
        return real_scan(t)

    monkeypatch.setattr(checks, "check_scale", count_scale)
    monkeypatch.setattr(checks, "all_finite", count_scan)
    qg = q.clone().requires_grad_()
    attn_lib.flash_attention(qg, k, v, scale=0.25, backend=backend).sum().backward()
    assert calls == {"scale": 1, "scan": 3}  # once at the door: scale once, q, k, v scanned once each


def test_no_package_attribute_shadows_a_submodule():
    """In every package of attn_lib, a name that is also a submodule's name is that submodule (a function
    re-exported under its module's name would hide the module from `attn_lib.core.softmax.softmax`)."""
    packages = [name for name, path in modules().items() if path.name == "__init__.py"]
    assert {"attn_lib", "attn_lib.core", "attn_lib.flash", "attn_lib.flash.triton", "attn_lib.checks"} <= set(packages)
    shadowed = []
    for name in packages:
        package = importlib.import_module(name)
        for info in pkgutil.iter_modules(package.__path__):  # lists submodules without importing them
            attr = vars(package).get(info.name)
            if attr is not None and attr is not sys.modules.get(f"{name}.{info.name}"):
                shadowed.append(f"{name}.{info.name} is {type(attr).__name__}")
    assert shadowed == []
    assert importlib.import_module("attn_lib.core.softmax").softmax is attn_lib.softmax
    assert importlib.import_module("attn_lib.core.online").online_softmax is attn_lib.online_softmax


def test_numpy_twin_gives_the_torch_messages():
    q = np.zeros((1, 1, 2, 4))
    pairs = [
        (dict(scale="big"), TypeError),
        (dict(scale=-1.0), ValueError),
        (dict(is_causal="yes"), TypeError),
        (dict(mask=np.ones((2, 2), dtype=np.int64)), TypeError),
    ]
    for kwargs, exc in pairs:
        t_kwargs = {key: torch.as_tensor(val) if key == "mask" else val for key, val in kwargs.items()}
        with pytest.raises(exc) as from_torch:
            attn_lib.attention(torch.as_tensor(q), torch.as_tensor(q), torch.as_tensor(q), **t_kwargs)
        with pytest.raises(exc) as from_numpy:
            numpy_ref.attention(q, q, q, **kwargs)
        want = str(from_torch.value).replace("torch.int64", "int64").replace(".bool()", ".astype(bool)")
        assert str(from_numpy.value) == want, kwargs
    nan = q.copy()
    nan[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError) as from_numpy:
        numpy_ref.attention(nan, q, q)
    with pytest.raises(ValueError) as from_torch:
        attn_lib.attention(torch.as_tensor(nan), torch.as_tensor(q), torch.as_tensor(q))
    assert str(from_numpy.value) == str(from_torch.value)


def test_the_triton_configuration_policy_is_pure_python():
    # Tile sizes and shared-memory estimates can be read (and tested) without importing Triton.
    import subprocess
    import sys

    code = ("import sys, attn_lib.flash.triton.configs as c, torch; "
            "cfg = c.candidate_configs(64, 64, torch.float16, False)[0]; "
            "print('triton' in sys.modules, cfg['BLOCK_M'] >= 16)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]


# --- the GPU kernel's pure-Python rules (names avoid the word the mutation run deselects) -------------

def test_the_dot_precision_rule():
    """DOT_FP32 under the interpreter and for bfloat16 before sm_80; "ieee" for every fp32 dot."""
    from attn_lib.rules.numerics import dot_fp32, dot_input_precision

    assert dot_fp32(torch.float16, None, 1) is True  # the interpreter, whatever the dtype (a bool, not 1)
    assert dot_fp32(torch.bfloat16, (7, 5), False) is True  # bfloat16 on a pre-Ampere GPU
    assert dot_fp32(torch.bfloat16, [7, 5], False) is True  # a capability given as a list
    assert dot_fp32(torch.bfloat16, (8, 0), False) is False  # sm_80 has bfloat16 dots
    assert dot_fp32(torch.bfloat16, None, False) is False  # no capability known
    assert dot_fp32(torch.float16, (7, 0), False) is False  # float16 dots exist before sm_80
    assert dot_fp32(torch.float32, (9, 0), False) is False
    assert dot_input_precision(torch.float32, False) == "ieee"  # not the GPU's default TF32
    assert dot_input_precision(torch.bfloat16, True) == "ieee"
    assert dot_input_precision(torch.float16, False) is None
    assert dot_input_precision(torch.bfloat16, False) is None


def test_the_gpu_kernel_door_refuses_float64_and_head_dims_over_256():
    from attn_lib.checks.flash import check_triton_inputs

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert check_triton_inputs(dtype, 256, 256) is None  # 256 is the largest head dim it takes
    with pytest.raises(TypeError, match=r"^the Triton kernel takes float16, bfloat16 or float32; for float64 use "
                                        r"backend='torch' \(got torch\.float64\)$"):
        check_triton_inputs(torch.float64, 4, 4)
    with pytest.raises(ValueError, match=r"^the Triton kernel supports head dims up to 256, got D=257, Dv=256; "
                                         r"use backend='torch'$"):
        check_triton_inputs(torch.float32, 257, 256)
    with pytest.raises(ValueError, match=r"got D=256, Dv=257; use backend='torch'$"):
        check_triton_inputs(torch.float32, 256, 257)


def test_the_gpu_kernel_door_refuses_cpu_tensors_unless_interpreted():
    from attn_lib.checks.flash import check_triton_device

    assert check_triton_device(torch.device("cpu"), True) is None  # the interpreter runs on CPU tensors
    assert check_triton_device(torch.device("cuda"), False) is None  # compiled kernels take CUDA tensors
    assert check_triton_device("cuda:0", False) is None  # a device given by name
    for x in (torch.zeros(1), torch.zeros(1, device="meta")):
        with pytest.raises(ValueError, match=(
                rf"^backend='triton' got tensors on {x.device}, but Triton in this process compiles GPU kernels \(a CUDA "
                r"device is present\); expected CUDA tensors\. Remedy: move q, k, v \(and the mask\) to 'cuda', use "
                r"backend='torch', or start Python with TRITON_INTERPRET=1 to run the kernel under Triton's "
                r"interpreter\.$")):
            check_triton_device(x.device, False)


# --- a window side wider than any sequence limits nothing, on every path that takes window_size ----------------

WIDE = [((2**64, 0), True), ((2**64, -1), True), ((2**64, 2**64), False), ((-1, 2**63 + 1), False)]


@pytest.mark.parametrize("window,is_causal", WIDE, ids=["causal left 2**64", "causal left 2**64, right -1",
                                                        "both 2**64", "right beyond int64"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_window_wider_than_the_sequence_gives_the_unbounded_answer(backend, window, is_causal):
    """The same answer as no window at all, against torch's SDPA in float64 (top-left causal, as attn_lib's
    default); forward and gradients, functions and the tiled / Triton entries alike."""
    q, k, v = _qkv(L=5, S=6)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=is_causal)  # (B,H,L,Dv)
    dout = torch.randn(expected.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    grads64 = torch.autograd.grad(expected, (q64, k64, v64), dout)
    forward = attn_lib.flash_attention_torch if backend == "torch" else attn_lib.flash_attention_triton
    got = {"attention": attn_lib.attention(q, k, v, is_causal=is_causal, window_size=window)[0],
           "flash_attention": attn_lib.flash_attention(q, k, v, is_causal=is_causal, window_size=window, backend=backend),
           forward.__name__: forward(q, k, v, is_causal=is_causal, window_size=window)[0]}
    for name, out in got.items():
        assert_close(out, expected, dtype=torch.float32, what=f"{name}, window {window}")
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = attn_lib.flash_attention(qg, kg, vg, is_causal=is_causal, window_size=window, backend=backend)
    grads = torch.autograd.grad(out, (qg, kg, vg), dout.float())
    for name, g, e in zip("qkv", grads, grads64):
        assert_close(g, e, dtype=torch.float32, kind="gradient", what=f"d{name}, window {window}")


@pytest.mark.parametrize("window,is_causal", WIDE)
def test_a_wide_window_mask_and_layer_are_the_unbounded_ones(window, is_causal):
    L, S = 5, 7
    everything = torch.ones(L, S, dtype=torch.bool)
    for align, diagonal in (("top-left", 0), ("bottom-right", S - L)):
        expected = everything.tril(diagonal) if is_causal else everything  # query i sees keys j <= i + diagonal
        got = attn_lib.sliding_window_mask(L, S, window_size=window, is_causal=is_causal, align=align)
        assert torch.equal(got, expected), (window, align)
    layer = seed_weights(attn_lib.MultiHeadAttention(8, 2, is_causal=is_causal, window_size=window)).double()
    x = randn64(2, 6, 8)
    with torch.no_grad():
        assert_close(layer(x), mha_reference64(layer, x), dtype="float64", what=f"layer, window {window}")
