"""Honest floors: one torch floor in pyproject.toml, attn_lib's import check and the set-up cell.

The floor is the oldest torch on which what the book prints holds (SDPA's zeros for a fully
masked row, chapters 03 and 06; enable_gqa): 2.5. ``import attn_lib`` on an older torch raises
ImportError naming the version needed; checked here by faking ``torch.__version__`` in a
fresh interpreter before attn_lib is imported.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP_CELL = (ROOT / "scripts" / "setup_cell.py").read_text(encoding="utf-8")


def _pyproject_floor(name: str) -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    found = [d for d in deps if re.match(rf"{name}\s*>=", d)]
    assert len(found) == 1, deps
    return found[0].split(">=", 1)[1].strip()


def test_one_torch_floor_everywhere():
    import attn_lib

    floor = _pyproject_floor("torch")
    assert floor == "2.5", "the book needs torch 2.5 (fully masked rows, enable_gqa); change all three together"
    assert attn_lib.TORCH_MIN == floor
    cell = re.search(r'^TORCH_MIN = "([0-9.]+)"', SETUP_CELL, re.M)
    assert cell and cell.group(1) == floor, "scripts/setup_cell.py's TORCH_MIN differs from pyproject.toml"


def test_matplotlib_floor_has_labelfontfamily():
    """attn_lib.figures.plotting names the CJK font with tick_params(labelfontfamily=), new in matplotlib 3.8."""
    assert "labelfontfamily" in (ROOT / "attn_lib" / "figures" / "plotting.py").read_text(encoding="utf-8")
    assert tuple(int(p) for p in _pyproject_floor("matplotlib").split(".")) >= (3, 8)


def _import_with_torch(version: str) -> subprocess.CompletedProcess:
    code = f"import torch; torch.__version__ = {version!r}\nimport attn_lib\nprint('imported')"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)


@pytest.mark.parametrize("old", ["2.4.1", "2.1.2+cu121"])
def test_import_on_an_older_torch_says_which_version_is_needed(old):
    proc = _import_with_torch(old)
    assert proc.returncode != 0 and "imported" not in proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (f"ImportError: torch must be version 2.5 or newer for attn_lib, got {old}; "
                    'run pip install -U "torch>=2.5" and restart the kernel'), proc.stderr[-2000:]


def test_import_on_the_floor_itself_works():
    proc = _import_with_torch("2.5.0")
    assert proc.returncode == 0 and proc.stdout.strip() == "imported", proc.stderr[-2000:]
