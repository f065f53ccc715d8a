"""The rules the test suite keeps, read from its source with ast:

- no tolerance typed into a test: a keyword ``atol=`` / ``rtol=`` (``abs=`` / ``rel=`` of pytest.approx,
  ``abs_tol=`` / ``rel_tol=`` of math.isclose) holding a number, a comparison of an error (an ``abs`` /
  ``norm`` / ``max_abs_error`` expression, or a name that says ``err``) with a float literal, or a closeness
  call (``allclose``, ``isclose``, ``assert_allclose``, ``torch.testing.assert_close``) left on its own
  default tolerances. Tolerances come from ``attn_lib.tolerances``, the one place with numbers; exact
  equality is ``torch.equal`` or ``==``;
- no test file imports another test file (a shared helper lives in ``tests/*.py``);
- one test file per module, in folders that mirror the package: ``tests/<path>/test_<module>.py`` tests
  ``attn_lib/<path>/<module>.py`` (``tests/test_device.py`` tests ``attn_lib/device.py``); topic files
  are in ``tests/topics``, the book's in ``tests/book``, the benchmarks' in ``tests/bench``; below
  ``tests/`` a folder holds test files only (and a conftest.py); and the other way round, every module
  has its test file, but for the book's exercises (``attn_lib/exercises``: tests/book/test_exercises.py and
  tests/book/test_code_exercises.py check every one of them, with the notebooks that ask them).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
PACKAGE = ROOT / "attn_lib"
FREE_FOLDERS = ("book", "topics", "bench")  # not mirrors of a module
TOLERANCE_KEYWORDS = {"atol", "rtol", "abs_tol", "rel_tol"}
APPROX_KEYWORDS = {"abs", "rel"}  # pytest.approx's
CLOSENESS_CALLS = {"allclose", "isclose", "assert_allclose", "assert_close"}
ERROR_CALLS = {"abs", "absolute", "fabs", "norm", "max_abs_error"}
ORDERINGS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def suite_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _name(func: ast.AST) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _dotted(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return f"{_dotted(func.value)}.{func.attr}"
    return func.id if isinstance(func, ast.Name) else ""


def _has_number(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool)
               for n in ast.walk(node))


def _is_float_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, float)


def _is_error(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and _name(n.func) in ERROR_CALLS:
            return True
        if isinstance(n, (ast.Name, ast.Attribute)) and "err" in _name(n).lower():
            return True
    return False


def _is_tolerance_helper(call: ast.Call) -> bool:
    """attn_lib.tolerances.assert_close (imported under that name, or as attn_lib.assert_close) takes its
    tolerance from the table: it is not torch.testing's."""
    dotted = _dotted(call.func)
    return dotted in ("assert_close", "attn_lib.assert_close", "tolerances.assert_close")


def tolerance_literals(path: Path) -> list[str]:
    """'file:line: what' for each tolerance written into the file."""
    found = []
    where = _where(path)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            approx = _name(node.func) == "approx"
            for kw in node.keywords:
                if (kw.arg in TOLERANCE_KEYWORDS or (approx and kw.arg in APPROX_KEYWORDS)) and _has_number(kw.value):
                    found.append(f"{where}:{node.lineno}: {kw.arg}={ast.unparse(kw.value)}")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for op, a, b in zip(node.ops, sides, sides[1:]):
                if isinstance(op, ORDERINGS) and ((_is_float_literal(b) and _is_error(a))
                                                  or (_is_float_literal(a) and _is_error(b))):
                    found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def default_tolerances(path: Path) -> list[str]:
    """'file:line: call' for each closeness test left on its library's default tolerances."""
    found = []
    where = _where(path)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and _name(node.func) in CLOSENESS_CALLS and not _is_tolerance_helper(node):
            given = {kw.arg for kw in node.keywords}
            if not {"atol", "rtol"} <= given and not {"abs_tol", "rel_tol"} <= given:
                found.append(f"{where}:{node.lineno}: {_dotted(node.func)}(...) without atol and rtol")
    return found


