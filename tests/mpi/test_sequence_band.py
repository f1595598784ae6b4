"""The sequence sampler when writers stop: rows the guard band hid come back before a
learner decides that nothing will ever be drawable.

While writers write, the owner hides the oldest rows of the ring (the guard band, up to
half of it); once they have reserved nothing for ``OwnedShard.idle_s`` it gives those
rows back to sampling. A learner that waited for a drawable sequence window saw every
actor finish, fenced the owners and, finding no window drawable yet, raised
``DataPlaneClosed: every actor finished with 32 rows held (total priority mass 0)``
although the shard held whole windows - in the band, drawable a moment later (the
stress sweep: 2 runs in 3 of one configuration, service mode, window 11 in a 32-row
shard). The owner is made slow to notice idle writers here (``idle_s`` of 5 s, as a
descheduled owner on an oversubscribed node is), which turned the race into every run.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc.errors import DataPlaneClosed
from conduit_hpc.testing import CHECKED_SPEC, checked_batch, make_config, row_consistent

COMM = MPI.COMM_WORLD
TRANSPORTS = {"shm": {"shared_memory": "auto"}, "rma": {"shared_memory": "never"}}
CAP, WINDOW, STEP = 32, 8, 4  # ring rows, window rows, rows per ingest
LAPS = 4


def _rows(writer: int, wseq: int, n: int, total: int) -> dict[str, np.ndarray]:
    """Rows ``wseq..wseq+n-1`` of the actor's ``total``: every row ends an episode except
    the first ``WINDOW - 1`` of the last lap, so the only whole window of ``WINDOW`` rows
    starts at the last lap's first row - which the guard band hides while writers write."""
    b = checked_batch(writer, wseq, n)
    s = b["wseq"]
    first = total - CAP
    b["done"] = ~((s >= first) & (s < first + WINDOW - 1))
    return b


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["sync", "service"])
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_band_rows_are_given_back_before_the_learner_closes(transport: str,
                                                            mode: str) -> None:
    spec = {**CHECKED_SPEC, "done": {"dtype": "bool"}}
    cfg = make_config(spec=spec, run={"timeout_s": 10.0},
                      layout={"learners": 1, "buffers": 1, "actors": COMM.Get_size() - 2},
                      # a long guard time: the band is half the ring once a rate is seen
                      storage={"capacity_rows": CAP, "guard_s": 2.0},
                      transport=TRANSPORTS[transport],
                      scheduler={"mode": mode, "sampler": "sequence", "batch_rows": 4,
                                 "sequence_length": WINDOW, "min_fill_rows": CAP,
                                 "episode_field": "done", "stream_field": "writer"})
    got, hidden = "nothing", False
    problems: list[str] = []
    total = LAPS * CAP
    with ExperienceDataPlane(cfg) as edp:
        world = edp.roles.world
        if edp.role is Role.ACTOR:  # the first actor writes, the others only wait
            for w in range(0, total if edp.world_rank == edp.roles.actor_ranks[0] else 0,
                           STEP):
                edp.ingest(_rows(edp.world_rank, w, STEP, total))
            world.Ibarrier().Wait()  # A: the rows are written
            world.Ibarrier().Wait()  # B: the owner looked at its band
        elif edp.role is Role.LEARNER:
            world.Ibarrier().Wait()
            world.Ibarrier().Wait()
            try:  # right after the actor is done, as a learner waiting in next_batch is
                b = edp.next_batch()
                cols = {k: v.numpy() for k, v in b.data.items()}
                flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in cols.items()}
                got = "batch"
                if not row_consistent(flat).all():
                    problems.append("a torn row")
                want = np.arange(total - CAP, total - CAP + WINDOW)
                if not (cols["wseq"] == want[None, :]).all():
                    problems.append(f"windows {cols['wseq'].tolist()}, expected {want}")
            except DataPlaneClosed as err:
                got = f"DataPlaneClosed: {err}"
        else:
            (shard,) = edp.owned_shards()
            shard.idle_s = 5.0  # an owner slow to see that writers went idle
            for _ in range(2):  # A, then B: passes run meanwhile, as in serve()
                req = world.Ibarrier()
                while not req.Test():
                    edp.server.step()
                # the pass serve() runs within storage.commit_interval_s: the last
                # rows written (fewer than a pass waits for) are committed by it
                time.sleep(shard.commit_interval_s)
                edp.server.step()
                if not hidden:  # the case under test: the window's first row is in the band
                    hidden = shard.hidden_upto - CAP > total - CAP
            edp.serve()
        edp.done()
        every = world.allgather((got, problems, hidden))
    owner = every[edp.roles.buffer_ranks[0]]
    learner = every[edp.roles.learner_ranks[0]]
    assert owner[2], "the guard band did not cover the window when the actor stopped"
    assert learner[:2] == ("batch", []), learner


@pytest.mark.mpi(min_size=3)
def test_no_window_in_any_episode_is_said_when_the_actors_are_done() -> None:
    """Every episode shorter than the window: once the actors are done the learner is
    told that no window is drawable, not only "total priority mass 0" (the rows held
    have priority 1: it is the windows that have none)."""
    spec = {**CHECKED_SPEC, "done": {"dtype": "bool"}}
    cfg = make_config(spec=spec, run={"timeout_s": 10.0},
                      layout={"learners": 1, "buffers": 1, "actors": COMM.Get_size() - 2},
                      storage={"capacity_rows": CAP},
                      scheduler={"mode": "sync", "sampler": "sequence", "batch_rows": 4,
                                 "sequence_length": WINDOW, "min_fill_rows": 8,
                                 "episode_field": "done", "stream_field": "writer"})
    said = ""
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            b = checked_batch(edp.world_rank, 0, 24)
            b["done"] = np.arange(24) % 3 == 2  # episodes of 3 rows
            edp.ingest(b)
        elif edp.role is Role.LEARNER:
            try:
                edp.next_batch()
            except DataPlaneClosed as err:
                said = str(err)
        else:
            edp.serve()
        edp.done()
        said = edp.roles.world.allreduce(said, op=MPI.MAX)
    assert (f"(total priority mass 0: no window of {WINDOW} rows within one stream's "
            f"episode has priority > 0)") in said, said
