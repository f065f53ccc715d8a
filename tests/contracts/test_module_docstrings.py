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
