"""``attn_lib.rules.settings.rows_with_keys`` (the overflow rule's "which rows see a key") against a loop
written here, for every band a causal rule and an alignment give, and key masks that leave rows, whole
sequences or single keys present."""
import pytest
import torch

from attn_lib.rules.band import Band
from attn_lib.rules.settings import AttentionSettings, rows_with_keys

L, S = 5, 6
KEY_MASKS = {
    "none": None,
    "some": torch.tensor([[True, False, True, True, False, False], [False] * 3 + [True] * 3]),
    "all absent": torch.zeros(2, S, dtype=torch.bool),
    "one per row": torch.tensor([[False, False, True, False, False, False], [True] + [False] * 5]),
}


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("offset", [-4, -1, 0, 2])
@pytest.mark.parametrize("padding", list(KEY_MASKS))
def test_rows_with_keys_says_which_queries_see_a_present_key(is_causal, offset, padding):
    key_mask = KEY_MASKS[padding]
    settings = AttentionSettings(band=Band.resolve(L, S, is_causal=is_causal, offset=offset), scale=1.0,
                                 work_dtype=torch.float32, key_mask=key_mask)
    got = rows_with_keys(L, S, settings, "cpu")
    B = 1 if key_mask is None else 2
    want = torch.tensor([[[any((key_mask is None or bool(key_mask[b, j])) and (not is_causal or j <= i + offset)
                           for j in range(S)) for i in range(L)]] for b in range(B)])  # (B,1,L), by a loop
    assert got.shape == want.shape and torch.equal(got, want)
    if key_mask is not None:
        empty = AttentionSettings(band=Band.resolve(L, 0, is_causal=is_causal, offset=offset), scale=1.0,
                                  work_dtype=torch.float32, key_mask=key_mask[:, :0])
        assert torch.equal(rows_with_keys(L, 0, empty, "cpu"), torch.zeros(B, 1, L, dtype=torch.bool))
