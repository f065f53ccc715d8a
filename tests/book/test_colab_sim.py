"""A Colab-like first start: every chapter runs in a fresh environment without attn_lib.

Google Colab has torch (with triton), numpy, matplotlib, ipykernel and ipywidgets, but not
attn_lib. This test builds such an environment once per test session (``python -m venv``,
then ``pip install`` of ``COLAB_PACKAGES``; torch 2.13.0 is the CPU build the machine's pip
finds on disk), runs the notebooks' set-up cell (scripts/setup_cell.py, the very text every
notebook starts with) with ``ATTN_LIB_SOURCE`` pointing at a copy of this checkout instead
of GitHub, checks that attn_lib was installed into that environment (a regular install, as
on Colab: no access to the repository's other files), and then executes EVERY chapter
(``chapters/*.ipynb``) with that environment's Python as the Jupyter kernel, from an empty
folder, as Colab opens a single notebook. Every checked cell (all but the set-up cell and
cells tagged ``nbval-ignore-output``) must print what the committed notebook shows, after
the same sanitising nbval applies (tests/sanitize.cfg), and nothing may go to stderr.

ModelScope (魔搭) is simulated after that, in the same environment with attn_lib uninstalled
again: a reader clones the repository into the instance and opens a chapter, so the set-up
cell runs with the kernel's working folder inside the clone (``chapters/``), no
``ATTN_LIB_SOURCE`` and no GitHub. pip is given no configuration at all (``PIP_CONFIG_FILE``
is the null device) except ``PIP_INDEX_URL``, a local index made here that holds only the
build back-end (setuptools): so the install can only succeed from the clone, through that
index, keeping the instance's torch (which the index does not have). Chapters 04 (figures, the
slider) and 08 (package data) then run from the clone and must print what is committed.

Speed: one environment for all chapters, which run one after another in this process's main
thread (several NotebookClients in threads can lose kernel messages and hang). A few minutes on
2 CPU cores, most of it installing torch.
"""
from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from book_helpers import COLAB_CHAPTERS as CHAPTERS
from book_helpers import COLAB_KERNEL_THREADS as KERNEL_THREADS
from book_helpers import ROOT, SETUP_CELL, UNCHECKED_TAGS, digest
# What Colab has preinstalled that the chapters use (torch's CUDA build brings triton there).
COLAB_PACKAGES = ["torch==2.13.0", "triton==3.7.1", "numpy", "matplotlib", "ipykernel", "ipywidgets"]
_COPY_IGNORE = shutil.ignore_patterns(".venv", ".git", "_build", "build", "*.egg-info", "__pycache__",
                                      ".pytest_cache", ".hypothesis", "test-artifacts", ".ipynb_checkpoints")


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kw)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _sanitizers() -> list[tuple[re.Pattern, str]]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "tests" / "sanitize.cfg", encoding="utf-8")
    return [(re.compile(cfg[s]["regex"]), cfg[s]["replace"]) for s in cfg.sections()]


SANITIZE = _sanitizers()


def _checked_text(cell) -> str:
    """What nbval compares for a cell: stdout and text/plain results, sanitised."""
    parts = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream" and o.get("name") == "stdout":
            parts.append(o.get("text", ""))
        elif o.get("output_type") in ("execute_result", "display_data") and "text/plain" in o.get("data", {}):
            if not any(k.startswith("image/") or k.startswith("application/vnd.jupyter.widget") for k in o["data"]):
                parts.append(o["data"]["text/plain"])
    text = "".join("".join(p) if isinstance(p, list) else p for p in parts)
    for pattern, replacement in SANITIZE:
        text = pattern.sub(replacement, text)
    return text


def test_there_are_chapters_to_run():
    assert len(CHAPTERS) >= 9, f"found only {len(CHAPTERS)} chapters/*.ipynb to run"


@pytest.fixture(scope="module")
def colab_env(tmp_path_factory):
    """A fresh venv with Colab's packages and attn_lib installed by the set-up cell."""
    tmp = tmp_path_factory.mktemp("colab")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--quiet", *COLAB_PACKAGES])
    # The environment's own view: no PYTHONPATH (a developer's export would show this checkout's attn_lib)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "MPLBACKEND")}
    probe = _run([str(python), "-c", "import importlib.util as u; print(u.find_spec('attn_lib') is None)"],
                 cwd=tmp, env=env)
    assert probe.stdout.strip() == "True", "the fresh environment must not have attn_lib yet"

    checkout = tmp / "checkout"
    shutil.copytree(ROOT, checkout, ignore=_COPY_IGNORE)
    env["ATTN_LIB_SOURCE"] = str(checkout)
    # The set-up cell itself, then the import a notebook's next cell does, in one process.
    code = SETUP_CELL + "\nimport attn_lib\nprint(attn_lib.__file__)\n"
    proc = _run([str(python), "-c", code], cwd=tmp, env=env)
    installed_at = Path(proc.stdout.strip().splitlines()[-1])
    assert venv in installed_at.parents, f"attn_lib was imported from {installed_at}, not from the new environment"

    kernels = tmp / "jupyter" / "kernels" / "colab-sim"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Colab simulation", "language": "python",
        "env": KERNEL_THREADS,  # the 1-thread pass of the book (see KERNEL_THREADS)
    }))
    yield {"tmp": tmp, "venv": venv, "python": python, "env": env, "checkout": checkout,
           "jupyter_path": str(tmp / "jupyter"), "install_output": proc.stdout}
    shutil.rmtree(tmp, ignore_errors=True)  # about 1.5 GB (torch); pytest would keep the last three runs


