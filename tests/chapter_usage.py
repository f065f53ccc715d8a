"""Which attn_lib modules each chapter's code cells use, read with ast: ``import attn_lib.x.y``,
``from attn_lib.x import y`` and attribute chains on those names (``attn_lib.softmax(...)``,
``we.KEY_TOKENS``), resolved to the module that defines the function or class (``attn_lib.softmax`` ->
attn_lib.core.softmax; ``attn_lib.figures.plotting.setup_chinese_font`` -> attn_lib.figures.fonts,
where it is defined). Any other object is credited to the one attn_lib file whose top level assigns
its name (``NAME = ...`` or ``NAME: T = ...``); if none or several do (``VOCAB``), to the module it was
reached through. A string that is a module's file name (``"forward.py"``, when exactly one module has
that name) counts as a use of that module. A line magic is read as the longest tail of its words
that is Python (``%timeit -n 1 f(x)`` -> ``f(x)``); a cell magic's cell is read only for ``%%time``,
``%%timeit`` and ``%%capture``, whose body is Python (a setup statement on ``%%timeit``'s first line is
not read); shell lines are dropped. Only lines that begin with ``%`` or ``!`` are taken for magics and
shell lines: ``t = %timeit -o f(x)`` is a SyntaxError here, as is a continuation line that begins with
the ``%`` operator. A whole chain counts once, for its full path (``attn_lib.core.softmax.softmax`` ->
attn_lib.core.softmax, not also attn_lib.core). Names live
on across a notebook's cells, as in its kernel. Not counted: what the library calls on a chapter's
behalf (a layer's forward reaching ``dispatch``). Used by tests/topics/test_package_structure.py: a
module's docstring names every chapter that uses it."""
from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
import types
from pathlib import Path

import attn_lib


PACKAGE = Path(attn_lib.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = ["attn_lib", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = {p: _module_name(p) for p in sorted(PACKAGE.rglob("*.py"))}


@functools.lru_cache(maxsize=None)
def _assigning_modules(name: str) -> tuple[str, ...]:
    """The modules whose top level assigns ``name`` (a constant's home)."""
    found = []
    for path, module in FILES.items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found.append(module)
    return tuple(found)


def _defining_module(obj, name: str, fallback: str) -> str:
    if inspect.isfunction(obj) or inspect.isclass(obj):
        module = getattr(obj, "__module__", "") or ""
        return module if module.startswith("attn_lib") else fallback
    homes = _assigning_modules(name)
    return homes[0] if len(homes) == 1 else fallback


def resolve(dotted: str) -> str:
    """``attn_lib.a.b.c`` -> the module that defines the first non-module on the path (or the last module)."""
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
            return _defining_module(obj, part, name)
        name = obj.__name__
    return name


def _chain(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


PYTHON_CELL_MAGICS = ("time", "timeit", "capture")  # their body is Python


def _line_as_python(line: str) -> str:
    """A line magic as its code, at its indentation: the longest tail of its words that is Python
    (``%timeit -n 1 f(x)`` -> ``f(x)``); ``pass`` if none is."""
    indent, words = line[: len(line) - len(line.lstrip())], line.split()[1:]
    for start in range(len(words)):
        try:
            ast.parse(" ".join(words[start:]))
        except SyntaxError:
            continue
        return indent + " ".join(words[start:])
    return indent + "pass"


def _python_of(code: str) -> str:
    """A cell as Python: a cell magic's cell kept only if its body is Python, shell lines dropped, a line
    magic replaced by its code."""
    lines = code.splitlines()
    if lines and lines[0].startswith("%%"):
        if lines[0][2:].split(None, 1)[0] not in PYTHON_CELL_MAGICS:
            return ""
        lines = lines[1:]
    return "\n".join(line[: len(line) - len(line.lstrip())] + "pass" if line.lstrip().startswith("!")
                     else _line_as_python(line) if line.lstrip().startswith("%") else line for line in lines)


def modules_in(code: str, aliases: dict[str, str]) -> set[str]:
    """The attn_lib modules one cell uses; ``aliases`` (local name -> attn_lib path) carries over cells."""
    tree, used = ast.parse(_python_of(code)), set()
    by_file = {}
    for path, module in FILES.items():
        by_file.setdefault(path.name, []).append(module)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in (a for a in node.names if a.name.split(".")[0] == "attn_lib"):
                aliases[alias.asname or "attn_lib"] = alias.name if alias.asname else "attn_lib"
                used.add(resolve(alias.name))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "attn_lib":
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                used.add(resolve(f"{node.module}.{alias.name}"))
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}  # parts of a longer chain
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(by_file.get(node.value, [])) == 1:
            used.add(by_file[node.value][0])  # a module's source read by its file name
        chain = _chain(node) if isinstance(node, ast.Attribute) and id(node) not in inner else None
        if chain and chain.split(".")[0] in aliases:
            head, *rest = chain.split(".")
            used.add(resolve(".".join([aliases[head], *rest])))
    return {u for u in used if u.startswith("attn_lib.")}


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
