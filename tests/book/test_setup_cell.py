"""The notebooks' set-up cell: identical everywhere, pointing at the repository, silent locally.

scripts/setup_cell.py is the one source of the cell. Every chapters/*.ipynb must start with
it verbatim as its first code cell; the repository it installs from must be _config.yml's
``repository.url`` (the one place the URL is set). Where attn_lib is importable the cell
prints nothing and runs nothing (so nbval's committed outputs stay identical); where it is
not, it runs exactly one pip command: from ATTN_LIB_SOURCE when set, else from the clone of
this repository the notebook runs in (ModelScope), else from GitHub (Colab). While it installs
it prints one line: 「正在安装 attn_lib 及其依赖（来自 <source>，含中文字体）……」 before pip starts (so the
reader sees it during the install), then 「完成（attn_lib <version>）」 on the same line. It never runs
apt (the CJK font ships with attn_lib), and on a torch older than the floor it stops with the
version needed instead of installing.
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import os
import re
import subprocess
import sys
import types

import pytest
import yaml

from book_helpers import NOTEBOOKS, ROOT, SETUP_CELL, read_notebook


def test_there_are_notebooks():
    assert NOTEBOOKS, "no chapters/*.ipynb found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_first_code_cell_is_the_setup_cell_verbatim(path):
    nb = read_notebook(path)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path.name} has no code cell"
    first = code[0].source
    # Verbatim: only a trailing newline (invisible in a notebook) may differ.
    assert first.rstrip("\n") == SETUP_CELL.rstrip("\n"), (
        f"{path.name}: the first code cell is not scripts/setup_cell.py verbatim; paste the file's text"
    )
    assert not code[0].get("outputs"), f"{path.name}: the set-up cell printed something locally"


def test_setup_cell_installs_from_the_configured_repository():
    url = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["repository"]["url"]
    found = re.findall(r"git\+(https://[^\s\"']+)", SETUP_CELL)
    assert found, "the set-up cell has no git+https:// install URL"
    assert all(u.rstrip("/").removesuffix(".git") == url.rstrip("/") for u in found), (
        f"the set-up cell installs from {found}, but _config.yml's repository.url is {url}"
    )


def _exec_cell(monkeypatch, *, importable: bool, env_source: str | None = None, colab: bool = False,
               torch_version: str | None = "2.13.0", attn_lib_version: str | None = "0.1.0"):
    """Run the cell's text in this process with subprocess.run recorded instead of executed.

    Each recorded call is (args, kwargs, what the cell had printed to stdout when it ran pip).
    """
    calls = []
    real_version = importlib.metadata.version
    fakes = {"torch": torch_version, "attn-lib": attn_lib_version}
    out, err = io.StringIO(), io.StringIO()

    def fake_version(name):
        if name not in fakes:
            return real_version(name)
        if fakes[name] is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return fakes[name]

    monkeypatch.setattr(importlib.metadata, "version", fake_version)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append((a, k, out.getvalue())) or
                        subprocess.CompletedProcess(a[0] if a else None, 0))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (real_find_spec(name, *a) if importable or name != "attn_lib" else None))
    if env_source is None:
        monkeypatch.delenv("ATTN_LIB_SOURCE", raising=False)
    else:
        monkeypatch.setenv("ATTN_LIB_SOURCE", env_source)
    if colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    namespace: dict = {}
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        exec(compile(SETUP_CELL, "setup_cell.py", "exec"), namespace)
    return calls, out.getvalue(), err.getvalue()


def test_setup_cell_does_nothing_when_attn_lib_is_importable(monkeypatch):
    assert importlib.util.find_spec("attn_lib") is not None
    calls, out, err = _exec_cell(monkeypatch, importable=True, colab=True)
    assert calls == [] and out == "" and err == ""


def test_setup_cell_is_silent_in_a_real_interpreter():
    """The same in a fresh Python process of this environment (what a kernel sees)."""
    proc = subprocess.run([sys.executable, "-c", SETUP_CELL], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", proc


def test_setup_cell_installs_from_github_when_attn_lib_is_missing(monkeypatch, tmp_path):
    url = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["repository"]["url"]
    monkeypatch.chdir(tmp_path)  # outside any clone of the repository (Colab opens a lone notebook)
    calls, out, err = _exec_cell(monkeypatch, importable=False)
    assert len(calls) == 1, calls
    cmd = calls[0][0][0]
    assert cmd == [sys.executable, "-m", "pip", "install", "-q", f"git+{url}"]
    assert calls[0][1].get("check") is True
    assert out == f"正在安装 attn_lib 及其依赖（来自 git+{url}，含中文字体）……完成（attn_lib 0.1.0）\n" and err == ""


def test_setup_cell_says_what_it_installs_before_pip_runs(monkeypatch, tmp_path):
    """The line's start is printed (and flushed) before pip starts; the end, on the same line, after."""
    monkeypatch.chdir(tmp_path)
    calls, out, _ = _exec_cell(monkeypatch, importable=False, env_source="/some/attn_lib")
    assert calls[0][2] == "正在安装 attn_lib 及其依赖（来自 /some/attn_lib，含中文字体）……"
    assert out == calls[0][2] + "完成（attn_lib 0.1.0）\n" and out.count("\n") == 1
    _, out, _ = _exec_cell(monkeypatch, importable=False, env_source="/some/attn_lib", attn_lib_version=None)
    assert out == "正在安装 attn_lib 及其依赖（来自 /some/attn_lib，含中文字体）……完成\n"


