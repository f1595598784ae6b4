"""The transports on ``MPI.COMM_WORLD`` at any size (the same cases run on
``COMM_SELF`` in ``tests/unit/test_transport.py``)."""

from __future__ import annotations

import pytest
from mpi4py import MPI
from transport_cases import ChannelCases, RmaWindowCases


@pytest.mark.mpi(min_size=2)
class TestRmaWindowWorld(RmaWindowCases):
    COMM = MPI.COMM_WORLD


@pytest.mark.mpi(min_size=2)
class TestChannelWorld(ChannelCases):
    COMM = MPI.COMM_WORLD
