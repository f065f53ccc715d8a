"""Details of the core modules that the mutation run (mutmut, see pyproject's [tool.mutmut])
found untested: each test asserts a behaviour a reader relies on, against an independent answer.
"""
from __future__ import annotations

import importlib

import pytest
import torch

import attn_lib
import attn_lib.flash as flash_module
from attn_lib.tolerances import assert_close


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# --- softmax.naive_softmax: the axis, on square and non-square inputs --------------------------
@pytest.mark.parametrize("shape,dim", [((3, 3), 0), ((3, 3), -1), ((3, 3), 1), ((2, 5), 0), ((2, 5), -1),
                                       ((4, 1, 3), 0), ((4, 1, 3), 1), ((4, 1, 3), -1)])
def test_naive_softmax_normalises_along_dim(shape, dim):
    x = _x(*shape)
    assert_close(attn_lib.naive_softmax(x, dim), torch.softmax(x, dim), dtype="float64", what="naive_softmax")
    assert_close(attn_lib.naive_softmax(x), torch.softmax(x, -1), dtype="float64", what="naive_softmax default dim")


# --- online_softmax_update: which argument is wrong, and every shape mismatch ------------------
@pytest.mark.parametrize("bad", ["m", "l", "piece"])
def test_online_softmax_update_names_the_bad_argument(bad):
    args = {"m": torch.zeros(2), "l": torch.zeros(2), "piece": torch.zeros(2, 3)}
    args[bad] = [0.0]
    with pytest.raises(TypeError, match=rf"^{bad} must be a torch.Tensor, got list"):
        attn_lib.online_softmax_update(args["m"], args["l"], args["piece"])
    args[bad] = torch.zeros(2, 3, dtype=torch.long) if bad == "piece" else torch.zeros(2, dtype=torch.long)
    with pytest.raises(TypeError, match=rf"^{bad} must be a floating-point tensor"):
        attn_lib.online_softmax_update(args["m"], args["l"], args["piece"])


@pytest.mark.parametrize("m,l,piece", [
    ((2,), (3,), (2, 4)),  # m and l differ, piece fits m
    ((2,), (2,), ()),  # a 0-D piece
    ((2,), (2,), (3, 4)),  # piece's leading axes differ from m
])
def test_online_softmax_update_refuses_every_shape_mismatch(m, l, piece):
    with pytest.raises(ValueError, match=r"piece must have shape \(\.\.\., P\)"):
        attn_lib.online_softmax_update(torch.zeros(m), torch.zeros(l), torch.zeros(piece))


def test_online_softmax_update_one_step_by_hand():
    m, l = torch.tensor([1.0, float("-inf")]), torch.tensor([2.0, 0.0])
    piece = torch.tensor([[3.0, 0.0], [float("-inf"), float("-inf")]])
    m_new, l_new = attn_lib.online_softmax_update(m, l, piece)
    assert torch.equal(m_new, torch.tensor([3.0, float("-inf")]))
    expected = 2.0 * torch.exp(torch.tensor(1.0 - 3.0)) + 1.0 + torch.exp(torch.tensor(-3.0))
    assert_close(l_new[0], expected, dtype="float32")
    assert l_new[1] == 0


# --- the layers' printed form (what chapter 05 and 07 print) -----------------------------------
def test_layer_repr_names_sizes_and_a_non_default_backend():
    mha = repr(attn_lib.MultiHeadAttention(8, 2, is_causal=True))
    assert "d_model=8, num_heads=2, head_dim=4, is_causal=True\n" in mha and "backend" not in mha
    looped = repr(attn_lib.LoopedMultiHeadAttention(8, 4, backend="flash"))
    assert "d_model=8, num_heads=4, head_dim=2, is_causal=False, backend='flash'\n" in looped
    single = repr(attn_lib.SelfAttention(6, 4, 2, backend="flash"))
    assert "d_model=6, d_k=4, d_v=2, is_causal=False, backend='flash'\n" in single
    assert "backend" not in repr(attn_lib.SelfAttention(6))