def test_setup_cell_line_reaches_the_terminal_before_pip_in_a_real_interpreter(tmp_path):
    """A fresh process, stdout a pipe (block-buffered, as in a kernel): pip, here a stand-in that reads what the
    pipe has received so far, sees the start of the line already; the whole output is that one line."""
    seen = tmp_path / "seen_by_pip.txt"
    stand_in = (f"def _pip(cmd, **k):\n    import time; time.sleep(0.5)\n"
                f"    open({str(seen)!r}, 'w').write(str(cmd))\n")
    code = ("import subprocess, importlib.util\nimportlib.util.find_spec = lambda name, *a: None\n"
            + stand_in + "subprocess.run = _pip\n" + SETUP_CELL)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as a kernel's stdout
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=tmp_path, env={**env, "ATTN_LIB_SOURCE": "/x"}, bufsize=0)
    start = "正在安装 attn_lib 及其依赖（来自 /x，含中文字体）……".encode()
    first = b""
    while len(first) < len(start):  # arrives while pip is still "running"
        chunk = os.read(proc.stdout.fileno(), len(start) - len(first))
        assert chunk, f"the process ended after printing only {first.decode()!r}"
        first += chunk
    assert not seen.exists() and first == start
    rest, err = proc.communicate(timeout=120)
    version = importlib.metadata.version("attn-lib")
    assert proc.returncode == 0 and err == b"", err
    assert (first + rest).decode() == f"正在安装 attn_lib 及其依赖（来自 /x，含中文字体）……完成（attn_lib {version}）\n"
    assert "pip" in seen.read_text(encoding="utf-8")


def test_setup_cell_honours_attn_lib_source(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT / "chapters")  # even inside a clone, the explicit source wins
    calls, _, _ = _exec_cell(monkeypatch, importable=False, env_source=str(tmp_path))
    assert [c[0][0] for c in calls] == [[sys.executable, "-m", "pip", "install", "-q", str(tmp_path)]]


def _fake_clone(root):
    (root / "attn_lib").mkdir(parents=True)
    (root / "attn_lib" / "__init__.py").write_text("", encoding="utf-8")
    (root / "pyproject.toml").write_text("[project]\nname = 'attn-lib'\n", encoding="utf-8")
    (root / "chapters").mkdir()
    return root


def test_setup_cell_installs_from_the_clone_it_runs_in(monkeypatch, tmp_path):
    """ModelScope: the reader clones the repository and opens chapters/NN.ipynb (the kernel's cwd)."""
    clone = _fake_clone(tmp_path / "attention-chapter")
    monkeypatch.chdir(clone / "chapters")
    calls, out, err = _exec_cell(monkeypatch, importable=False)
    assert [c[0][0] for c in calls] == [[sys.executable, "-m", "pip", "install", "-q", str(clone)]]
    assert out == f"正在安装 attn_lib 及其依赖（来自 {clone}，含中文字体）……完成（attn_lib 0.1.0）\n" and err == ""
    monkeypatch.chdir(clone)  # a notebook opened at the clone's top folder finds it too
    calls, _, _ = _exec_cell(monkeypatch, importable=False)
    assert [c[0][0][-1] for c in calls] == [str(clone)]


def test_setup_cell_never_runs_apt(monkeypatch, tmp_path):
    """The CJK font ships with attn_lib (attn_lib/data/fonts/): no apt-get on Colab or anywhere."""
    monkeypatch.chdir(tmp_path)
    for colab in (True, False):
        calls, _, _ = _exec_cell(monkeypatch, importable=False, colab=colab)
        assert len(calls) == 1 and calls[0][0][0][:4] == [sys.executable, "-m", "pip", "install"], calls
    assert "apt-get" not in SETUP_CELL


@pytest.mark.parametrize("old", ["2.4.1", "2.1.0+cu121", "1.13.1"])
def test_setup_cell_stops_on_a_torch_below_the_floor(monkeypatch, tmp_path, old):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError) as info:
        _exec_cell(monkeypatch, importable=False, torch_version=old)
    message = str(info.value)
    assert f"torch 2.5 或更新的版本，这里是 {old}" in message and 'pip install -U "torch>=2.5"' in message


@pytest.mark.parametrize("ok", ["2.5.0", "2.5.1+cu124", "2.13.0", "3.0.0"])
def test_setup_cell_keeps_a_torch_that_meets_the_floor(monkeypatch, tmp_path, ok):
    """A runtime's own torch (Colab's, ModelScope's CUDA build) is kept: pip installs attn_lib only."""
    monkeypatch.chdir(tmp_path)
    calls, _, _ = _exec_cell(monkeypatch, importable=False, torch_version=ok)
    assert len(calls) == 1 and not any("torch" in part for part in calls[0][0][0])


def test_setup_cell_installs_where_torch_is_missing(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    calls, _, _ = _exec_cell(monkeypatch, importable=False, torch_version=None)
    assert len(calls) == 1  # pip brings torch as attn_lib's dependency
