"""What a checkpoint agent keeps of the checkpoints of a long run: the latest records, and
counts of them all. Every checkpoint's record (path, cut and write time, failure) was
kept, gathered at the job's end and listed in its summary: a record per checkpoint for
as long as the job ran (every_seconds = 1: 86,400 a day, every one's path in summary.json
though ``keep`` had removed all but a few)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc import checkpoint as ck
from conduit_hpc.features.checkpointing import agent as agent_module
from conduit_hpc.features.checkpointing import outcome as outcome_module
from conduit_hpc.features.checkpointing.agent import CheckpointAgent
from conduit_hpc.features.checkpointing.outcome import checkpoint_outcome
from conduit_hpc.testing import checked_batch, make_config

CHECKPOINTS = 12
KEEP = 5


def wait_for(path: Path, timeout_s: float = 60.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if path.exists():
            return True
        time.sleep(0.005)
    return False


@pytest.mark.mpi(min_size=2)
def test_an_agent_keeps_the_latest_records_and_counts_every_checkpoint(shared_dir,
                                                                        monkeypatch) -> None:
    monkeypatch.setattr(agent_module, "RECORDS_KEEP", KEEP, raising=False)
    monkeypatch.setattr(outcome_module, "RECORDS_KEEP", KEEP, raising=False)
    cfg = make_config(layout={"learners": 0, "buffers": 1},
                      storage={"capacity_rows": 2000, "priority_exponent": 0.6})
    root = shared_dir
    with ExperienceDataPlane(cfg) as edp:
        agent = CheckpointAgent(edp, root, keep=2)
        if edp.role is Role.ACTOR:
            edp.ingest(checked_batch(edp.world_rank, 0, 8))
            if edp.roles.actor.Get_rank() == 0:
                for n in range(1, CHECKPOINTS + 1):  # one at a time: none is dropped
                    agent.request(reason="test")
                    assert wait_for(root / ck.checkpoint_name(n) / ck.DONE), n
            edp.done()
        else:
            edp.serve()
        agent.finish()
        outcome = checkpoint_outcome(edp, agent)
        leader = agent.is_leader
    if leader:
        assert len(agent.completed) == len(agent.cuts_s) == len(agent.writes_s) == KEEP
        assert agent.completed[-1]["seq"] == CHECKPOINTS
    assert len(outcome.written) == KEEP and outcome.n_written == CHECKPOINTS
    assert outcome.written[-1] == str(root / ck.checkpoint_name(CHECKPOINTS))
    assert outcome.n_failed == 0 and outcome.longest_cut_s > 0
    assert outcome.lines()[0].startswith(f"checkpoints: {CHECKPOINTS} written, 0 failed")
    assert sorted(p.name for p in root.iterdir()) == [  # keep = 2 on disk
        ck.checkpoint_name(CHECKPOINTS - 1), ck.checkpoint_name(CHECKPOINTS)]
