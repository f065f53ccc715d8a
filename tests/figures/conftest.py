"""Fixtures shared by the figure tests of tests/figures."""
import matplotlib as mpl
import matplotlib.pyplot as plt
import pytest


@pytest.fixture
def default_rc():
    """matplotlib's own defaults (no Chinese font), restored afterwards; the figures drawn are closed."""
    with mpl.rc_context():
        mpl.rcdefaults()
        yield
    plt.close("all")
