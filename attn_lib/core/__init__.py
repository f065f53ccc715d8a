"""第 1–13 章（注意力的数学）：字典类比、点积、Softmax、缩放、参考实现、掩码、在线 Softmax。

- ``lookup`` (01), ``similarity`` (02), ``softmax``, ``numpy_ref``, ``proportions`` (03),
  ``scaling`` (04), ``worked_example`` (every chapter: the vectors of the worked example);
- ``reference`` (05 on): the reference implementation every other path is tested against;
- ``masks`` (06, 12): causal, sliding-window and padding masks;
- ``online`` (08): the online softmax that FlashAttention is built on.
"""
