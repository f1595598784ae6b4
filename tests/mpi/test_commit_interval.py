"""The owner's commit interval (``storage.commit_interval_s``) with learners sampling.

While learners sample, a pass of the buffer loop that finds fewer than 4,096 rows
waiting lets them wait for the next pass the interval allows (``OwnedShard._coalesce``):
the rows then arrive in fewer, larger commits. Checked here with actors writing batches
of 3 rows (far fewer than a pass waits for) while a learner samples and lapping a
64-row ring, over shared memory and one-sided RMA: every delivered row is intact, every
actor's rows are drawn, the interval used is at most a tenth of ``run.timeout_s``, and
rows written last by actors that then finish are delivered at once (the learner's
fence commits without waiting for the interval).
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc.testing import CHECKED_SPEC, checked_batch, make_config, row_consistent

COMM = MPI.COMM_WORLD
TRANSPORTS = {"shm": {"shared_memory": "auto"}, "rma": {"shared_memory": "never"}}
CAP, BATCHES, MAX_BATCHES = 64, 60, 20_000


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize(("interval", "timeout", "used"),
                         [(0.05, 10.0, 0.05), (1.0, 2.0, 0.2)])
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_few_rows_wait_for_a_pass_and_are_drawn_intact(transport: str, interval: float,
                                                       timeout: float, used: float) -> None:
    cfg = make_config(spec=CHECKED_SPEC, run={"timeout_s": timeout},
                      layout={"learners": 1, "buffers": 1, "actors": COMM.Get_size() - 2},
                      storage={"capacity_rows": CAP, "commit_interval_s": interval},
                      transport=TRANSPORTS[transport],
                      scheduler={"mode": "sync", "batch_rows": 8, "min_fill_rows": 8})
    problems: list[str] = []
    seen: dict[int, int] = {}
    got = -1.0
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            w = 0
            while not edp.should_stop:
                edp.ingest(checked_batch(edp.world_rank, w, 3))
                w += 3
        elif edp.role is Role.LEARNER:
            n_act = len(edp.roles.actor_ranks)
            for i in range(MAX_BATCHES):  # (an actor may start late on a busy node)
                if i >= BATCHES and len(seen) == n_act:
                    break
                b = edp.next_batch()
                cols = {k: v.numpy() for k, v in b.data.items()}
                if not row_consistent(cols).all():
                    problems.append(f"batch {i}: a torn row")
                for wr, s in zip(cols["writer"].tolist(), cols["wseq"].tolist(), strict=True):
                    seen[wr] = max(seen.get(wr, -1), s)
                edp.update_priorities(b.indices, np.random.default_rng(i).random(8) + 0.1)
        else:
            (shard,) = edp.owned_shards()
            got = shard.commit_interval_s
            edp.serve()
        edp.done()
        summary = edp.summary()
        roles = edp.roles
    every = COMM.allgather((got, seen, problems))  # every rank asserts on every rank's
    assert [p for _, _, part in every for p in part] == []
    assert every[roles.buffer_ranks[0]][0] == pytest.approx(used)
    drawn = every[roles.learner_ranks[0]][1]
    assert sorted(drawn) == sorted(roles.actor_ranks), drawn  # every actor's rows came
    (learner,) = summary["learners"].values()
    assert learner["supersteps"] >= BATCHES


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_the_last_rows_of_finished_actors_are_delivered(transport: str) -> None:
    """Each actor writes 3 rows and finishes; the learner asks for all of them at once,
    with the interval at its longest: its fence commits them (every actor finished, no
    mass seen yet), and the batch holds only rows that were written."""
    n_act = COMM.Get_size() - 2
    cfg = make_config(spec=CHECKED_SPEC, run={"timeout_s": 30.0},
                      layout={"learners": 1, "buffers": 1, "actors": n_act},
                      storage={"capacity_rows": CAP, "commit_interval_s": 1.0,
                               "priority_exponent": 0.0},
                      transport=TRANSPORTS[transport],
                      scheduler={"mode": "sync", "batch_rows": 3 * n_act,
                                 "min_fill_rows": 3 * n_act, "sampler": "uniform"})
    rows: list[tuple[int, int]] = []
    problems: list[str] = []
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            edp.ingest(checked_batch(edp.world_rank, 0, 3))
        elif edp.role is Role.LEARNER:
            b = edp.next_batch()
            cols = {k: v.numpy() for k, v in b.data.items()}
            if not row_consistent(cols).all():
                problems.append("a torn row")
            rows = sorted(zip(cols["writer"].tolist(), cols["wseq"].tolist(), strict=True))
        else:
            edp.serve()
        edp.done()
        roles = edp.roles
    every = COMM.allgather((rows, problems))
    assert [p for _, part in every for p in part] == []
    drawn = every[roles.learner_ranks[0]][0]
    written = {(a, s) for a in roles.actor_ranks for s in range(3)}
    assert set(drawn) <= written and len(drawn) == 3 * n_act, drawn
