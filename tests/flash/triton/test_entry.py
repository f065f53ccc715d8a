"""attn_lib/flash/triton/entry.py: how the kernel files are imported (once, in the process's Triton mode), the
precision flags of a launch (kernel_flags, launch_target), and the two public doors' refusals and overflow rule.

Without a GPU these run the kernels under Triton's interpreter (``TRITON_INTERPRET=1``, set once per process by
attn_lib.device before Triton is imported); on a CUDA machine they run the compiled kernels on CUDA tensors
(ATTN_LIB_DEVICE overrides the device). The process-mode rules of attn_lib.device that load_kernels relies on
are checked here too, in fresh interpreters where a test needs Triton not yet imported.
"""
import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch

import attn_lib
from attn_lib import device as attn_device
from attn_lib.flash.triton import entry
from attn_lib.flash.triton.entry import flash_attention_triton, flash_attention_triton_backward
from attn_lib.rules.band import Band
from attn_lib.rules.numerics import OVERFLOW_MESSAGE
from attn_lib.rules.settings import AttentionSettings
from attn_lib.tolerances import assert_close

from attn_paths import flash_inputs, flash_reference

# Triton is pinned in requirements.txt, so this always runs. Do not `import triton` here: the first import
# decides whether Triton interprets, and attn_lib.device must make that choice.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

DEVICE = torch.device(os.environ.get("ATTN_LIB_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu"))
KERNELS = {"forward": ("attn_fwd",), "backward": ("attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq"),
           "decode": ("decode_split", "decode_merge")}


# --- load_kernels and the process's Triton mode ---------------------------------------------------------------

