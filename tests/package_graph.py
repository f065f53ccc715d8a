"""The package's structure, read from its source: modules, imports, sizes, signatures; and how often a call
enters the check package. Shared by tests/topics/test_package_structure.py, tests/topics/test_doors.py and
scripts/package_report.py (which prints the numbers the tests hold to).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "attn_lib"
CHECKS = "attn_lib.checks"
KERNEL_LIMIT, MODULE_LIMIT, FUNCTION_LIMIT, SIGNATURE_LIMIT = 400, 300, 60, 8


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of attn_lib: dotted name -> file."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def is_package(name: str, mods: dict[str, Path]) -> bool:
    return mods[name].name == "__init__.py"


def _resolve(node: ast.ImportFrom, here: str, package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = here.split(".") if package else here.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(name: str, mods: dict[str, Path]) -> set[str]:
    """The attn_lib modules that module ``name`` imports, at any depth of its code (lazy imports too)."""
    found = set()
    for node in ast.walk(ast.parse(mods[name].read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "attn_lib"}
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(node, name, is_package(name, mods))
            if target.split(".")[0] != "attn_lib":
                continue
            for a in node.names:  # `from pkg import submodule` imports the submodule
                found.add(f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target)
    return {m for m in found if m in mods and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports(m, mods) for m in mods}


def folder(name: str, mods: dict[str, Path]) -> str:
    """The package a module belongs to (a package's __init__ belongs to the package itself)."""
    return name if is_package(name, mods) else name.rsplit(".", 1)[0]


def folder_graph() -> dict[str, set[str]]:
    """Package -> the other packages its modules import (attn_lib's own __init__ left out: it hands names on)."""
    mods, edges = modules(), {}
    for m, targets in graph().items():
        if m == "attn_lib":
            continue
        here = folder(m, mods)
        for t in targets:
            there = folder(t, mods)
            if there != here and there != "attn_lib" and not there.startswith(here + "."):
                edges.setdefault(here, set()).add(there)
        edges.setdefault(here, set())
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan): each is an import circle."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _is_kernel(fn: ast.FunctionDef) -> bool:
    return any((isinstance(d, ast.Attribute) and d.attr == "jit") or (isinstance(d, ast.Name) and d.id == "jit")
               for d in fn.decorator_list)


def functions():
    """(module, qualified name, node, is a Triton kernel) for every function and method of attn_lib."""
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield name, node.name, node, _is_kernel(node)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        yield name, f"{node.name}.{item.name}", item, False


def parameters(fn: ast.FunctionDef) -> int:
    """Parameters of a signature, ``self`` / ``ctx`` / ``cls`` not counted (``*args``, ``**kw`` count one each)."""
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    if names and names[0] in ("self", "ctx", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def is_internal(module: str, qualname: str) -> bool:
    """An underscore name (not a dunder), a function of an underscore module, or anything in the check
    package or the rules (neither is the library's API)."""
    last = qualname.split(".")[-1]
    private = last.startswith("_") and not (last.startswith("__") and last.endswith("__"))
    underscore_module = any(part.startswith("_") for part in module.split(".")[1:])
    return private or underscore_module or module.startswith(("attn_lib.checks", "attn_lib.rules"))


def line_count(path: Path) -> int:
    return path.read_text(encoding="utf-8").count("\n")


def module_limit(name: str) -> int:
    """400 lines for a Triton kernel file (its kernels, launcher and grid), 300 for every other module."""
    kernel_file = name.startswith("attn_lib.flash.triton.") and name.rsplit(".", 1)[1] in ("forward", "backward",
                                                                                           "decode")
    return KERNEL_LIMIT if kernel_file else MODULE_LIMIT


def trace_call(call, prefix: str = "attn_lib") -> tuple[list[str], int, int]:
    """Run ``call()`` once under sys.setprofile; return (modules, stays, check-package entries).

    Frames whose module name starts with ``prefix`` count. *modules*: the distinct modules passed, the
    check package attn_lib.checks counted as one; *stays*: the changes of module along the way; *entries*:
    how many times the call enters attn_lib.checks from outside it (one per door).
    """
    stays, stack, entries = [], [], [0]

    def profile(frame, event, arg):
        if event not in ("call", "return"):
            return
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(prefix):
            return
        if event == "call":
            if name.startswith(CHECKS) and not any(m.startswith(CHECKS) for m in stack):
                entries[0] += 1
            stack.append(name)
        elif stack:
            stack.pop()
        if stack and (not stays or stays[-1] != stack[-1]):
            stays.append(stack[-1])

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return sorted({CHECKS if m.startswith(CHECKS) else m for m in stays}), len(stays), entries[0]


def check_entries(call) -> int:
    """How many times ``call()`` enters attn_lib.checks from outside it: one per door."""
    return trace_call(call)[2]
