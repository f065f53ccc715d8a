"""Which attn_lib modules each chapter's code cells use, read with ast: ``import attn_lib.x.y``,
``from attn_lib.x import y`` and attribute chains on those names (``attn_lib.softmax(...)``,
``we.TOKENS``), resolved to the module that defines the function or class (``attn_lib.softmax`` ->
attn_lib.core.softmax). Names live on across a notebook's cells, as in its kernel. Used by
tests/topics/test_package_structure.py: a module's docstring names every chapter that uses it."""
from __future__ import annotations

import ast
import importlib
import inspect
import json
import types
from pathlib import Path

import attn_lib


def _defining_module(obj, fallback: str) -> str:
    if inspect.isfunction(obj) or inspect.isclass(obj):
        module = getattr(obj, "__module__", "") or ""
        return module if module.startswith("attn_lib") else fallback
    return fallback


def resolve(dotted: str) -> str:
    """``attn_lib.a.b.c`` -> the module that holds the longest prefix that exists."""
    obj, name = attn_lib, "attn_lib"
    for part in dotted.split(".")[1:]:
        if hasattr(obj, part):
            obj = getattr(obj, part)
        else:
            try:
                obj = importlib.import_module(f"{name}.{part}")
            except ImportError:
                return name
        if not isinstance(obj, types.ModuleType):
            return _defining_module(obj, name)
        name = obj.__name__
    return name


def _chain(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def modules_in(code: str, aliases: dict[str, str]) -> set[str]:
    """The attn_lib modules one cell uses; ``aliases`` (local name -> attn_lib path) carries over cells."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in code.splitlines())
    tree, used = ast.parse(code), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in (a for a in node.names if a.name.split(".")[0] == "attn_lib"):
                aliases[alias.asname or "attn_lib"] = alias.name if alias.asname else "attn_lib"
                used.add(resolve(alias.name))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "attn_lib":
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                used.add(resolve(f"{node.module}.{alias.name}"))
    for node in ast.walk(tree):
        chain = _chain(node) if isinstance(node, ast.Attribute) else None
        if chain and chain.split(".")[0] in aliases:
            head, *rest = chain.split(".")
            used.add(resolve(".".join([aliases[head], *rest])))
    return used - {"attn_lib"}


def chapter_usage(notebooks) -> dict[str, set[int]]:
    """attn_lib module -> the chapter numbers whose code cells use it."""
    usage: dict[str, set[int]] = {}
    for path in notebooks:
        number, aliases = int(Path(path).name[:2]), {}
        for cell in json.loads(Path(path).read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                for module in modules_in("".join(cell["source"]), aliases):
                    usage.setdefault(module, set()).add(number)
    return usage