@pytest.mark.slow
def test_setup_cell_installs_attn_lib_into_a_fresh_environment(colab_env):
    python = colab_env["python"]
    # Installing, the cell said so in one line (pip's own output, with -q, goes nowhere or to stderr).
    version = _run([str(python), "-c", "import importlib.metadata as m; print(m.version('attn-lib'))"],
                   cwd=colab_env["tmp"], env=colab_env["env"]).stdout.strip()
    said = colab_env["install_output"].splitlines()[0]
    assert said == f"正在安装 attn_lib 及其依赖（来自 {colab_env['checkout']}，含中文字体）……完成（attn_lib {version}）", said
    # Running the cell a second time (attn_lib now importable) does nothing and prints nothing.
    again = _run([str(python), "-c", SETUP_CELL], cwd=colab_env["tmp"], env=colab_env["env"])
    assert again.stdout == "" and again.stderr == ""
    shown = _run([str(python), "-m", "pip", "show", "attn-lib"], cwd=colab_env["tmp"], env=colab_env["env"]).stdout
    assert "Name: attn-lib" in shown and "Editable project location" not in shown
    # The package data a chapter reads (chapter 08's benchmark table) came with the install.
    data = _run([str(python), "-c", "from attn_lib.data.tables import load_cpu_bench, load_cpu_backward_bench, "
                 "load_cpu_decode_bench; print(len(load_cpu_bench()['results']), len(load_cpu_backward_bench()['results']), "
                 "len(load_cpu_decode_bench()['results']))"],
                cwd=colab_env["tmp"], env=colab_env["env"]).stdout
    assert all(int(n) > 0 for n in data.split())


@pytest.mark.parametrize("shipped_name, measured_name", [("cpu_bench.json", "cpu.json"),
                                                         ("cpu_backward_bench.json", "cpu_backward.json"),
                                                         ("cpu_decode_bench.json", "cpu_decode.json")])
def test_packaged_benchmark_table_matches_the_measured_one(shipped_name, measured_name):
    shipped = json.loads((ROOT / "attn_lib" / "data" / shipped_name).read_text(encoding="utf-8"))
    measured = json.loads((ROOT / "bench" / "results" / measured_name).read_text(encoding="utf-8"))
    assert shipped == measured, (f"attn_lib/data/{shipped_name} differs from bench/results/{measured_name}: "
                                 f"cp bench/results/{measured_name} attn_lib/data/{shipped_name}")


# Every chapter runs in seconds. Chapter 04's slider used to stall now and then until this
# timeout and then go on, with no error. The cause is nbclient, not the chapter: for a cell that
# draws into an ipywidgets Output widget (``widgets.interact``: chapters 04, 07, 08), nbclient
# emulates the widget and, while the cell runs, sends comm messages to the kernel on the shell
# socket, the socket on which it is awaiting the cell's execute reply. Such a send can swallow
# the edge-triggered ZMQ wake-up for the reply, which then sits unread until the poll's timeout
# fires (measured: kernel and client both idle in select(); the cell took exactly the timeout;
# about 1 slider cell in 30-40 under load). A browser front end does not do this. So the
# simulation turns the emulation off (``widget_registry = {}``): nothing is sent mid-cell and a
# widget's figure lands in the cell's own outputs (test_widget_cells_ran_without_output_widget_emulation).
CELL_TIMEOUT_S = 120


def _client(nb, workdir: Path) -> NotebookClient:
    client = NotebookClient(nb, kernel_name="colab-sim", timeout=CELL_TIMEOUT_S,
                            resources={"metadata": {"path": str(workdir)}})
    client.widget_registry = {}  # no Output-widget emulation: see CELL_TIMEOUT_S
    return client


