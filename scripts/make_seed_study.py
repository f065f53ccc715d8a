"""Run chapter 10's seed study and write attn_lib/data/seed_study.json (read by chapters 10 to 12).

    python scripts/make_seed_study.py            # writes attn_lib/data/seed_study.json
    python scripts/make_seed_study.py --out x.json

Sets torch to one thread first (the study itself changes no process-wide setting): with one
thread the float64 training is bit-identical whatever the machine's core count, and
tests/book/test_packaged_seed_study.py recomputes the study this way and checks the shipped file.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "attn_lib" / "data" / "seed_study.json"


def machine() -> dict:
    """This machine: CPU model, logical CPUs, torch and Python versions, date."""
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "date": datetime.date.today().isoformat()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)  # bit-identical training whatever the core count (see the docstring)
    from attn_lib.models.seed_study import seed_study

    t0 = time.perf_counter()
    results = seed_study()
    seconds = time.perf_counter() - t0
    record = {"machine": machine(), "command": "python scripts/make_seed_study.py", "threads": 1,
              "seconds": round(seconds, 1), "results": results}
    args.out.write_text(json.dumps(record, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({seconds:.1f} s)")


if __name__ == "__main__":
    main()
