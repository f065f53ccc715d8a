"""第 3–13 章共用的约定（书中不单独讲）：每条注意力路径都遵守的名字、数值规则、「对角线带」和一次调用的设置。

The leaf of the package: nothing here imports another part of attn_lib, so the check package
(``attn_lib.checks``) and every path can import it.

- ``names``: the names and limits shared by checks and paths (``BACKENDS``, ``MAX_HEAD_DIM`` ...);
- ``numerics``: working dtype, default scale, base-2 factors, the overflow rule and message, dot precision;
- ``band``: the causal rule and the sliding window as one band of diagonals;
- ``settings``: the frozen settings object a door returns and every core takes.
"""
