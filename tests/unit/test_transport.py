"""The transports on ``MPI.COMM_SELF`` (one process; the same cases run on
``COMM_WORLD`` in ``tests/mpi/test_transport.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI
from transport_cases import ChannelCases, RmaWindowCases

from conduit_hpc.transport.rma import RmaWindow


class TestRmaWindowSelf(RmaWindowCases):
    COMM = MPI.COMM_SELF


class TestChannelSelf(ChannelCases):
    COMM = MPI.COMM_SELF


def test_get_blocks_of_more_than_2_gib_in_all() -> None:
    """Nine blocks of 256 MiB (2.25 GiB) gathered in one call: one MPI Get of them all
    raised ``MPI.Exception(13)`` (a count past 2**31 - 1). Real sizes, through MPI RMA
    (no shared memory), one process: about 2.8 GB for a moment."""
    blk = 256 << 20
    win = RmaWindow(MPI.COMM_SELF, 2 * blk, node_comm=None, shared=False)
    try:
        seg = win.own_segment()
        seg[:blk], seg[blk:2 * blk] = 1, 2
        out = np.zeros(9 * blk, np.uint8)
        win.get_blocks(0, 0, blk, np.array([0, blk] * 4 + [blk]), out)
        win.flush(0)
        firsts = [int(out[i * blk]) for i in range(9)]
        lasts = [int(out[(i + 1) * blk - 1]) for i in range(9)]
    finally:
        win.close()
    assert firsts == lasts == [1, 2, 1, 2, 1, 2, 1, 2, 2]


def test_a_message_past_2_gib_is_refused_by_name() -> None:
    """One message of more than 2**31 - 1 bytes raised a bare ``MPI.Exception(13)`` (the
    config refuses the batches that would make one; this is what any other sender gets).
    The payload is never touched: no memory is used for it."""
    from conduit_hpc.errors import TransportError
    from conduit_hpc.transport.channel import Channel

    ch = Channel(MPI.COMM_SELF.Dup())
    try:
        for send in (ch.isend, ch.send):
            with pytest.raises(TransportError, match="message of 2147483648 bytes"):
                send(0, 7, np.empty(2**31, np.uint8))
    finally:
        ch.close()
