"""What the book and the README point a reader to exists: every dotted name ``attn_lib.x.y`` resolves (a module,
or an attribute of one) and every path ``attn_lib/...`` is a file or folder of the package."""
from __future__ import annotations

import importlib
import json
import re

import pytest

from book_helpers import NOTEBOOKS, ROOT

DOCS = [ROOT / "README.md", ROOT / "intro.md", ROOT / "glossary.md", ROOT / "DEVELOPERS.md", ROOT / "tests" / "README.md"]
DOTTED = re.compile(r"(?<![\w/])attn_lib(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w.])attn_lib/[\w./]*[\w/]")


def _without_old_names(text: str) -> str:
    """The README's table of renamed names keeps the old name in its first column: leave that column out."""
    head, sep, rest = text.partition("## 改过的名字")
    if not sep:
        return text
    section, sep2, tail = rest.partition("\n## ")
    rows = [line.split("|", 2)[2] if line.startswith("| `") or line.startswith("| 平铺") or line.startswith("| 层")
            or line.startswith("| 核函数") or line.startswith("| 模块") else line for line in section.splitlines()]
    return head + sep + "\n".join(rows) + sep2 + tail


def _texts():
    for doc in DOCS:
        yield doc.name, _without_old_names(doc.read_text(encoding="utf-8"))
    for nb in NOTEBOOKS:
        for i, cell in enumerate(json.loads(nb.read_text(encoding="utf-8"))["cells"]):
            yield f"{nb.name} cell {i}", "".join(cell["source"])


def _resolves(dotted: str) -> bool:
    """Import the longest module prefix, then follow the rest as attributes."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:n]))
        except ImportError:
            continue
        try:
            for name in parts[n:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


REFERENCES = sorted({(where, m.group(0).rstrip(".")) for where, text in _texts() for m in DOTTED.finditer(text)})
PATHS = sorted({(where, m.group(0).rstrip(".")) for where, text in _texts() for m in PATH.finditer(text)})


def test_the_scan_finds_references():
    assert len(REFERENCES) > 50 and len(PATHS) > 10
    assert not _resolves("attn_lib.no_such_module") and _resolves("attn_lib.core.reference.attention")


@pytest.mark.parametrize("where,name", REFERENCES)
def test_every_dotted_name_resolves(where, name):
    assert _resolves(name), f"{where}: {name} is no module or attribute of attn_lib"


@pytest.mark.parametrize("where,path", [(w, p) for w, p in PATHS if "NN" not in p])  # chNN: a placeholder
def test_every_path_exists(where, path):
    target = ROOT / path.replace("*", "")
    glob_ok = "*" in path and any(ROOT.glob(path))
    assert target.exists() or glob_ok, f"{where}: {path} does not exist"


# Paths into the repository's own tests, scripts, benchmarks and CI, wherever a file names one (a docstring
# pointing to the test that checks it, a chapter sending the reader to a script): each must exist.
REPO_PATH = re.compile(r"(?<![\w./-])(?:tests|scripts|bench|\.ci)/[\w./-]*\.(?:py|sh|md|txt|json|yml)")
# Written by `bench/gpu.py` on a GPU; none is committed until one has run.
NOT_YET_WRITTEN = {"bench/results/gpu.json", "bench/results/gpu_decode.json", "bench/results/gpu_window.json"}


def _repo_files():
    for pattern in ("attn_lib/**/*.py", "tests/**/*.py", "scripts/*", "bench/*.py", "chapters/*.ipynb", "*.md",
                    "tests/README.md", "_config.yml", "pyproject.toml", "Makefile", ".ci/run"):
        yield from (p for p in ROOT.glob(pattern) if p.is_file() and ".venv" not in p.parts)


REPO_PATHS = sorted({(p.relative_to(ROOT).as_posix(), m.group(0))
                     for p in _repo_files() for m in REPO_PATH.finditer(p.read_text(encoding="utf-8"))})


def test_the_scan_finds_repository_paths():
    assert len(REPO_PATHS) > 50
    assert ("tests/README.md", "tests/topics/test_suite_rules.py") in REPO_PATHS


@pytest.mark.parametrize("where,path", [(w, p) for w, p in REPO_PATHS if p not in NOT_YET_WRITTEN])
def test_every_repository_path_exists(where, path):
    assert (ROOT / path).exists(), f"{where}: {path} does not exist"