# --- masks: messages, dtypes and devices -------------------------------------------------------
META = torch.device("meta")  # a device other than the CPU that every machine has


@pytest.mark.parametrize("call,exc,pattern", [
    (lambda: attn_lib.padding_mask(torch.tensor([1.0, 2.0])), TypeError,
     r"^lengths must be a 1-D integer tensor or a list of ints, got dtype torch.float32; convert with lengths.long\(\)$"),
    (lambda: attn_lib.padding_mask(torch.tensor([True])), TypeError, r"got dtype torch.bool; convert with lengths.long"),
    (lambda: attn_lib.padding_mask(torch.ones(2, 2, dtype=torch.long)), ValueError,
     r"^lengths must be a 1-D integer tensor or a list of ints, got dtype torch.int64 and shape \(2, 2\)$"),
    (lambda: attn_lib.padding_mask("ab"), TypeError, r"^lengths must be a sequence of B ints \(one per sentence\), got 'ab'"),
    (lambda: attn_lib.padding_mask([]), ValueError, r"^lengths is empty: need one length per sentence in the batch$"),
    (lambda: attn_lib.padding_mask([1], 0), ValueError, r"^S must be a positive int, got 0$"),
    (lambda: attn_lib.bool_to_additive([True]), TypeError, r"^mask must be a bool tensor \(True = may attend\), got list$"),
    (lambda: attn_lib.additive_to_bool([0.0]), TypeError, r"^mask must be a floating tensor of 0 and -inf, got list$"),
    (lambda: attn_lib.additive_to_bool(torch.tensor([0.5])), ValueError,
     r"such a bias cannot be expressed as a bool mask, pass the float mask to attention as it is$"),
])
def test_mask_messages(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


def test_masks_stay_on_the_requested_device():
    assert attn_lib.padding_mask([2, 1], 3, device=META).device == META
    assert attn_lib.padding_mask(torch.tensor([2, 1]), device=META).device == META
    assert attn_lib.bool_to_additive(torch.ones(2, 3, dtype=torch.bool, device=META)).device == META
    assert attn_lib.causal_mask(3, device=META).device == META


# --- multi-head: which projection path, and the looped layer's settings --------------------------
def _fused(**kw):
    layer = attn_lib.MultiHeadAttention(8, 2, **kw).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(_x(*p.shape, seed=p.numel()) / 3)
    return layer


def _ref_mha(layer, xq, xk, xv):
    C, H = layer.d_model, layer.num_heads
    w_q, w_k, w_v = layer.qkv.weight.split(C)
    b_q, b_k, b_v = layer.qkv.bias.split(C)

    def heads(y):  # (B,L,C) -> (B,H,L,D)
        return y.reshape(y.shape[0], y.shape[1], H, C // H).transpose(1, 2)

    out = torch.nn.functional.scaled_dot_product_attention(heads(xq @ w_q.T + b_q), heads(xk @ w_k.T + b_k),
                                                           heads(xv @ w_v.T + b_v))
    return layer.out_proj(out.transpose(1, 2).reshape(xq.shape))


@pytest.mark.parametrize("Layer", ["fused", "looped"])
@pytest.mark.parametrize("which", ["kv_is_query", "k_is_query", "v_is_query", "kv_shared", "all_differ", "self"])
def test_every_combination_of_query_key_value(Layer, which):
    fused = _fused()
    layer = fused if Layer == "fused" else attn_lib.LoopedMultiHeadAttention.from_fused(fused)
    x, y, z = _x(2, 4, 8, seed=1), _x(2, 4, 8, seed=2), _x(2, 4, 8, seed=3)
    xq, xk, xv = {"kv_is_query": (x, x, x), "k_is_query": (x, x, y), "v_is_query": (x, y, x), "kv_shared": (x, y, y),
                  "all_differ": (x, y, z), "self": (x, None, None)}[which]
    with torch.no_grad():
        out = layer(xq, xk, xv)
        expected = _ref_mha(fused, xq, xq if xk is None else xk, (xq if xk is None else xk) if xv is None else xv)
    assert_close(out, expected, dtype="float64", what=f"{Layer} {which}")


def test_self_attention_projects_with_one_matmul(monkeypatch):
    layer = _fused()
    calls = []
    real = layer.qkv.forward
    monkeypatch.setattr(layer.qkv, "forward", lambda x: calls.append(x.shape) or real(x))
    layer(_x(2, 4, 8))
    assert calls == [(2, 4, 8)], "self-attention: the fused (3C, C) projection runs once"


def test_looped_layer_settings_default_and_copy():
    looped = attn_lib.LoopedMultiHeadAttention(8, 2)
    assert looped.check_finite is True and looped.backend == "reference"
    fused = _fused(backend="flash", check_finite=False, is_causal=True)
    copy = attn_lib.LoopedMultiHeadAttention.from_fused(fused)
    assert (copy.backend, copy.check_finite, copy.is_causal) == ("flash", False, True)


def test_looped_layer_honours_check_finite_and_backend(monkeypatch):
    bad = _x(1, 3, 8)
    bad[0, 0, 0] = float("nan")
    nan_mask = torch.zeros(3, 3, dtype=torch.float64)
    nan_mask[0, 0] = float("nan")
    strict = attn_lib.LoopedMultiHeadAttention.from_fused(_fused())
    with pytest.raises(ValueError, match="query contains nan or inf"):
        strict(bad)
    with pytest.raises(ValueError, match="additive float mask may contain -inf"):
        strict(_x(1, 3, 8), mask=nan_mask)
    with pytest.raises(ValueError, match=r"mask has 3 heads on axis 1, expected 1 or 2"):
        strict(_x(1, 3, 8), mask=torch.ones(1, 3, 4, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="attention scores overflowed"):
        huge = torch.full((1, 3, 8), 1e200, dtype=torch.float64)
        strict(huge * torch.arange(1, 9, dtype=torch.float64))
    lax = attn_lib.LoopedMultiHeadAttention.from_fused(_fused(check_finite=False))
    assert torch.isnan(lax(bad, mask=nan_mask)).any()  # the caller turned the checks off: no error
    flash = attn_lib.LoopedMultiHeadAttention.from_fused(_fused(backend="flash"))
    with pytest.raises(ValueError, match="need_weights=True needs the attention scores"):
        flash(_x(1, 3, 8), need_weights=True)
    calls = []
    real = flash_module.flash_attention
    monkeypatch.setattr(flash_module, "flash_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad():
        flash(_x(1, 3, 8))
    assert len(calls) == 2, "backend='flash': every head goes through attn_lib.flash_attention"


# --- reference: which argument, which device, the checks check_finite turns off ---------------
QQ = _x(1, 1, 3, 4)


@pytest.mark.parametrize("call,exc,pattern", [
    (lambda: attn_lib.attention(QQ, [0.0], QQ), TypeError, r"^k must be a torch.Tensor, got list"),
    (lambda: attn_lib.attention(QQ, QQ, [0.0]), TypeError, r"^v must be a torch.Tensor, got list"),
    (lambda: attn_lib.attention(QQ.numpy(), QQ, QQ), TypeError,
     r"^q must be a torch.Tensor, got ndarray; for numpy arrays use attn_lib.numpy_ref.attention$"),
    (lambda: attn_lib.attention(QQ, QQ.to(META), QQ), ValueError, r"^q, k and v must be on one device, got cpu, meta, cpu; move them with \.to\(q\.device\)$"),
    (lambda: attn_lib.attention(QQ, QQ, QQ, mask=torch.ones(3, 3, dtype=torch.bool, device=META)), ValueError,
     r"^mask must be on q's device cpu, got meta; move it with mask\.to\(q\.device\)$"),
    (lambda: attn_lib.attention(QQ * float("nan"), QQ, QQ), ValueError,
     r"^q contains nan or inf; attention would turn it into nan. Check the layer that produced it \(masks belong in `mask`, not in q/k/v\).$"),
    (lambda: attn_lib.softmax(torch.tensor([float("nan")])), ValueError, r"Only -inf is allowed \(it means 'masked'\).$"),
    (lambda: attn_lib.online_softmax(torch.tensor(1.0), 1), ValueError,
     r"^x must have at least one axis \(the row to normalise is the last one\)$"),
    (lambda: attn_lib.online_softmax(torch.zeros(5), [2, 0, 3]), ValueError, r"^splits\[1\] must be a positive int, got 0$"),
    (lambda: attn_lib.online_weighted_sum(torch.zeros(3), [[0.0]], 2), TypeError, r"^v must be a torch.Tensor, got list"),
    (lambda: attn_lib.online_weighted_sum(torch.zeros(2, 4, 3), torch.zeros(5, 3, 2), 2), ValueError,
     r"^v's leading axes \(5,\) do not broadcast with x's \(2, 4\) "),
    (lambda: attn_lib.online_weighted_sum(torch.zeros(3), torch.full((3, 2), float("inf")), 2), ValueError,
     r"^v contains nan or inf; the weighted sum would be nan. Check what produced it.$"),
])
def test_core_messages(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


def test_check_finite_false_skips_the_mask_scan_too():
    nan_mask = torch.zeros(3, 3, dtype=torch.float64)
    nan_mask[1, 1] = float("nan")
    with pytest.raises(ValueError, match="additive float mask"):
        attn_lib.attention(QQ, QQ, QQ, mask=nan_mask)
    out, _ = attn_lib.attention(QQ, QQ, QQ, mask=nan_mask, check_finite=False)
    assert torch.isnan(out[0, 0, 1]).all() and not torch.isnan(out[0, 0, 0]).any()


def test_empty_float_mask_and_no_keys():
    q, k, v = _x(1, 1, 2, 4), _x(1, 1, 0, 4), _x(1, 1, 0, 3)
    out, scores = attn_lib.attention(q, k, v, mask=torch.zeros(2, 0, dtype=torch.float64))
    assert out.shape == (1, 1, 2, 3) and (out == 0).all() and scores.shape == (1, 1, 2, 0)


# --- softmax: a single score, and the float32 work precision of 16-bit input ------------------
def test_softmax_of_a_single_score():
    one = attn_lib.softmax(torch.tensor(2.5))
    assert one.shape == () and one.item() == 1.0
    assert attn_lib.softmax(torch.tensor(float("-inf"))).item() == 0.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_softmax_is_computed_in_float32(dtype):
    x = (_x(4, 300) * 4).to(dtype)
    expected = torch.softmax(x.float(), -1).to(dtype)
    assert torch.equal(attn_lib.softmax(x), expected)
    assert_close(attn_lib.online_softmax(x, 64), torch.softmax(x.double(), -1), dtype=dtype, what="online, 16-bit")
    m, l = attn_lib.online_max_and_sum(x, 7)
    assert m.dtype == l.dtype == torch.float32


# --- online softmax on more than one leading axis, rows of very different sizes ---------------
@pytest.mark.parametrize("shape", [(6,), (2, 6), (2, 3, 6)])
def test_online_functions_on_any_leading_axes(shape):
    x = _x(*shape, seed=4) * 3
    x[..., 0] = x[..., 0] - 1000  # one row far below the others (when there are several rows)
    if len(shape) > 1:
        x[0] = x[0] - 1000
    v = _x(*shape, 2, seed=5)
    m, l = attn_lib.online_max_and_sum(x, 4)
    assert_close(m, x.amax(-1), dtype="float64")
    assert_close(l, torch.exp(x - x.amax(-1, keepdim=True)).sum(-1), dtype="float64")
    assert_close(attn_lib.online_logsumexp(x, [1, 5]), torch.logsumexp(x, -1), dtype="float64")
    expected = (torch.softmax(x, -1)[..., None, :] @ v)[..., 0, :]
    assert_close(attn_lib.online_weighted_sum(x, v, 4), expected, dtype="float64", what="softmax(x) @ v")
    x16, v16 = x.to(torch.float16), v.to(torch.float16)
    out16 = attn_lib.online_weighted_sum(x16, v16, 4)
    assert out16.dtype == torch.float16
    assert_close(out16, (torch.softmax(x16.double(), -1)[..., None, :] @ v16.double())[..., 0, :], dtype="float16")


def test_cross_attention_without_bias():
    layer = attn_lib.MultiHeadAttention(8, 2, bias=False).double()
    x, y = _x(2, 4, 8, seed=1), _x(2, 5, 8, seed=2)
    w_q, w_k, w_v = layer.qkv.weight.split(8)
    with torch.no_grad():
        for xk, xv in ((y, y), (y, _x(2, 5, 8, seed=3))):
            q, k, v = (t.reshape(2, -1, 2, 4).transpose(1, 2) for t in (x @ w_q.T, xk @ w_k.T, xv @ w_v.T))
            expected = layer.out_proj(torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2)
                                      .reshape(2, 4, 8))
            assert_close(layer(x, xk, xv), expected, dtype="float64", what="no bias, cross-attention")


@pytest.mark.parametrize("call,exc,pattern", [
    (lambda: attn_lib.MultiHeadAttention(8, 2)(torch.zeros(2, 3, 8), torch.zeros(1, 3, 8), torch.zeros(2, 3, 8)),
     ValueError, r"same batch size B, got 2, 1 and 2"),
    (lambda: attn_lib.MultiHeadAttention(8, 2)(torch.zeros(2, 3, 8), torch.zeros(2, 3, 8), torch.zeros(1, 3, 8)),
     ValueError, r"same batch size B, got 2, 2 and 1"),
    (lambda: attn_lib.MultiHeadAttention(8, 2)(torch.zeros(2, 3, 8), torch.zeros(2, 3, 8), torch.zeros(2, 3, 5)),
     ValueError, r"^value has last dimension 5"),
])
def test_layer_input_messages(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


def test_layer_check_finite_false_reaches_the_mask_check():
    nan_mask = torch.zeros(3, 3)
    nan_mask[0, 1] = float("nan")
    x = torch.ones(1, 3, 8)
    with pytest.raises(ValueError, match="additive float mask"):
        attn_lib.MultiHeadAttention(8, 2)(x, mask=nan_mask)
    assert torch.isnan(attn_lib.MultiHeadAttention(8, 2, check_finite=False)(x, mask=nan_mask)).any()


def test_default_and_flash_reprs():
    assert "backend" not in repr(attn_lib.LoopedMultiHeadAttention(8, 2))
    assert "head_dim=4, is_causal=False\n" in repr(attn_lib.LoopedMultiHeadAttention(8, 2))
    assert "head_dim=4, is_causal=False, backend='flash'\n" in repr(attn_lib.MultiHeadAttention(8, 2, backend="flash"))


def test_16_bit_softmax_with_a_dead_row_keeps_its_dtype():
    x = torch.tensor([[0.5, 1.0], [float("-inf"), float("-inf")]], dtype=torch.float16)
    p = attn_lib.softmax(x)
    assert p.dtype == torch.float16 and (p[1] == 0).all()
    assert_close(p[0], torch.softmax(x[0].double(), -1), dtype="float16")


def test_softmax_with_max_keeps_the_dtype_and_the_row_check_does_not_scan(monkeypatch):
    sm = importlib.import_module("attn_lib.stable_softmax")  # the module (attn_lib.softmax is the function)
    x = torch.tensor([[0.5, 1.0], [float("-inf"), float("-inf")]], dtype=torch.float16)
    live = x[:1]
    assert sm.softmax_with_max(live, live.amax(-1, keepdim=True), 1).dtype == torch.float16
    assert sm.softmax_with_max(x, x.amax(-1, keepdim=True), 1).dtype == torch.float16

    def no_scan(*a, **k):
        raise AssertionError("finite row maxima: check_row_max must not scan the scores")

    checks = importlib.import_module("attn_lib._validate.tensors")  # where check_row_max lives
    monkeypatch.setattr(checks, "check_scores_finite", no_scan)
    checks.check_row_max(x, x.amax(-1, keepdim=True))  # one -inf row max: allowed, no scan
    assert (attn_lib.softmax(x)[1] == 0).all()
