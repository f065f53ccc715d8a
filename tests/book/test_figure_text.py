"""The chapters' figures write subscripts in mathtext (「$H_{kv}$」), as the prose does with MathJax.

Read from the code cells' source (tests/figure_text.py defines a plain subscript): every string that
reaches a figure's text, that is, an argument of a figure-text method (``set_title``, ``text``,
``annotate``, ``suptitle``, ``legend``, tick labels ...), a text keyword of any call (``label=``,
``title=``, ``xlabel=`` ...) or an argument of attn_lib's drawing functions (``draw_*``, ``show_*``,
``bar_scores``). A name in such an argument counts with every value the chapter assigns to it (also as a
``for`` target or a comprehension variable), followed through further names. An f-string counts with its
literal parts (``{{`` read as ``{``). What ``print()`` prints is not figure text and is not checked. The
figures attn_lib draws are checked on their drawn Text artists in tests/figures.
"""
from __future__ import annotations

import ast

import pytest

from book_helpers import NOTEBOOKS, read_notebook
from figure_text import plain_subscripts

TEXT_METHODS = {"set_title", "set_xlabel", "set_ylabel", "text", "annotate", "suptitle", "supxlabel", "supylabel",
                "legend", "set_xticklabels", "set_yticklabels", "set_xticks", "set_yticks", "figtext", "set_label",
                "set_text", "bar_label", "table"}
TEXT_KEYWORDS = {"label", "labels", "title", "titles", "xlabel", "ylabel", "suptitle", "row_labels",
                 "col_labels", "names", "tick_labels", "text"}


def _is_drawing_function(name: str) -> bool:
    return name.startswith(("draw_", "show_")) or name == "bar_scores"


def _code(source: str) -> str:
    """A cell's source with IPython's magics and shell lines commented out, so that ast can read it."""
    return "\n".join("# " + line if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n"))


def _assignments(tree: ast.AST) -> dict[str, list[ast.AST]]:
    """{name: every expression the code assigns to it} (tuple targets take the whole value)."""
    found: dict[str, list[ast.AST]] = {}

    def bind(target, value):
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                found.setdefault(node.id, []).append(value)

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                bind(target, node.value)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
            bind(node.target, node.value)
        elif isinstance(node, (ast.For, ast.comprehension)):
            bind(node.target, node.iter)
    return found


def _strings(node: ast.AST, assigned: dict, seen: set) -> list[str]:
    """The literal text an expression can contribute, following names through their assignments."""
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else []
    if isinstance(node, ast.JoinedStr):
        text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        return [text] + [s for v in node.values if isinstance(v, ast.FormattedValue)
                         for s in _strings(v.value, assigned, seen)]
    if isinstance(node, ast.Name):
        if node.id in seen:
            return []
        seen.add(node.id)
        return [s for value in assigned.get(node.id, []) for s in _strings(value, assigned, seen)]
    if isinstance(node, ast.Subscript):  # d["key"]: the key is code, the value is what d holds
        return _strings(node.value, assigned, seen)
    return [s for child in ast.iter_child_nodes(node) for s in _strings(child, assigned, seen)]


def _call_name(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def figure_strings(sources: list[str]) -> list[str]:
    """Every string of these code cells (one chapter) that can reach a figure's text."""
    tree = ast.parse("\n".join(_code(s) for s in sources))
    assigned = _assignments(tree)
    found = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        name = _call_name(call)
        if name == "print":
            continue
        args = list(call.args) if name in TEXT_METHODS or _is_drawing_function(name) else []
        args += [k.value for k in call.keywords if k.arg in TEXT_KEYWORDS]
        for arg in args:
            found += _strings(arg, assigned, set())
    return found


def _chapter_problems(path) -> list[str]:
    sources = [c.source for c in read_notebook(path).cells if c.cell_type == "code"]
    return [f"{s!r}: {plain_subscripts(s)}" for s in dict.fromkeys(figure_strings(sources)) if plain_subscripts(s)]


@pytest.mark.parametrize("source, found", [
    ('ax.set_title(f"{title}\\nH = {H}，H_kv = {H_kv}")', ["{}\nH = {}，H_kv = {}"]),
    ('def f(ax, t):\n    ax.set_title(t)\nfor ax, t in zip(axes, ("x", "lse_p 图")):\n    f(ax, t)', ["lse_p 图"]),
    ('fig = show_flash_steps(steps, suptitle="Q_i 留着")', ["Q_i 留着"]),
    ('for t in ("a_b 图", "c"):\n    ax.plot([1], label=t)', ["a_b 图"]),
    ('ax.set_title(f"$H_{{kv}} = {n}$")\nax.plot([1], color="RdBu_r", label="window_size=3")', []),
    ('print("H_kv =", n)\nrows.append(["H_kv = 8"])', []),
])
def test_the_reader_finds_figure_strings(source, found):
    assert [s for s in figure_strings([source]) if plain_subscripts(s)] == found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_figures_write_subscripts_in_mathtext(path):
    problems = _chapter_problems(path)
    assert not problems, f"{path.name}: a figure text writes a subscript as plain text (use $H_{{kv}}$): {problems}"
