"""Every module of attn_lib opens its docstring with the chapter it serves."""
from pathlib import Path


def test_every_module_docstring_names_its_chapter():
    """A reader goes from a chapter to its code in one step: each module's first docstring line
    names the chapter(s) it serves (a package's __init__ names the chapters of its modules). Read
    from the source, so that the Triton modules need not be imported."""
    import ast
    import re

    import attn_lib

    root = Path(attn_lib.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert len(files) > 20, files
    missing = []
    for path in files:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        first = doc.strip().splitlines()[0] if doc.strip() else ""
        if not re.search(r"第 ?[0-9]+(?:[、–-][0-9]+)* ?章", first):
            missing.append(f"{path.relative_to(root)}: {first[:40]}")
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
