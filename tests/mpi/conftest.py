from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
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


#: the two-field spec of the failure tests (test_leave_on_error, test_api_misuse)
SMALL_SPEC = {"obs": {"dtype": "float32", "shape": [4]}, "reward": {"dtype": "float32"}}


def small_rows(n: int = 8) -> dict[str, np.ndarray]:
    """``n`` rows of :data:`SMALL_SPEC`."""
    return {"obs": np.zeros((n, 4), np.float32), "reward": np.ones(n, np.float32)}


def verdict(ok: bool) -> bool:
    """Every rank's verdict (plain MPI: the plane's communicators are not used)."""
    return bool(MPI.COMM_WORLD.allreduce(int(ok), op=MPI.MIN))


def play(edp: Any, learner: Callable[[Any], object]) -> None:
    """Each rank's part up to ``done()``: actors ingest :func:`small_rows` until the run
    stops, buffers serve, the learner runs ``learner(edp)``."""
    from conduit_hpc import Role

    if edp.role is Role.ACTOR:
        while not edp.should_stop:
            edp.ingest(small_rows())
    elif edp.serves:
        edp.serve()
    else:
        learner(edp)
    edp.done()
