"""基准测试的测量结果，随 attn_lib 一起安装（第 08 章读它画图）。

``bench/cpu.py`` writes its measurements to ``bench/results/cpu.json`` in the repository.
A copy ships inside the package as ``attn_lib/data/cpu_bench.json`` (``package-data`` in
pyproject.toml), so that chapter 08 reads the table with ``importlib.resources`` wherever
attn_lib is installed, also when Colab opens the notebook alone, without the repository.
After re-running the benchmark, copy the file:
``cp bench/results/cpu.json attn_lib/data/cpu_bench.json`` (tests/test_colab_sim.py checks
that the two are identical).
"""
from __future__ import annotations

import json
from importlib import resources
from typing import Any

CPU_BENCH_RESOURCE = "cpu_bench.json"


def load_cpu_bench() -> dict[str, Any]:
    """读出随包安装的 CPU 基准测试结果（bench/cpu.py 测得的那张表）。

    Returns:
        The JSON object of ``bench/results/cpu.json``: ``machine`` (where it was measured),
        ``config``, ``command`` and ``results`` (one dict per implementation, length and
        causal flag, with ``time_s`` and ``peak_extra_mib``).
    """
    text = resources.files("attn_lib").joinpath("data", CPU_BENCH_RESOURCE).read_text(encoding="utf-8")
    return json.loads(text)
