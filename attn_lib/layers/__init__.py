"""第 5–7、10–13 章（层）：自注意力、多头注意力、位置编码、KV 缓存，以及层选择注意力路径的分派。

- ``self_attention``, ``multihead`` and ``multihead_looped``: the layers;
- ``positions``: sinusoidal positions and RoPE; ``kv_cache``: the KV cache;
- ``dispatch``: which attention path a layer's call takes (reference, SDPA, tiled,
  Triton, the split-KV decode step).
"""
