"""第 5–7、10、12、13 章（层）：自注意力、多头注意力、位置编码、KV 缓存，以及层选择注意力路径的分派。

- ``self_attention`` (05), ``multihead`` and ``multihead_looped`` (07, 12): the layers;
- ``positions`` (10): sinusoidal positions and RoPE; ``kv_cache`` (10, 12, 13): the KV cache;
- ``dispatch`` (13): which attention path a layer's call takes (reference, SDPA, tiled,
  Triton, the split-KV decode step).
"""
