"""A Colab-like first start: a fresh virtual environment without attn_lib runs a chapter.

Google Colab has torch, numpy, matplotlib and ipykernel but not attn_lib. This test builds
such an environment from scratch (``python -m venv``, then ``pip install torch==2.13.0 numpy
matplotlib ipykernel``; torch 2.13.0 is the CPU build the machine's pip finds on disk), runs
the notebooks' set-up cell (scripts/setup_cell.py, the very text every notebook starts
with) with ``ATTN_LIB_SOURCE`` pointing at a copy of this checkout instead of GitHub, checks
that attn_lib was installed into that environment, and then executes a whole chapter with
that environment's Python as the Jupyter kernel. Every checked cell must print what the
committed notebook shows. Takes about a minute (most of it installing torch).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
SETUP_CELL = (ROOT / "scripts" / "setup_cell.py").read_text(encoding="utf-8")
CHAPTER = ROOT / "chapters" / "01_dictionary.ipynb"
COLAB_PACKAGES = ["torch==2.13.0", "numpy", "matplotlib", "ipykernel"]
_COPY_IGNORE = shutil.ignore_patterns(".venv", ".git", "_build", "build", "*.egg-info", "__pycache__",
                                      ".pytest_cache", ".hypothesis", "test-artifacts", ".ipynb_checkpoints")


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def colab_env(tmp_path_factory):
    """A fresh venv with Colab's packages and attn_lib installed by the set-up cell."""
    tmp = tmp_path_factory.mktemp("colab")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--quiet", *COLAB_PACKAGES])
    probe = _run([str(python), "-c", "import importlib.util as u; print(u.find_spec('attn_lib') is None)"], cwd=tmp)
    assert probe.stdout.strip() == "True", "the fresh environment must not have attn_lib yet"

    checkout = tmp / "checkout"
    shutil.copytree(ROOT, checkout, ignore=_COPY_IGNORE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["ATTN_LIB_SOURCE"] = str(checkout)
    # The set-up cell itself, then the import a notebook's next cell does, in one process.
    code = SETUP_CELL + "\nimport attn_lib\nprint(attn_lib.__file__)\n"
    proc = _run([str(python), "-c", code], cwd=tmp, env=env)
    installed_at = Path(proc.stdout.strip().splitlines()[-1])
    assert venv in installed_at.parents, f"attn_lib was imported from {installed_at}, not from the new environment"
    yield {"tmp": tmp, "venv": venv, "python": python, "env": env, "checkout": checkout}
    shutil.rmtree(tmp, ignore_errors=True)  # about 1.5 GB (torch); pytest would keep the last three runs


def test_setup_cell_installs_attn_lib_into_a_fresh_environment(colab_env):
    python = colab_env["python"]
    # Running the cell a second time (attn_lib now importable) does nothing and prints nothing.
    again = _run([str(python), "-c", SETUP_CELL], cwd=colab_env["tmp"], env=colab_env["env"])
    assert again.stdout == "" and again.stderr == ""
    shown = _run([str(python), "-m", "pip", "show", "attn-lib"], cwd=colab_env["tmp"]).stdout
    assert "Name: attn-lib" in shown and "Editable project location" not in shown


def _stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == "stdout")


def test_a_chapter_runs_in_the_fresh_environment(colab_env, monkeypatch):
    if not CHAPTER.is_file():
        pytest.fail(f"{CHAPTER.relative_to(ROOT)} is missing: the Colab simulation runs that chapter")
    kernels = colab_env["tmp"] / "jupyter" / "kernels" / "colab-sim"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(colab_env["python"]), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Colab simulation", "language": "python",
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(colab_env["tmp"] / "jupyter"))
    monkeypatch.setenv("ATTN_LIB_SOURCE", str(colab_env["checkout"]))
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel picks the inline backend, as in Colab
    monkeypatch.delenv("PYTHONPATH", raising=False)

    committed = nbformat.read(CHAPTER, as_version=4)
    nb = nbformat.read(CHAPTER, as_version=4)
    workdir = colab_env["tmp"] / "run"
    workdir.mkdir()
    client = NotebookClient(nb, kernel_name="colab-sim", timeout=300, resources={"metadata": {"path": str(workdir)}})
    client.execute()  # raises CellExecutionError on any error

    probe = NotebookClient(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import attn_lib, sys; print(sys.prefix); print(attn_lib.__file__)")]),
        kernel_name="colab-sim", timeout=120, resources={"metadata": {"path": str(workdir)}})
    where = _stdout(probe.execute().cells[0]).split()
    assert where[0] == str(colab_env["venv"]) and str(colab_env["venv"]) in where[1], where

    compared, mismatched = 0, []
    code_cells = [(c, r) for c, r in zip(committed.cells, nb.cells) if c.cell_type == "code"]
    for i, (want, got) in enumerate(code_cells):
        if i == 0 or want.source.lstrip().startswith("# NBVAL_IGNORE_OUTPUT"):
            continue  # the set-up cell installs here (pip may talk); ignored cells vary by design
        stderr = [o.get("text", "") for o in got.get("outputs", []) if o.get("name") == "stderr"]
        assert not stderr, f"code cell {i} wrote to stderr in the fresh environment: {stderr}"
        if _stdout(want):
            compared += 1
            if _stdout(got) != _stdout(want):
                mismatched.append(f"code cell {i}:\n  committed: {_stdout(want)!r}\n  fresh env: {_stdout(got)!r}")
    assert compared >= 3, f"only {compared} cells print numbers to compare"
    assert not mismatched, "the fresh environment printed different numbers:\n" + "\n".join(mismatched)
