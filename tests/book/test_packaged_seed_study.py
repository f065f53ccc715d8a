"""The seed study that chapters 10 and 11 read (attn_lib/data/seed_study.json) is never stale."""
import json
import os
import subprocess
import sys

import pytest

from attn_lib.models import tiny_model
from attn_lib.data.tables import load_seed_study
from attn_lib.models.seed_study import DIGITS, KINDS, SEEDS
from book_helpers import ROOT


def test_packaged_seed_study_is_self_consistent():
    record = load_seed_study()
    r = record["results"]
    rounding = len(tiny_model.ROLES) * 10.0 ** -DIGITS  # sums of stored values, each rounded to DIGITS decimals
    assert record["threads"] == 1 and record["seconds"] > 0
    assert r["seeds"] == list(SEEDS)
    for name in KINDS:
        assert len(r[name]) == len(SEEDS) and all(len(row) == 3 for row in r[name])
        assert all(0.0 <= a <= 1.0 for row in r[name] for a in row)
    for roles, verb, gap in zip(r["roles"], r["verb_head"], r["head_gap"]):
        assert len(roles) == 2 and all(len(row) == len(tiny_model.ROLES) for row in roles)
        assert all(abs(sum(row) - 1.0) <= rounding for row in roles)  # each head's weights sum to 1
        assert roles[verb][0] >= roles[1 - verb][0]  # the verb head gives 「它」's verb more weight
        assert abs(gap - 0.5 * sum(abs(a - b) for a, b in zip(*roles))) <= rounding


@pytest.mark.slow
def test_packaged_seed_study_equals_a_fresh_run(tmp_path):
    out = tmp_path / "seed_study.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_seed_study.py"), "--out", str(out)],
                   check=True, env=env, cwd=ROOT, timeout=1800)
    fresh = json.loads(out.read_text(encoding="utf-8"))
    assert fresh["results"] == load_seed_study()["results"]  # rounded as stored: exactly equal
