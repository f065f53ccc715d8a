"""attn_lib.costs.kv_memory: KV-cache bytes of real configurations: every expected value is hand
arithmetic from the formula 2 (K and V) * layers * kv_heads * head_dim * stored_tokens * bytes,
written out here, never taken from the module."""
import pytest

from attn_lib.costs import kv_memory
from attn_lib.costs.kv_memory import CONFIGS, ModelConfig, format_kv_table, kv_cache_bytes, kv_memory_table

GIB = 1024 ** 3


def test_published_configuration_values():
    """The values of the models' config.json (cited in the module docstring)."""
    l7, l70, m7 = CONFIGS["Llama-2-7B"], CONFIGS["Llama-2-70B"], CONFIGS["Mistral-7B"]
    assert (l7.num_layers, l7.num_heads, l7.num_kv_heads, l7.hidden_size, l7.sliding_window) == (32, 32, 32, 4096, None)
    assert (l70.num_layers, l70.num_heads, l70.num_kv_heads, l70.hidden_size, l70.sliding_window) == (80, 64, 8, 8192, None)
    assert (m7.num_layers, m7.num_heads, m7.num_kv_heads, m7.hidden_size, m7.sliding_window) == (32, 32, 8, 4096, 4096)
    assert [c.head_dim for c in (l7, l70, m7)] == [128, 128, 128]  # 4096/32, 8192/64, 4096/32
    assert [c.group_size for c in (l7, l70, m7)] == [1, 8, 4]  # 32/32, 64/8, 32/8
    assert (l7.max_positions, l70.max_positions, m7.max_positions) == (4096, 4096, 32768)


def test_llama2_7b_at_4k_is_exactly_2_gib():
    assert kv_cache_bytes(CONFIGS["Llama-2-7B"], 4096) == 2 * 32 * 32 * 128 * 4096 * 2 == 2 * GIB


@pytest.mark.parametrize("name,tokens,expected", [
    ("Llama-2-7B", 32768, 2 * 32 * 32 * 128 * 32768 * 2),   # 16 GiB
    ("Llama-2-70B", 4096, 2 * 80 * 8 * 128 * 4096 * 2),     # 1.25 GiB
    ("Llama-2-70B", 32768, 2 * 80 * 8 * 128 * 32768 * 2),   # 10 GiB
    ("Mistral-7B", 4096, 2 * 32 * 8 * 128 * 4096 * 2),      # 0.5 GiB
    ("Mistral-7B", 32768, 2 * 32 * 8 * 128 * 4096 * 2),     # the window caps it: still 0.5 GiB
    ("Mistral-7B", 1000, 2 * 32 * 8 * 128 * 1000 * 2),      # shorter than the window: all stored
])
def test_bytes_by_hand(name, tokens, expected):
    assert kv_cache_bytes(CONFIGS[name], tokens) == expected


def test_gib_values_by_hand():
    assert kv_cache_bytes(CONFIGS["Llama-2-7B"], 32768) == 16 * GIB
    assert kv_cache_bytes(CONFIGS["Llama-2-70B"], 4096) == 5 * GIB // 4
    assert kv_cache_bytes(CONFIGS["Llama-2-70B"], 32768) == 10 * GIB
    assert kv_cache_bytes(CONFIGS["Mistral-7B"], 32768) == GIB // 2


def test_without_sharing_batch_and_dtype():
    l70 = CONFIGS["Llama-2-70B"]
    assert kv_cache_bytes(l70, 4096, share_kv=False) == 2 * 80 * 64 * 128 * 4096 * 2  # 10 GiB: 8 x the GQA cache
    assert kv_cache_bytes(l70, 4096, bytes_per_value=4, batch=3) == 2 * 80 * 8 * 128 * 4096 * 4 * 3
    m7 = CONFIGS["Mistral-7B"]
    assert kv_cache_bytes(m7, 32768, share_kv=False) == 2 * 32 * 32 * 128 * 4096 * 2  # window still caps


def test_table_rows_and_text():
    rows = kv_memory_table()
    assert [(r["model"], r["tokens"]) for r in rows] == [
        ("Llama-2-7B", 4096), ("Llama-2-7B", 32768), ("Llama-2-70B", 4096), ("Llama-2-70B", 32768),
        ("Mistral-7B", 4096), ("Mistral-7B", 32768)]
    assert [r["gib"] for r in rows] == [2.0, 16.0, 1.25, 10.0, 0.5, 0.5]
    assert [r["gib_without_sharing"] for r in rows] == [2.0, 16.0, 10.0, 80.0, 2.0, 2.0]
    assert [r["stored_tokens"] for r in rows] == [4096, 32768, 4096, 32768, 4096, 4096]
    lines = format_kv_table(rows).splitlines()
    assert lines[0].split() == ["模型", "位置数", "缓存里存的位置数", "KV", "缓存", "GiB", "不共用键值头时", "GiB"]
    assert len(lines) == 1 + 6
    assert lines[4].split() == ["Llama-2-70B", "32768", "32768", "10.00", "80.00"]
    assert lines[6].split() == ["Mistral-7B", "32768", "4096", "0.50", "2.00"]


def test_print_kv_table_prints_and_returns(capsys):
    rows = kv_memory.print_kv_table(tokens=(4096,))
    out = capsys.readouterr().out.splitlines()
    assert len(rows) == 3 and len(out) == 1 + 3 and out[1].split()[3] == "2.00"


def test_custom_config_and_bad_input():
    mqa = ModelConfig("toy-mqa", 2, 4, 1, 64, 128, sliding_window=8)
    assert kv_cache_bytes(mqa, 5) == 2 * 2 * 1 * 16 * 5 * 2
    assert kv_cache_bytes(mqa, 100) == 2 * 2 * 1 * 16 * 8 * 2
    with pytest.raises(ValueError, match=r"tokens must be a positive int, got 0"):
        kv_cache_bytes(mqa, 0)
    with pytest.raises(TypeError, match=r"config must be a ModelConfig, got str; take one from attn_lib.costs.kv_memory"):
        kv_cache_bytes("Mistral-7B", 4096)
    with pytest.raises(ValueError, match=r"bytes_per_value must be a positive int"):
        kv_cache_bytes(mqa, 4, bytes_per_value=0)


def test_window_size_counts_the_current_position():
    """A config's sliding_window = W is W positions in all, the current one included: flash-attn's
    window_size=(W - 1, 0) (Hugging Face transformers' mask, Mistral's reference code)."""
    import attn_lib

    assert CONFIGS["Mistral-7B"].window_size == (4095, 0)
    assert CONFIGS["Llama-2-7B"].window_size is None and CONFIGS["Llama-2-70B"].window_size is None
    toy = ModelConfig("toy", 2, 4, 1, 64, 128, sliding_window=4)
    band = attn_lib.sliding_window_mask(10, window_size=toy.window_size, is_causal=True)  # (10,10)
    assert band.sum(dim=1).tolist() == [1, 2, 3, 4, 4, 4, 4, 4, 4, 4]  # at most W = 4 keys, itself among them
    assert kv_cache_bytes(toy, 100) == 2 * 2 * 1 * 16 * 4 * 2  # the W slots: the current token and W - 1 before it