def imports_of_tests(path: Path) -> list[str]:
    """'file:line: module' for each import of a test module (a module whose name starts with test_)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [a.name for a in node.names if node.module is None]
        for name in names:
            if any(part.startswith("test_") for part in name.split(".")):
                found.append(f"{_where(path)}:{node.lineno}: {name}")
    return found


def is_shared_helper(path: Path) -> bool:
    return path.parent == TESTS and not path.name.startswith("test_")


def mirror_problem(path: Path) -> str | None:
    """Why a file below tests/ breaks the one naming scheme (None: it keeps it)."""
    rel = path.relative_to(TESTS)
    if is_shared_helper(path) or rel.parts[0] in FREE_FOLDERS:
        return None
    if path.name in ("conftest.py", "__init__.py"):
        return None
    if not path.name.startswith("test_"):
        return f"tests/{rel}: a helper below tests/ (shared helpers live in tests/*.py)"
    module = rel.parent / path.name[len("test_"):]
    if (PACKAGE / module).is_file() or (PACKAGE / module.with_suffix("") / "__init__.py").is_file():
        return None
    return f"tests/{rel}: no module attn_lib/{module.as_posix()} to mirror"


# Modules whose tests are not a mirror file: the book's exercises are checked with the chapters that ask them.
UNMIRRORED = ("exercises",)


def modules_without_a_test_file() -> list[str]:
    """The modules of attn_lib with no ``tests/<path>/test_<module>.py`` (``__init__.py`` aside)."""
    missing = []
    for module in sorted(PACKAGE.rglob("*.py")):
        rel = module.relative_to(PACKAGE)
        if module.name == "__init__.py" or rel.parts[0] in UNMIRRORED or "__pycache__" in rel.parts:
            continue
        if not (TESTS / rel.parent / f"test_{module.name}").is_file():
            missing.append(f"attn_lib/{rel.as_posix()}: no tests/{(rel.parent / f'test_{module.name}').as_posix()}")
    return missing


def _violations(check, files) -> list[str]:
    return [v for f in files for v in check(f)]


def test_the_readers_find_what_they_look_for(tmp_path):
    """The checks themselves: each finds its mistake in a file made for it, and passes the right spelling."""
    bad = tmp_path / "test_bad.py"
    bad.write_text("import torch\nimport test_other\nfrom tests.topics.test_edges import x\n"
                   "torch.testing.assert_close(a, b, rtol=0, atol=1e-6)\nassert (a - b).abs().max() < 1e-6\n"
                   "assert max_err <= 2e-3\nassert 1e-4 > err\nnp.allclose(a, b)\npytest.approx(1.0, abs=1e-9)\n",
                   encoding="utf-8")
    good = tmp_path / "test_good.py"
    good.write_text("from attn_paths import DISTINGUISHABLE\nfrom attn_lib.tolerances import assert_close, tolerance\n"
                    "tol = tolerance('float32')\nassert_close(a, b, dtype='float32')\n"
                    "np.allclose(a, b, rtol=tol['rtol'], atol=tol['atol'])\n"
                    "assert (a - b).abs().max() > DISTINGUISHABLE\nassert (a - b).abs().max() == 0.0\n"
                    "assert x.max() > 65504\n", encoding="utf-8")
    assert len(tolerance_literals(bad)) == 6, tolerance_literals(bad)
    assert len(default_tolerances(bad)) == 1
    assert [v.split(": ")[1] for v in imports_of_tests(bad)] == ["test_other", "tests.topics.test_edges"]
    assert tolerance_literals(good) == default_tolerances(good) == imports_of_tests(good) == []
    assert mirror_problem(TESTS / "core" / "test_reference.py") is None
    assert mirror_problem(TESTS / "flash" / "triton" / "test_forward.py") is None
    assert mirror_problem(TESTS / "test_device.py") is None
    assert mirror_problem(TESTS / "topics" / "test_doors.py") is None
    assert mirror_problem(TESTS / "attn_paths.py") is None
    assert "no module attn_lib/core/reference_gqa_window.py" in mirror_problem(TESTS / "core" / "test_reference_gqa_window.py")
    assert "no module attn_lib/unit/masks.py" in mirror_problem(TESTS / "unit" / "test_masks.py")
    assert "a helper below tests/" in mirror_problem(TESTS / "core" / "helpers.py")


def test_no_tolerance_is_typed_into_a_test():
    assert _violations(tolerance_literals, suite_files()) == []


def test_no_closeness_test_relies_on_a_library_default_tolerance():
    assert _violations(default_tolerances, suite_files()) == []


def test_no_test_file_imports_another():
    assert _violations(imports_of_tests, suite_files()) == []


def test_every_test_file_mirrors_a_module_or_is_a_topic():
    assert [p for p in map(mirror_problem, suite_files()) if p] == []


def test_every_module_has_its_test_file():
    assert modules_without_a_test_file() == []


@pytest.mark.parametrize("check", [tolerance_literals, default_tolerances, imports_of_tests],
                         ids=["tolerance literals", "default tolerances", "imports of test files"])
def test_the_topic_files_and_shared_helpers_keep_the_rules(check):
    """The files of tests/topics and the shared helpers, on their own (the other folders are checked above)."""
    mine = [p for p in suite_files() if p.parent == TESTS or p.parent.name == "topics"]
    assert _violations(check, mine) == []
