"""Stopping together: SIGTERM / SIGUSR1 on any rank become a stop every rank sees.

A rank that gets the signal sends :attr:`~conduit_hpc.plane.buffer.Tag.STOP` to every other
rank; buffer ranks notice it inside their progress loop, other ranks when they call
:meth:`StopCoordinator.requested` in theirs. After their loops, all ranks call
:meth:`StopCoordinator.agree` (one all-reduce) and then, if it says so, write a final
checkpoint together (:func:`.save.save_checkpoint`). Nothing here can
hang: the signal handler only sets a flag, messages are non-blocking, and the agreement
is one collective that every rank reaches after its loop.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from conduit_hpc.features.checkpointing.parts import io_timeout
from conduit_hpc.job import stop_signal
from conduit_hpc.plane.extensions import BufferExtension
from conduit_hpc.protocol import Tag
from conduit_hpc.transport.channel import Message
from conduit_hpc.transport.objects import bounded_allgather

if TYPE_CHECKING:
    from conduit_hpc.plane.host import FeatureHost

__all__ = ["StopCoordinator"]


class StopCoordinator(BufferExtension):
    """Turn SIGTERM / SIGUSR1 on any rank into a stop every rank sees.

    ``mpirun`` (Open MPI 5) forwards SIGUSR1 to every rank and keeps the job running, but
    turns SIGTERM into a kill within a fraction of a second; SLURM sends SIGTERM to every
    task and waits ``KillWait``. So jobs treat both as "stop and checkpoint";
    ``conduit-hpc run`` turns a SIGTERM it receives into SIGUSR1 for ``mpirun``.

    Construct on every rank after the data plane (local; installs signal handlers when
    called from the main thread). A stop request that reached the rank earlier (the
    ``SIGUSR1`` that :func:`conduit_hpc.job.job_main`'s handler recorded while the
    data plane was being set up) counts as received here. Buffer ranks watch for a stop
    inside their progress loop; other ranks call :meth:`requested` in their loops.

    Args:
        edp (FeatureHost): this rank's data plane.
        signals (tuple[int, ...]): signals that request a stop.
    """

    def __init__(self, edp: FeatureHost,
                 signals: Sequence[int] = (signal.SIGTERM, signal.SIGUSR1)) -> None:
        self.edp = edp
        # a request that came before this object existed is not lost
        self.signal_received: int | None = stop_signal() or None
        self.remote = False
        self._sent = False
        self._old: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for s in signals:
                self._old[s] = signal.signal(s, self._on_signal)
        if edp.server is not None:
            edp.server.add_extension(self)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signal_received = signum

    # -- the buffer loop's events (see BufferExtension) --------------------------------
    tags = frozenset({Tag.STOP})

    def on_message(self, msg: Message) -> None:
        self.remote = True

    def on_pass(self) -> int:
        self._broadcast()
        return 0

    def trigger(self) -> None:
        """Request a stop from code (as a signal would). Local."""
        self.signal_received = self.signal_received or -1

    def _broadcast(self) -> None:
        if self.signal_received is not None and not self._sent:
            self._sent = True
            ch = self.edp.channel
            for r in range(ch.size):
                if r != ch.rank:
                    ch.isend(r, Tag.STOP, np.zeros(0, np.uint8))

    def requested(self) -> bool:
        """Whether a stop was requested here or anywhere else. Local; never blocks
        (on a learner in ``edp`` mode it waits for one turn of the data-plane thread,
        which owns the rank's MPI calls)."""
        learner = self.edp.learner
        if learner is not None and learner.started:
            learner.run_on_thread(self._poll, "a stop check")
        else:
            self._poll()
        return self.signal_received is not None or self.remote

    def _poll(self) -> None:
        self._broadcast()
        if self.edp.server is None:
            while self.edp.channel.poll(tag=Tag.STOP) is not None:
                self.remote = True

    def agree(self) -> bool:
        """True on every rank iff a stop was requested on any. **Collective** on the
        world; call it after the main loop (buffers: after ``serve`` returned and
        :meth:`CheckpointAgent.finish` wrote the checkpoint in flight, which the other
        ranks wait for here). Bounded by ``max(run.timeout_s, checkpoint.timeout_s)``
        (:class:`~conduit_hpc.errors.CollectiveFailed`; at once
        :class:`~conduit_hpc.errors.RemoteFailure` when a rank left on an exception)."""
        edp, world = self.edp, self.edp.roles.world
        got = np.zeros(world.Get_size(), dtype=np.int64)
        io_s, io_note = io_timeout(edp)
        bounded_allgather(world, np.array([int(self.requested())], np.int64), got,
                          io_s, f"StopCoordinator.agree() (buffer ranks finish the checkpoint "
                          f"in flight first){io_note}",
                          lambda: edp.control.raise_if_failed(edp.world_rank))
        return bool(got.any())

    def close(self) -> None:
        """Restore the previous signal handlers. Local."""
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}
