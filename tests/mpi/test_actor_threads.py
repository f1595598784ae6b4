"""Threads of one actor rank: concurrent ingest, and done()/close() from another thread
while an ingest is in flight or blocked; the plane after close()."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest
import torch
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc.errors import UsedAfterClose
from conduit_hpc.plane.control import C_INSERTS, C_RESERVED, C_SAMPLES
from conduit_hpc.scheduler import LimiterState
from conduit_hpc.testing import (
    FRAME_SPEC,
    checked_batch,
    frame_rows,
    frame_stacks_of,
    make_config,
    row_consistent,
)
from conduit_hpc.wait import wait_until

COMM = MPI.COMM_WORLD
THREADS = 3


def held_rows(edp: ExperienceDataPlane) -> dict[int, tuple]:
    """On buffers: shard -> (seqs, columns, committed); elsewhere {}. Inside the block."""
    out = {}
    for s in edp.owned_shards():
        seqs, cols, _ = s.ring.read_committed()
        out[s.shard_id] = (seqs, cols, s.committed)
    return out


def gathered(edp: ExperienceDataPlane, receipts: list, held: dict) -> tuple[dict, dict]:
    """Every rank's receipts (shard -> seq -> (writer, wseq)) and held rows."""
    expected: dict[int, dict[int, tuple[int, int]]] = {}
    for rs in edp.roles.world.allgather(receipts):
        for writer, shard, first, wseq, n in rs:
            for i in range(n):
                assert first + i not in expected.setdefault(shard, {}), "seq handed twice"
                expected[shard][first + i] = (writer, wseq + i)
    every: dict = {}
    for h in edp.roles.world.allgather(held):
        every.update(h)
    return expected, every


def assert_exactly_the_receipted_rows(expected: dict, held: dict, capacity: int) -> None:
    """Every committed row is one some thread got a receipt for, and the reverse: the
    newest ``capacity`` of them are held, whole, each once."""
    for shard, (seqs, cols, committed) in held.items():
        exp = expected.get(shard, {})
        assert committed == len(exp), "a receipted row was never committed (or extra)"
        assert row_consistent(cols).all(), "a torn row"
        want = sorted(s for s in exp if s >= committed - capacity)
        assert seqs.tolist() == want
        got = list(zip(cols["writer"].tolist(), cols["wseq"].tolist(), strict=True))
        assert got == [exp[s] for s in want]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("shm", ["auto", "never"])
def test_threads_of_one_actor_ingest_every_row_once(shm: str) -> None:
    """Three threads of every actor ingest at once into a 37-slot ring that laps many
    times: every receipted row is committed, the newest are held whole, each once, and
    the rank's counters add up the threads' rows."""
    cfg = make_config(layout={"learners": 0, "buffers": 1},
                      storage={"capacity_rows": 37}, transport={"shared_memory": shm})
    receipts: list = []
    errors: list = []
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:

            def work(t: int) -> None:
                writer, wseq = edp.world_rank * 100 + t, 0
                try:
                    for i in range(60):
                        n = 1 + (i * 7 + t) % 9
                        r = edp.ingest(checked_batch(writer, wseq, n),
                                       priorities=torch.ones(n, requires_grad=True))
                        receipts.append((writer, r.shard_id, r.first_seq, wseq, n))
                        wseq += n
                except BaseException as err:  # the thread reports it
                    errors.append(err)

            threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            assert not errors, errors
            assert edp.ingest_stats.rows == sum(r[4] for r in receipts)
            assert edp.ingest_stats.batches == len(receipts) == THREADS * 60
            edp.done()
        else:
            edp.serve()
        expected, held = gathered(edp, receipts, held_rows(edp))
    assert_exactly_the_receipted_rows(expected, held, 37)


