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


def bounded_barrier(comm: MPI.Comm, timeout_s: float = 30.0, poll_s: float = 0.01) -> bool:
    """A barrier that gives up after ``timeout_s`` (returns whether every rank came):
    for clean-up, where after a failure on one rank the others may never arrive."""
    req = comm.Ibarrier()
    end = time.monotonic() + timeout_s
    while not req.Test():
        if time.monotonic() > end:
            return False
        time.sleep(poll_s)
    return True


_ALIGN: list[MPI.Comm] = []  # a private duplicate of the world, made at the first test


@pytest.fixture(autouse=True)
def _every_rank_starts_the_test_together() -> None:
    """Every rank starts each test together (a bounded barrier on a private communicator,
    so that one left pending after a failure is never matched by a test's own): a test's
    first collective is bounded by its ``run.timeout_s`` - 3 s in some - and the skew the
    ranks brought from their start (each imports and collects on its own) or from the
    end of the test before counted against it (``-k`` of two 3 s tests of
    test_delivery.py at 3 ranks under load: "waited 3.0 s for every rank of 3 to reach
    the data plane's constructor", both tests, in 1 run of 4)."""
    if not _ALIGN:
        _ALIGN.append(MPI.COMM_WORLD.Dup())
    # (polled every 0.5 ms: at 10 ms, each of a barrier's rounds waited for a poll, and
    # the barrier before each of ~380 tests added a minute to the 6-rank run)
    bounded_barrier(_ALIGN[0], 60.0, poll_s=0.0005)


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


def play(edp: Any, learner: Callable[[Any], object], *, checked: int = 0) -> object:
    """Each rank's part up to ``done()``: actors ingest :func:`small_rows` until the run
    stops (with ``checked``: batches of ``checked_batch(world_rank, w, checked)``, ``w``
    counting the rows on), buffers (and delivery ranks) serve, the learner runs
    ``learner(edp)``. Returns what ``learner`` returned (None on the other ranks)."""
    from conduit_hpc import Role
    from conduit_hpc.testing import checked_batch

    got = None
    if edp.role is Role.ACTOR:
        w = 0
        while not edp.should_stop:
            edp.ingest(checked_batch(edp.world_rank, w, checked) if checked else small_rows())
            w += checked
    elif edp.serves:
        edp.serve()
    else:
        got = learner(edp)
    edp.done()
    return got


def _wait_committed(ring: Any, seq: int, timeout_s: float = 20.0) -> None:
    """Until ``ring``'s commit cursor reaches ``seq`` (bounded): the owner commits in
    its serve loop, which a loaded machine may not run before the victim's failing
    write (then nothing is committed, and there is nothing to check)."""
    import time

    from conduit_hpc.storage.layout import H_COMMIT

    end = time.monotonic() + timeout_s
    while int(ring.read_header()[H_COMMIT]) < seq:
        assert time.monotonic() < end, f"seq {seq} not committed in {timeout_s} s"
        time.sleep(0.001)


def hostile_writer_run(shared_memory: str, timeout_s: float, wrap: Callable[[Any], Any],
                       caught: type[BaseException]) -> dict[str, Any]:
    """The job of the abandoned-write tests (test_abandoned_write, test_interrupts): the
    first actor ingests through ``wrap(ring.transport)``, catching ``caught`` and
    ingesting on, as a hostile job would; the other actors ingest, a learner (4 ranks and
    more) draws, the buffer serves and keeps what it holds. Returns, on every rank: the
    error this rank ended with (None: none), the first actor's world rank (``victim``),
    how often it caught ``caught``, what its later ingests raised (``later``), and every
    rank's receipts (``wrote``: (shard, seq) -> (writer, wseq)) with what the buffer held
    (``held``: shard -> (seqs, columns))."""
    from conduit_hpc import ExperienceDataPlane, IngestAbandoned, RemoteFailure, Role
    from conduit_hpc.testing import checked_batch, make_config

    comm = MPI.COMM_WORLD
    learners = 1 if comm.size >= 4 else 0
    cfg = make_config(run={"timeout_s": timeout_s},
                      layout={"learners": learners, "buffers": 1,
                              "actors": comm.size - 1 - learners},
                      storage={"capacity_rows": 16},
                      transport={"shared_memory": shared_memory},
                      scheduler={"mode": "sync", "batch_rows": 4, "min_fill_rows": 4})
    error: BaseException | None = None
    times, later = 0, []
    receipts: list[tuple[int, int, int, int]] = []
    held: dict[int, tuple] = {}
    committed = 0  # rows the buffer found committed, intact after its copy or not
    victim = -1
    try:
        with ExperienceDataPlane(cfg) as edp:
            victim = edp.roles.actor_ranks[0]
            me = edp.world_rank
            if edp.role is Role.ACTOR:
                if me == victim:
                    for ring in edp.rings.values():
                        ring.transport = wrap(ring.transport)
                w = 0
                while not edp.should_stop:
                    try:  # a hostile job: catches the failure and ingests on
                        r = edp.ingest(checked_batch(me, w, 3))
                        receipts.append((r.shard_id, r.first_seq, w, 3))
                        if me == victim and w == 0:  # rows committed before the gap
                            _wait_committed(edp.rings[r.shard_id], r.first_seq + 3)
                    except caught:
                        times += 1
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
                finally:  # the other actors may still be writing: only rows intact
                    for s in edp.owned_shards():  # after the copy (the ring's rule) count
                        seqs, _, _ = s.ring.read_committed()
                        cols, cursor = s.ring.gather(seqs % s.ring.capacity)
                        ok = s.ring.intact(seqs + 1, cursor)
                        committed += len(seqs)
                        held[s.shard_id] = (seqs[ok], {k: v[ok] for k, v in cols.items()})
    except Exception as err:  # RemoteFailure expected; a timeout (or other) is a finding
        error = err
    every = comm.allgather(receipts)
    wrote = {(sid, first + k): (rank, w + k) for rank, rs in enumerate(every)
             for sid, first, w, n in rs for k in range(n)}
    return {"error": error, "victim": comm.allreduce(victim, op=MPI.MAX), "caught": times,
            "later": later, "wrote": wrote, "held": held,
            "committed": comm.allreduce(committed)}


def assert_held_as_written(run: dict[str, Any]) -> None:
    """What the buffer holds (:func:`hostile_writer_run`) is whole and is the row its
    writer wrote at that seq (writes past a gap may overwrite rows committed before it:
    they had those slots, as in any lap). The buffer found rows committed (the victim
    waits for its first batch to be); that any of them is still intact after its copy
    is not asked: the other actors write on past the gap until they see the failure,
    and on a 16-row ring they may lap every committed row first (seen at 3 ranks on a
    loaded machine)."""
    from conduit_hpc.testing import row_consistent

    assert run["committed"] > 0, run
    for sid, (seqs, cols) in run["held"].items():
        assert row_consistent(cols).all()
        got = list(zip(cols["writer"].tolist(), cols["wseq"].tolist(), strict=True))
        assert got == [run["wrote"][(sid, int(q))] for q in seqs]


def assert_stopped_by(victim: int, seen: str, victim_saw: str) -> None:
    """Every rank's ending (``seen``, gathered here) names ``victim``: the victim's
    starts with ``victim_saw``; every other rank's is its RemoteFailure naming the
    victim (not a deadline's error)."""
    every = MPI.COMM_WORLD.allgather(seen)
    for rank, text in enumerate(every):
        assert (text.startswith(victim_saw) if rank == victim
                else f"world rank {victim} left" in text), every