def test_load_kernels_imports_each_file_once_in_the_process_mode():
    assert entry.KERNEL_FILES == tuple(KERNELS)
    interpret = attn_device.triton_interprets()
    assert interpret is attn_device.triton_interprets()  # decided once
    assert interpret == (not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1")
    for name, kernels in KERNELS.items():
        module = entry.load_kernels(name)
        assert module is entry.load_kernels(name) and module.__name__ == f"attn_lib.flash.triton.{name}"
        for kernel in kernels:  # every kernel built in the process's mode
            assert type(getattr(module, kernel)).__name__ == ("InterpretedFunction" if interpret else "JITFunction")
    assert entry.load_kernels() is entry.load_kernels("forward")
    if interpret:  # the process mode is an environment variable, kept for the whole process
        assert os.environ.get("TRITON_INTERPRET") == "1"


def test_flash_attention_runs_the_kernels_in_the_process_mode():
    q, k, v, kpm = flash_inputs(1, 2, 17, 33, 16, padding=True)
    ref, _ = flash_reference(q, k, v, kpm, True)
    ql, kl, vl = (t.float().to(DEVICE) for t in (q, k, v))
    out = attn_lib.flash_attention(ql, kl, vl, is_causal=True, key_mask=kpm.to(DEVICE), backend="triton")
    assert_close(out.cpu(), ref)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's overflow warnings inside the interpreter
def test_the_unchecked_cores_check_nothing():
    settings = AttentionSettings(band=Band(), scale=0.25, work_dtype=torch.float32, backend="triton")
    q = torch.ones(1, 1, 3, 16, device=DEVICE) * 1e20  # q·k = 1.6e41 > 3.4e38: every score overflows
    out, lse = entry.triton_forward(q, q, q, settings)  # (B,H,L,D), (B,H,L): no overflow rule here
    assert out.shape == (1, 1, 3, 16) and not torch.isfinite(lse).any()
    with pytest.raises(ValueError, match=r"^attention scores overflowed"):  # the door applies it
        flash_attention_triton(q, q, q, scale=0.25)
    x = torch.randn(1, 1, 3, 16, device=DEVICE)
    x[0, 0, 1, 0] = float("nan")  # no nan scan below the door: the gradients carry the nan
    saved = (torch.zeros_like(x), torch.zeros(1, 1, 3, device=DEVICE), torch.ones_like(x))
    dq, dk, dv = entry.triton_backward(x, x, x, saved, settings)
    assert torch.isnan(dq).any() and torch.isnan(dk).any()
    with pytest.raises(ValueError, match=r"^q contains nan or inf"):
        flash_attention_triton_backward(x, x, x, *saved)


def _run_clean(code: str, **env_extra) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter without TRITON_INTERPRET (plus ``env_extra``), this worktree's attn_lib."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "ATTN_LIB_DEVICE")}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env.update(PYTHONPATH=root, **env_extra)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180)


_RUN_KERNEL = (
    "q = torch.randn(1, 2, 20, 16); k = torch.randn(1, 2, 30, 16)\n"
    "out = attn_lib.flash_attention(q, k, k, is_causal=True, backend='triton')\n"
    "ref, _ = attn_lib.attention(q, k, k, is_causal=True)\n"
    "print(bool((out - ref).abs().max() <= attn_lib.tolerances.FLOAT32_ATOL))\n"
)

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter rule is for machines without a GPU")


@needs_no_gpu
def test_attn_lib_first_sets_interpret_mode_for_the_whole_process():
    code = (
        "import os, sys, torch, attn_lib\n"
        "print('triton' in sys.modules, os.environ.get('TRITON_INTERPRET'))\n"
        "from torch.utils._python_dispatch import TorchDispatchMode\n"
        "class Spy(TorchDispatchMode):\n"
        "    def __torch_dispatch__(self, func, types, args=(), kwargs=None):\n"
        "        return func(*args, **(kwargs or {}))\n"
        "with Spy(): torch.ones(2) + 1\n"  # torch imports triton here (the book's memory spy does this)
        "print('triton' in sys.modules)\n" + _RUN_KERNEL +
        "print(os.environ.get('TRITON_INTERPRET'))\n"
        "import triton.language, torch._dynamo\n"  # later imports see the same mode
        "print(type(triton.language.standard.zeros).__name__)\n"
        "print(attn_lib.flash_attention(q, k, k, backend='triton').shape == (1, 2, 20, 16))\n"
    )
    res = _run_clean(code)
    assert res.stdout.split() == ["False", "1", "True", "True", "1", "InterpretedFunction", "True"], res.stdout + res.stderr


@needs_no_gpu
def test_triton_imported_first_in_compiled_mode_gives_the_remedy():
    # e.g. torch.compile / torch._dynamo imports triton (compiled mode) before attn_lib runs a kernel
    code = (
        "import torch, triton.language, attn_lib\n"
        "q = torch.randn(1, 1, 8, 16)\n"
        "try:\n"
        "    attn_lib.flash_attention(q, q, q, backend='triton')\n"
        "except RuntimeError as e:\n"
        "    print(str(e))\n"
    )
    msg = _run_clean(code).stdout
    assert "Triton is already imported in compiled (GPU) mode" in msg, msg
    assert "no CUDA device" in msg and "expected Triton in interpreter mode" in msg
    assert "TRITON_INTERPRET=1" in msg and "use_triton_interpreter()" in msg and "backend='torch'" in msg


@needs_no_gpu
@pytest.mark.parametrize("setup", ["import attn_lib.device; attn_lib.device.use_triton_interpreter()\n",
                                   "import os; os.environ['TRITON_INTERPRET'] = '1'\n"])
def test_the_remedies_work_when_triton_is_imported_first(setup):
    code = setup + "import torch, triton.language, attn_lib\n" + _RUN_KERNEL
    res = _run_clean(code)
    assert res.stdout.split() == ["True"], res.stdout + res.stderr


def test_no_cuda_device_is_known_without_touching_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: 1 / 0)  # must not be asked
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", None)
    assert attn_device.no_cuda_device_for_sure()  # a CPU-only torch build
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(attn_device.sys, "platform", "linux")
    monkeypatch.setattr(attn_device.glob, "glob", lambda pattern: [])
    assert attn_device.no_cuda_device_for_sure()  # CUDA build, but no /dev/nvidia0 (e.g. Colab's CPU runtime)
    monkeypatch.setattr(attn_device.glob, "glob", lambda pattern: ["/dev/nvidia0"])
    assert not attn_device.no_cuda_device_for_sure()
    monkeypatch.setattr(attn_device.sys, "platform", "win32")
    monkeypatch.setattr(attn_device.glob, "glob", lambda pattern: [])
    assert not attn_device.no_cuda_device_for_sure()  # cannot tell: decided at the first kernel call
    monkeypatch.setattr(torch.version, "hip", "6.2")
    monkeypatch.setattr(attn_device.sys, "platform", "linux")
    assert not attn_device.no_cuda_device_for_sure()


