"""第 10–13 章（书里训练的两个小模型）：「它」指代的数据与一层两头的小模型、多种子实验；小语言模型、它的语料与逐字生成。

- ``it_data``, ``tiny_model``, ``seed_study``;
- ``lm_data``, ``tiny_lm``, ``generation``.
"""
