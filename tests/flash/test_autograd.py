"""The differentiable entry (``attn_lib.flash.autograd``): ``flash_attention``, ``flash_core`` and
``FlashAttentionFunction.apply(q, k, v, settings)``, on the torch backend, against the float64
reference's autograd (``attn_lib.attention``).

Covered: the backend ``"auto"`` resolves to the tiled torch path on CPU tensors; the Function is used
only when a gradient is needed and saves no (L, S) matrix; the settings (band, scale, key mask, k and v
with H_kv heads) reach the forward and the backward core of the backend they name (the Triton cores
replaced here by stand-ins that compute with the tiled torch cores: the Triton kernels themselves are
tested in tests/flash/triton); ``align="bottom-right"`` and any band offset given in the settings;
second-order gradients refused; overflow refused with and without a gradient; a graph with a shared
input; empty sizes; a layer trained on the flash path.
"""
import pytest
import torch

import attn_lib
import attn_lib.flash.autograd as autograd
from attn_lib import flash_attention
from attn_lib.checks.doors import check_flash_call
from attn_lib.checks.flash import triton_available
from attn_lib.device import triton_interprets
from attn_lib.flash.autograd import FlashAttentionFunction, flash_core
from attn_lib.flash.tiled_backward import backward_core
from attn_lib.flash.tiled_forward import forward_core
from attn_lib.rules.band import Band
from attn_lib.rules.settings import AttentionSettings, Options
from attn_lib.tolerances import assert_close

from attn_paths import flash_inputs, reference_grads, visible_band

OVERFLOW_UP = r"attention scores overflowed to \+inf"