def _execute(chapter: Path, colab_env, workdir: Path | None = None) -> tuple[nbformat.NotebookNode, nbformat.NotebookNode]:
    committed = nbformat.read(chapter, as_version=4)
    nb = nbformat.read(chapter, as_version=4)
    if workdir is None:
        workdir = colab_env["tmp"] / "run" / chapter.stem  # an empty folder: no repository around it
        workdir.mkdir(parents=True)
    _client(nb, workdir).execute()  # raises CellExecutionError on any error
    return committed, nb


@pytest.fixture(scope="module")
def executed(colab_env):
    """Every chapter executed in the Colab-like kernel: {name: (committed, executed) or error}."""
    env_backup = {k: os.environ.get(k) for k in ("JUPYTER_PATH", "ATTN_LIB_SOURCE", "MPLBACKEND", "PYTHONPATH")}
    os.environ["JUPYTER_PATH"] = colab_env["jupyter_path"]
    os.environ["ATTN_LIB_SOURCE"] = str(colab_env["checkout"])
    os.environ.pop("MPLBACKEND", None)  # the kernel picks the inline backend, as in Colab
    os.environ.pop("PYTHONPATH", None)

    def one(chapter: Path):
        try:
            return chapter.name, _execute(chapter, colab_env)
        except Exception as exc:  # reported by the chapter's own test
            return chapter.name, exc

    before = digest(CHAPTERS)
    try:
        results = dict(one(chapter) for chapter in CHAPTERS)
        results["digests"] = (before, digest(CHAPTERS))
    finally:
        for k, v in env_backup.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return results


def _compare(chapter: Path, result, where: str) -> None:
    """The executed chapter printed what the committed one shows (checked cells), nothing on stderr."""
    if isinstance(result, Exception):
        pytest.fail(f"{chapter.name} failed in the {where} environment: {str(result)[-3000:]}")
    committed, nb = result
    compared, mismatched = 0, []
    code_cells = [(c, r) for c, r in zip(committed.cells, nb.cells) if c.cell_type == "code"]
    for i, (want, got) in enumerate(code_cells):
        stderr = [o.get("text", "") for o in got.get("outputs", []) if o.get("name") == "stderr"]
        if i == 0:
            continue  # the set-up cell installs here (pip may talk)
        assert not stderr, f"{chapter.name} code cell {i} wrote to stderr in the {where} environment: {stderr}"
        if UNCHECKED_TAGS & set(want.metadata.get("tags", [])):
            continue  # ignored cells vary by design
        if _checked_text(want):
            compared += 1
            if _checked_text(got) != _checked_text(want):
                mismatched.append(f"code cell {i}:\n  committed: {_checked_text(want)!r}\n  {where}: {_checked_text(got)!r}")
    assert compared >= 1, f"{chapter.name}: no cell prints anything to compare"
    assert not mismatched, f"{chapter.name}: the {where} environment printed different output:\n" + "\n".join(mismatched)


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_chapter_runs_in_the_fresh_environment(executed, colab_env, chapter):
    _compare(chapter, executed[chapter.name], "Colab-like")


@pytest.mark.slow
def test_widget_cells_ran_without_output_widget_emulation(executed):
    """The slider's figure is the cell's own output (nbclient mirrored nothing into the kernel)."""
    result = executed["04_scaling.ipynb"]
    if isinstance(result, Exception):
        pytest.fail(f"04_scaling.ipynb failed: {str(result)[-2000:]}")
    _, nb = result
    slider = [c for c in nb.cells if c.cell_type == "code" and "widgets.interact(" in c.source]
    assert len(slider) == 1
    kinds = [k for o in slider[0].outputs for k in o.get("data", {})]
    assert "application/vnd.jupyter.widget-view+json" in kinds and "image/png" in kinds, kinds


@pytest.mark.slow
def test_running_the_chapters_left_the_committed_files_untouched(executed):
    before, after = executed["digests"]
    assert len(before) == len(CHAPTERS) and after == before, "running the chapters changed the committed files"


@pytest.mark.slow
def test_chapters_ran_on_the_fresh_environment_s_attn_lib(executed, colab_env):
    probe = NotebookClient(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import attn_lib, sys, torch; print(sys.prefix); print(attn_lib.__file__); print(torch.get_num_threads())")]),
        kernel_name="colab-sim", timeout=120, resources={"metadata": {"path": str(colab_env["tmp"])}})
    old = {k: os.environ.get(k) for k in ("JUPYTER_PATH", "PYTHONPATH")}
    os.environ["JUPYTER_PATH"] = colab_env["jupyter_path"]
    os.environ.pop("PYTHONPATH", None)  # the kernel must see only the fresh environment
    try:
        cell = probe.execute().cells[0]
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    where = "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout").split()
    assert where[0] == str(colab_env["venv"]) and str(colab_env["venv"]) in where[1], where
    assert where[2] == "1", f"the simulation's kernels must run torch with 1 thread (the 1-thread pass), found {where[2]}"


