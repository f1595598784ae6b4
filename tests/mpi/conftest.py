from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mpi4py import MPI

TRANSPORTS = {
    # shared-memory windows, direct numpy access
    "shm": {"transport": {"shared_memory": "auto"}},
    # every access through MPI RMA (what ranks on different nodes do)
    "rma": {"transport": {"shared_memory": "never"}},
    # two emulated nodes: shared memory within, RMA (Win.Create) across
    "hybrid": {"transport": {"shared_memory": "auto"}, "layout": {"emulate_nodes": 2}},
}


@pytest.fixture(params=sorted(TRANSPORTS))
def transport_sections(request) -> dict:
    return TRANSPORTS[request.param]


def bounded_barrier(comm: MPI.Comm, timeout_s: float = 30.0) -> bool:
    """A barrier that gives up after ``timeout_s`` (returns whether every rank came):
    for clean-up, where after a failure on one rank the others may never arrive."""
    req = comm.Ibarrier()
    end = time.monotonic() + timeout_s
    while not req.Test():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A temporary directory made by rank 0, its path on every rank (one node);
    removed at the end once every rank is done with it (or 30 s passed)."""
    comm = MPI.COMM_WORLD
    path = Path(comm.bcast(tempfile.mkdtemp(prefix="conduit-mpi-") if comm.rank == 0
                           else None))
    yield path
    bounded_barrier(comm)
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def gave_up(every: list[str], rank: int, call: str) -> bool:
    """Rank ``rank`` gave up on the collective ``call`` (CollectiveFailed naming it), or
    stopped on the mark of a rank that did (RemoteFailure naming that rank): the first
    to give up marks itself, so that a buffer in ``serve()`` (no deadline) ends too."""
    seen = every[rank]
    if seen.startswith("RemoteFailure") and " left the data plane" in seen:
        first = int(seen.split("world rank ")[1].split()[0])
        seen = every[first]
    return seen.startswith("CollectiveFailed") and call in seen
