"""scripts/kernel_poll.py: a reply that is already waiting is read at the next slice, not when the
caller's whole timeout runs out; with no reply, the caller's timeout still ends in ``Empty``."""
from __future__ import annotations

import asyncio
import time
from queue import Empty

import pytest
from jupyter_client.channels import AsyncZMQSocketChannel

import kernel_poll


class _Socket:
    """A socket whose poll misses a message that arrived before it was called (the measured fault),
    the way an edge-triggered poll does: it reports readiness only when its timer runs out."""

    def __init__(self, ready_at):
        self.ready_at = ready_at

    async def poll(self, timeout_ms):
        await asyncio.sleep(timeout_ms / 1000)
        return time.monotonic() >= self.ready_at


def _channel(ready_at):
    channel = object.__new__(AsyncZMQSocketChannel)
    channel.socket = _Socket(ready_at)

    async def recv():
        return {"msg_type": "execute_reply"}
    channel._recv = recv
    return channel


def test_a_waiting_reply_is_read_within_a_slice_not_at_the_timeout():
    kernel_poll.use_sliced_polling()
    kernel_poll.use_sliced_polling()  # idempotent: one layer of slicing
    channel = _channel(time.monotonic() + 0.1)
    t0 = time.monotonic()
    msg = asyncio.run(AsyncZMQSocketChannel.get_msg(channel, timeout=20))
    assert msg["msg_type"] == "execute_reply"
    assert time.monotonic() - t0 < 2 * kernel_poll.SLICE_S + 0.5


def test_no_reply_still_times_out_with_empty():
    kernel_poll.use_sliced_polling()
    channel = _channel(float("inf"))
    t0 = time.monotonic()
    with pytest.raises(Empty):
        asyncio.run(AsyncZMQSocketChannel.get_msg(channel, timeout=1.2))
    assert 1.1 < time.monotonic() - t0 < 2.5
