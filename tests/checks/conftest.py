"""Fixtures shared by the door tests of tests/checks (test_doors.py, test_decoding.py)."""
import pytest

import attn_lib.checks.flash as flash_checks


@pytest.fixture
def kernels_present(monkeypatch):
    """The kernel package counts as installed (only its presence is asked; nothing is compiled here)."""
    monkeypatch.setattr(flash_checks, "triton_available", lambda: True)
