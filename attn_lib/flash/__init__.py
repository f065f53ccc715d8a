"""第 8、9、12、13 章（快路径）：分块 FlashAttention 的前向与反向（纯 torch）、Triton 核函数、朴素对照组、一步解码。

- ``tiled_forward`` (08) and ``tiled_backward`` (09): the tiled torch paths, any device, float64 too;
- ``autograd`` (08, 09): ``flash_attention``, the differentiable entry on both backends;
- ``naive`` (08, 09): the baseline that stores the whole score matrix;
- ``decoding`` (13): ``flash_decoding``, the split-KV decode step;
- ``triton/`` (08, 09, 13): the Triton kernels, imported only when a Triton path runs.
"""
