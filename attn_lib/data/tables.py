"""第 8–13 章（随包安装的测量结果）：第 08 章读前向的基准测试表画图，第 09 章读前向 + 反向的表，第 10–12 章读多种子实验的结果，第 13 章读解码步的表。

``bench/cpu.py`` writes its measurements to ``bench/results/cpu.json`` in the repository.
A copy ships inside the package as ``attn_lib/data/cpu_bench.json`` (``package-data`` in
pyproject.toml), so that chapter 08 reads the table with ``importlib.resources`` wherever
attn_lib is installed, also when Colab opens the notebook alone, without the repository.
The same holds for ``bench/cpu.py --backward`` (``bench/results/cpu_backward.json``, shipped as
``attn_lib/data/cpu_backward_bench.json``, read by chapter 09). After re-running a benchmark,
copy the file: ``cp bench/results/cpu.json attn_lib/data/cpu_bench.json`` or
``cp bench/results/cpu_backward.json attn_lib/data/cpu_backward_bench.json``
(tests/book/test_colab_sim.py checks that each pair is identical). Chapter 13 reads the decode-step
table of ``bench/decode.py`` (``bench/results/cpu_decode.json``, shipped as
``attn_lib/data/cpu_decode_bench.json``: ``cp bench/results/cpu_decode.json attn_lib/data/cpu_decode_bench.json``).

``attn_lib/data/seed_study.json`` is the result of ``attn_lib.models.seed_study.seed_study()`` (20
trainings of chapter 10's tiny model), written by ``scripts/make_seed_study.py``; chapters 10
to 12 read it with ``load_seed_study`` instead of training for minutes, and
``tests/book/test_packaged_seed_study.py`` recomputes it and checks the file equals the fresh result.
"""
from __future__ import annotations

import json
from importlib import resources
from typing import Any

CPU_BENCH_RESOURCE = "cpu_bench.json"
CPU_BACKWARD_BENCH_RESOURCE = "cpu_backward_bench.json"
SEED_STUDY_RESOURCE = "seed_study.json"
CPU_DECODE_BENCH_RESOURCE = "cpu_decode_bench.json"


def _load(name: str) -> dict[str, Any]:
    return json.loads(resources.files("attn_lib.data").joinpath(name).read_text(encoding="utf-8"))


def load_cpu_backward_bench() -> dict[str, Any]:
    """读出随包安装的 CPU 前向 + 反向基准测试结果（``bench/cpu.py --backward`` 测得的那张表）。

    Returns:
        The JSON object of ``bench/results/cpu_backward.json``: ``machine``, ``command`` and
        ``results`` (one dict per implementation ``"sdpa"`` / ``"tiled"``, length ``N`` and
        causal flag, with ``time_s`` and ``peak_extra_mib``).
    """
    return _load(CPU_BACKWARD_BENCH_RESOURCE)


def load_cpu_bench() -> dict[str, Any]:
    """读出随包安装的 CPU 基准测试结果（bench/cpu.py 测得的那张表）。

    Returns:
        The JSON object of ``bench/results/cpu.json``: ``machine`` (where it was measured),
        ``config``, ``command`` and ``results`` (one dict per implementation, length and
        causal flag, with ``time_s`` and ``peak_extra_mib``).
    """
    return _load(CPU_BENCH_RESOURCE)


def load_cpu_decode_bench() -> dict[str, Any]:
    """读出随包安装的 CPU 解码步基准测试结果（``bench/decode.py`` 测得的那张表，第 13 章读）。

    Returns:
        The JSON object of ``bench/results/cpu_decode.json`` as ``bench/decode.py`` wrote it
        (where it was measured, the command, and one entry per implementation and cache length).
    """
    return _load(CPU_DECODE_BENCH_RESOURCE)


def load_seed_study() -> dict[str, Any]:
    """读出随包安装的多种子实验结果（``scripts/make_seed_study.py`` 用 ``seed_study()`` 算出的那份）。

    Returns:
        The JSON object of ``attn_lib/data/seed_study.json``: ``machine`` (where it was run),
        ``command``, ``threads``, ``seconds`` (how long the study took there) and ``results``
        (what ``attn_lib.models.seed_study.seed_study()`` returned: a dict of lists, one entry per seed).
    """
    return _load(SEED_STUDY_RESOURCE)
