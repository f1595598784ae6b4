"""An interrupt (Ctrl-C, a job's signal handler that raises, an asynchronous exception)
at an arbitrary point inside a library call on one rank, caught by the job.

The hostile sweep of stop 40 ran real jobs under ``mpirun`` with ``signal.setitimer``
raising ``KeyboardInterrupt`` after a random delay in a learner, a buffer or an actor
(``edp`` and ``sync`` modes, shared memory on and off): the interrupted rank's exception
stayed a ``KeyboardInterrupt`` and every other rank stopped with :class:`RemoteFailure`
naming it. The one window that was not covered is inside the reservation itself: an
interrupt raised inside the transport's ``fetch_add`` after the atomic add (the handler
runs at the next bytecode of the call, e.g. before ``Flush`` returns) left seqs reserved
that the writer never learnt of. A job that caught the interrupt and ingested on then
wrote behind a gap that the shard's commit cursor can never pass: none of its later
rows (nor any other writer's) became visible and every rank waited out
``run.timeout_s``. Now an interrupted reservation counts as one that may have happened:
the writer marks the job failed and every rank raises :class:`RemoteFailure` naming it at
once; what the shard holds is still whole.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import assert_held_as_written, assert_stopped_by, hostile_writer_run
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, RemoteFailure, Role
from conduit_hpc.testing import make_config

COMM = MPI.COMM_WORLD
TRANSPORTS = {"shm": {"shared_memory": "auto"}, "rma": {"shared_memory": "never"}}
TIMEOUT_S = 30.0  # far longer than a run: an error only by deadline is a failure here


class InterruptedInReserve:
    """A transport whose ``at``-th ``fetch_add`` is interrupted after the add is done
    (a ``KeyboardInterrupt`` raised at the next bytecode of the call)."""

    def __init__(self, inner, at: int) -> None:
        self.inner, self.at, self.calls = inner, at, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def fetch_add(self, target_rank, displacement, value):
        old = self.inner.fetch_add(target_rank, displacement, value)
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return old


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_an_interrupt_inside_the_reservation_stops_every_rank_by_name(transport: str) -> None:
    run = hostile_writer_run(TRANSPORTS[transport]["shared_memory"], TIMEOUT_S,
                             lambda t: InterruptedInReserve(t, at=4), KeyboardInterrupt)
    error, victim, later = run["error"], run["victim"], run["later"]
    errors = COMM.allgather((type(error).__name__, str(error)))
    assert all(name == "RemoteFailure" for name, _ in errors), errors  # not by deadline
    assert all(f"world rank {victim} " in text for _, text in errors), errors
    if COMM.rank == victim:
        assert run["caught"] == 1, run["caught"]  # the interrupt stayed a KeyboardInterrupt
        assert not later or later[0] in ("IngestAbandoned", "RemoteFailure"), later
    assert_held_as_written(run)


@pytest.mark.mpi(min_size=3)
def test_a_second_interrupt_during_the_leave_still_stops_every_rank_by_name() -> None:
    """Ctrl-C, then Ctrl-C again while ``__exit__`` marks the rank as left (here: in the
    control block's write of its name). The mark was never made: the job caught the
    interrupt outside the block and ended normally, and the other actors (lapping their
    ring) and the buffer in ``serve()`` - none waits on a deadline - ran forever."""
    timeout = 6.0
    cfg = make_config(spec={"obs": {"dtype": "float32", "shape": [4]}},
                      run={"timeout_s": timeout},
                      layout={"learners": 0, "buffers": 1, "actors": COMM.size - 1},
                      storage={"capacity_rows": 64})
    rows = {"obs": np.zeros((8, 4), np.float32)}
    seen, victim = "nothing", -1
    try:
        with ExperienceDataPlane(cfg) as edp:
            victim = edp.roles.actor_ranks[0]
            if edp.role is Role.ACTOR:
                n = 0
                if edp.world_rank == victim:
                    write = edp.control.write

                    def interrupted(*args):  # the second Ctrl-C, once
                        edp.control.write = write
                        raise KeyboardInterrupt("second")
                    edp.control.write = interrupted
                while not edp.should_stop:
                    edp.ingest(rows)
                    n += 1
                    if edp.world_rank == victim and n == 10:
                        raise KeyboardInterrupt("first")
                edp.done()
            else:
                edp.serve()
    except KeyboardInterrupt as err:
        seen = f"KeyboardInterrupt: {err}"
    except RemoteFailure as err:
        seen = f"RemoteFailure: {err}"
    assert_stopped_by(COMM.allreduce(victim, op=MPI.MAX), seen, "KeyboardInterrupt")


class SyncInterrupted:
    """A transport whose ``at``-th ``sync()`` raises ``KeyboardInterrupt`` after the
    barrier (the signal handler runs at the next bytecode)."""

    def __init__(self, inner, at: int) -> None:
        self.inner, self.at, self.calls = inner, at, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def sync(self):
        self.inner.sync()
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt


def _learner_trains_on_through_ctrl_c(arm: Callable[[Any], None],
                                     look: Callable[[Any], list]) -> list[tuple]:
    """A job whose node-local learner, ``arm(edp)``-ed to be interrupted once inside its
    priority writes, catches the ``KeyboardInterrupt`` and trains on for 40 batches; the
    actors ingest and the buffer serves. Asserts that every rank finished and that the
    learner caught the interrupt once; returns every rank's ``(ending, interrupts,
    look(edp))``, ``look`` run on the learner after its batches."""
    cfg = make_config(spec={"obs": {"dtype": "float32", "shape": [4]}},
                      run={"timeout_s": TIMEOUT_S},
                      layout={"learners": 1, "buffers": 1, "actors": COMM.size - 2},
                      storage={"capacity_rows": 64}, transport=TRANSPORTS["shm"],
                      scheduler={"mode": "sync", "batch_rows": 8, "min_fill_rows": 16})
    rows = {"obs": np.zeros((8, 4), np.float32)}
    seen, interrupted, seen_after = "nothing", 0, []
    try:
        with ExperienceDataPlane(cfg) as edp:
            if edp.role is Role.ACTOR:
                while not edp.should_stop:
                    edp.ingest(rows)
            elif edp.serves:
                edp.serve()
            else:
                arm(edp)
                for step in range(40):
                    b = edp.next_batch()
                    try:  # a hostile job: catches Ctrl-C and trains on
                        edp.update_priorities(b.indices, np.full(len(b), 1.0 + step))
                    except KeyboardInterrupt:
                        interrupted += 1
                seen_after = look(edp)
            edp.done()
        seen = "finished"
    except Exception as err:  # a timeout (or anything else) is the finding
        seen = f"{type(err).__name__}: {err}"
    every = COMM.allgather((seen, interrupted, seen_after))
    assert all(s == "finished" for s, _, _ in every), every
    assert sum(i for _, i, _ in every) == 1, every  # the interrupt stayed one
    return every


@pytest.mark.mpi(min_size=3)
def test_an_interrupt_that_leaves_the_index_seqlock_open_heals_at_the_next_write() -> None:
    """A learner on the shard's node writes its priority updates into the shard's index
    itself, inside the seqlock. Ctrl-C in ``index_write_end`` after the stats but before
    the closing increment left the version odd; the job caught it and went on: the
    next write's increment made it even *during* writes and odd after, so every reader
    (the learner's own draws) retried until ``run.timeout_s`` - or took a torn read.
    The seqlock's values are absolute now (open: odd, closed: the next even), so the
    next write closes it and the job runs to its end with the priorities it set."""
    def arm(edp) -> None:
        armed = {"at": 5}
        for ring in edp.rings.values():
            if ring.views is None:
                continue
            end = ring.index_write_end

            def interrupted_end(*args, ring=ring, end=end):
                armed["at"] -= 1
                if armed["at"]:
                    return end(*args)
                inner = ring.transport  # the 2nd sync: stats out, not closed
                ring.transport = SyncInterrupted(inner, 2)
                try:
                    return end(*args)
                finally:
                    ring.transport = inner
            ring.index_write_end = interrupted_end

    def versions(edp) -> list[int]:
        from conduit_hpc.storage.layout import H_STATS_VERSION
        from conduit_hpc.storage.shared_index import lock_index, unlock_index

        out = []
        for r in edp.rings.values():
            if r.views is None:
                continue
            # Read under the index lock: the owner commits the actors' rows inside the
            # seqlock, so an unlocked read can land in one of its writes (odd for a
            # moment; seen at 6 ranks). Under the lock, only a write an interrupt left
            # open shows odd.
            lock_index(r, COMM.rank)
            try:
                out.append(int(r.views.header[H_STATS_VERSION]) % 2)
            finally:
                unlock_index(r, COMM.rank)
        return out

    every = _learner_trains_on_through_ctrl_c(arm, versions)
    assert all(v == 0 for _, _, vs in every for v in vs), every  # every seqlock closed


def _collective_job(tmp_path_factory) -> tuple[str, Any]:
    """A checkpoint root every rank names alike, and the small job of the collective
    interrupt tests (a 6 s timeout: a stop by deadline would take that long)."""
    root = COMM.bcast(str(tmp_path_factory.mktemp("ckpt")) if COMM.rank == 0 else None)
    return root, make_config(spec={"obs": {"dtype": "float32", "shape": [4]}},
                             run={"timeout_s": 6.0},
                             layout={"learners": 1, "buffers": 1, "actors": COMM.size - 2},
                             storage={"capacity_rows": 64}, checkpoint={"on_stop": False})


def _interrupt_after_the_arrival(monkeypatch, *, once: bool = False) -> None:
    """This rank's next JSON all-gather raises ``KeyboardInterrupt`` after every rank
    arrived, once the others are in its data step (not still settling the arrival);
    ``once``: the all-gathers after it run as they are."""
    from conduit_hpc.transport import objects

    gathered = objects.bounded_allgather

    def interrupted(*args, **kwargs):
        gathered(*args, **kwargs)
        time.sleep(2.0)
        if once:
            monkeypatch.setattr(objects, "bounded_allgather", gathered)
        raise KeyboardInterrupt
    monkeypatch.setattr(objects, "bounded_allgather", interrupted)


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("call", ["summary", "save"])
def test_an_interrupt_between_a_collectives_arrival_and_its_data_step_stops_every_rank(
        call, monkeypatch, tmp_path_factory) -> None:
    """The JSON collectives are bounded at their arrival (every rank has come) and then
    moved the data with a plain ``Allgatherv``/``Bcast``/``Gatherv``. Ctrl-C on one rank
    between the two (here: right after the sizes are gathered), caught outside the block,
    left every other rank in the plain collective forever, checking nothing (seen with a
    learner interrupted in ``save_checkpoint``). The data step is bounded too now: the
    others raise :class:`RemoteFailure` naming the interrupted rank."""
    from pathlib import Path

    root, cfg = _collective_job(tmp_path_factory)
    seen, victim = "nothing", -1
    try:
        with ExperienceDataPlane(cfg) as edp:
            victim = edp.roles.learner_ranks[0]
            if edp.world_rank == victim:
                _interrupt_after_the_arrival(monkeypatch)
            if call == "summary":
                edp.summary()
            else:
                from conduit_hpc.features.checkpointing import save_checkpoint

                save_checkpoint(edp, Path(root))
    except KeyboardInterrupt:
        seen = "KeyboardInterrupt"
    except RemoteFailure as err:
        seen = f"RemoteFailure: {err}"
    assert_stopped_by(COMM.allreduce(victim, op=MPI.MAX), seen, "KeyboardInterrupt")


@pytest.mark.mpi(min_size=3)
@pytest.mark.skipif(COMM.size != 3, reason="one rank count (make test's time)")
@pytest.mark.parametrize("call", ["summary", "save"])
def test_a_collective_called_again_after_an_interrupted_one_stops_every_rank(
        call, monkeypatch, tmp_path_factory) -> None:
    """As above, but the interrupted rank catches Ctrl-C inside the block and calls again.
    Its new collective's messages were matched to the data step the others were still
    in: they failed with UnicodeDecodeError (another collective's bytes decoded as this
    one's JSON: bytes that happen to parse would have been taken as data) and the
    interrupted rank with MPI_ERR_TRUNCATE. The interrupted rank now refuses any
    collective on a communicator it left out of step (CollectiveFailed, saying so), and
    the others stop with RemoteFailure naming it."""
    import contextlib
    from pathlib import Path

    from conduit_hpc.features.checkpointing import save_checkpoint

    root, cfg = _collective_job(tmp_path_factory)
    seen, victim = "nothing", -1
    try:
        with ExperienceDataPlane(cfg) as edp:
            victim = edp.roles.learner_ranks[0]

            def collective() -> None:
                if call == "summary":
                    edp.summary()
                else:
                    save_checkpoint(edp, Path(root))
            if edp.world_rank == victim:
                _interrupt_after_the_arrival(monkeypatch, once=True)
                with contextlib.suppress(KeyboardInterrupt):  # a hostile job: catches
                    collective()  # Ctrl-C and calls again
            collective()
        seen = "finished"
    except Exception as err:  # what each rank ended with is the finding
        seen = f"{type(err).__name__}: {err}"
    assert_stopped_by(COMM.allreduce(victim, op=MPI.MAX), seen, "CollectiveFailed")
    if COMM.rank == COMM.allreduce(victim, op=MPI.MAX):
        assert "out of step" in seen and "KeyboardInterrupt" in seen, seen


class LockTakeInterrupted:
    """A transport whose ``at``-th compare-and-swap that takes a lock (0 -> holder)
    succeeds and then raises ``KeyboardInterrupt`` (the signal handler runs at the next
    bytecode, before the caller's ``try``)."""

    def __init__(self, inner, at: int) -> None:
        self.inner, self.at, self.takes = inner, at, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def compare_and_swap(self, target_rank, displacement, compare, value):
        old = self.inner.compare_and_swap(target_rank, displacement, compare, value)
        if compare == 0 and old == 0:
            self.takes += 1
            if self.takes == self.at:
                raise KeyboardInterrupt
        return old


@pytest.mark.mpi(min_size=3)
@pytest.mark.skipif(COMM.size != 3, reason="one rank count (make test's time)")
def test_an_interrupt_right_after_the_index_lock_is_taken_gives_it_back() -> None:
    """A node-local learner takes the shard's index lock to write its priority updates.
    Ctrl-C after the compare-and-swap took it, before the ``try`` that gives it back,
    left it held: the job caught the interrupt and went on, and every index writer (the
    owner committing the actors' rows, the learner's next update) waited out
    ``run.timeout_s`` for "the index lock of the shard ... held by world rank" the
    learner. The take gives the lock back now; the job runs to its end."""
    def arm(edp) -> None:
        for ring in edp.rings.values():
            if ring.views is not None:
                ring.transport = LockTakeInterrupted(ring.transport, 3)

    def held_by_me(edp) -> list[bool]:
        from conduit_hpc.storage.layout import H_INDEX_LOCK

        return [int(r.views.header[H_INDEX_LOCK]) == edp.world_rank + 1
                for r in edp.rings.values() if r.views is not None]

    every = _learner_trains_on_through_ctrl_c(arm, held_by_me)
    assert not any(mine for _, _, held in every for mine in held), every  # not left held
