"""第 1–13 章（注意力的数学）：字典类比、点积、Softmax、缩放、参考实现、掩码、在线 Softmax。

- ``lookup``, ``similarity``, ``softmax``, ``numpy_ref``, ``proportions``,
  ``scaling``, ``worked_example``;
- ``reference``: the reference implementation every other path is tested against;
- ``masks``: causal, sliding-window and padding masks;
- ``online``: the online softmax that FlashAttention is built on.
"""
