"""A write that fails after reserving its ring slots stops every rank, at once and by name.

Commits are in sequence order: a writer that reserved seqs and never stamped them (its
transport call raised, an interrupt, its lap wait timed out) leaves a gap that the
shard's commit cursor can never pass. Before the fix the writer could catch the error
and ingest on; every other writer then waited out ``run.timeout_s`` for slots
("is its owner still serving?"), a learner for rows ("they kept being overwritten while
gathered"), and at 2 ranks the buffer hung in ``close()``'s window free (the writer,
marked failed, raised inside the bounded barrier after entering it). Now the failed
write marks the job failed: every rank raises :class:`RemoteFailure` naming the writer
(the writer's later ingests :class:`IngestAbandoned`), well before its timeout, and the
rows the shard holds are whole and the ones their writers wrote.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, IngestAbandoned, RemoteFailure, Role
from conduit_hpc.errors import CollectiveFailed, DataPlaneTimeout
from conduit_hpc.testing import checked_batch, make_config, row_consistent

COMM = MPI.COMM_WORLD
TRANSPORTS = {"shm": {"shared_memory": "auto"}, "rma": {"shared_memory": "never"}}
TIMEOUT_S = 60.0  # far longer than a run: an error only by deadline is a failure here


class Injected(Exception):
    """The failure between reserving and committing (not a library error)."""


class FailsAfterReserve:
    """A transport that raises on the first step after the ``at``-th reservation."""

    def __init__(self, inner, at: int) -> None:
        self.inner, self.at, self.reserved, self.raised = inner, at, 0, False

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def fetch_add(self, target_rank, displacement, value):
        self.reserved += 1
        return self.inner.fetch_add(target_rank, displacement, value)

    def _maybe(self) -> None:
        if self.reserved == self.at and not self.raised:
            self.raised = True
            raise Injected("injected failure between reserve and commit")

    def put(self, target_rank, displacement, buffer):
        self._maybe()
        self.inner.put(target_rank, displacement, buffer)

    def sync(self):
        self._maybe()
        self.inner.sync()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_failed_write_after_reserve_stops_every_rank_by_name(transport: str) -> None:
    learners = 1 if COMM.size >= 4 else 0
    cfg = make_config(run={"timeout_s": TIMEOUT_S},
                      layout={"learners": learners, "buffers": 1,
                              "actors": COMM.size - 1 - learners},
                      storage={"capacity_rows": 16}, transport=TRANSPORTS[transport],
                      scheduler={"mode": "sync", "batch_rows": 4, "min_fill_rows": 4})
    error: BaseException | None = None
    later: list[str] = []
    receipts: list[tuple[int, int, int, int]] = []
    held: dict[int, tuple] = {}
    failing = -1
    try:
        with ExperienceDataPlane(cfg) as edp:
            failing = edp.roles.actor_ranks[0]
            me = edp.world_rank
            if edp.role is Role.ACTOR:
                if me == failing:
                    for ring in edp.rings.values():
                        ring.transport = FailsAfterReserve(ring.transport, at=5)
                        ring.views = None  # every write through the transport
                w = 0
                while not edp.should_stop:
                    try:  # a hostile job: catches the failure and ingests on
                        r = edp.ingest(checked_batch(me, w, 3))
                        receipts.append((r.shard_id, r.first_seq, w, 3))
                    except Injected:
                        pass
                    except (IngestAbandoned, RemoteFailure) as err:
                        later.append(type(err).__name__)
                        break
                    w += 3
                edp.done()
            elif edp.role is Role.LEARNER:
                for _ in range(10_000):
                    b = edp.next_batch()
                    edp.update_priorities(b.indices, np.ones(len(b)))
                edp.done()
            else:
                try:
                    edp.serve()
                finally:
                    for s in edp.owned_shards():
                        seqs, cols, _ = s.ring.read_committed()
                        held[s.shard_id] = (seqs, cols)
    except RemoteFailure as err:
        error = err
    failing = COMM.allreduce(failing, op=MPI.MAX)
    errors = COMM.allgather((type(error).__name__, str(error)))
    assert all(name == "RemoteFailure" for name, _ in errors), errors  # not by deadline
    assert all(f"world rank {failing} " in text for _, text in errors), errors
    if COMM.rank == failing:
        assert not later or later[0] in ("IngestAbandoned", "RemoteFailure"), later
    assert not isinstance(error, CollectiveFailed)
    # what the shard holds is whole and is the row its writer wrote at that seq (the
    # others' writes past the gap may have overwritten rows committed before it: they
    # had those slots, as in any lap)
    every = COMM.allgather((COMM.rank, receipts))
    wrote = {(sid, first + k): (rank, w + k) for rank, rs in every
             for sid, first, w, n in rs for k in range(n)}
    for sid, (seqs, cols) in held.items():
        assert row_consistent(cols).all()
        got = list(zip(cols["writer"].tolist(), cols["wseq"].tolist(), strict=True))
        assert got == [wrote[(sid, int(q))] for q in seqs]


class StallsAfterReserve(FailsAfterReserve):
    """A writer descheduled (or stopped) between reserving and committing: it sleeps."""

    def __init__(self, inner, at: int, sleep_s: float) -> None:
        super().__init__(inner, at)
        self.sleep_s = sleep_s

    def _maybe(self) -> None:
        if self.reserved == self.at and not self.raised:
            self.raised = True
            time.sleep(self.sleep_s)


@pytest.mark.mpi(min_size=3)
def test_a_writer_stalled_after_reserving_is_named_in_the_others_timeout() -> None:
    # the others' lap waits time out; their message said "is its owner still serving?"
    # of an owner that was serving: it now names the seq a writer reserved and never wrote
    timeout = 3.0
    cfg = make_config(run={"timeout_s": timeout},
                      layout={"learners": 0, "buffers": 1, "actors": COMM.size - 1},
                      storage={"capacity_rows": 16}, transport=TRANSPORTS["rma"])
    errors: list[str] = []
    try:
        with ExperienceDataPlane(cfg) as edp:
            me = edp.world_rank
            if edp.role is Role.ACTOR:
                if me == edp.roles.actor_ranks[0]:
                    for ring in edp.rings.values():
                        ring.transport = StallsAfterReserve(ring.transport, 3, 3 * timeout)
                        ring.views = None
                w = 0
                while not edp.should_stop:
                    edp.ingest(checked_batch(me, w, 3))
                    w += 3
                edp.done()
            else:
                edp.serve()
    except (DataPlaneTimeout, RemoteFailure) as err:
        errors.append(f"{type(err).__name__}: {err}")
    every = [e for part in COMM.allgather(errors) for e in part]
    assert len(every) == COMM.size, every  # every rank stopped on a named error
    assert any(e.startswith("DataPlaneTimeout") and "was reserved by a writer that has "
               "not written it" in e for e in every), every
