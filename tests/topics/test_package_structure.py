"""The house the package is: no import circles, the check package and the rules underneath everything,
modules and functions short enough to read from a chapter, small internal signatures, no underscore
module, no chapter that sends a reader to an underscore name, and every module naming its chapter."""
from __future__ import annotations

import ast
import json
import re

import pytest

from book_helpers import NOTEBOOKS
from chapter_usage import chapter_usage, modules_in
from package_graph import (FUNCTION_LIMIT, ROOT, SIGNATURE_LIMIT, cycles, folder_graph, functions, graph,
                           is_internal, line_count, module_limit, modules, parameters)


def test_the_reader_of_the_graph_sees_the_imports():
    """The analysis itself: it finds a known edge, a lazy import and a `from pkg import submodule`."""
    edges = graph()
    assert "attn_lib.checks.doors" in edges["attn_lib.core.reference"]
    assert "attn_lib.flash.tiled_forward" in edges["attn_lib.flash.autograd"]  # from . import tiled_forward
    assert "attn_lib.rules.names" in edges["attn_lib.checks.values"]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]  # a circle is found


def test_no_module_imports_itself_back():
    assert cycles(graph()) == []


def test_no_folder_imports_itself_back():
    """The subpackages form layers too: core, layers, flash, models ... never import each other in a loop."""
    assert cycles(folder_graph()) == []


def test_the_check_package_imports_only_the_rules():
    """attn_lib.checks imports torch, numpy, the standard library and attn_lib.rules: no path, layer or model."""
    outside = {(m, t) for m, targets in graph().items() if m.startswith("attn_lib.checks")
               for t in targets if not t.startswith(("attn_lib.checks", "attn_lib.rules"))}
    assert outside == set()


def test_the_rules_are_a_leaf():
    outside = {(m, t) for m, targets in graph().items() if m.startswith("attn_lib.rules")
               for t in targets if not t.startswith("attn_lib.rules")}
    assert outside == set()


def test_modules_and_functions_stay_short_enough_to_read_from_a_chapter():
    """Every module at most 300 lines (a Triton kernel file, with its launcher and grid, 400); every function,
    kernels included, at most 60 lines, docstring included."""
    too_long = [f"{name}: {line_count(path)} lines" for name, path in modules().items()
                if line_count(path) > module_limit(name)]
    too_long += [f"{m}.{q}: {fn.end_lineno - fn.lineno + 1} lines" for m, q, fn, _ in functions()
                 if fn.end_lineno - fn.lineno + 1 > FUNCTION_LIMIT]
    assert too_long == []


def test_internal_signatures_take_at_most_eight_parameters():
    """Cores, launchers, helpers and the checks take (q, k, v, settings) and a few more, not a bag of flags;
    Triton kernels are exempt (a kernel's arguments are its pointers, strides and constexprs)."""
    wide = [f"{m}.{q}: {parameters(fn)}" for m, q, fn, kernel in functions()
            if not kernel and is_internal(m, q) and parameters(fn) > SIGNATURE_LIMIT]
    assert wide == []


def test_no_module_or_folder_starts_with_an_underscore():
    """Internal means no chapter needs it, not an underscore: the folders say what each part is."""
    hidden = [name for name in modules() if any(p.startswith("_") for p in name.split(".")[1:])]
    assert hidden == []


def _chapter_texts():
    for path in NOTEBOOKS:
        for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            yield f"{path.name} cell {i}", "".join(cell["source"])


def test_no_chapter_sends_a_reader_to_an_underscore_name():
    """Paths and dotted names of attn_lib in a chapter, and the names of attn_lib's functions it quotes,
    never start with an underscore."""
    library_names = {q.split(".")[-1] for _, q, _, _ in functions()}
    bad = []
    for where, text in _chapter_texts():
        for ref in re.findall(r"attn_lib(?:[./][\w]+)+", text):
            bad += [f"{where}: {ref}" for part in re.split(r"[./]", ref)[1:]
                    if part.startswith("_") and not (part.startswith("__") and part.endswith("__"))]
        for word in re.findall(r"`(_[a-z]\w*)", text):
            if word in library_names:
                bad.append(f"{where}: `{word}`")
    assert bad == []


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_module_docstring_names_its_chapter(name):
    """A reader goes from a chapter to its code in one step: each module's first docstring line names the
    chapter(s) it serves (a package's __init__ names the chapters of its modules)."""
    doc = ast.get_docstring(ast.parse(modules()[name].read_text(encoding="utf-8"))) or ""
    first = doc.strip().splitlines()[0] if doc.strip() else ""
    assert re.search(r"第 ?[0-9]+(?:[、–-][0-9]+)* ?章", first), f"{name}: {first[:40]!r}"


CHAPTERS = re.compile(r"第 ?([0-9]+(?:[、–-][0-9]+)*) ?章")


