"""No space after (or before) full-width punctuation in what the chapters print.

``print("三个比例加起来：", total)`` prints 「三个比例加起来： 1」: print's separator puts a space after the
full-width colon, which Chinese typography does not have (the mark already takes a full character's
width). This script rewrites such calls in the notebooks' code cells as one f-string,
``print(f"三个比例加起来：{total}")``, keeping a space only where neither side is full-width
punctuation; where an argument would not read well inside braces (it holds quotes, braces or a
lambda), it adds ``sep=""`` and writes the kept spaces into the literals instead. A call it cannot rewrite safely (``sep=`` given, ``*args``, a string with a prefix or
triple quotes, an argument holding a backslash) is left alone and listed.

Usage: python scripts/glue_prints.py [--check] [notebooks...]   (default: chapters/*.ipynb)
Re-execute the notebooks it changed afterwards.
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
AFTER = "：，；。！？、"  # a piece ending in one of these is glued to the next
BEFORE = "：，；。！？、）」"  # a piece starting with one of these is glued to the previous


def _literal_body(seg: str) -> str | None:
    """The inside of a plain one-line string literal ``"..."`` / ``'...'`` as written, else None."""
    if len(seg) < 2 or seg[0] not in "\"'" or seg[-1] != seg[0] or seg[:3] in ('"""', "'''"):
        return None
    return seg[1:-1]


def _pieces(call: ast.Call, src: str) -> list[tuple[str, str]] | None:
    """(kind, text) per argument: 'text' (a literal's inside, braces doubled), 'f' (an f-string's
    inside), 'expr' (source of an expression); None if a piece cannot go into an f-string."""
    out = []
    for arg in call.args:
        seg = ast.get_source_segment(src, arg)
        if seg is None or isinstance(arg, ast.Starred) or "\n" in seg:
            return None
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            body = _literal_body(seg)
            if body is None:
                return None
            out.append(("text", body.replace("{", "{{").replace("}", "}}")))
        elif isinstance(arg, ast.JoinedStr):
            body = _literal_body(seg[1:]) if seg[:1] in "fF" else None
            if body is None:
                return None
            out.append(("f", body))
        else:
            if "\\" in seg:
                return None
            out.append(("expr", seg))
    return out


def _visible(kind: str, text: str) -> str:
    return text if kind != "expr" else "x"


def _simple(expr: str) -> bool:
    """An expression that reads well inside an f-string's braces."""
    return not any(c in expr for c in "{}'\"") and "lambda" not in expr


def _with_sep(call: ast.Call, src: str, pieces, glue) -> str:
    """The call with ``sep=""`` and the spaces that are kept written into its literals."""
    args = [(k, ast.get_source_segment(src, a)) for (k, _), a in zip(pieces, call.args)]
    out = [args[0][1]]
    for g, (kind, seg), (left_kind, left) in zip(glue, args[1:], args):
        if not g:
            if left_kind != "expr":
                out[-1] = out[-1][:-1] + " " + out[-1][-1]
            elif kind == "text":
                seg = seg[0] + " " + seg[1:]
            else:
                out.append('" "')
        out.append(seg)
    kwargs = [ast.get_source_segment(src, k) for k in call.keywords]
    return "print(" + ", ".join(out + ['sep=""'] + kwargs) + ")"


def rewrite_call(call: ast.Call, src: str) -> str | None:
    """The call without print's space next to full-width punctuation: one f-string when every
    argument is a simple expression or a literal, else ``sep=""`` with the kept spaces written in."""
    if not (isinstance(call.func, ast.Name) and call.func.id == "print") or len(call.args) < 2:
        return None
    if any(k.arg == "sep" or k.arg is None for k in call.keywords):
        return None
    pieces = _pieces(call, src)
    if pieces is None:
        return None
    glue = [_visible(*a).endswith(tuple(AFTER)) or _visible(*b).startswith(tuple(BEFORE))
            for a, b in zip(pieces, pieces[1:])]
    if not any(glue):
        return None
    literals = "".join(t for k, t in pieces if k != "expr")
    if not all(_simple(t) for k, t in pieces if k == "expr") or '"' in literals:
        return _with_sep(call, src, pieces, glue)
    bodies = [f"{{{text}}}" if kind == "expr" else text for kind, text in pieces]
    joined = bodies[0] + "".join(("" if g else " ") + b for g, b in zip(glue, bodies[1:]))
    kwargs = "".join(", " + ast.get_source_segment(src, k) for k in call.keywords)
    return f'print(f"{joined}"{kwargs})'


def rewrite_source(src: str) -> tuple[str, list[str]]:
    """The cell's source with every rewritable call rewritten, and the calls left alone."""
    try:
        tree = ast.parse(src)
    except SyntaxError:  # IPython magics
        return src, []
    lines = src.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line.encode("utf-8")))
    edits, skipped = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            new = rewrite_call(node, src)
            seg = ast.get_source_segment(src, node)
            if new is not None:
                edits.append((node, new))
            elif len(node.args) > 1 and seg and "sep=" not in seg and \
                    any(m + '"' in seg or m + "'" in seg for m in AFTER):
                skipped.append(seg)
    data = src.encode("utf-8")
    for node, new in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):
        a = offsets[node.lineno - 1] + node.col_offset
        b = offsets[node.end_lineno - 1] + node.end_col_offset
        data = data[:a] + new.encode("utf-8") + data[b:]
    return data.decode("utf-8"), skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="report, change nothing; exit 1 if a call would change")
    ap.add_argument("notebooks", nargs="*", type=Path)
    args = ap.parse_args(argv)
    changed = 0
    for path in args.notebooks or sorted((ROOT / "chapters").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        touched = False
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            new, skipped = rewrite_source(cell.source)
            for seg in skipped:
                print(f"{path.name} cell {i}: left alone: {seg[:90]}")
            if new != cell.source:
                touched = True
                if not args.check:
                    cell.source = new
        if touched:
            changed += 1
            print(f"{path.name}: {'would change' if args.check else 'changed'}")
            if not args.check:
                nbformat.write(nb, path)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
