"""第 3–9 章共用（书中不单独讲）：形状、精度、设备的检查——q、k、v 的 (B, H, L, D)，掩码能否广播。"""
from __future__ import annotations

from typing import Any, Sequence


def _shape(x: Any) -> tuple:
    return tuple(int(s) for s in x.shape)


def check_rank(name: str, x: Any, rank: int, layout: str) -> None:
    """检查张量的维数：``x`` 必须正好是 ``rank`` 维，否则报 ValueError（并提示怎么补轴）。

    Args:
        name: the argument's name for the message, e.g. ``"q"``.
        x: a torch tensor or numpy array.
        rank: the required number of axes.
        layout: the expected layout for the message, e.g. ``"(B, H, L, D)"``.
    """
    if x.ndim != rank:
        hint = ""
        if rank == 4 and x.ndim == 2:
            hint = f" For one sequence of one head, add the batch and head axes: {name}[None, None]."
        elif rank == 4 and x.ndim == 3:
            hint = f" For a single head, add the head axis: {name}.unsqueeze(1)."
        elif rank == 3 and x.ndim == 2:
            hint = f" For one sequence, add the batch axis: {name}.unsqueeze(0)."
        raise ValueError(
            f"{name} must be {rank}-D {layout}, got {x.ndim}-D with shape {_shape(x)}.{hint}"
        )


def check_qkv_shapes(q: Any, k: Any, v: Any, *, enable_gqa: bool = False, gqa_keyword: bool = True,
                     names: tuple = ("q", "k", "v")) -> tuple[int, int, int, int, int, int]:
    """检查 q (B,H,L,D)、k (B,H_kv,S,D)、v (B,H_kv,S,Dv) 的形状是否相容，返回 (B, H, L, S, D, Dv)。

    Args:
        q: (B, H, L, D); k: (B, H_kv, S, D); v: (B, H_kv, S, Dv) (torch tensors or numpy arrays).
        enable_gqa: True lets k, v have H_kv heads with H % H_kv == 0 (grouped-query
            attention); False (the default) needs H_kv = H (already checked to be a bool).
        gqa_keyword: False when the caller has no ``enable_gqa`` keyword (the remedy then
            names ``attn_lib.attention``).
        names: the three arguments' names for the messages (``flash_decoding``: q, k_cache, v_cache).

    Returns:
        ``(B, H, L, S, D, Dv)`` as ints (H: q's heads).
    """
    qn, kn, vn = names
    check_rank(qn, q, 4, "(B, H, L, D)")
    check_rank(kn, k, 4, "(B, H, S, D)")
    check_rank(vn, v, 4, "(B, H, S, Dv)")
    B, H, L, D = _shape(q)
    Bk, Hk, S, Dk = _shape(k)
    Bv, Hv, Sv, Dv = _shape(v)
    if Bk != B or Bv != B or Hv != Hk:
        raise ValueError(
            f"{qn}, {kn} and {vn} must share batch and head sizes (B, H): "
            f"{qn} has {(B, H)}, {kn} has {(Bk, Hk)}, {vn} has {(Bv, Hv)}."
        )
    _check_kv_heads(H, Hk, enable_gqa if gqa_keyword else None, kn)
    if Dk != D:
        raise ValueError(
            f"{qn} and {kn} must have the same head dim D (last axis): {qn} has D={D}, {kn} has D={Dk}. "
            "Every query is compared with every key by a dot product, so their lengths must match."
        )
    if Sv != S:
        raise ValueError(
            f"{kn} and {vn} must have the same number of keys S (axis 2): {kn} has S={S}, {vn} has S={Sv}. "
            "Each key needs exactly one value."
        )
    if D == 0:
        raise ValueError(f"{qn} and {kn} have head dim D=0; attention needs D >= 1.")
    return B, H, L, S, D, Dv


def _check_kv_heads(H: int, Hk: int, enable_gqa, kn: str = "k") -> None:
    """GQA 的头数规则：H_kv 必须整除 H；H_kv != H 还要 enable_gqa=True。"""
    if Hk == H:
        return
    if Hk == 0 or H < Hk or H % Hk:
        divisors = [d for d in range(1, H + 1) if H % d == 0] or [1]
        raise ValueError(
            f"{kn} must have a number of heads H_kv that divides q's H={H} (query head h uses key/value head "
            f"h // (H // H_kv)), got H_kv={Hk}; use one of {divisors} key/value heads"
        )
    if enable_gqa is None:
        raise ValueError(f"{kn} must have H={H} heads like q, got H_kv={Hk}; this function has no enable_gqa: "
                         "use attn_lib.attention(q, k, v, enable_gqa=True) for grouped-query attention")
    if not enable_gqa:
        raise ValueError(f"{kn} must have H={H} heads like q, got H_kv={Hk}; pass enable_gqa=True to share each "
                         f"key/value head among H // H_kv = {H // Hk} query heads (grouped-query attention)")


def check_same_dtype(names: Sequence[str], dtypes: Sequence[Any]) -> None:
    """检查几个输入的精度是否相同，不同就报 TypeError。

    Args:
        names: the arguments' names, e.g. ``("q", "k", "v")``.
        dtypes: their dtypes (torch or numpy), in the same order.
    """
    if len(set(map(str, dtypes))) > 1:
        found = ", ".join(f"{n}={d}" for n, d in zip(names, dtypes))
        raise TypeError(
            f"{', '.join(names)} must have the same dtype, got {found}. "
            f"Cast them first, e.g. k = k.to({names[0]}.dtype)."
        )


def check_mask_shape(mask: Any, target: tuple) -> None:
    """检查掩码形状：必须能广播到评分矩阵的形状 (B, H, L, S)，且不能把它变大，否则报 ValueError。

    Args:
        mask: torch tensor or numpy array, e.g. (L, S), (B, 1, 1, S) or (B, H, L, S).
        target: the scores' shape ``(B, H, L, S)``.
    """
    shape = _shape(mask)
    if len(shape) > len(target):
        raise ValueError(
            f"mask has shape {shape} ({len(shape)}-D), more axes than the scores (B, H, L, S) = {target}."
        )
    padded = (1,) * (len(target) - len(shape)) + shape
    for m, t in zip(padded, target):
        if m != t and m != 1:
            raise ValueError(
                f"mask has shape {shape}, which does not broadcast to the scores' shape "
                f"(B, H, L, S) = {target}. Each mask axis must equal the scores' axis or be 1; "
                "e.g. (L, S), (B, 1, 1, S) for key padding, or (B, H, L, S)."
            )


def check_same_device(names: Sequence[str], tensors: Sequence[Any]) -> None:
    """检查几个张量在同一个设备上，不同就报 ValueError（并说怎么搬）。"""
    devices = [str(t.device) for t in tensors]
    if len(set(devices)) > 1:
        raise ValueError(f"{', '.join(names[:-1])} and {names[-1]} must be on one device, got {', '.join(devices)}; "
                         f"move them with .to({names[0]}.device)")
