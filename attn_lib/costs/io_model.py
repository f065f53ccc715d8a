"""第 8、9、12 章（FlashAttention 之二，访存模型）：数一数标准注意力和分块注意力各要读写多少次慢速显存（HBM），单位是「元素个数」。

Counts follow the FlashAttention paper (Dao et al. 2022, arXiv 2205.14135) for one head
(one (b, h) pair) with N queries, N keys and head dim d; M is the size of the fast on-chip
memory (SRAM) in elements:

- ``standard_attention_io``: the paper's Algorithm 0. S = Q Kᵀ and P = softmax(S) are
  written to HBM and read back: Θ(Nd + N²) accesses (Theorem 2).
- ``flash_attention_io``: the paper's Algorithm 1, loop by loop, with its block sizes
  ``Bc = ceil(M / 4d)`` and ``Br = min(Bc, d)``. K and V blocks are the outer loop; each
  inner step loads and stores a block of O and of the statistics ℓ, m: Θ(N²d²/M) accesses.
- ``tiled_attention_io``: the loop order of ``attn_lib.flash.tiled_forward`` and of the Triton
  kernel (FlashAttention-2 and the Triton tutorial swap the loops): a block of queries
  stays on chip with its ``m_i``, ``l_i``, ``acc`` while K and V stream past; Q is read
  once, O and the log-sum-exp written once, K and V read once per query block. With
  ``tiled_block_sizes(d, M)`` this is Θ(N²d²/M) as well. ``flash_attention_torch(...,
  counter=IOCounter())`` tallies the same counts while it computes (tests check equality).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..checks import check_counts, check_positive_int


@dataclass
class IOCounter:
    """记账本：分块实现每从慢速显存读（load）或写（store）一块，就记下元素个数。"""

    reads: dict = field(default_factory=dict)
    writes: dict = field(default_factory=dict)

    def load(self, name: str, n: int) -> None:
        """记一次读：``name`` 是哪个张量（Q、K、V、mask），``n`` 是元素个数。"""
        self.reads[name] = self.reads.get(name, 0) + int(n)

    def store(self, name: str, n: int) -> None:
        """记一次写：``name`` 是哪个张量（O、lse），``n`` 是元素个数。"""
        self.writes[name] = self.writes.get(name, 0) + int(n)

    @property
    def total_reads(self) -> int:
        """读的元素总数（所有张量加起来）。"""
        return sum(self.reads.values())

    @property
    def total_writes(self) -> int:
        """写的元素总数（所有张量加起来）。"""
        return sum(self.writes.values())

    @property
    def total(self) -> int:
        """读加写的元素总数。"""
        return self.total_reads + self.total_writes


def _result(reads: dict, writes: dict) -> dict:
    r, w = sum(reads.values()), sum(writes.values())
    return {"reads": r, "writes": w, "total": r + w, "by_tensor_reads": reads, "by_tensor_writes": writes}


def standard_attention_io(N: int, d: int) -> dict:
    """标准注意力（论文 Algorithm 0）对慢速显存的读写次数，单位：元素。

    1. read Q, K (Nd each), write S = QKᵀ (N²);
    2. read S, write P = softmax(S) (N² each);
    3. read P (N²) and V (Nd), write O (Nd).

    Args:
        N: sequence length (queries = keys).
        d: head dim.

    Returns:
        dict with ``reads``, ``writes``, ``total`` and the per-tensor breakdowns.
    """
    check_positive_int("N", N)
    check_positive_int("d", d)
    reads = {"Q": N * d, "K": N * d, "S": N * N, "P": N * N, "V": N * d}
    writes = {"S": N * N, "P": N * N, "O": N * d}
    return _result(reads, writes)


def block_sizes(d: int, M: int) -> tuple[int, int]:
    """论文 Algorithm 1 的块大小：Bc = ceil(M / 4d)，Br = min(Bc, d)。返回 (Br, Bc)。

    Args:
        d: head dim.
        M: on-chip memory in elements (the paper assumes d <= M).
    """
    check_positive_int("d", d)
    check_positive_int("M", M)
    if M < d:
        raise ValueError(f"on-chip memory M={M} must hold at least one row of d={d} elements (paper: d <= M <= Nd)")
    bc = math.ceil(M / (4 * d))
    return min(bc, d), bc


def flash_attention_io(N: int, d: int, M: int) -> dict:
    """FlashAttention（论文 Algorithm 1）对慢速显存的读写次数，单位：元素。

    Step 2 writes the initial O (Nd), ℓ and m (N each). The outer loop over Tc = ceil(N/Bc)
    key blocks loads K_j, V_j once each (2Nd in all); for every key block the inner loop over
    all query blocks loads Q_i, O_i, ℓ_i, m_i and stores O_i, ℓ_i, m_i (steps 8 and 12-13).

    Args:
        N: sequence length.
        d: head dim.
        M: on-chip memory in elements.

    Returns:
        dict with ``reads``, ``writes``, ``total``, the breakdowns and the block sizes
        ``Br``, ``Bc``, ``Tr``, ``Tc``.
    """
    check_positive_int("N", N)
    br, bc = block_sizes(d, M)
    tc, tr = math.ceil(N / bc), math.ceil(N / br)
    reads = {"K": N * d, "V": N * d, "Q": tc * N * d, "O": tc * N * d, "l": tc * N, "m": tc * N}
    writes = {"O": N * d + tc * N * d, "l": N + tc * N, "m": N + tc * N}
    out = _result(reads, writes)
    out.update(Br=br, Bc=bc, Tr=tr, Tc=tc)
    return out


def tiled_block_sizes(d: int, M: int) -> tuple[int, int]:
    """本书分块实现（查询块在外层）按片上内存 M 选块：BLOCK_M = ceil(M / 4d)，BLOCK_N = min(BLOCK_M, d)。

    The roles of the paper's Br and Bc swap with the loops: Q_i and acc (BLOCK_M x d each)
    take half of M, K_j and V_j (BLOCK_N x d) at most half, the score tile BLOCK_M x BLOCK_N
    at most a quarter. Returns ``(block_m, block_n)``.
    """
    br, bc = block_sizes(d, M)
    return bc, br


def tiled_attention_io(L: int, S: int, d: int, block_m: int, block_n: int, *, is_causal: bool = False,
                       dv: int | None = None, key_mask: bool = False) -> dict:
    """本书分块实现（查询块在外层，与 Triton 核函数同一顺序）对慢速显存的读写次数，单位：元素。

    For each query block ``[m0, m1)``: load Q_i once; stream the key blocks that some query
    of the block may see (all S keys, or the first ``min(S, m1)`` when ``is_causal``, top-left
    aligned), loading K_j, V_j (and the key-padding flags); store O_i and the log-sum-exp.
    ``block_n`` does not change the count (every visible key is loaded exactly once per query
    block); it is taken for symmetry with the implementation.

    Args:
        L, S: numbers of queries and keys.
        d: head dim of q and k; ``dv``: of v (default ``d``).
        block_m, block_n: block sizes.
        is_causal: only keys ``<= query index`` are visible.
        key_mask: whether a (B, S) key mask is read as well (the tiled paths' ``key_mask``).

    Returns:
        dict with ``reads``, ``writes``, ``total``, the breakdowns and ``n_query_blocks``.
    """
    for name, value in (("block_m", block_m), ("block_n", block_n), ("d", d)):
        check_positive_int(name, value)
    check_counts(L=L, S=S)
    dv = d if dv is None else check_positive_int("dv", dv)
    kv_keys = 0  # keys loaded, summed over query blocks
    n_blocks = 0
    for m0 in range(0, L, block_m):
        m1 = min(m0 + block_m, L)
        kv_keys += min(S, m1) if is_causal else S
        n_blocks += 1
    reads = {"Q": L * d, "K": kv_keys * d, "V": kv_keys * dv}
    if key_mask:
        reads["mask"] = kv_keys
    writes = {"O": L * dv, "lse": L}
    out = _result(reads, writes)
    out["n_query_blocks"] = n_blocks
    return out


def largest_tensor(fn, *args, **kwargs):
    """运行 fn(*args, **kwargs)，返回（结果，运行中新建的最大张量的元素个数）。

    Every aten operation's output is inspected (``torch.utils._python_dispatch``), so the
    count does not depend on the allocator, the device or the thread count: naive attention
    shows its (B, H, L, S) score matrix, the tiled path only its tiles and O(L·D) buffers.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Spy(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.largest = max(self.largest, t.numel())
            return out

    with _Spy() as spy:
        result = fn(*args, **kwargs)
    return result, spy.largest


def score_matrix_bytes(B: int, H: int, L: int, S: int, bytes_per_element: int = 4) -> int:
    """朴素注意力要存下的评分矩阵 (B, H, L, S) 占多少字节（训练时随长度平方增长）。

    Args:
        B, H, L, S: batch, heads, queries, keys (ints >= 0).
        bytes_per_element: 4 for float32, 2 for float16 / bfloat16.

    Returns:
        ``B * H * L * S * bytes_per_element`` (int).
    """
    check_counts(B=B, H=H, L=L, S=S, bytes_per_element=bytes_per_element)
    return B * H * L * S * bytes_per_element


def kv_cache_bytes(num_layers: int, B: int, H: int, S: int, D: int, bytes_per_element: int = 2) -> int:
    """生成时键值缓存占多少字节：每层存 K 和 V 各 (B, H, S, D)，随长度线性增长。

    Args:
        num_layers: number of layers.
        B, H, S, D: batch, heads, cached length, head dim (ints >= 0).
        bytes_per_element: 2 for float16 / bfloat16, 4 for float32.

    Returns:
        ``2 * num_layers * B * H * S * D * bytes_per_element`` (int).
    """
    check_counts(num_layers=num_layers, B=B, H=H, S=S, D=D, bytes_per_element=bytes_per_element)
    return 2 * num_layers * B * H * S * D * bytes_per_element


__all__ = [
    "IOCounter",
    "standard_attention_io",
    "block_sizes",
    "flash_attention_io",
    "tiled_block_sizes",
    "tiled_attention_io",
    "largest_tensor",
    "score_matrix_bytes",
    "kv_cache_bytes",
]