def chapters_named(text: str) -> set[int]:
    """Every chapter a text names as 第 N 章, 第 N、M 章 or 第 N–M 章."""
    found = set()
    for group in CHAPTERS.findall(text):
        for part in group.split("、"):
            lo, _, hi = part.replace("-", "–").partition("–")
            found |= set(range(int(lo), int(hi or lo) + 1))
    return found


def first_docstring_line(name: str) -> str:
    doc = ast.get_docstring(ast.parse(modules()[name].read_text(encoding="utf-8"))) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def test_chapters_named_reads_lists_and_ranges():
    assert chapters_named("第 3、5 章（以及第 07–09 章）") == {3, 5, 7, 8, 9}
    assert chapters_named("全书共用（第 1–13 章）") == set(range(1, 14))


def test_the_usage_reader_resolves_names_to_their_modules():
    aliases = {}
    assert modules_in("import attn_lib\nfrom attn_lib.core import worked_example as we", aliases) == \
        {"attn_lib.core.worked_example"}
    assert modules_in("attn_lib.softmax(x); we.KEY_TOKENS", aliases) == {"attn_lib.core.softmax",
                                                                       "attn_lib.core.worked_example"}
    assert modules_in("from attn_lib import MultiHeadAttention as M", {}) == {"attn_lib.layers.multihead"}
    assert modules_in("from attn_lib import BACKENDS", {}) == {"attn_lib.rules.names"}  # a constant: its home
    assert modules_in("%timeit attn_lib.attention(q, k, v)", {"attn_lib": "attn_lib"}) == {"attn_lib.core.reference"}
    assert modules_in('source = PACKAGE / "flash" / "triton" / "forward.py"', {}) == {"attn_lib.flash.triton.forward"}
    assert modules_in('name = "decoding.py"', {}) == set()  # two modules have that file name: neither
    assert modules_in("from attn_lib.models.lm_data import VOCAB", {}) == {"attn_lib.models.lm_data"}  # two homes
    assert modules_in("for i in range(2):\n    %timeit -n 1 attn_lib.softmax(x)\n%pip install y",
                      {"attn_lib": "attn_lib"}) == {"attn_lib.core.softmax"}
    assert modules_in("%%bash\necho attn_lib.softmax", {"attn_lib": "attn_lib"}) == set()
    top = {"attn_lib": "attn_lib"}
    assert modules_in("%%time\nattn_lib.softmax(x)", top) == {"attn_lib.core.softmax"}
    assert modules_in("for i in r:\n    !ls\n    attn_lib.softmax(x)", top) == {"attn_lib.core.softmax"}
    assert modules_in("%timeit we.f(x) + attn_lib.attention(q, k, v)", {**top, "we": "attn_lib.core.worked_example"}) \
        == {"attn_lib.core.reference", "attn_lib.core.worked_example"}
    assert modules_in("attn_lib.figures.plotting.setup_chinese_font()", top) == {"attn_lib.figures.fonts"}


def test_a_module_names_every_chapter_whose_code_uses_it():
    """The first docstring line names (at least) every chapter whose code cells use the module; it may
    also name chapters that discuss it, or reach it through what the chapter calls."""
    short = [f"{name}: also chapters {sorted(used - chapters_named(first_docstring_line(name)))}"
             for name, used in sorted(chapter_usage(NOTEBOOKS).items())
             if name in modules() and used - chapters_named(first_docstring_line(name))]
    assert short == []


def test_a_package_names_every_chapter_its_modules_serve():
    packages = [n for n in modules() if (ROOT / n.replace(".", "/")).is_dir()]
    short = []
    for package in packages:
        served = set().union(*[chapters_named(first_docstring_line(m)) for m in modules()
                               if m.startswith(package + ".") and m.count(".") == package.count(".") + 1])
        missing = served - chapters_named(first_docstring_line(package))
        if missing:
            short.append(f"{package}: also chapters {sorted(missing)}")
    assert short == []


def test_the_readme_module_map_gives_each_module_its_docstring_chapters():
    """In README's 「attn_lib 一览」, every `module`（chapters） names what the module's docstring names."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("## attn_lib 一览"):readme.index("一次调用怎么走")]
    wrong = []
    for row in table.splitlines()[3:]:
        folder = re.match(r"\| `(\w+)/", row)
        for module, numbers in re.findall(r"`(\w+)`（([0-9、–]+)）", row):
            name = next((n for n in modules() if n.endswith("." + module) and
                         (folder is None or f".{folder.group(1)}." in n)), None)
            said = chapters_named(f"第 {numbers} 章")
            if name is None or said != chapters_named(first_docstring_line(name)):
                wrong.append(f"{module}（{numbers}）: {first_docstring_line(name)[:40] if name else 'no such module'}")
    assert wrong == []


def test_the_folders_follow_the_book():
    """The subpackages the README's module map describes are the ones there are."""
    folders = sorted({n.split(".")[1] for n in modules() if n.count(".") >= 1 and (ROOT / n.replace(".", "/")).is_dir()})
    assert folders == ["checks", "core", "costs", "data", "exercises", "figures", "flash", "layers", "models", "rules"]
