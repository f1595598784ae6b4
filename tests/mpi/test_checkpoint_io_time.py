"""A checkpoint that takes longer to write than ``run.timeout_s`` (a large replay on a
slow or compressing file system) is written, not dropped: the waits that cover its
writes last ``max(run.timeout_s, checkpoint.timeout_s)``.

Before: a periodic checkpoint whose part came later than ``run.timeout_s`` was dropped
by the leader ("no part from world ranks ... within 2 s"), and a collective save failed
on every rank waiting for the slowest part (``CollectiveFailed``), so the final
checkpoint of a job with a large replay was lost. The slow disk is
``CONDUIT_CHECKPOINT_STALL_S`` (each buffer rank sleeps after writing its shard file).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc import checkpoint as ck
from conduit_hpc.features.checkpointing import restore_data_plane, save_checkpoint
from conduit_hpc.features.checkpointing.agent import CheckpointAgent
from conduit_hpc.features.checkpointing.outcome import checkpoint_outcome
from conduit_hpc.features.checkpointing.parts import STALL_ENV
from conduit_hpc.features.checkpointing.stopping import StopCoordinator
from conduit_hpc.testing import checked_batch, make_config

COMM = MPI.COMM_WORLD
RUN_TIMEOUT_S = 2.0
STALL_S = 3.5  # past RUN_TIMEOUT_S: each buffer rank's file takes this long to write
pytestmark = pytest.mark.skipif(COMM.size != 2, reason="a timeout rule, not concurrency "
                                                      "(tests/mpi/test_checkpoint.py races "
                                                      "cuts at every rank count): 2 ranks")


def config():
    return make_config(layout={"learners": 0, "buffers": 1},
                       storage={"capacity_rows": 1000},
                       run={"timeout_s": RUN_TIMEOUT_S},
                       checkpoint={"timeout_s": 60.0, "on_stop": False})


def ingest(edp: ExperienceDataPlane, batches: int) -> int:
    for i in range(batches):
        edp.ingest(checked_batch(edp.world_rank, 4 * i, 4))
    return 4 * batches


def wait_for_tmp(root: Path, timeout_s: float = 30.0) -> bool:
    """Whether a checkpoint started (its temporary directory appeared)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if root.exists() and any(p.name.startswith(ck.TMP_PREFIX) for p in root.iterdir()):
            return True
        time.sleep(0.01)
    return False


@pytest.mark.mpi(min_size=2)
def test_a_save_slower_than_run_timeout_is_written_and_restores(shared_dir,
                                                                 monkeypatch) -> None:
    monkeypatch.setenv(STALL_ENV, str(STALL_S))
    rows = 0
    with ExperienceDataPlane(config()) as edp:
        if edp.role is Role.ACTOR:
            rows = ingest(edp, 5)
            edp.done()
        else:
            edp.serve()
        result = save_checkpoint(edp, shared_dir)  # every rank waits for the slow part
        total = sum(edp.roles.world.allgather(rows))
    assert result.seconds >= STALL_S and (result.path / ck.DONE).exists()
    monkeypatch.delenv(STALL_ENV)
    with ExperienceDataPlane(config()) as edp2:
        restored = restore_data_plane(edp2, "latest", roots=[shared_dir])
        edp2.done()
        if edp2.serves:
            edp2.serve()
    assert restored is not None and restored.rows == total > 0


@pytest.mark.mpi(min_size=2)
def test_a_periodic_checkpoint_slower_than_run_timeout_completes(shared_dir,
                                                                  monkeypatch) -> None:
    monkeypatch.setenv(STALL_ENV, str(STALL_S))
    with ExperienceDataPlane(config()) as edp:
        stop = StopCoordinator(edp)
        agent = CheckpointAgent(edp, shared_dir, keep=0)
        started = True
        if edp.role is Role.ACTOR:
            ingest(edp, 5)
            if edp.roles.actor.Get_rank() == 0:
                agent.request(reason="test")
                started = wait_for_tmp(shared_dir)  # the buffer is writing it now
            edp.done()
        else:
            edp.serve()
        agent.finish()  # the buffer waits for its slow write; the others in agree()
        stopped = stop.agree()
        stop.close()
        outcome = checkpoint_outcome(edp, agent)
    assert started and not stopped
    assert outcome.failed == [] and len(outcome.written) == 1, outcome
    assert (Path(outcome.written[0]) / ck.DONE).exists()
