"""第 12 章（分组查询注意力与滑动窗口）：真实模型的 KV 缓存有多大，按公开的配置值计算。

A decoder stores, for every layer, the keys and the values of every cached position, for each
key/value head. In bytes::

    bytes = 2 (K and V) * layers * kv_heads * head_dim * stored_tokens * bytes_per_value * batch

with ``bytes_per_value = 2`` for bf16 / fp16. Sharing key/value heads (GQA, MQA) shrinks
``kv_heads``; a sliding window with a rolling buffer (Mistral) caps ``stored_tokens`` at the
window: ``stored_tokens = min(tokens, window)``.

The window's convention: a config's ``sliding_window = W`` (Mistral, Hugging Face transformers)
counts every position of the window, the current one included: position i sees keys
i - W + 1 .. i, W keys, which is flash-attn's ``window_size=(W - 1, 0)`` (``ModelConfig.window_size``),
not ``(W, 0)``. The rolling buffer has W slots and the current token's key and value are written
into it before the token attends, so while generating position t the W slots hold the token
itself and the W - 1 before it. Sources of the convention:

- Mistral's reference code, mistralai/mistral-inference ``mistral/cache.py``
  (``RotatingBufferCache``; ``BufferCache`` in the later ``src/mistral_inference/cache.py``): the
  prefill mask is xformers'
  ``BlockDiagonalCausalMask.make_local_attention(sliding_window)`` (xformers documents
  ``BlockDiagonalCausalLocalAttentionMask``: "The ith query in a block only attends to keys in its
  block with index greater than i - window_size and less than or equal to i"), and a decode step
  attends over ``(cached + new).clamp(max=sliding_window)`` keys, its own included;
- Hugging Face transformers: its eager mask with ``sliding_window=2048`` lets each query see at
  most 2048 keys (huggingface/transformers#29623). The same issue reports that its
  FlashAttention-2 path disagreed, one key more: it passed ``window_size=(sliding_window,
  sliding_window)``; reported again in huggingface/transformers#39408 and fixed by
  huggingface/transformers#40163 (August 2025). Earlier, Timothée Lacroix (Mistral) suggested
  in a comment on huggingface/transformers#26464: "params are window_size_left =
  config.sliding_window-1 // window_size_right = -1 I believe ?".

The paper (Jiang et al., "Mistral 7B", arXiv:2310.06825, section 2) says a hidden state at
position i attends to positions "between i − W and i", and counts the receptive field of k
layers as k × W (32 × 4096, "approximately 131K"); the book reads that window as the code
does, W positions with i among them, so k layers reach back k × (W − 1) positions.

The configuration values are those published with the models (Hugging Face ``config.json``;
``head_dim = hidden_size / num_attention_heads`` as the models compute it):

- Llama-2-7B, ``meta-llama/Llama-2-7b-hf``: ``num_hidden_layers`` 32, ``num_attention_heads`` 32,
  ``num_key_value_heads`` 32 (no sharing), ``hidden_size`` 4096 (head dim 128),
  ``max_position_embeddings`` 4096. The official repository is gated; read from the public copy
  https://huggingface.co/philschmid/Llama-2-7b-hf/blob/7efb34fb74d8cf47c51ed88bf49662c0494049fc/config.json
  (``"_name_or_path": "meta-llama/Llama-2-7b-hf"``).
- Llama-2-70B, ``meta-llama/Llama-2-70b-hf``: 80 layers, 64 query heads, 8 key/value heads,
  ``hidden_size`` 8192 (head dim 128), ``max_position_embeddings`` 4096; read from
  https://huggingface.co/TheBloke/Llama-2-70B-fp16/blob/refs%2Fpr%2F6/config.json
  (``"_name_or_path": "meta-llama/Llama-2-70b-hf"``). GQA with 8 groups: Touvron et al.,
  "Llama 2: Open Foundation and Fine-Tuned Chat Models" (arXiv:2307.09288), section 2.2.
- Mistral-7B, ``mistralai/Mistral-7B-v0.1``: 32 layers, 32 query heads, 8 key/value heads,
  ``hidden_size`` 4096 (head dim 128), ``sliding_window`` 4096, ``max_position_embeddings`` 32768;
  read from copies that name it as their base, e.g.
  https://huggingface.co/Open-Orca/Mistral-7B-OpenOrca/blob/refs%2Fpr%2F19/config.json, and
  Mistral's own ``params.json`` (``"head_dim": 128``, ``"sliding_window": 4096``) in
  https://huggingface.co/mlx-community/mistral-7B-v0.1/blob/refs%2Fpr%2F5/params.json. The
  rolling buffer of W = 4096 slots: Jiang et al., "Mistral 7B" (arXiv:2310.06825), section 2.

Llama 2 was trained with 4096 positions: its 32k rows are the formula carried past the
model's context, to show how the cache grows, not a setting the model supports.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import check_positive_int
from ..figures.text_table import text_table

GIB = 2**30
BF16_BYTES = 2  # bytes per value in bf16 / fp16
TABLE_TOKENS = (4096, 32768)  # the lengths of the chapter's table (4k and 32k)


@dataclass(frozen=True)
class ModelConfig:
    """一个模型和 KV 缓存有关的配置值（来自它公开的 config.json）。

    Attributes:
        name: the model's name.
        num_layers: ``num_hidden_layers``.
        num_heads: ``num_attention_heads`` (query heads).
        num_kv_heads: ``num_key_value_heads`` (key/value heads; = num_heads without sharing).
        hidden_size: ``hidden_size`` (= num_heads * head_dim).
        max_positions: ``max_position_embeddings``.
        sliding_window: ``sliding_window`` W, None without one: the window's length counting the
            current position (keys i - W + 1 .. i) and the rolling buffer's number of slots.
        source: where the values were read.
    """

    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    hidden_size: int
    max_positions: int
    sliding_window: int | None = None
    source: str = ""

    @property
    def head_dim(self) -> int:
        """每个头的维度：hidden_size / num_heads。"""
        return self.hidden_size // self.num_heads

    @property
    def group_size(self) -> int:
        """几个查询头共用一个键值头：num_heads / num_kv_heads。"""
        return self.num_heads // self.num_kv_heads

    @property
    def window_size(self) -> tuple[int, int] | None:
        """配置里的 sliding_window = W 换成 flash-attn 的写法：(W - 1, 0)（窗口一共 W 个位置，含当前位置）；没有窗口时是 None。"""
        return None if self.sliding_window is None else (self.sliding_window - 1, 0)


CONFIGS = {
    "Llama-2-7B": ModelConfig("Llama-2-7B", 32, 32, 32, 4096, 4096, None,
                              "meta-llama/Llama-2-7b-hf config.json"),
    "Llama-2-70B": ModelConfig("Llama-2-70B", 80, 64, 8, 8192, 4096, None,
                               "meta-llama/Llama-2-70b-hf config.json"),
    "Mistral-7B": ModelConfig("Mistral-7B", 32, 32, 8, 4096, 32768, 4096,
                              "mistralai/Mistral-7B-v0.1 config.json"),
}


def _check_config(config) -> ModelConfig:
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}; "
                        f"take one from attn_lib.costs.kv_memory.CONFIGS, e.g. CONFIGS['Mistral-7B']")
    return config


def stored_tokens(config: ModelConfig, tokens: int) -> int:
    """缓存里实际存几个位置：没有窗口时是 tokens；有滚动缓存时最多 sliding_window 个（W 格里含正在生成的这个位置）。"""
    config = _check_config(config)
    tokens = check_positive_int("tokens", tokens)
    return tokens if config.sliding_window is None else min(tokens, config.sliding_window)


def kv_cache_bytes(config: ModelConfig, tokens: int, *, bytes_per_value: int = BF16_BYTES, batch: int = 1,
                   share_kv: bool = True) -> int:
    """一个模型生成到第 tokens 个位置时，整个 KV 缓存占多少字节。

    Args:
        config: the model's configuration values (a ``ModelConfig``, e.g. ``CONFIGS["Mistral-7B"]``).
        tokens: positions generated so far (prompt included), a positive int.
        bytes_per_value: 2 for bf16 / fp16, 4 for fp32.
        batch: sequences decoded together.
        share_kv: False counts one key/value head per query head (the same model without GQA).

    Returns:
        ``2 * layers * kv_heads * head_dim * stored_tokens * bytes_per_value * batch`` (int).
    """
    config = _check_config(config)
    bytes_per_value = check_positive_int("bytes_per_value", bytes_per_value)
    batch = check_positive_int("batch", batch)
    kv_heads = config.num_kv_heads if share_kv else config.num_heads
    return 2 * config.num_layers * kv_heads * config.head_dim * stored_tokens(config, tokens) * bytes_per_value * batch


def kv_memory_table(tokens=TABLE_TOKENS, *, bytes_per_value: int = BF16_BYTES, configs=None) -> list[dict]:
    """KV 缓存表：每个模型、每个长度一行，给出实际的字节数和不共用键值头时的字节数。

    Args:
        tokens: the lengths (default 4k and 32k).
        bytes_per_value: 2 for bf16.
        configs: the models (default ``CONFIGS``, all three).

    Returns:
        A list of dicts with ``model``, ``tokens``, ``stored_tokens``, ``bytes``, ``gib``,
        ``bytes_without_sharing`` and ``gib_without_sharing``.
    """
    rows = []
    for config in (CONFIGS.values() if configs is None else configs):
        for n in tokens:
            actual = kv_cache_bytes(config, n, bytes_per_value=bytes_per_value)
            plain = kv_cache_bytes(config, n, bytes_per_value=bytes_per_value, share_kv=False)
            rows.append({"model": config.name, "tokens": int(n), "stored_tokens": stored_tokens(config, n),
                         "bytes": actual, "gib": actual / GIB,
                         "bytes_without_sharing": plain, "gib_without_sharing": plain / GIB})
    return rows


def format_kv_table(rows: list[dict]) -> str:
    """把 ``kv_memory_table`` 的结果排成一张文字表（中文表头，GiB 保留两位小数）。"""
    return text_table(["模型", "位置数", "缓存里存的位置数", "KV 缓存 GiB", "不共用键值头时 GiB"],
                      [[r["model"], str(r["tokens"]), str(r["stored_tokens"]), f"{r['gib']:.2f}",
                        f"{r['gib_without_sharing']:.2f}"] for r in rows])


def print_kv_table(tokens=TABLE_TOKENS, *, bytes_per_value: int = BF16_BYTES) -> list[dict]:
    """打印 4k 和 32k 个位置（bf16）时三个模型的 KV 缓存表，并返回表的各行。"""
    rows = kv_memory_table(tokens, bytes_per_value=bytes_per_value)
    print(format_kv_table(rows))
    return rows
