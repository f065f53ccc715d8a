"""第 8、9、12、13 章（快路径）：分块 FlashAttention 的前向与反向（纯 torch）、Triton 核函数、朴素对照组、一步解码。

- ``tiled_forward`` and ``tiled_backward``: the tiled torch paths, any device, float64 too;
- ``autograd``: ``flash_attention``, the differentiable entry on both backends;
- ``naive``: the baseline that stores the whole score matrix;
- ``decoding``: ``flash_decoding``, the split-KV decode step;
- ``triton/``: the Triton kernels, imported only when a Triton path runs.
"""