def test_prefer_interpreter_early_only_sets_an_unset_variable(monkeypatch):
    monkeypatch.setattr(attn_device, "no_cuda_device_for_sure", lambda: True)
    monkeypatch.setattr(attn_device, "_triton_mode", {})
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.delitem(sys.modules, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    attn_device.prefer_interpreter_early()
    assert os.environ["TRITON_INTERPRET"] == "0"  # the reader's own setting stands
    monkeypatch.delenv("TRITON_INTERPRET")
    attn_device.prefer_interpreter_early()
    assert os.environ["TRITON_INTERPRET"] == "1"
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(attn_device, "no_cuda_device_for_sure", lambda: False)
    attn_device.prefer_interpreter_early()
    assert "TRITON_INTERPRET" not in os.environ


def test_use_triton_interpreter_too_late_is_an_error(monkeypatch):
    monkeypatch.setitem(attn_device._triton_mode, "interpret", False)
    with pytest.raises(RuntimeError, match=r"came too late.*already imported in compiled mode.*TRITON_INTERPRET=1"):
        attn_device.use_triton_interpreter()


# --- kernel_flags and launch_target ---------------------------------------------------------------------------

def test_bf16_dots_in_fp32_before_sm80(monkeypatch):
    # Colab's T4 is sm_75: Triton has no bf16 tl.dot there, so the kernels multiply in fp32.
    gpu = torch.device("cuda", 0)
    for capability, dtype, dot_fp32 in [((7, 5), torch.bfloat16, True), ((7, 5), torch.float16, False),
                                        ((7, 5), torch.float32, False), ((8, 0), torch.bfloat16, False),
                                        ((9, 0), torch.bfloat16, False), ((8, 6), torch.float16, False)]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        flags = entry.kernel_flags(dtype, gpu, interpret=False)
        assert flags["dot_fp32"] is dot_fp32, (capability, dtype)
        assert flags["capability"] == capability
        assert flags["input_precision"] == ("ieee" if dot_fp32 or dtype == torch.float32 else None)
        # a capability given (bench/gpu.py --compile-only) is used as it is: the GPU is not asked
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: 1 / 0)
        assert entry.kernel_flags(dtype, None, False, capability=capability) == flags
    # the interpreter always multiplies in fp32 (its bf16 tl.dot is wrong) and never asks the GPU
    assert entry.kernel_flags(torch.bfloat16, torch.device("cpu"), interpret=True) == {
        "dot_fp32": True, "input_precision": "ieee", "capability": None}
    assert entry.kernel_flags(torch.float16, None, True, capability=(7, 5))["capability"] is None


def test_launch_target_is_the_process_mode_or_the_given_machine(monkeypatch):
    q = torch.zeros(1, 1, 1, 16, dtype=torch.bfloat16)
    interpret = attn_device.triton_interprets()
    if interpret:
        assert entry.launch_target(q) == {"interpret": True, "dot_fp32": True, "input_precision": "ieee",
                                          "capability": None}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: 1 / 0)  # never asked below
    assert entry.launch_target(q, (False, (7, 5))) == {"interpret": False, "dot_fp32": True,
                                                       "input_precision": "ieee", "capability": (7, 5)}
    assert entry.launch_target(q, (False, (9, 0))) == {"interpret": False, "dot_fp32": False,
                                                       "input_precision": None, "capability": (9, 0)}
    assert entry.launch_target(q.float(), (True, (9, 0)))["capability"] is None


# --- the doors ------------------------------------------------------------------------------------------------

