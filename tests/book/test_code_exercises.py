"""Code exercises (the reader writes a function): the checker passes the notebook's folded answer,
fails every registered wrong solution with its diagnosis, and says "not written yet" for the
reader's stub. The convention is in attn_lib/exercises/code.py."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import nbformat
import pytest

from attn_lib.exercises.code import CODE_REGISTRY, all_code_exercises, check_code, diagnose

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
CHECK = re.compile(r'check_code\("(\d\d-\d+)",\s*(\w+)\)')
PY_BLOCK = re.compile(r"```(?:python|\{code-cell\}[^\n]*)\n(.*?)\n```", re.S)


def _code_exercises() -> dict[str, dict]:
    """Every code exercise found in the notebooks: its label, the reader's cell, the folded answer."""
    found = {}
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for i, cell in enumerate(nb.cells):
            m = CHECK.search(cell.source) if cell.cell_type == "code" else None
            if not m:
                continue
            ex_id, name = m.groups()
            stub = nb.cells[i - 1]
            answer = nb.cells[i + 1] if i + 1 < len(nb.cells) else None
            text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
            found[ex_id] = dict(path=path, cell=i, name=name, stub=stub, answer=answer, text=text, check=cell)
    return found


FOUND = _code_exercises()
REGISTERED = all_code_exercises()


def test_there_are_code_exercises():
    assert FOUND, "no check_code(...) cell in any chapter: the tests below would check nothing"
    assert REGISTERED, "no code exercise registered in attn_lib/exercises/chNN.py"
    assert sorted(FOUND) == sorted(REGISTERED), \
        f"in notebooks {sorted(FOUND)} vs registered {sorted(REGISTERED)}"


def _exec(source: str, name: str):
    ns: dict = {}
    exec(compile(source, f"<{name}>", "exec"), ns)  # noqa: S102 (the book's own cells)
    assert callable(ns.get(name)), f"the cell does not define {name}()"
    return ns[name]


@pytest.mark.parametrize("ex_id", sorted(FOUND))
def test_notebook_layout(ex_id):
    """Label, a stub cell with def + raise NotImplementedError, the checker, a folded 参考答案."""
    ex = FOUND[ex_id]
    where = f"{ex['path'].name} cell {ex['cell']}"
    assert ex_id.startswith(ex["path"].name[:2] + "-"), where
    assert f"**练习 {ex_id}**" in ex["text"], f"{where}: label 「练习 {ex_id}」 missing"
    assert ex["stub"].cell_type == "code", f"{where}: the reader's cell must come right before the checker"
    assert f"def {ex['name']}(" in ex["stub"].source and "raise NotImplementedError" in ex["stub"].source, where
    assert REGISTERED[ex_id].name == ex["name"], f"{where}: checks {ex['name']}, registry says {REGISTERED[ex_id].name}"
    assert "hide-input" in ex["check"].metadata.get("tags", []), f"{where}: tag the checker cell hide-input"
    ans = ex["answer"]
    assert ans is not None and ans.cell_type == "markdown" and ans.source.startswith(":::{dropdown} 参考答案") \
        and ":open:" not in ans.source, f"{where}: the checker must be followed by a folded 参考答案 dropdown"
    assert PY_BLOCK.search(ans.source), f"{where}: the 参考答案 has no ```python block"


@pytest.mark.parametrize("ex_id", sorted(FOUND))
def test_stub_says_not_written_yet(ex_id, capsys):
    ex = FOUND[ex_id]
    stub = _exec("import torch\n" + ex["stub"].source, ex["name"])
    assert diagnose(ex_id, stub)[0] == "todo"
    check_code(ex_id, stub)
    out = capsys.readouterr().out.splitlines()
    assert out == [out[0]] and out[0].startswith(f"练习 {ex_id}：还没有写"), out


@pytest.mark.parametrize("ex_id", sorted(FOUND))
def test_folded_answer_passes(ex_id, capsys):
    ex = FOUND[ex_id]
    code = PY_BLOCK.search(ex["answer"].source).group(1)
    fn = _exec(code, ex["name"])
    verdict = diagnose(ex_id, fn)
    assert verdict[0] == "ok", f"the folded answer of {ex_id} fails its own checker: {verdict[1]}"
    check_code(ex_id, fn)
    assert capsys.readouterr().out.startswith(f"练习 {ex_id}：通过")


@pytest.mark.parametrize("ex_id, k", [(i, k) for i, ex in sorted(REGISTERED.items())
                                      for k in range(len(ex.wrong_solutions))])
def test_wrong_solution_fails_with_its_diagnosis(ex_id, k, capsys):
    fn, expected = REGISTERED[ex_id].wrong_solutions[k]
    code, message = diagnose(ex_id, fn)
    assert code == expected, f"{ex_id} wrong solution {k}: diagnosed {code!r} ({message}), expected {expected!r}"
    check_code(ex_id, fn)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "通过" not in out[0] and message in out[0]


