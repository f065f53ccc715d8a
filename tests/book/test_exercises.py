"""Every chapter's exercises: the reference answer passes, a wrong answer fails."""
import pytest

from attn_lib.exercises import all_exercises, check

from book_helpers import NOTEBOOKS, ROOT, read_notebook

EXERCISES = all_exercises()


def test_every_chapter_has_exercises():
    chapters = sorted(p.name[:2] for p in (ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
    assert chapters, f"no chapters/NN_*.ipynb under {ROOT}: the test would check nothing"
    assert EXERCISES, "no exercises registered: the parametrized test below would collect nothing"
    have = {ex_id.split("-")[0] for ex_id in EXERCISES}
    missing = [c for c in chapters if c not in have]
    assert not missing, f"chapters without registered exercises: {missing}"


@pytest.mark.parametrize("ex_id", sorted(EXERCISES))
def test_reference_answer_passes_and_wrong_fails(ex_id, capsys):
    ex = EXERCISES[ex_id]
    assert ex.is_correct(ex.answer)
    assert ex.wrong_example is not None, f"{ex_id} needs a wrong_example"
    assert not ex.is_correct(ex.wrong_example)
    for wrong in ex.more_wrong:
        assert not ex.is_correct(wrong), f"{ex_id} accepts the wrong answer {wrong!r}"
    assert not ex.is_correct(None)
    check(ex_id, ex.answer)
    check(ex_id, ex.wrong_example)
    check(ex_id, None)
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("正确！") and "提示" in out[1] and "还没有作答" in out[2]



def test_a_four_place_answer_is_held_to_four_places():
    """06-1 asks for 4 decimal places: the answer written to 4 places (or more) passes; the slip the
    folded answer explains (rounding the shares first gives 0.9169) and the source's 0.92 do not."""
    ex = EXERCISES["06-1"]
    assert ex.is_correct(0.9168) and ex.is_correct(0.916827)
    assert not ex.is_correct(0.9169) and not ex.is_correct(0.9167) and not ex.is_correct(0.92)
    assert ex.wrong_example == 0.9169

def test_answer_keys_do_not_use_the_library_under_test():
    """An answer key is a literal or an independent computation: a library bug must not become the key."""
    import ast

    modules = sorted((ROOT / "attn_lib" / "exercises").glob("ch*.py"))
    assert modules, "no exercise modules found"
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level >= 1:
                names = {a.name for a in node.names}
                allowed = (node.level == 1 and node.module is None and names <= {"Exercise", "register"}) or \
                          (node.level == 1 and node.module == "code" and
                           names <= {"CodeExercise", "Mistake", "Probe", "register_code"}) or \
                          (node.level == 2 and node.module == "core" and names <= {"worked_example"})
                assert allowed, f"{path.name} imports {names} from the library; compute its keys independently"
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert node.module.split(".")[0] in {"math", "torch", "__future__"}, f"{path.name} imports {node.module}"
            if isinstance(node, ast.Import):  # code exercises: the key is torch itself
                assert all(a.name == "math" or a.name.split(".")[0] == "torch" for a in node.names), \
                    f"{path.name} imports {[a.name for a in node.names]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_exercise_has_a_label_and_a_folded_worked_solution(path):
    """「练习 NN-k」 in the text, the checker, then a 参考答案 dropdown (closed on the site)."""
    import re

    nb = read_notebook(path)
    chapter = path.name[:2]
    ids = [m.group(1) for c in nb.cells if c.cell_type == "code"
           for m in re.finditer(r'check\("(\d\d-\d+)"', c.source)]
    assert ids, f"{path.name} has no exercise checker"
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for ex_id in ids:
        assert ex_id.startswith(chapter + "-"), f"{path.name} checks {ex_id}"
        assert f"**练习 {ex_id}**" in text, f"{path.name}: label 「练习 {ex_id}」 missing"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and 'check("' in cell.source:
            nxt = nb.cells[i + 1] if i + 1 < len(nb.cells) else None
            assert nxt is not None and nxt.cell_type == "markdown" and \
                nxt.source.startswith(":::{dropdown} 参考答案") and ":open:" not in nxt.source, \
                f"{path.name}: the checker in cell {i} is not followed by a folded 参考答案 dropdown"