@pytest.mark.mpi(min_size=2)
def test_threads_of_one_actor_ingest_frame_stacks_exactly() -> None:
    """Frame stacks (each frame stored once, remembered per writer): threads of one
    actor, one stream each, ingest at once; every stack held is the one produced."""
    cfg = make_config(spec=FRAME_SPEC, layout={"learners": 0, "buffers": 1},
                      storage={"capacity_rows": 192})
    made: set = set()
    errors: list = []
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:

            def work(t: int) -> None:
                rng = np.random.default_rng(t)
                env = edp.world_rank * 10 + t
                try:
                    for episode in range(12):
                        rows = frame_rows(env, episode, int(rng.integers(5, 30)))
                        pos = 0
                        while pos < len(rows["env"]):
                            k = int(rng.integers(1, 5))
                            part = {n: c[pos:pos + k] for n, c in rows.items()}
                            edp.ingest(part)
                            made.update(zip(part["env"].tolist(), part["episode"].tolist(),
                                            part["step"].tolist(), strict=True))
                            pos += k
                except BaseException as err:  # the thread reports it
                    errors.append(err)

            threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            assert not errors, errors
            edp.done()
        else:
            edp.serve()
        cols = [c for _, c, _ in held_rows(edp).values()]
        every_made = set().union(*edp.roles.world.allgather(made))
    for c in cols:
        assert len(c["env"]) > 0 and frame_stacks_of(c).all()
        assert set(zip(c["env"].tolist(), c["episode"].tolist(), c["step"].tolist(),
                       strict=True)) <= every_made


def received(req: MPI.Request) -> None:
    """Wait (bounded) for a message posted with ``irecv``."""
    wait_until(lambda: req.test()[0], timeout_s=30.0, what="another rank's message")


def blocked_ingest_then(end: str, held_by: str = "ring") -> tuple[list, list, dict, dict]:
    """1 learner (draws nothing), 1 buffer, actors: a second thread of each actor
    ingests 8-row batches until refused; once every actor's next batch is held back
    (``held_by`` ``ring``: it reserved its slots in a 64-row ring per actor under the
    ``block`` ingest policy; ``limiter``: the rate limiter admits no more rows), the
    main thread calls ``done()`` or ``close()`` (``end``); the learner ends after that.
    Returns the receipts, the errors that ended the threads, and (``done`` only) every
    rank's receipts and held rows."""
    actors = COMM.size - 2
    storage = {"capacity_rows": 64 * actors, "ingest_policy": "block",
               "block_timeout_s": 10.0}
    sch = {"mode": "sync", "batch_rows": 4, "min_fill_rows": 8}
    if held_by == "limiter":
        storage = {"capacity_rows": 1000}
        sch |= {"samples_per_insert": 1.0, "error_buffer": 40, "max_insert_batch": 8}
    cfg = make_config(layout={"learners": 1, "buffers": 1}, storage=storage,
                      scheduler=sch, run={"timeout_s": 30.0})
    receipts: list = []
    ended: list = []
    expected: dict = {}
    held: dict = {}
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:

            def work() -> None:
                wseq = 0
                try:
                    while True:
                        r = edp.ingest(checked_batch(edp.world_rank, wseq, 8))
                        receipts.append((edp.world_rank, r.shard_id, r.first_seq, wseq, 8))
                        wseq += 8
                except BaseException as err:  # the thread reports it
                    ended.append(err)

            th = threading.Thread(target=work)
            th.start()
            ring, control, lim = edp.actor.rings[edp.actor.home], edp.control, edp.limiter

            def held() -> bool:  # every actor's next batch waits, and waits for good
                if held_by == "ring":
                    return ring.reserve_cursor() >= 72 * actors
                inserts = control.read(C_INSERTS)
                return (control.read(C_RESERVED) == inserts + 8 * actors and not
                        lim.can_insert(LimiterState(inserts, control.read(C_SAMPLES), 0), 8))

            wait_until(lambda: held() or ended, timeout_s=30.0, what="held-back batches")
            learner = edp.roles.learner_ranks[0]
            COMM.send(True, dest=learner, tag=77)
            received(COMM.irecv(source=learner, tag=78))  # every actor saw it held
            if end == "close":
                edp.close()
            else:
                edp.done()
                if held_by == "limiter":  # (a message left unreceived would be the
                    COMM.send(True, dest=learner, tag=79)  # next test's)
            th.join(timeout=60.0)
            assert not th.is_alive()
        elif edp.role is Role.LEARNER:
            for tag in (77, 79) if held_by == "limiter" else (77,):
                # the actors' done() first: the learner's would let the limiter admit
                for a in edp.roles.actor_ranks:
                    received(COMM.irecv(source=a, tag=tag))
                if tag == 77:
                    for a in edp.roles.actor_ranks:
                        COMM.send(True, dest=a, tag=78)
            edp.done()
        else:
            edp.serve()
        if end == "done":
            expected, held = gathered(edp, receipts, held_rows(edp))
            if held_by == "limiter":  # every rank is done: no refused ingest's reservation
                assert edp.control.read(C_RESERVED) == edp.control.read(C_INSERTS)
    return receipts, ended, expected, held


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("held_by", ["ring", "limiter"])
def test_done_on_another_thread_keeps_the_blocked_ingest_rows(held_by: str) -> None:
    """done() while another thread's ingest is held back by the ``block`` policy or by
    the rate limiter: that ingest finishes first and its rows are committed, or it is
    refused with nothing written (the limiter's reservation given back) - never a
    receipt for rows the buffers never commit (before: the held batch got a receipt
    once the learner ended, and the buffer had stopped before its rows came)."""
    receipts, ended, expected, held = blocked_ingest_then("done", held_by)
    if receipts:  # an actor: its thread ended on the refusal, nothing else
        assert len(ended) == 1 and isinstance(ended[0], UsedAfterClose), ended
    assert_exactly_the_receipted_rows(expected, held, 64 * (COMM.size - 2))