@pytest.mark.parametrize("ex_id", sorted(REGISTERED))
def test_every_known_mistake_is_diagnosed(ex_id, monkeypatch):
    """Each registered mistake, used as the reader's function, gets its own diagnosis (not 'values').
    A mistake is written with torch (it is part of the answer key), so the forbidden calls are lifted."""
    ex = dataclasses.replace(REGISTERED[ex_id], forbidden=())
    monkeypatch.setitem(CODE_REGISTRY, ex_id, ex)
    for mistake in ex.mistakes:
        code, message = diagnose(ex_id, mistake.compute)
        assert code == mistake.code, f"{ex_id}: {mistake.message!r} diagnosed as {code!r}: {message}"


def test_checker_reports_errors_and_wrong_shapes_in_one_line(capsys):
    ex_id = sorted(REGISTERED)[0]

    def broken(*args):
        raise RuntimeError("boom")

    assert diagnose(ex_id, broken)[0] == "error"
    assert diagnose(ex_id, lambda *a: "not a tensor")[0] == "type"
    import torch
    assert diagnose(ex_id, lambda *a: torch.zeros(1, 2, 3))[0] == "shape"
    check_code(ex_id, broken)
    assert len(capsys.readouterr().out.splitlines()) == 1


# A cheat per forbidden call (and per way of reaching it: a method, a wrapper, an alias): each must be
# refused with the diagnosis 'forbidden', naming the call, although its values are right.
def _cheats() -> dict[str, list[tuple[str, object]]]:
    import torch
    import torch.nn.functional as F

    import attn_lib
    from attn_lib import apply_rotary as rotate, causal_mask as tril_mask, softmax as book_softmax

    return {
        "03-4": [("torch.softmax", lambda x: torch.softmax(x, -1)),
                 ("torch.softmax", lambda x: x.softmax(dim=-1)),
                 ("torch.softmax", lambda x: F.softmax(x, dim=-1)),
                 ("torch.softmax", lambda x: torch.special.softmax(x, -1)),
                 ("attn_lib.softmax", lambda x: book_softmax(x))],
        "05-3": [("F.scaled_dot_product_attention", lambda q, k, v: F.scaled_dot_product_attention(q, k, v)),
                 ("attn_lib.attention", lambda q, k, v: attn_lib.attention(q, k, v)[0])],
        "06-3": [("attn_lib.causal_mask", lambda L: tril_mask(L))],
        "07-4": [("attn_lib.split_heads", lambda x, num_heads: attn_lib.split_heads(x, num_heads))],
        "07-5": [("attn_lib.merge_heads", lambda x: attn_lib.merge_heads(x))],
        "10-4": [("attn_lib.apply_rotary", lambda x, positions: rotate(x, positions))],
        "12-4": [("attn_lib.attention", lambda q, k, v: attn_lib.attention(q, k, v, enable_gqa=True)[0]),
                 ("F.scaled_dot_product_attention",
                  lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))],
    }


CHEATS = _cheats()
CHEAT_CASES = [(ex_id, k) for ex_id, cheats in sorted(CHEATS.items()) for k in range(len(cheats))]


def test_every_forbidden_call_has_a_cheat_in_the_tests():
    forbidden = {(ex_id, name) for ex_id, ex in REGISTERED.items() for name in ex.forbidden}
    cheated = {(ex_id, name) for ex_id, cheats in CHEATS.items() for name, _ in cheats}
    assert forbidden, "no code exercise forbids a call: the cheat tests would check nothing"
    assert forbidden == cheated, f"forbidden without a cheat: {forbidden - cheated}; cheat for nothing: {cheated - forbidden}"


@pytest.mark.parametrize("ex_id, k", CHEAT_CASES)
def test_a_forbidden_call_is_refused(ex_id, k, capsys):
    name, fn = CHEATS[ex_id][k]
    code, message = diagnose(ex_id, fn)
    assert (code, name in message) == ("forbidden", True), f"{ex_id} cheat {k} ({name}): {code!r} {message}"
    check_code(ex_id, fn)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "通过" not in out[0] and name in out[0], out


FORBID_SENTENCE = re.compile(r"不要调用([^：。]*)")


@pytest.mark.parametrize("ex_id", sorted(FOUND))
def test_the_task_forbids_what_the_checker_refuses(ex_id):
    """The calls a task's 「不要调用 …」 names are exactly the ones its checker refuses, and it says so."""
    ex = FOUND[ex_id]
    nb = nbformat.read(ex["path"], as_version=4)
    task = next(c.source for c in nb.cells if c.cell_type == "markdown" and f"**练习 {ex_id}**" in c.source)
    named = [n for m in FORBID_SENTENCE.finditer(task) for n in re.findall(r"`([\w.]+)`", m.group(1))]
    assert sorted(set(named)) == sorted(REGISTERED[ex_id].forbidden), \
        f"{ex_id}: the task forbids {named}, the checker refuses {REGISTERED[ex_id].forbidden}"
    if named:
        assert "检查器会拒绝" in task, f"{ex_id}: say that the checker refuses the forbidden calls (检查器会拒绝…)"