# --- ModelScope (魔搭): the reader clones the repository into the instance and opens a chapter ---
MODELSCOPE_CHAPTERS = ["04_scaling.ipynb", "08_flash_attention.ipynb"]
_PIP_VARS = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_CONFIG_FILE",
             "PIP_CONSTRAINT", "PIP_LOG", "ATTN_LIB_SOURCE", "JUPYTER_PATH", "MPLBACKEND", "PYTHONPATH")


def _local_index(tmp: Path) -> Path:
    """A PEP 503 index holding only setuptools (the clone's build back-end), fetched with this machine's pip set-up."""
    wheels = tmp / "wheels"
    _run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--no-deps",
          "--dest", str(wheels), "setuptools>=61"])
    root = tmp / "index" / "simple"
    (root / "setuptools").mkdir(parents=True)
    links = "".join(f'<a href="{w.resolve().as_uri()}">{w.name}</a>\n' for w in sorted(wheels.glob("setuptools-*.whl")))
    assert links, "no setuptools wheel downloaded"
    (root / "setuptools" / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    (root / "index.html").write_text('<!DOCTYPE html><html><body><a href="setuptools/">setuptools</a></body></html>\n')
    return root


def _torch_record(python, env) -> str:
    code = "import importlib.metadata as m; d = m.distribution('torch'); print(d.version, d.locate_file(''))"
    return _run([str(python), "-c", code], env=env).stdout.strip()


@pytest.fixture(scope="module")
def modelscope_run(executed, colab_env):
    """attn_lib uninstalled again; chapters run from a clone with only PIP_INDEX_URL (a local index) for pip."""
    python, tmp = colab_env["python"], colab_env["tmp"]
    env = colab_env["env"]
    _run([str(python), "-m", "pip", "uninstall", "--yes", "--quiet", "attn-lib"], env=env)
    probe = _run([str(python), "-c", "import importlib.util as u; print(u.find_spec('attn_lib') is None)"],
                 cwd=tmp, env=env)
    assert probe.stdout.strip() == "True", "attn_lib must be gone before the ModelScope run"
    torch_before = _torch_record(python, env)
    clone = tmp / "modelscope" / "attention-chapter"
    shutil.copytree(ROOT, clone, ignore=_COPY_IGNORE)
    index = _local_index(tmp / "modelscope")
    pip_log = tmp / "modelscope" / "pip.log"
    backup = {k: os.environ.get(k) for k in _PIP_VARS}
    for k in _PIP_VARS:
        os.environ.pop(k, None)
    os.environ.update({"JUPYTER_PATH": colab_env["jupyter_path"], "PIP_CONFIG_FILE": os.devnull,
                       "PIP_INDEX_URL": index.as_uri(), "PIP_LOG": str(pip_log)})
    results = {}
    try:
        for name in MODELSCOPE_CHAPTERS:
            chapter = clone / "chapters" / name
            try:  # the kernel's working folder is the notebook's own, inside the clone
                results[name] = _execute(chapter, colab_env, workdir=chapter.parent)
            except Exception as exc:  # reported by the chapter's own test
                results[name] = exc
    finally:
        for k, v in backup.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {"results": results, "clone": clone, "index": index, "pip_log": pip_log,
            "torch_before": torch_before, "torch_after": _torch_record(python, env)}


@pytest.mark.slow
def test_modelscope_setup_cell_installed_from_the_clone_through_the_index(modelscope_run, colab_env):
    python = colab_env["python"]
    code = ("import importlib.metadata as m, json; d = m.distribution('attn-lib'); "
            "print(json.loads(d.read_text('direct_url.json'))['url']); print(d.locate_file(''))")
    url, location = _run([str(python), "-c", code], cwd=colab_env["tmp"], env=colab_env["env"]).stdout.split()
    assert url == modelscope_run["clone"].as_uri(), f"attn_lib was installed from {url}"
    assert str(colab_env["venv"]) in location  # a regular install into the instance's environment
    log = modelscope_run["pip_log"].read_text(encoding="utf-8", errors="replace")
    assert f"Looking in indexes: {modelscope_run['index'].as_uri()}" in log, "pip did not use PIP_INDEX_URL"
    assert "github.com" not in log


@pytest.mark.slow
def test_modelscope_keeps_the_instance_s_torch(modelscope_run):
    assert modelscope_run["torch_after"] == modelscope_run["torch_before"]


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELSCOPE_CHAPTERS)
def test_chapter_runs_from_a_clone_on_modelscope(modelscope_run, name):
    _compare(ROOT / "chapters" / name, modelscope_run["results"][name], "ModelScope-like")
