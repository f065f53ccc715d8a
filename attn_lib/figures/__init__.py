"""全书共用（第 1–13 章）：图、用代码画的示意图、中文字体和纯文本表格。

- ``plotting``: heatmaps and bar charts in the book's style; ``flash_steps``: the tiling figure;
- ``diagrams``, ``diagrams_heads``, ``diagrams_decode``: diagrams drawn by code;
- ``fonts``: the CJK font (the system's, else the subset in ``attn_lib/data/fonts``);
- ``text_table``: the plain-text tables chapters print.
"""
