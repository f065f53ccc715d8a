"""写代码练习的「不许调用」：记下读者的函数运行时调用过哪些现成函数（第 03、05、06、07、10、12 章）。

A code exercise may forbid calls (``CodeExercise.forbidden``): the functions the task tells the
reader not to call, written as the task writes them (``"torch.softmax"``,
``"F.scaled_dot_product_attention"``, ``"attn_lib.causal_mask"``). The checker does not read the
reader's source: it watches the calls the function makes while it runs (``sys.setprofile``), so an
alias (``from attn_lib import causal_mask as cm``), a method (``x.softmax(-1)``) or a wrapper that
calls the function (``F.softmax``) is caught as well.

A forbidden torch function is a builtin: every builtin call of that name counts (``torch.softmax``,
``Tensor.softmax`` and ``torch.special.softmax``, the builtin ``special_softmax``, are one computation). A forbidden attn_lib function is
a Python function: a call that runs its code object counts.
"""
from __future__ import annotations

import importlib
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator

ALIASES = {"F": "torch.nn.functional"}


def resolve(name: str) -> Any:
    """把练习里写的名字（``torch.softmax``、``F.scaled_dot_product_attention``）变成函数对象。"""
    head, _, attr = name.rpartition(".")
    module = importlib.import_module(ALIASES.get(head, head))
    return getattr(module, attr)


def _matchers(names: tuple[str, ...]) -> tuple[dict[str, str], dict[Any, str]]:
    builtins: dict[str, str] = {}  # builtin's __name__ -> the name the task uses
    codes: dict[Any, str] = {}  # a Python function's code object -> the name the task uses
    for name in names:
        fn = resolve(name)
        code = getattr(fn, "__code__", None)
        if code is not None:
            codes[code] = name
        else:
            builtins[fn.__name__] = name
            builtins["special_" + fn.__name__] = name  # torch.special.softmax is the builtin special_softmax
    return builtins, codes


@contextmanager
def watch_calls(names: tuple[str, ...]) -> Iterator[list[str]]:
    """在 with 块里记下调用过的禁用函数（按任务里的写法，按第一次调用的先后）。"""
    builtins, codes = _matchers(names)
    seen: list[str] = []

    def profile(frame, event: str, arg) -> None:
        if event == "c_call":
            hit = builtins.get(getattr(arg, "__name__", ""))
        elif event == "call":
            hit = codes.get(frame.f_code)
        else:
            return
        if hit is not None and hit not in seen:
            seen.append(hit)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


def forbidden_calls(fn: Callable[..., Any], args: tuple, names: tuple[str, ...]) -> tuple[Any, list[str]]:
    """运行 ``fn(*args)``，返回（结果，调用过的禁用函数）；``fn`` 抛出的异常照样抛出。"""
    with watch_calls(names) as seen:
        result = fn(*args)
    return result, seen
