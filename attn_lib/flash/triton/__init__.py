"""第 8、9、13 章（Triton 核函数）：前向、反向、一步解码的核函数，每个文件连同它的启动器和网格；导入本包不导入 Triton。

- ``entry``: ``flash_attention_triton`` and ``flash_attention_triton_backward`` (their doors) and
  the rule that imports the kernels lazily, after ``attn_lib.device`` fixed the Triton mode;
- ``configs``: tile sizes and shared-memory estimates (pure Python);
- ``forward``, ``backward``, ``decode``: kernels, launcher and grid, read top to bottom.
"""
