import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture
def rng():
    import torch

    return torch.Generator().manual_seed(0)