def qkv(B, H, Hkv, L, S, D=12, Dv=10, dtype=torch.float64, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    shapes = ((B, H, L, D), (B, Hkv, S, D), (B, Hkv, S, Dv))
    return tuple(torch.randn(*s, generator=g, dtype=torch.float64).to(dtype).requires_grad_(requires_grad)
                 for s in shapes)


def masked_reference(q, k, v, visible, dout, scale=None):
    """float64 (out, dq, dk, dv) of attn_lib.attention given the bool mask ``visible`` (B|1, 1, L, S)."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, _ = attn_lib.attention(q, k, v, mask=visible, enable_gqa=True, scale=scale)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), dout.double()))


def ids(c):
    return "x".join(map(str, c)) if isinstance(c, tuple) else str(c)


# --- the backend and the Function ------------------------------------------------------------------------

def test_auto_is_the_tiled_torch_path_on_cpu_tensors():
    q, k, v, key_mask = flash_inputs(1, 2, 33, 47, 16, padding=True)
    assert check_flash_call(q, k, v, Options(backend="auto"), triton_interprets).backend == "torch"
    out = flash_attention(q, k, v, is_causal=True, key_mask=key_mask)
    mask = key_mask[:, None, None, :]
    assert_close(out, attn_lib.attention(q, k, v, mask=mask, is_causal=True)[0])
    assert torch.equal(out, flash_attention(q, k, v, is_causal=True, key_mask=key_mask, backend="torch"))


@pytest.mark.skipif(not triton_available() or torch.cuda.is_available(),
                    reason="needs the triton package, and CPU tensors run under its interpreter only without a GPU")
def test_an_explicit_triton_backend_is_kept():
    q, k, v, _ = flash_inputs(1, 2, 5, 6, 16)
    assert check_flash_call(q.float(), k.float(), v.float(), Options(backend="triton"), triton_interprets).backend \
        == "triton"


def test_the_function_is_used_only_when_a_gradient_is_needed():
    q, k, v, _ = flash_inputs(1, 1, 5, 6, 4)
    assert flash_attention(q, k, v, backend="torch").grad_fn is None
    qg = q.clone().requires_grad_()
    out = flash_attention(qg, k, v, backend="torch")
    assert type(out.grad_fn).__name__ == "FlashAttentionFunctionBackward"
    with torch.no_grad():
        assert flash_attention(qg, k, v, backend="torch").grad_fn is None
    assert issubclass(FlashAttentionFunction, torch.autograd.Function)


def test_apply_takes_the_settings_and_gives_the_reference_gradients():
    q, k, v, key_mask = flash_inputs(2, 2, 9, 11, 6, 5, padding=True, seed=3)
    settings = check_flash_call(q, k, v, Options(is_causal=True, key_mask=key_mask, backend="torch"),
                                triton_interprets)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = FlashAttentionFunction.apply(qg, kg, vg, settings)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out.backward(dout)
    assert_close(out.detach(), attn_lib.attention(q, k, v, mask=key_mask[:, None, None, :], is_causal=True)[0])
    for g, e in zip((qg.grad, kg.grad, vg.grad), reference_grads(q, k, v, dout, key_mask, True)):
        assert_close(g, e, kind="gradient")


def test_saves_no_score_matrix_for_the_backward():
    q, k, v, _ = flash_inputs(1, 2, 200, 300, 8)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        flash_attention(q, k, v, backend="torch")
    assert saved and max(saved) <= 2 * 300 * 8  # q, k, v, out, lse: never 200×300 per head


def test_second_order_gradients_are_refused():
    # Refused as soon as they are asked for (create_graph=True), naming the path that has them,
    # instead of returning a detached gradient.
    q, k, v, _ = flash_inputs(1, 1, 5, 6, 4)
    qg = q.clone().requires_grad_()
    out = flash_attention(qg, k, v, backend="torch")
    dout = torch.ones_like(out, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"no second-order gradients.*attn_lib\.attention"):
        torch.autograd.grad(out, qg, dout, create_graph=True)
    assert torch.autograd.grad(flash_attention(qg, k, v, backend="torch"), qg, dout)[0].shape == q.shape


class StandInCores:
    """Stands in for the Triton cores attn_lib.flash.autograd calls: records what they get, computes with the
    tiled torch cores."""

    def __init__(self, monkeypatch):
        self.seen = []
        monkeypatch.setattr(autograd, "triton_forward", self.forward)
        monkeypatch.setattr(autograd, "triton_backward", self.backward)

    def forward(self, q, k, v, settings):
        self.seen.append(("forward", settings.backend, settings.band, settings.scale, k.shape[1]))
        return forward_core(q, k, v, settings)

    def backward(self, q, k, v, saved, settings):
        self.seen.append(("backward", settings.backend, settings.band, settings.scale, k.shape[1]))
        return backward_core(q, k, v, saved, settings)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_each_backend_gets_the_band_the_scale_and_k_v_with_their_kv_heads(backend, monkeypatch):
    """The door resolves is_causal, window_size and align into one band (here bottom-right, L < S); the
    Function hands it, the scale and k, v of H_kv heads to the forward and the backward core of its backend."""
    stand_in = StandInCores(monkeypatch)
    L, S = 9, 14
    q, k, v = qkv(2, 6, 2, L, S, D=16, dtype=torch.float32, requires_grad=True)
    options = Options(is_causal=True, scale=0.25, window_size=(3, 0), align="bottom-right", enable_gqa=True,
                      backend="torch")
    settings = check_flash_call(q, k, v, options, triton_interprets).replace(backend=backend)
    out = flash_core(q, k, v, settings)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    grads = torch.autograd.grad(out, (q, k, v), dout)
    band = Band.resolve(L, S, is_causal=True, window_size=(3, 0), offset=S - L)
    want = [("forward", "triton", band, 0.25, 2), ("backward", "triton", band, 0.25, 2)]
    assert stand_in.seen == (want if backend == "triton" else [])
    ref_out, *ref_grads = masked_reference(q, k, v, visible_band(L, S, True, (3, 0), offset=S - L), dout, 0.25)
    assert_close(out, ref_out, dtype=torch.float32)
    for got, e in zip(grads, ref_grads):
        assert got.shape == e.shape  # dk, dv with H_kv = 2 heads
        assert_close(got, e, dtype=torch.float32, kind="gradient")


def test_without_a_gradient_the_triton_core_is_called_once_and_checked_for_overflow(monkeypatch):
    stand_in = StandInCores(monkeypatch)
    q, k, v = qkv(1, 4, 4, 5, 5, D=16, dtype=torch.float32)
    settings = check_flash_call(q, k, v, Options(backend="torch"), triton_interprets).replace(backend="triton")
    flash_core(q, k, v, settings)
    assert stand_in.seen == [("forward", "triton", Band(None, None), 0.25, 4)]  # H_kv = H, no band
    with pytest.raises(ValueError, match=OVERFLOW_UP):
        flash_core(q * 1e20, k * 1e20, v, settings)


# --- alignment and bands -------------------------------------------------------------------------------------

# (L, S): bottom-right for L < S, L > S, L = S and one query at the end of the keys.
@pytest.mark.parametrize("L,S", [(5, 11), (11, 5), (7, 7), (1, 17)], ids=ids)
def test_bottom_right_through_flash_attention(L, S):
    q, k, v, key_mask = flash_inputs(1, 2, L, S, 8, seed=L + 50, padding=True)
    dout = torch.randn(1, 2, L, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    visible = torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L) & key_mask[:, None, None, :]  # (B,1,L,S)
    ref_out, *ref_grads = masked_reference(q, k, v, visible, dout)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = flash_attention(qg, kg, vg, is_causal=True, align="bottom-right", key_mask=key_mask, backend="torch")
    out.backward(dout)
    assert_close(out.detach(), ref_out, dtype=torch.float64)
    for got, want in zip((qg.grad, kg.grad, vg.grad), ref_grads):
        assert_close(got, want, dtype=torch.float64, what="gradient", kind="gradient")


@pytest.mark.parametrize("L,S", [(9, 9), (7, 13), (13, 9)], ids=ids)
def test_bottom_right_moves_a_gqa_window_forward_and_backward(L, S):
    q, k, v = qkv(1, 6, 3, L, S, requires_grad=True)
    dout = torch.randn(1, 6, L, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ref_out, *ref_grads = masked_reference(q, k, v, visible_band(L, S, True, (3, 0), offset=S - L), dout)
    out = flash_attention(q, k, v, is_causal=True, window_size=(3, 0), align="bottom-right", enable_gqa=True,
                          backend="torch")
    assert_close(out, ref_out, dtype=torch.float64)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), dout), ref_grads):
        assert_close(got, want, dtype=torch.float64, kind="gradient")


def test_any_band_offset_in_the_settings_reaches_forward_and_backward():
    """Offset 3 for L = 9, S = 13 (bottom-right would be 4): only settings written by hand give it."""
    L, S = 9, 13
    q, k, v, key_mask = flash_inputs(1, 2, L, S, 8, seed=53, padding=True)
    dout = torch.randn(1, 2, L, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    visible = torch.ones(L, S, dtype=torch.bool).tril(diagonal=3) & key_mask[:, None, None, :]  # (B,1,L,S)
    ref_out, *ref_grads = masked_reference(q, k, v, visible, dout)
    settings = AttentionSettings(band=Band.resolve(L, S, is_causal=True, offset=3), scale=8 ** -0.5,
                                 work_dtype=torch.float64, key_mask=key_mask, backend="torch")
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = FlashAttentionFunction.apply(qg, kg, vg, settings)
    out.backward(dout)
    assert_close(out.detach(), ref_out, dtype=torch.float64)
    for got, want in zip((qg.grad, kg.grad, vg.grad), ref_grads):
        assert_close(got, want, dtype=torch.float64, kind="gradient")


# --- overflow, graphs, sizes, layers ---------------------------------------------------------------------------

@pytest.mark.parametrize("requires_grad", [False, True], ids=["no-grad", "grad"])
def test_overflowing_scores_raise(requires_grad):
    q, k, v, _ = flash_inputs(1, 2, 5, 6, 4)
    q, k, v = q.float() * 0 + 1e20, k.float() * 0 + 1e20, v.float()  # scale·q·k = 2e40 > 3.4e38
    with pytest.raises(ValueError, match=OVERFLOW_UP + r" \(\|scale·q·k\| exceeds the range of float32\); "
                                         "compute in float64 or use a smaller scale"):
        flash_attention(q.requires_grad_(requires_grad), k, v, backend="torch")
    q64, k64, v64 = (t.detach().double() for t in (q, k, v))
    assert_close(flash_attention(q64, k64, v64, backend="torch"), attn_lib.attention(q64, k64, v64)[0])


def test_a_graph_with_a_shared_input_gets_the_reference_gradients():
    """h = lin(x); loss = flash(h, h, h).sum() + h.sum(): the weight's gradient equals the reference's."""
    grads = {}
    for path in ("flash", "reference"):
        torch.manual_seed(0)
        lin = torch.nn.Linear(16, 16, dtype=torch.float64)
        x = torch.randn(2, 3, 37, 16, dtype=torch.float64)  # (B,H,L,C)
        h = lin(x)  # (B,H,L,C) -> (B,H,L,D)
        if path == "flash":
            out = flash_attention(h, h, h, is_causal=True, backend="torch")  # (B,H,L,D)
        else:
            out, _ = attn_lib.attention(h, h, h, is_causal=True)  # (B,H,L,D)
        (out.sum() + h.sum()).backward()
        grads[path] = (lin.weight.grad.clone(), lin.bias.grad.clone())
    for g, e in zip(grads["flash"], grads["reference"]):
        assert_close(g, e, what="lin grad", kind="gradient")
    assert grads["flash"][0].abs().max() > 1  # not a vacuous comparison of zeros


@pytest.mark.parametrize("sizes", [(2, 0, 5), (2, 5, 0), (0, 4, 4), (2, 0, 0)], ids=ids)
def test_empty_sizes_keep_the_query_heads(sizes):
    """No query, no key or no batch: shapes still follow q's H heads and k's H_kv heads (no crash in the views)."""
    B, L, S = sizes
    q, k, v = qkv(B, 6, 2, L, S, requires_grad=True)
    out = flash_attention(q, k, v, backend="torch", enable_gqa=True, window_size=(2, 0))
    ref, _ = attn_lib.attention(q, k, v, enable_gqa=True, window_size=(2, 0))
    assert out.shape == ref.shape == (B, 6, L, 10) and torch.equal(out, ref)
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


@pytest.mark.parametrize("layer_name", ["MultiHeadAttention", "SelfAttention"])
def test_a_layer_trains_on_the_flash_path(layer_name):
    """A layer with backend="torch" gets the same gradients (input and every parameter) as the
    same layer on the reference path, with causal masking and key padding."""
    Layer = getattr(attn_lib, layer_name)
    kwargs = {"num_heads": 2} if layer_name == "MultiHeadAttention" else {}
    torch.manual_seed(0)
    ref = Layer(8, **kwargs, is_causal=True).double()
    flash = Layer(8, **kwargs, is_causal=True, backend="torch").double()
    flash.load_state_dict(ref.state_dict())
    x = torch.randn(2, 7, 8, dtype=torch.float64)  # (B,L,C)
    pad = attn_lib.padding_mask([7, 4], 7)  # (B,1,1,S)
    grads = []
    for layer in (ref, flash):
        xi = x.clone().requires_grad_()
        layer.zero_grad()
        out = layer(xi, mask=pad)  # (B,L,C)
        (out * torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out)).sum().backward()
        grads.append([xi.grad] + [p.grad for p in layer.parameters()])
    assert len(grads[1]) > 1 and all(g is not None for g in grads[1])
    for g_ref, g_flash in zip(*grads):
        assert_close(g_flash, g_ref, dtype="float64", what=f"{layer_name} gradient, flash vs reference",
                     kind="gradient")
