"""Shards that a machine's memory cannot hold are refused on every rank before any window
is allocated, also when the machine is split into emulated nodes.

The check summed the shards of each (emulated) node and compared them with the machine's
free memory: two emulated nodes of one machine, each with a buffer holding three
quarters of the free memory, both passed, and the ranks went on to zero 1.5 times the
machine's free memory (the kernel kills the job; no named error). The sum is now over
the ranks of each real node."""

from __future__ import annotations

import pytest
from mpi4py import MPI

from conduit_hpc import ConfigError, ExperienceDataPlane
from conduit_hpc.plane.memory import free_memory_bytes
from conduit_hpc.testing import make_config

COMM = MPI.COMM_WORLD
ROW = 1 << 20  # bytes of one row


def refusals(cfg) -> list[tuple[str, str] | None]:
    """Every rank's (key, message) of the ConfigError building a plane of ``cfg``
    raised (``None``: it built); each is asserted to name storage.capacity_rows."""
    error: ConfigError | None = None
    try:
        with ExperienceDataPlane(cfg) as edp:  # (never reached with the fix)
            edp.done()
            if edp.serves:
                edp.serve()
    except ConfigError as err:
        error = err
    got = COMM.allgather(None if error is None else (error.key, str(error)))
    assert all(g is not None and g[0] == "storage.capacity_rows" for g in got), got
    return got


@pytest.mark.mpi(min_size=4)
def test_emulated_nodes_of_one_machine_share_its_memory() -> None:
    free = COMM.bcast(free_memory_bytes() if COMM.rank == 0 else None)
    assert free is not None
    capacity = 3 * free // 2 // ROW  # each of the two buffers' shards: 3/4 of it
    cfg = make_config(spec={"x": {"dtype": "uint8", "shape": [ROW]}},
                      layout={"learners": 0, "buffers": 1, "per_node": True,
                              "emulate_nodes": 2},
                      storage={"capacity_rows": capacity})
    got = refusals(cfg)
    assert all("more than is free" in g[1] for g in got if g is not None), got


@pytest.mark.mpi(min_size=2)
def test_checkpoint_staging_counts_toward_the_buffer_nodes_memory() -> None:
    """A job that checkpoints holds a staging copy of every shard beside it (allocated and
    touched when its CheckpointAgent is made, so that a cut is one memcpy). Shards of
    three fifths of the free memory passed the check, and the agent then asked for as
    much again: the kernel killed the buffer rank (SIGKILL, no named error). Counted now,
    and named."""
    free = COMM.bcast(free_memory_bytes() if COMM.rank == 0 else None)
    assert free is not None
    capacity = 3 * free // 5 // ROW
    cfg = make_config(spec={"x": {"dtype": "uint8", "shape": [ROW]}},
                      layout={"learners": 0, "buffers": 1},
                      storage={"capacity_rows": capacity},
                      checkpoint={"on_stop": True})
    got = refusals(cfg)
    assert all("checkpoints (checkpoint.on_stop, every_seconds or every_supersteps" in g[1]
               for g in got if g is not None), got
