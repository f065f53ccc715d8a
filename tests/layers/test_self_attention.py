"""attn_lib.layers.self_attention: x -> three projections -> attention, against hand-written projections and
attn_lib.attention; causal parallel == sequential; windows; the parameter count and the printed form."""
import math

import torch

import attn_lib
from attn_lib import SelfAttention
from attn_lib.core import worked_example as we
from attn_lib.tolerances import assert_close

from attn_paths import DISTINGUISHABLE, visible_band


def test_matches_hand_written_projections(rng):
    torch.manual_seed(0)
    layer = SelfAttention(6, 4, 3).double()
    x = torch.randn(2, 5, 6, generator=rng, dtype=torch.float64)
    out, scores = layer(x, need_weights=True)
    assert out.shape == (2, 5, 3) and scores.shape == (2, 5, 5)
    q = x @ layer.w_q.weight.T  # (B,L,C) @ (C,d_k) -> (B,L,d_k)
    k = x @ layer.w_k.weight.T
    v = x @ layer.w_v.weight.T
    p = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(4), dim=-1)  # (B,L,L)
    assert_close(scores, p, dtype=torch.float64)
    assert_close(out, p @ v, dtype=torch.float64)


def test_identity_matrices_reduce_to_attention_x_x_x(rng):
    x = torch.randn(1, 4, 3, generator=rng, dtype=torch.float64)
    eye = torch.eye(3, dtype=torch.float64)
    layer = SelfAttention.from_matrices(eye, eye, eye)
    expected, _ = attn_lib.attention(x[:, None], x[:, None], x[:, None])  # (B,1,L,C)
    assert_close(layer(x), expected[:, 0], dtype=torch.float64)


def test_from_matrices_reproduces_x_at_w_and_worked_example():
    # one sentence x; three matrices chosen so that x @ W gives the worked example's vectors
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 4, generator=gen, dtype=torch.float64)  # tokens 水 书 它 打翻 (sentence order)
    keys = torch.tensor(we.key_matrix(), dtype=torch.float64)
    values = torch.tensor(we.value_matrix(), dtype=torch.float64)
    query = torch.tensor(we.QUERY, dtype=torch.float64)[None]
    kv_rows = [0, 1, 3]
    w_k = torch.linalg.pinv(x[kv_rows]) @ keys
    w_v = torch.linalg.pinv(x[kv_rows]) @ values
    w_q = torch.linalg.pinv(x[[2]]) @ query
    layer = SelfAttention.from_matrices(w_q, w_k, w_v)
    assert_close(layer.w_k(x)[kv_rows], keys, dtype=torch.float64)
    keep = torch.ones(4, 4, dtype=torch.bool)
    keep[2, 2] = False  # the worked example looks at 水 书 打翻 only, not at 它 itself
    out, scores = layer(x[None], mask=keep, need_weights=True)
    q, k, v = we.as_tensors()
    ref_out, ref_scores = attn_lib.attention(q, k, v)
    assert_close(out[0, 2], ref_out[0, 0, 0], dtype=torch.float64)
    assert_close(scores[0, 2, kv_rows], ref_scores[0, 0, 0], dtype=torch.float64)


def test_causal_parallel_equals_sequential(rng):
    torch.manual_seed(1)
    layer = SelfAttention(8, is_causal=True).double()
    x = torch.randn(2, 6, 8, generator=rng, dtype=torch.float64)
    full = layer(x)  # (B,L,C)
    for t in range(6):
        step = layer(x[:, : t + 1])  # only the prefix exists at step t
        assert_close(full[:, t], step[:, t], dtype=torch.float64, what=f"step {t}")
    # without the mask, the early rows see the future and differ
    layer.is_causal = False
    assert (layer(x)[:, 0] - full[:, 0]).abs().max() > DISTINGUISHABLE


def test_mask_3d_and_causal_combined(rng):
    layer = SelfAttention(4, is_causal=True).double()
    x = torch.randn(2, 3, 4, generator=rng, dtype=torch.float64)
    keep = torch.ones(2, 3, 3, dtype=torch.bool)
    keep[1, :, 0] = False
    keep[1, 0, 0] = True  # query 0 must still see one key
    _, scores = layer(x, mask=keep, need_weights=True)
    assert torch.all(scores[1, 1:, 0] == 0)
    assert torch.all(scores.triu(1) == 0)


def test_parameter_count():
    assert attn_lib.count_parameters(SelfAttention(8)) == 3 * 8 * 8
    assert attn_lib.count_parameters(SelfAttention(8, 4, 2, bias=True)) == 8 * 4 * 2 + 8 * 2 + 4 * 2 + 2


def test_a_window_hides_the_keys_outside_it():
    torch.manual_seed(0)
    layer = SelfAttention(8, window_size=(1, 0), is_causal=True).double()
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        out, scores = layer(x, need_weights=True)  # (B,L,d_v), (B,L,L)
    band = visible_band(6, 6, True, (1, 0))  # (L,S) from the definition
    assert torch.equal(scores > 0, band.expand(2, 6, 6))
    q, k, v = layer.w_q(x), layer.w_k(x), layer.w_v(x)
    logits = (q @ k.transpose(-2, -1) / 8 ** 0.5).masked_fill(~band, float("-inf"))
    assert_close(out, torch.softmax(logits, -1) @ v, dtype=torch.float64, what="windowed self-attention")
    assert "window_size=(1, 0)" in repr(layer)


def test_either_alignment_gives_the_same_self_attention():
    """L = S: top-left and bottom-right put the causal rule and the window on the same diagonal."""
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    layers = []
    for align in ("top-left", "bottom-right"):
        torch.manual_seed(3)
        layers.append(SelfAttention(8, is_causal=True, window_size=(2, 0), align=align).double())
    with torch.no_grad():
        assert torch.equal(layers[0](x), layers[1](x))


def test_repr_names_sizes_and_a_non_default_backend():
    single = repr(SelfAttention(6, 4, 2, backend="torch"))
    assert "d_model=6, d_k=4, d_v=2, is_causal=False, backend='torch'\n" in single
    assert "backend" not in repr(SelfAttention(6))
