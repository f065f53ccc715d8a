import os
import sys
from pathlib import Path

import pytest

# Shared helpers (attn_paths.py, site_server.py) live in tests/ itself; the tests live in
# a folder per attn_lib subpackage, tests/topics, tests/book and tests/bench (see tests/README.md).
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Agg for the plots made inside pytest's own process. Not through the MPLBACKEND environment
# variable: nbval's kernels inherit the environment, and under Agg a notebook's plt.show()
# displays nothing, so its committed figure outputs would no longer match.
import matplotlib  # noqa: E402

matplotlib.use("Agg")

# The notebooks this process runs itself (tests/figure_record.py, tests/book/test_colab_sim.py) wait
# for kernel replies in short slices: scripts/kernel_poll.py says why (a lost cell timeout per run).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from kernel_poll import use_sliced_polling  # noqa: E402

use_sliced_polling()


@pytest.fixture
def rng():
    import torch

    return torch.Generator().manual_seed(0)


# --- hypothesis profiles and the `slow` marker ---
# "ci" (the default) gives every attention path >= 200 examples and keeps the whole property
# suite well under 5 minutes on 2 cores; it is derandomized so `make test` is reproducible.
# "long" explores much more, with fresh random examples each run:
#     HYPOTHESIS_PROFILE=long .venv/bin/python -m pytest tests/topics/test_properties.py -o addopts=""
from hypothesis import HealthCheck, settings  # noqa: E402

_SLOW_CHECKS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("ci", max_examples=200, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=_SLOW_CHECKS)
settings.register_profile("long", max_examples=3000, deadline=None, print_blob=True,
                          suppress_health_check=_SLOW_CHECKS)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: takes minutes (nbval reruns, the seed study recomputed) or over 20 s (the sm_75 bf16 compile of "
        "every kernel); deselect with -m 'not slow'"
    )
