"""attn_lib/data/tables.py: the loaders return the JSON files shipped beside them, read here from the
source tree without importlib.resources, and each table has the fields its chapter reads."""
from __future__ import annotations

import json
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from attn_lib.data import tables

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "attn_lib" / "data"

LOADERS = [
    (tables.load_cpu_bench, "cpu_bench.json"),
    (tables.load_cpu_backward_bench, "cpu_backward_bench.json"),
    (tables.load_cpu_decode_bench, "cpu_decode_bench.json"),
    (tables.load_seed_study, "seed_study.json"),
]


@pytest.mark.parametrize(("load", "file"), LOADERS, ids=[f for _, f in LOADERS])
def test_loader_returns_the_shipped_file(load, file):
    assert load() == json.loads((DATA / file).read_text(encoding="utf-8"))


@pytest.mark.parametrize(("load", "file"), LOADERS, ids=[f for _, f in LOADERS])
def test_each_call_reads_afresh(load, file):
    first = load()
    first.clear()
    assert load() != {}


@pytest.mark.parametrize("file", [f for _, f in LOADERS])
def test_every_table_is_package_data(file):
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["attn_lib.data"]
    assert any(fnmatch(file, pattern) for pattern in patterns)


@pytest.mark.parametrize("load", [tables.load_cpu_bench, tables.load_cpu_backward_bench])
def test_bench_tables_have_what_chapters_08_and_09_plot(load):
    table = load()
    assert {"machine", "config", "command", "results"} <= set(table)
    assert table["results"], "an empty table would draw an empty figure"
    for row in table["results"]:
        assert {"impl", "N", "causal", "time_s"} <= set(row)
        assert isinstance(row["N"], int) and row["N"] > 0
        assert row["time_s"] > 0


def test_decode_table_has_what_chapter_13_prints():
    table = tables.load_cpu_decode_bench()
    assert {"machine", "command", "results"} <= set(table)
    assert table["results"]
    for row in table["results"]:
        assert {"impl", "S", "time_s"} <= set(row)
        assert isinstance(row["S"], int) and row["S"] > 0
        assert row["time_s"] > 0


def test_seed_study_has_one_entry_per_seed_in_every_list():
    study = tables.load_seed_study()
    assert {"machine", "command", "threads", "seconds", "results"} <= set(study)
    lists = [v for v in study["results"].values() if isinstance(v, list)]
    assert lists, "the study holds its per-seed results as lists"
    assert len({len(v) for v in lists}) == 1
