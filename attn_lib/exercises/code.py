"""第 03、05、06、07、10、12、13 章的写代码练习：读者自己写一个函数，检查器拿 PyTorch 核对。

The convention (one per code exercise, see DEVELOPERS.md):

1. a markdown cell with the label ``**练习 NN-k**`` and the task;
2. a code cell for the reader: ``def name(...):`` whose body is ``raise NotImplementedError``;
3. a code cell (tag ``hide-input``) calling ``check_code("NN-k", name)``: it runs the reader's
   function on random inputs against torch and prints ONE Chinese line: not written yet
   (NotImplementedError, so nbval's output is stable), passed, or what is off (shape, axis,
   missing scale, mask direction, nan on a large input...);
   If the task forbids calls (「不要调用 `torch.softmax`」), ``forbidden`` lists them as the task
   writes them and the checker refuses a function that makes them (forbidden.py watches the calls);
4. a folded ``:::{dropdown} 参考答案`` whose first ```` ```python ```` block is the reference
   solution, self-contained (it imports what it uses).

A chapter registers its code exercises in its own module ``chNN.py`` with ``register_code``.
The answer key is torch itself (``reference``), never attn_lib code under test. Each exercise
lists known mistakes (``mistakes``: a torch function computing what the mistake computes, and
the diagnosis it gets) and at least one plausible wrong solution (``wrong_solutions``);
tests/book/test_code_exercises.py runs the checker on the notebook's folded answer (must pass)
and on every wrong solution (must fail with its diagnosis).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .forbidden import forbidden_calls

Inputs = tuple  # the positional arguments of one call of the reader's function


@dataclass(frozen=True)
class Probe:
    """一组随机输入：名字（出错时告诉读者是哪种输入）和生成输入的函数。"""

    label: str
    make: Callable[[torch.Generator], Inputs]


@dataclass(frozen=True)
class Mistake:
    """一种常见错误：诊断代号、它算出来的东西（用 torch 写）和给读者的一句话。"""

    code: str
    compute: Callable[..., Any]
    message: str


@dataclass(frozen=True)
class CodeExercise:
    """一道写代码的练习：编号、函数名、PyTorch 参考、随机输入、常见错误和错误示例。"""

    id: str
    name: str
    reference: Callable[..., Any]
    probes: tuple[Probe, ...]
    mistakes: tuple[Mistake, ...] = ()
    wrong_solutions: tuple[tuple[Callable[..., Any], str], ...] = ()  # (function, expected code)
    forbidden: tuple[str, ...] = ()  # the calls the task forbids, as it writes them (see forbidden.py)
    atol: float = 1e-6
    seed: int = 0
    extra: dict = field(default_factory=dict, compare=False)


CODE_REGISTRY: dict[str, CodeExercise] = {}

MESSAGES = {
    "todo": "还没有写。把上一格的函数 {name} 写完（删掉 raise NotImplementedError），再运行这一格。",
    "error": "{label}：函数报错（{err}）。",
    "type": "{label}：应返回一个张量，得到的是 {found}。",
    "dtype": "{label}：返回的数据类型应为 {want}，得到 {found}。",
    "shape": "{label}：形状不对，应为 {want}，得到 {found}。",
    "nan": "{label}：输出里有 nan 或 inf。",
    "values": "{label}：数值与 PyTorch 不一致（最大差 {diff:.1e}）。",
    "forbidden": "函数里调用了 {calls}：这道题要你自己写出来，不调用现成的函数（检查器记下了函数运行时调用过的函数）。",
    "ok": "通过！{n} 组输入上都与 PyTorch 一致。",
}


def register_code(ex: CodeExercise) -> CodeExercise:
    """登记一道写代码的练习；编号重复时报错。"""
    if ex.id in CODE_REGISTRY:
        raise ValueError(f"code exercise {ex.id} registered twice")
    if not ex.wrong_solutions:
        raise ValueError(f"code exercise {ex.id} needs at least one wrong solution")
    CODE_REGISTRY[ex.id] = ex
    return ex


def _shape(x: Any) -> str:
    return "(" + ", ".join(str(n) for n in x.shape) + ")"


def _same(got: torch.Tensor, want: torch.Tensor, atol: float) -> bool:
    if got.shape != want.shape:
        return False
    if got.dtype == torch.bool or want.dtype == torch.bool:
        return bool(torch.equal(got.bool(), want.bool()))
    g, w = got.double(), want.double()
    both_inf = torch.isinf(g) & torch.isinf(w) & (torch.sign(g) == torch.sign(w))
    return bool(torch.where(both_inf, torch.zeros_like(g), (g - w).abs()).le(atol).all())


def _judge(ex: CodeExercise, label: str, args: Inputs, got: Any) -> tuple[str, str] | None:
    """一组输入上的结论；对了返回 None。"""
    want = ex.reference(*args)
    if not isinstance(got, torch.Tensor):
        return "type", MESSAGES["type"].format(label=label, found=type(got).__name__)
    if got.shape != want.shape:
        return "shape", MESSAGES["shape"].format(label=label, want=_shape(want), found=_shape(got))
    if (want.dtype == torch.bool) != (got.dtype == torch.bool):
        return "dtype", MESSAGES["dtype"].format(label=label, want=want.dtype, found=got.dtype)
    if _same(got, want, ex.atol):
        return None
    if got.is_floating_point() and not torch.isfinite(got).all() and torch.isfinite(want).all():
        return "nan", MESSAGES["nan"].format(label=label) + ex.extra.get("nan_hint", "")
    for mistake in ex.mistakes:
        if _same(got, mistake.compute(*args), ex.atol):
            return mistake.code, f"{label}：{mistake.message}"
    diff = float((got.double() - want.double()).abs().nan_to_num(float("inf")).max())
    return "values", MESSAGES["values"].format(label=label, diff=diff)


def diagnose(ex_id: str, fn: Callable[..., Any]) -> tuple[str, str]:
    """在随机输入上运行读者的函数，返回（诊断代号，给读者的一句话）；代号 ``ok`` 表示通过。"""
    ex = all_code_exercises()[ex_id]
    gen = torch.Generator().manual_seed(ex.seed)
    for probe in ex.probes:
        args = probe.make(gen)
        try:
            got, seen = forbidden_calls(fn, tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args),
                                        ex.forbidden)
        except NotImplementedError:
            return "todo", MESSAGES["todo"].format(name=ex.name)
        except Exception as err:  # the reader's bug, reported in one line
            return "error", MESSAGES["error"].format(label=probe.label, err=f"{type(err).__name__}：{err}")
        if seen:
            return "forbidden", MESSAGES["forbidden"].format(calls="、".join(seen))
        verdict = _judge(ex, probe.label, args, got)
        if verdict is not None:
            return verdict
    return "ok", MESSAGES["ok"].format(n=len(ex.probes))


def check_code(ex_id: str, fn: Callable[..., Any]) -> None:
    """检查读者写的函数 ``fn``（练习 ``ex_id``），打印一行结论。"""
    _code, message = diagnose(ex_id, fn)
    print(f"练习 {ex_id}：{message}")


def all_code_exercises() -> dict[str, CodeExercise]:
    """全部已登记的写代码练习（按编号）；与数值练习的编号不重复。"""
    from . import all_exercises  # loads every chNN module

    clash = sorted(set(CODE_REGISTRY) & set(all_exercises()))
    if clash:
        raise ValueError(f"exercise ids used twice (value and code exercise): {clash}")
    return dict(sorted(CODE_REGISTRY.items()))
