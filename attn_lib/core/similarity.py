"""第 1–3 章（点积，第 2 章讲它）：「有多像」怎么算：点积（一对、一个查询对全部键、全部查询对全部键）和欧氏距离。

All functions accept numpy arrays or torch tensors (they only use ``*``, ``@`` and ``sum``).
"""
from __future__ import annotations

from typing import Any


def _check_arrays(what: str, **arrays: Any) -> None:
    for name, x in arrays.items():
        if not hasattr(x, "ndim") or not hasattr(x, "shape"):
            raise TypeError(
                f"{what}: {name} must be a numpy array or torch tensor, got {type(x).__name__}; "
                "wrap it with np.asarray(...) or torch.tensor(...)"
            )


def _check_last_dim(a: Any, b: Any, what: str) -> None:
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(
            f"{what}: vectors must have the same length D, got {a.shape[-1]} and {b.shape[-1]}"
        )


def dot(a: Any, b: Any) -> Any:
    """两个向量的点积：对应位置相乘，再全部加起来。

    Args:
        a: vector of shape (D,).
        b: vector of shape (D,).

    Returns:
        A scalar.
    """
    _check_arrays("dot", a=a, b=b)
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError(f"dot expects two 1-D vectors, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    _check_last_dim(a, b, "dot")
    return (a * b).sum()  # (D,) * (D,) -> (D,) -> ()


def dot_query_keys(q: Any, K: Any) -> Any:
    """一个查询对全部键的点积，一次矩阵乘法：q · Kᵀ。

    Args:
        q: query vector of shape (D,).
        K: keys stacked as rows, shape (S, D).

    Returns:
        Scores of shape (S,).
    """
    _check_arrays("dot_query_keys", q=q, K=K)
    if q.ndim != 1 or K.ndim != 2:
        raise ValueError(f"expects q of shape (D,) and K of shape (S, D), got {tuple(q.shape)} and {tuple(K.shape)}")
    _check_last_dim(q, K, "dot_query_keys")
    return K @ q  # (S,D) @ (D,) -> (S,)


def dot_all(Q: Any, K: Any) -> Any:
    """全部查询对全部键的点积：Q · Kᵀ，第 i 行第 j 列 = 第 i 个查询 · 第 j 个键。

    Args:
        Q: queries stacked as rows, shape (L, D).
        K: keys stacked as rows, shape (S, D).

    Returns:
        Scores of shape (L, S).
    """
    _check_arrays("dot_all", Q=Q, K=K)
    if Q.ndim != 2 or K.ndim != 2:
        raise ValueError(f"expects Q (L, D) and K (S, D), got {tuple(Q.shape)} and {tuple(K.shape)}")
    _check_last_dim(Q, K, "dot_all")
    return Q @ K.T  # (L,D) @ (D,S) -> (L,S)


def euclidean_distance(Q: Any, K: Any) -> Any:
    """欧氏距离：先相减，再平方、求和、开根。Q (L, D) 与 K (S, D) 两两之间，得到 (L, S)。

    Args:
        Q: shape (L, D) or (D,).
        K: shape (S, D) or (D,).

    Returns:
        Distances of shape (L, S) (or squeezed where an input was 1-D). Smaller = more alike,
        the opposite direction from the dot product.
    """
    _check_arrays("euclidean_distance", Q=Q, K=K)
    if Q.ndim not in (1, 2) or K.ndim not in (1, 2):
        raise ValueError(
            f"euclidean_distance expects Q (L, D) or (D,) and K (S, D) or (D,), "
            f"got {tuple(Q.shape)} and {tuple(K.shape)}"
        )
    _check_last_dim(Q, K, "euclidean_distance")
    q2 = Q[None, :] if Q.ndim == 1 else Q  # (D,) -> (1,D)
    k2 = K[None, :] if K.ndim == 1 else K  # (D,) -> (1,D)
    diff = q2[:, None, :] - k2[None, :, :]  # (L,1,D) - (1,S,D) -> (L,S,D)
    dist = (diff * diff).sum(-1) ** 0.5  # (L,S,D) -> (L,S)
    if Q.ndim == 1:
        dist = dist[0]  # (1,S) -> (S,)
    if K.ndim == 1:
        dist = dist[..., 0]  # (...,1) -> (...)
    return dist