def _both_doors(q, k, v, **kw):
    """Call the forward door, then the backward door with saved tensors of the right shapes, each under raises."""
    yield lambda: flash_attention_triton(q, k, v, **kw)
    out = torch.zeros(*q.shape[:3], v.shape[3], dtype=q.dtype, device=q.device)
    lse = torch.zeros(q.shape[:3], device=q.device)
    yield lambda: flash_attention_triton_backward(q, k, v, out, lse, out, **kw)


def test_float64_and_wide_heads_are_refused_with_the_torch_backend_named():
    q = torch.zeros(1, 1, 4, 16, device=DEVICE)
    for call in _both_doors(q.double(), q.double(), q.double()):
        with pytest.raises(TypeError, match=r"^the Triton kernel takes float16, bfloat16 or float32; "
                                            r"for float64 use backend='torch' \(got torch\.float64\)$"):
            call()
    wide = torch.zeros(1, 1, 4, 257, device=DEVICE)
    for k, v, dims in ((wide, wide, "D=257, Dv=257"), (q, torch.zeros(1, 1, 4, 300, device=DEVICE), "D=16, Dv=300")):
        for call in _both_doors(q if k is q else wide, k, v):
            with pytest.raises(ValueError, match=rf"supports head dims up to 256, got {dims}; use backend='torch'"):
                call()
    out, _ = flash_attention_triton(*(torch.ones(1, 1, 4, 256, device=DEVICE),) * 3)  # 256 itself is taken
    assert out.shape == (1, 1, 4, 256)


def test_cpu_tensors_in_a_compiled_process_get_a_clear_error(monkeypatch):
    # On a GPU machine Triton compiles; CPU tensors then name the remedies instead of crashing.
    monkeypatch.setitem(attn_device._triton_mode, "interpret", False)
    q = torch.zeros(1, 1, 4, 16)
    for call in _both_doors(q, q, q):
        with pytest.raises(ValueError, match=r"got tensors on cpu, but Triton in this process compiles GPU "
                                             r"kernels.*expected CUDA tensors.*backend='torch'.*TRITON_INTERPRET=1"):
            call()


def test_requires_grad_is_refused_with_the_function_to_use():
    q = torch.randn(1, 1, 4, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 1, 4, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"without a gradient, but q, k or v requires grad.*"
                                         r"attn_lib.flash_attention\(q, k, v, backend='triton'\)"):
        flash_attention_triton(q, k, k)
    with torch.no_grad():  # as inside a torch.autograd.Function's forward
        out, _ = flash_attention_triton(q, k, k)
    ref, _ = attn_lib.attention(q.detach().double().cpu(), k.double().cpu(), k.double().cpu())
    assert_close(out.cpu(), ref)


def test_the_doors_refuse_bad_heads_windows_alignments_and_blocks():
    q = torch.zeros(1, 6, 5, 16, device=DEVICE)
    k2, k4 = torch.zeros(1, 2, 7, 16, device=DEVICE), torch.zeros(1, 4, 7, 16, device=DEVICE)
    cases = [
        (dict(k=k2), ValueError, r"k must have H=6 heads like q, got H_kv=2; pass enable_gqa=True"),
        (dict(k=k4, enable_gqa=True), ValueError,
         r"k must have a number of heads H_kv that divides q's H=6 .*got H_kv=4; use one of \[1, 2, 3, 6\]"),
        (dict(window_size=3), TypeError, r"window_size must be a pair \(left, right\) of ints, as a tuple or list, "
                                         r"or None, got 3 \(int\); e\.g\. window_size=\(256, 0\)"),
        (dict(window_size=(2, -2)), ValueError, r"window_size must be a pair of ints >= -1 .*got \(2, -2\)"),
        (dict(window_size=(2, 1.0)), TypeError, r"window_size must be a pair .*got 1\.0 \(float\)"),
        (dict(window_size=(2, 1), is_causal=True), ValueError,
         r"window_size's right side must be 0 or -1 with is_causal=True.*got \(2, 1\); pass window_size=\(2, 0\)"),
        (dict(align="center"), ValueError, r'align must be "top-left" or "bottom-right", got \'center\''),
        (dict(align=None), TypeError, r'align must be the string "top-left" or "bottom-right", got None'),
        (dict(enable_gqa=1), TypeError, r"enable_gqa must be True or False, got 1"),
        (dict(block_m=24), ValueError, r"block_m must be a power of two >= 16 \(tl\.dot's smallest tile\), got 24"),
        (dict(block_n=8), ValueError, r"block_n must be a power of two >= 16 .*got 8"),
        (dict(key_mask=torch.ones(1, 7, device=DEVICE)), TypeError, r"key_mask must be bool \(True = key present"),
    ]
    for kw, exc, pattern in cases:
        kk = kw.pop("k", torch.zeros(1, 6, 7, 16, device=DEVICE))
        for call in _both_doors(q, kk, kk, **kw):
            with pytest.raises(exc, match=pattern):
                call()


