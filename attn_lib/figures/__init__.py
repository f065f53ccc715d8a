"""全书共用（第 1–13 章）：图、用代码画的示意图、中文字体和纯文本表格。

- ``plotting``: heatmaps and bar charts in the book's style; ``flash_steps`` (08): the tiling figure;
- ``diagrams`` (05, 06), ``diagrams_heads`` (07, 09, 10), ``diagrams_decode`` (13): diagrams drawn by code;
- ``fonts``: the CJK font (the system's, else the subset in ``attn_lib/data/fonts``);
- ``text_table``: the plain-text tables chapters print.
"""