@pytest.mark.mpi(min_size=3)
def test_close_on_another_thread_while_ingest_blocks() -> None:
    """close() (collective) while another thread's ingest is held back: it finishes or
    is refused with UsedAfterClose, and the job ends cleanly on every rank (close()
    waits for it before the buffers stop and the windows are freed)."""
    receipts, ended, _, _ = blocked_ingest_then("close")
    if receipts:  # an actor
        assert len(ended) == 1 and isinstance(ended[0], UsedAfterClose), ended


@pytest.mark.mpi(min_size=3)
def test_calls_after_close_are_refused_on_every_role() -> None:
    """After the with-block: summary(), share_weights(), pull_weights() and
    owned_shards() raise UsedAfterClose naming the call (before: summary() on a buffer
    read freed shared memory and crashed the process; the others raised raw MPI
    errors), should_stop is True (a producer thread's loop ends), done() and close()
    are no-ops."""
    cfg = make_config(layout={"learners": 1, "buffers": 1}, storage={"capacity_rows": 64},
                      scheduler={"mode": "sync", "batch_rows": 4, "min_fill_rows": 8})
    model = torch.nn.Linear(3, 2)
    with ExperienceDataPlane(cfg) as edp:
        edp.share_weights(None if edp.serves else model)
        if edp.role is Role.ACTOR:
            edp.ingest(checked_batch(edp.world_rank, 0, 8))
        if edp.serves:
            edp.serve()
        else:
            edp.done()
        edp.done()  # twice: a no-op
        assert edp.summary()["rows_ingested"] == 8 * len(edp.roles.actor_ranks)
    for name, call in [("summary()", edp.summary),
                       ("share_weights()", lambda: edp.share_weights(model)),
                       ("pull_weights()", edp.pull_weights),
                       ("owned_shards()", edp.owned_shards)]:
        with pytest.raises(UsedAfterClose, match=re.escape(
                f"{name} called after close() on world rank {COMM.rank}")):
            call()
    assert edp.should_stop
    edp.done()
    edp.close()