def test_the_backward_door_takes_only_what_the_forward_returned():
    q = torch.zeros(1, 2, 5, 16, device=DEVICE)
    out, lse = torch.zeros_like(q), torch.zeros(1, 2, 5, device=DEVICE)
    bad = [((out.half(), lse, out), r"out must be torch\.float32, got torch\.float16"),
           ((out, lse.double(), out), r"lse must be torch\.float32, got torch\.float64"),
           ((out, lse[..., :4], out), r"lse must have shape \(1, 2, 5\), got \(1, 2, 4\)")]
    for saved, pattern in bad:
        with pytest.raises((TypeError, ValueError), match=pattern + r"; pass what flash_attention_triton returned"):
            flash_attention_triton_backward(q, q, q, *saved)


# --- the overflow rule after the forward kernel -----------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's overflow warnings inside the interpreter
def test_overflowing_scores_raise_the_agreed_error():
    q = torch.ones(1, 1, 3, 16, device=DEVICE) * 1e20
    k = torch.ones(1, 1, 4, 16, device=DEVICE) * 1e20  # q·k = 1.6e41 > 3.4e38
    v = torch.randn(1, 1, 4, 16, device=DEVICE)
    pattern = (r"^attention scores overflowed to \+inf \(\|scale·q·k\| exceeds the range of float32\); "
               r"compute in float64 or use a smaller scale$")
    assert OVERFLOW_MESSAGE == "attention scores overflowed"
    with pytest.raises(ValueError, match=pattern):
        flash_attention_triton(q, k, v)
    with pytest.raises(ValueError, match=pattern):  # a huge scale overflows ordinary scores too
        flash_attention_triton(torch.ones_like(q), torch.ones_like(k), v, scale=1e38)
    # one overflowing row is enough, even when the other rows are fine
    q2 = torch.randn(1, 1, 3, 16, device=DEVICE)
    q2[0, 0, 1] = 1e20
    with pytest.raises(ValueError, match=pattern):
        flash_attention_triton(q2, k, v, is_causal=True)
    # every visible score of a row falling to -inf is an overflow too, named as such
    with pytest.raises(ValueError, match=r"^attention scores overflowed to -inf"):
        flash_attention_triton(q, -k, v)
    # a row whose keys are all masked is not an overflow: zeros, lse = -inf
    kpm = torch.zeros(1, 4, dtype=torch.bool, device=DEVICE)
    out, lse = flash_attention_triton(q2, k, v, key_mask=kpm)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()
    # check_finite=False: no check, no host sync; the overflow shows as a non-finite lse
    _, lse = flash_attention_triton(q, k, v, check_finite=False)
    assert not torch.isfinite(lse).any()


def test_a_finite_answer_is_not_mistaken_for_an_overflow():
    q = torch.full((1, 1, 2, 16), 3.0, device=DEVICE)  # q·k·scale = 36 for each of the 2 keys: large but finite
    out, lse = flash_attention_triton(q, q, q)
    ref, _ = attn_lib.attention(q.double().cpu(), q.double().cpu(), q.double().cpu())
    assert_close(out.cpu(), ref)
    assert_close(lse.cpu(), torch.full((1, 1, 2), 36.0 + math.log(2.0), dtype=torch.float64), what="lse")
