"""Every module of attn_lib opens its docstring with the chapter it serves."""
from pathlib import Path


def test_every_module_docstring_names_its_chapter():
    """A reader goes from a chapter to its code in one step: each module's first docstring line
    names the chapter(s) it serves (the package __init__ points to them instead)."""
    import importlib
    import pkgutil
    import re

    import attn_lib

    names = [m.name for m in pkgutil.walk_packages(attn_lib.__path__, "attn_lib.")]
    assert len(names) > 20, names
    missing = []
    for name in names:
        if name.endswith("flash_triton"):  # imported lazily with Triton; read its source instead
            doc = (Path(attn_lib.__file__).parent / "flash_triton.py").read_text(encoding="utf-8")
            first = doc.split('"""', 2)[1].splitlines()[0]
        else:
            first = (importlib.import_module(name).__doc__ or "").strip().splitlines()[0]
        if not re.search(r"第 ?[0-9]+(?:[、–-][0-9]+)* ?章", first):
            missing.append(f"{name}: {first[:40]}")
    assert not missing, "module docstrings that do not open with their chapter:\n" + "\n".join(missing)


def test_modules_and_functions_stay_short_enough_to_read_from_a_chapter():
    """The guide's size rule, measured on the source: every module of attn_lib at most 300 lines,
    every function (docstring included, Triton kernels too) at most 60."""
    import ast

    import attn_lib

    root = Path(attn_lib.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert len(files) > 20, files
    too_long = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > 300:
            too_long.append(f"{path.relative_to(root)}: {text.count(chr(10))} lines (module)")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60:
                too_long.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: "
                                f"{node.end_lineno - node.lineno + 1} lines")
    assert not too_long, "over the size rule:\n" + "\n".join(too_long)
