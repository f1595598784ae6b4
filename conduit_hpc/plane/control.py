"""The job-wide control block: counters every rank updates with MPI atomics.

64 bytes in the first buffer rank's memory: rows inserted by actors, rows sampled by
learners, actors and learners done, the lead learner's superstep, rows actors reserved
(admitted or waiting), and a rank that left on an exception (:meth:`ControlBlock.left_on_error`: the
others stop with :class:`~conduit_hpc.errors.RemoteFailure` rather than wait for it).
After them, the arrival board: one int64 per world rank, the bounded collectives of the
world it has entered (:meth:`ControlBlock.arrive`), so that a wait that gives up names
the ranks that never came (:meth:`ControlBlock.behind`); used where every rank is on the
block owner's node (``world_size`` 0 elsewhere: no atomics across nodes are added).
Plane-internal; features read it through the endpoints.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from conduit_hpc.errors import (
    CollectiveFailed,
    ConduitError,
    DataPlaneTimeout,
    RemoteFailure,
    TransportError,
)
from conduit_hpc.transport.rma import RmaWindow
from conduit_hpc.wait import NO_HOSTS

__all__ = [
    "CONTROL_BYTES",
    "C_ACTORS_DONE",
    "C_BOARD",
    "C_FAILED",
    "C_FAILED_FIRST",
    "C_INSERTS",
    "C_LEARNERS_DONE",
    "C_LEARNER_VERSION",
    "C_RESERVED",
    "C_SAMPLES",
    "ControlBlock",
    "control_bytes",
]

# control block slots (int64): rows written by actors, rows sampled by learners, ranks
# done, the lead learner's superstep, rows actors have reserved (admitted or waiting),
# ranks that left the data plane on an exception, and 1 + the world rank of the first
(C_INSERTS, C_SAMPLES, C_ACTORS_DONE, C_LEARNERS_DONE, C_LEARNER_VERSION,
 C_RESERVED, C_FAILED, C_FAILED_FIRST) = range(8)
CONTROL_BYTES = 64  # the counters; the arrival board follows (control_bytes)
C_BOARD = CONTROL_BYTES // 8  # slot of world rank 0's arrival count


def control_bytes(world_size: int) -> int:
    """Bytes of the control block of a world of ``world_size`` ranks (counters and
    the arrival board)."""
    return CONTROL_BYTES + 8 * world_size


class ControlBlock:
    """Job-wide counters in 64 bytes of one rank's memory, updated with atomics.

    Args:
        window (RmaWindow): the window holding the block.
        owner (int): rank whose segment holds it, at displacement 0.
        local (bool): the owner is on this rank's node (no link between them).
    """

    def __init__(self, window: RmaWindow, owner: int, *, local: bool = False,
                 world_size: int = 0) -> None:
        self.window, self.owner, self.local = window, owner, local
        self.hosts = NO_HOSTS  # each world rank's host, for errors (ShardMemory sets it)
        self.world_size = world_size  # ranks on the arrival board (0: no board)
        self._arrived = 0  # bounded collectives of the world this rank entered
        #: run (local, best effort) when this rank leaves on an exception, after the
        #: mark: e.g. the learners' process group shuts down, so that learners waiting
        #: for this one in a collective stop now instead of at its deadline
        self.on_leave: list[Callable[[], object]] = []

    def add(self, slot: int, n: int) -> int:
        """Atomically add ``n``; returns the old value. Blocks for the round trip."""
        return self.window.fetch_add(self.owner, 8 * slot, n)

    def read(self, slot: int) -> int:
        return self.window.atomic_read(self.owner, 8 * slot)

    def write(self, slot: int, value: int) -> None:
        self.window.atomic_write(self.owner, 8 * slot, value)

    def arrive(self, rank: int) -> None:
        """World rank ``rank`` (this one) enters a bounded collective of the world:
        count it on the arrival board (one atomic write). Best effort."""
        self._arrived += 1
        if 0 <= rank < self.world_size:
            with contextlib.suppress(ConduitError):
                self.write(C_BOARD + rank, self._arrived)

    def behind(self) -> list[int]:
        """The world ranks that have entered fewer bounded collectives of the world than
        this one: those its wait that gave up waited for (another rank's count may
        still be on its way). Best effort: ``[]`` where the board cannot be read."""
        if not self.world_size:
            return []
        counts = np.zeros(self.world_size, np.int64)
        try:
            self.window.get(self.owner, 8 * C_BOARD, counts)
            self.window.flush(self.owner)
        except (ConduitError, MPI.Exception):
            return []
        return [int(r) for r in np.flatnonzero(counts < self._arrived)]


    def left_on_error(self, rank: int, exc: BaseException | None, done: bool) -> None:
        """World rank ``rank`` leaves the data plane on ``exc`` (an exception out of its
        ``with`` block): mark it, so that every other rank stops with
        :class:`~conduit_hpc.errors.RemoteFailure` (:meth:`raise_if_failed`) instead of
        waiting for a rank that will never come - also when the exception is caught
        outside the block and the process ends normally. ``sys.exit(0)`` after
        ``done()`` is a clean leave, not a failure. Not marked: another rank's failure
        (:class:`RemoteFailure`: that rank is marked), a transport failure, and a
        timeout where the block's owner is on another node (the write crosses the link
        the wait may have run out on: after a dropped link it never returned; the peers'
        own deadlines end them). A timeout with the owner on this node is marked, also
        a collective's (:class:`CollectiveFailed`, e.g. ``summary()`` called while a
        buffer serves): the peers may never wait on anything (actors lapping a ring
        ingest on forever, a buffer in ``serve()``). Best effort: the window may be
        what failed."""
        if isinstance(exc, SystemExit) and exc.code in (0, None) and done:
            return
        try:
            self.mark_failed(rank, exc)
        finally:
            for leave in self.on_leave:
                with contextlib.suppress(Exception):  # best effort, as the mark
                    leave()

    def mark_failed(self, rank: int, exc: BaseException | None) -> None:
        """Mark world rank ``rank`` as failed on ``exc`` (by the rules of
        :meth:`left_on_error`), without leaving: e.g. a write that failed after reserving
        ring slots, which no later row of its shard can pass (every rank must stop,
        also when the writer catches the error). Best effort."""
        # a wait of this rank's own that ran out (also a collective's: CollectiveFailed
        # means no rank was marked, else it had raised RemoteFailure) is marked like a
        # timeout; a buffer in serve() waits on no deadline and would wait for ever
        timeout = isinstance(exc, DataPlaneTimeout | CollectiveFailed)
        if (timeout and not self.local) or (
                not timeout and isinstance(exc, TransportError | RemoteFailure)):
            return
        interrupt: BaseException | None = None
        for _ in range(3):  # a second Ctrl-C (a raising signal handler) during the mark
            try:  # must not leave it unmade: no peer waiting on no deadline would end
                with contextlib.suppress(ConduitError, OSError):  # the transport failed
                    if not self.read(C_FAILED_FIRST):  # the first to leave is named
                        self.write(C_FAILED_FIRST, rank + 1)  # (others leave on it),
                    self.add(C_FAILED, 1)  # written before the count: a reader sees a name
                break
            except BaseException as err:  # made again, then raised
                interrupt = interrupt or err
        if interrupt is not None:
            raise interrupt

    def name_first(self, rank: int) -> None:
        """Name world rank ``rank`` as the first to fail, if no rank is named yet,
        without counting it (its own mark counts it): for a rank told of a peer's
        failure over another path before that peer marked itself (a learner told by
        its delivery rank, which tells it first), which may then leave on it and be
        marked - and named first - in the peer's place. Best effort."""
        with contextlib.suppress(ConduitError, OSError):
            if not self.read(C_FAILED_FIRST):
                self.write(C_FAILED_FIRST, rank + 1)

    def failed(self) -> bool:
        """Whether a rank left the data plane on an exception. One atomic read."""
        return self.read(C_FAILED) > 0

    def raise_if_failed(self, rank: int) -> None:
        """Raise :class:`~conduit_hpc.errors.RemoteFailure` on world rank ``rank`` if a
        rank left the data plane on an exception (:meth:`left_on_error`)."""
        if self.read(C_FAILED):
            first = self.read(C_FAILED_FIRST)  # written before the count
            if first == rank + 1:  # this rank marked itself and went on (a caught error)
                raise RemoteFailure(f"world rank {rank} failed earlier (its first error "
                                    f"says why) and the job stops")
            who = self.hosts.rank(first - 1) if first else "another rank"
            raise RemoteFailure(f"{who} left the data plane on an exception (its own "
                                f"error says why); world rank {rank} stops too")

    def watch(self, rank: int, every_s: float = 0.5) -> Callable[[], None]:
        """:meth:`raise_if_failed` for world rank ``rank`` that reads the block at most
        every ``every_s`` seconds (for loops that may never wait long). Local."""
        due = [0.0]

        def check() -> None:
            now = time.monotonic()
            if now >= due[0]:
                due[0] = now + every_s
                self.raise_if_failed(rank)

        return check

    def count_done(self, learners: tuple[int, ...], writers: tuple[int, ...],
                   rank: int) -> None:
        """World rank ``rank`` said it is done: count it among the learners and among the
        writers (actors, and learners that ingest) if it is one. The control block's
        owner calls this, once per rank."""
        if rank in learners:
            self.add(C_LEARNERS_DONE, 1)
        if rank in writers:
            self.add(C_ACTORS_DONE, 1)
