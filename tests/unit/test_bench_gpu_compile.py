"""bench/gpu.py --compile-only SM without a GPU: attn_lib's launchers run for a GPU of compute capability SM with
every kernel compiled by Triton instead of launched. Checked: every kernel the launchers start (forward, the
backward's preprocess, dK/dV and dQ, the decode split and merge) is compiled and reports its shared memory
within the SM's limit, each launcher tries its configurations in the order of attn_lib.flash.triton.configs, and a
configuration over the limit makes the launcher go on to the next one, as OutOfResources does on a GPU.
Each compile runs in a subprocess (this process's Triton is in interpreter mode)."""
import importlib.util as iu
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attn_lib.flash.triton.configs import candidate_configs, decode_configs

pytestmark = pytest.mark.skipif(iu.find_spec("triton") is None, reason="triton is not installed")

ROOT = Path(__file__).resolve().parents[2]
GPU_PATH = ROOT / "bench" / "gpu.py"
_spec = iu.spec_from_file_location("bench_gpu_compile_only", GPU_PATH)
gpu = iu.module_from_spec(_spec)
_spec.loader.exec_module(gpu)

LINE = re.compile(r"^\s+(\w+) D=(\d+)\s+(\w+)\s+((?:BLOCK_\w+=\d+ )+)stages=(\d+) warps=(\d+):\s+(\d+) bytes(.*)$")
KERNELS = [name for names in gpu.LAUNCHED_KERNELS.values() for name in names]
# A limit below the decode split kernel's first configuration (fp16, D = 64, sm_80: BLOCK_N = 128, 38912
# bytes in the full run) and above its second (BLOCK_N = 64).
DECODE_LIMIT = 30000


def compiled(stdout: str) -> list:
    """The printed kernels: dicts with dtype, D, kernel, blocks, stages, warps, shared, fits."""
    rows = []
    for line in stdout.splitlines():
        m = LINE.match(line)
        if m:
            blocks = dict(pair.split("=") for pair in m.group(4).split())
            rows.append(dict(dtype=m.group(1), D=int(m.group(2)), kernel=m.group(3),
                             blocks={k: int(v) for k, v in blocks.items()}, stages=int(m.group(5)),
                             warps=int(m.group(6)), shared=int(m.group(7)), fits="over the limit" not in m.group(8)))
    return rows


def run(code: str):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="0", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                          cwd=ROOT)


def compile_only(sm: int, dtype: str, D: int, *, limit: int | None = None, decode_only: bool = False):
    """bench/gpu.py's compile_only in a fresh process (Triton compiled mode), the SM's limit optionally replaced."""
    code = (f"import importlib.util as iu, sys\nspec = iu.spec_from_file_location('gpu', {str(GPU_PATH)!r})\n"
            "gpu = iu.module_from_spec(spec); spec.loader.exec_module(gpu)\n"
            + (f"gpu.MAX_SHARED[{sm}] = {limit}\n" if limit is not None else "")
            + f"sys.exit(gpu.compile_only({sm}, [{D}], [{dtype!r}], decode_only={decode_only}))\n")
    return run(code)


def first(D: int, dtype, kind: str, cap: tuple) -> dict:
    cfg = candidate_configs(D, D, dtype, False, kind=kind, capability=cap)[0]
    return {k: cfg[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_DV")}


# sm_75 bf16 (its dots in fp32, DOT_FP32) compiles for half a minute with a cold Triton cache: slow.
@pytest.mark.parametrize("sm,dtype", [(80, "float16"), pytest.param(75, "bfloat16", marks=pytest.mark.slow)])
def test_every_kernel_compiles_within_the_shared_memory_limit(sm, dtype):
    D, cap = 64, (sm // 10, sm % 10)
    res = subprocess.run([sys.executable, str(GPU_PATH), "--compile-only", str(sm), "--dtypes", dtype,
                          "--head-dims", str(D)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"), cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = compiled(res.stdout)
    assert [r["kernel"] for r in rows if r["fits"]] == KERNELS  # each launched once, in the launchers' order
    limit = gpu.MAX_SHARED[sm]
    for r in rows:
        assert (r["dtype"], r["D"]) == (dtype, D)
        assert 0 < r["shared"] and (r["shared"] <= limit) == r["fits"], r
    # bf16 on sm_75 has no bf16 tl.dot: the launchers' rule (attn_lib.rules.numerics.dot_fp32) says DOT_FP32.
    assert f"# {dtype}: DOT_FP32={sm < 80 and dtype == 'bfloat16'}" in res.stdout
    tdtype = getattr(torch, dtype)
    rows_per_group = gpu.DECODE_SHAPE[1] // gpu.DECODE_SHAPE[2] * gpu.DECODE_SHAPE[3]  # G * L
    configs = {kernel: candidate_configs(D, D, tdtype, False, kind=kind, capability=cap)
               for kernel, kind in (("_attn_fwd", "fwd"), ("_attn_bwd_dkdv", "dkdv"), ("_attn_bwd_dq", "dq"))}
    configs["_decode_split"] = decode_configs(rows_per_group, D, D, tdtype, False, capability=cap)
    for kernel, cfgs in configs.items():  # the configurations tried, in attn_lib.flash.triton.configs's order
        tried = [r for r in rows if r["kernel"] == kernel]
        assert [(r["blocks"], r["stages"], r["warps"]) for r in tried] == [
            ({k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_DV")}, c["num_stages"], c["num_warps"])
            for c in cfgs[:len(tried)]]


def test_a_kernel_over_the_limit_makes_the_launcher_try_its_next_configuration():
    res = compile_only(80, "float16", 64, limit=DECODE_LIMIT, decode_only=True)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = compiled(res.stdout)
    splits = [r for r in rows if r["kernel"] == "_decode_split"]
    want = [c["BLOCK_N"] for c in decode_configs(4, 64, 64, torch.float16, False, capability=(8, 0))][:2]
    assert [r["blocks"]["BLOCK_N"] for r in splits] == want  # 128 tried first, then 64
    assert not splits[0]["fits"] and splits[0]["shared"] > DECODE_LIMIT
    assert splits[1]["fits"] and splits[1]["shared"] <= DECODE_LIMIT
    assert [r["kernel"] for r in rows if r["fits"]] == ["_decode_split", "_decode_merge"]


def test_no_configuration_fits_exits_1_naming_the_launcher():
    res = compile_only(80, "float16", 64, limit=100, decode_only=True)
    assert res.returncode == 1
    assert "no configuration of the float16 D=64 decode launcher fits sm_80" in res.stderr
    splits = [r for r in compiled(res.stdout) if r["kernel"] == "_decode_split"]
    assert len(splits) == len(decode_configs(4, 64, 64, torch.float16, False, capability=(8, 0)))
    assert not any(r["fits"] for r in splits)


def test_unknown_sm_and_interpreter_mode_are_refused():
    assert gpu.compile_only(70, [64], ["float16"]) == 2  # no limit known for sm_70
    res = run(f"import os, sys\nos.environ['TRITON_INTERPRET'] = '1'\nsys.argv = [{str(GPU_PATH)!r}]\n"
              "import runpy; g = runpy.run_path(sys.argv[0])\n"
              "sys.exit(g['compile_only'](80, [64], ['float16']))\n")
    assert res.returncode == 2 and "interpreter mode" in res.stderr
