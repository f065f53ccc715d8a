"""``attn_lib.layers.dispatch.attend`` with k, v of H_kv heads and a sliding window, on every backend.

The oracle is written here in plain torch from the definitions: K/V repeated per query head
(``repeat_interleave``, in this file only) and query i seeing key j iff
``i + offset - left <= j <= i + offset + right`` (and ``j <= i + offset`` with ``is_causal``).
Odd L and S, L != S, D not a power of 2, Dv != D, key padding and rows that see no key.
"""
import importlib.util

import pytest
import torch

from attn_lib.layers.dispatch import attend
from attn_lib.tolerances import assert_close

from attn_paths import visible_band

HAS_TRITON = importlib.util.find_spec("triton") is not None
BACKENDS = ["reference", "sdpa", "torch"] + (["triton"] if HAS_TRITON else [])
HEADS = [(6, 2), (8, 1), (4, 4)]
# (is_causal, window, L, S, offset): top-left (offset 0) and bottom-right decoding (offset S - L)
BANDS = [
    (False, (0, 0), 7, 7, 0), (True, (1, 0), 7, 7, 0), (True, (5, 0), 9, 9, 0), (False, (3, 2), 5, 9, 0),
    (False, (-1, 4), 9, 5, 0), (True, (40, 0), 7, 7, 0), (True, (2, 0), 3, 9, 6), (True, (-1, -1), 3, 9, 6),
    (False, (1, 1), 2, 7, 5),
]


def _oracle(q, k, v, pad, is_causal, window, offset, scale):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # (B,H,S,D), (B,H,S,Dv)
    L, S = q.shape[2], k.shape[2]
    ok = visible_band(L, S, is_causal, window, offset)  # (L,S)
    ok = ok & pad[:, None, None, :]  # (B,1,L,S)
    logits = (q @ k.transpose(-2, -1) * scale).masked_fill(~ok, float("-inf"))  # (B,H,L,S)
    p = torch.softmax(logits, -1).nan_to_num(0.0)  # a row that sees no key: zeros
    return p @ v, p  # (B,H,L,Dv), (B,H,L,S)


def _qkv(H, H_kv, L, S, dtype, D=5, Dv=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, L, D, generator=g, dtype=dtype)  # (B,H,L,D)
    k = torch.randn(2, H_kv, S, D, generator=g, dtype=dtype)  # (B,H_kv,S,D)
    v = torch.randn(2, H_kv, S, Dv, generator=g, dtype=dtype)  # (B,H_kv,S,Dv)
    pad = torch.ones(2, S, dtype=torch.bool)
    pad[1, S // 2:] = False  # the second sequence: the keys from S // 2 on are padding
    return q, k, v, pad


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}/{h[1]}")
@pytest.mark.parametrize("band", BANDS, ids=str)
def test_attend_with_shared_heads_and_a_window_equals_plain_torch(backend, heads, band):
    is_causal, window, L, S, offset = band
    dtype = torch.float32 if backend == "triton" else torch.float64  # the interpreter: float32
    q, k, v, pad = _qkv(*heads, L, S, dtype)
    scale = 0.4
    out, scores = attend(q, k, v, pad[:, None, None, :], is_causal=is_causal, scale=scale,
                         need_weights=backend == "reference", backend=backend, check_finite=True,
                         causal_offset=offset, window_size=window)
    want, p = _oracle(q, k, v, pad, is_causal, window, offset, scale)
    assert out.shape == (2, heads[0], L, 3)
    assert_close(out, want, dtype=dtype, what=f"{backend} output")
    if backend == "reference":
        assert scores.shape == (2, heads[0], L, S)
        assert_close(scores, p, dtype=dtype, what="scores")


def test_a_row_outside_every_window_gives_zeros_on_sdpa():
    """Window (0, 0) on a padded key: that query sees nothing, and the sdpa path returns zeros, not nan."""
    q, k, v, pad = _qkv(6, 2, 7, 7, torch.float64)
    out, _ = attend(q, k, v, pad[:, None, None, :], is_causal=False, scale=0.5, need_weights=False,
                    backend="sdpa", check_finite=True, window_size=(0, 0))
    assert torch.equal(out[1, :, 3:], torch.zeros_like(out[1, :, 3:]))  # keys 3.. of sequence 1 are padding
    assert not torch.isnan(out).any()


def test_sdpa_gets_the_shared_heads_without_a_repeat(monkeypatch):
    """The sdpa path hands k, v with H_kv heads to torch with enable_gqa=True (no repeated K/V here)."""
    import torch.nn.functional as F

    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((q.shape[1], k.shape[1], v.shape[1], kw.get("enable_gqa")))
        return real(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    q, k, v, _ = _qkv(8, 2, 5, 5, torch.float64)
    attend(q, k, v, None, is_causal=True, scale=0.5, need_weights=False, backend="sdpa", check_finite=False)
    attend(q, q, q, None, is_causal=True, scale=0.5, need_weights=False, backend="sdpa", check_finite=False)
    assert seen == [(8, 2, 2, True), (8, 8, 8, False)]
