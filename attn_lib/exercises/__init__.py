"""每章末尾的练习（第 1–13 章）的检查器：``check("04-1", answer)`` 检查读者的答案。

Each chapter registers its exercises in its own module ``chNN.py`` in this package (found
automatically). A notebook's exercise leaves ``answer = None`` for the reader; the hidden
cell after it calls ``check``. tests/book/test_exercises.py asserts that every registered
reference answer passes and that a wrong answer fails.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class Exercise:
    """一道练习：编号、题面、参考答案、提示，以及比较数值时的容差。"""

    id: str
    question: str
    answer: Any
    hint: str
    atol: float = 1e-6
    wrong_example: Any = None  # a plausible wrong answer, used by the tests
    more_wrong: tuple[Any, ...] = ()  # further wrong answers the checker must refuse (the tests check them)
    normalize: Callable[[Any], Any] | None = field(default=None, compare=False)

    def is_correct(self, value: Any) -> bool:
        """判断 ``value`` 是否等于参考答案（数值按 atol 比较，字符串去掉首尾空白后比较）。"""
        if value is None:
            return False
        if self.normalize is not None:
            value = self.normalize(value)
        expected = self.answer
        if isinstance(expected, str):
            return isinstance(value, str) and value.strip() == expected.strip()
        if isinstance(expected, bool):
            return isinstance(value, (bool, np.bool_)) and bool(value) == expected
        try:
            got = np.asarray(value.detach().cpu() if hasattr(value, "detach") else value, dtype=np.float64)
            want = np.asarray(expected, dtype=np.float64)
        except (TypeError, ValueError):
            return False
        return got.shape == want.shape and bool(np.allclose(got, want, rtol=0, atol=self.atol))


REGISTRY: dict[str, Exercise] = {}


def register(ex: Exercise) -> Exercise:
    """登记一道练习；编号重复时报错。"""
    if ex.id in REGISTRY:
        raise ValueError(f"exercise {ex.id} registered twice")
    REGISTRY[ex.id] = ex
    return ex


def check(ex_id: str, value: Any) -> None:
    """检查练习 ``ex_id`` 的答案并打印一行结论（没作答 / 正确 / 不对加提示）。"""
    _load_all()
    if ex_id not in REGISTRY:
        raise KeyError(f"no exercise {ex_id!r}; known: {sorted(REGISTRY)}")
    ex = REGISTRY[ex_id]
    if value is None:
        print(f"练习 {ex_id}：还没有作答。把答案填进上一格再运行这一格。")
    elif ex.is_correct(value):
        print(f"练习 {ex_id}：正确！")
    else:
        print(f"练习 {ex_id}：还不对。提示：{ex.hint}")


_loaded = False


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    for mod in pkgutil.iter_modules(__path__):
        if mod.name.startswith("ch"):
            importlib.import_module(f"{__name__}.{mod.name}")
    _loaded = True


def all_exercises() -> dict[str, Exercise]:
    """全部已登记的练习（按编号）。"""
    _load_all()
    return dict(sorted(REGISTRY.items()))
