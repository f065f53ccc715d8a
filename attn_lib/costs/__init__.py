"""第 8、9、12、13 章（代价模型）：读写显存的次数、KV 缓存的字节数、一次解码步的浮点运算与字节数。

- ``io_model``: the IO counts of standard and tiled attention;
- ``kv_memory``: KV-cache bytes from published configurations;
- ``decode_cost``: a decode step's FLOPs and bytes against GPU datasheets.
"""
