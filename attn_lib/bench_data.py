"""第 8、9 章（基准测试的测量结果）：随 attn_lib 一起安装，第 08 章读前向的表画图，第 09 章读前向 + 反向的表。

``bench/cpu.py`` writes its measurements to ``bench/results/cpu.json`` in the repository.
A copy ships inside the package as ``attn_lib/data/cpu_bench.json`` (``package-data`` in
pyproject.toml), so that chapter 08 reads the table with ``importlib.resources`` wherever
attn_lib is installed, also when Colab opens the notebook alone, without the repository.
The same holds for ``bench/cpu.py --backward`` (``bench/results/cpu_backward.json``, shipped as
``attn_lib/data/cpu_backward_bench.json``, read by chapter 09). After re-running a benchmark,
copy the file: ``cp bench/results/cpu.json attn_lib/data/cpu_bench.json`` or
``cp bench/results/cpu_backward.json attn_lib/data/cpu_backward_bench.json``
(tests/test_colab_sim.py checks that each pair is identical).
"""
from __future__ import annotations

import json
from importlib import resources
from typing import Any

CPU_BENCH_RESOURCE = "cpu_bench.json"
CPU_BACKWARD_BENCH_RESOURCE = "cpu_backward_bench.json"


def _load(name: str) -> dict[str, Any]:
    return json.loads(resources.files("attn_lib").joinpath("data", name).read_text(encoding="utf-8"))


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
