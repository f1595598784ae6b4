"""The transports on ``MPI.COMM_SELF`` (one process; the same cases run on
``COMM_WORLD`` in ``tests/mpi/test_transport.py``)."""

from __future__ import annotations

from mpi4py import MPI
from transport_cases import ChannelCases, RmaWindowCases


class TestRmaWindowSelf(RmaWindowCases):
    COMM = MPI.COMM_SELF


class TestChannelSelf(ChannelCases):
    COMM = MPI.COMM_SELF
