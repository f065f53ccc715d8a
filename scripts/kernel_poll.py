"""Wait for kernel replies in short slices, so that a reply already delivered is not left unread.

Measured here (nbclient 0.11.0, jupyter_client 8.10.0, pyzmq's asyncio poller): about one run in
three, the cell with ``widgets.interact`` in chapter 04 (also 07, 08) had its execute reply and every
iopub message, ``idle`` included, within a second, yet nbclient's one ``poll(timeout)`` on the shell
socket returned only when the whole cell timeout ran out; the cell then finished normally, so a run
lost ``timeout`` seconds without an error. Polling in slices of ``SLICE_S`` finds the waiting reply at
the next slice. ``use_sliced_polling()`` patches jupyter_client's asyncio channel for this process;
scripts/run_notebooks.py, tests/figure_record.py and tests/book/test_colab_sim.py call it.
"""
from __future__ import annotations

from queue import Empty
from time import monotonic

SLICE_S = 0.5


def use_sliced_polling() -> None:
    """Make ``AsyncZMQSocketChannel.get_msg(timeout)`` poll in slices of ``SLICE_S`` seconds (idempotent)."""
    from jupyter_client.channels import AsyncZMQSocketChannel

    if getattr(AsyncZMQSocketChannel.get_msg, "sliced", False):
        return
    whole = AsyncZMQSocketChannel.get_msg

    async def get_msg(self, timeout=None):
        deadline = None if timeout is None else monotonic() + timeout
        while True:
            left = SLICE_S if deadline is None else max(0.0, min(SLICE_S, deadline - monotonic()))
            try:
                return await whole(self, left)
            except Empty:
                if deadline is not None and monotonic() >= deadline:
                    raise

    get_msg.sliced = True
    AsyncZMQSocketChannel.get_msg = get_msg
