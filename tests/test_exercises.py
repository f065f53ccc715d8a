"""Every chapter's exercises: the reference answer passes, a wrong answer fails."""
from pathlib import Path

import pytest

from attn_lib.exercises import all_exercises, check

ROOT = Path(__file__).resolve().parents[1]  # paths from the repository root, whatever the working directory
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
    assert not ex.is_correct(None)
    check(ex_id, ex.answer)
    check(ex_id, ex.wrong_example)
    check(ex_id, None)
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("正确!") and "提示" in out[1] and "还没有作答" in out[2]
