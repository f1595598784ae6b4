"""Point-to-point messages of raw bytes, with timeouts.

A :class:`Channel` carries small control messages and bulk replies between ranks:
payloads are numpy arrays sent as bytes (no pickling); the receiver knows the layout
from the tag. Every blocking receive polls with a deadline, so a lost peer becomes a
:class:`~conduit_hpc.errors.DataPlaneTimeout`, never a hang.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from conduit_hpc.errors import TransportError
from conduit_hpc.transport.objects import bounded_barrier
from conduit_hpc.wait import wait_until

#: the most bytes one message carries (MPI's int count: past it a send raised a bare
#: MPI_ERR_ARG and its receiver waited for nothing)
MAX_MESSAGE_BYTES = 2**31 - 1

__all__ = ["Channel", "Message"]


@dataclass(frozen=True, slots=True)
class Message:
    """A received message.

    Attributes:
        source (int): sender's rank in the channel's communicator.
        tag (int): message tag.
        payload (np.ndarray): the bytes, as ``uint8``.
    """

    source: int
    tag: int
    payload: np.ndarray

    def view(self, dtype: np.dtype | type | str) -> np.ndarray:
        """The payload reinterpreted as ``dtype`` (no copy)."""
        return self.payload.view(dtype)


class Channel:
    """Tagged byte messages over a private duplicate of ``comm``.

    **Collective** on ``comm`` at construction and :meth:`close`. One thread per process
    uses a channel.

    Args:
        comm (MPI.Intracomm): the ranks that talk; duplicated once.
        poll_interval_s (float): sleep between polls while waiting.
        timeout_s (float | None): bound on the wait for every rank of ``comm`` to reach
            the ``Dup`` (a bounded ``Ibarrier`` first: a rank stopped or stuck before it
            makes the others raise :class:`~conduit_hpc.errors.CollectiveFailed`, not
            wait in ``Dup`` for ever); ``None``: a plain ``Dup``.
    """

    #: completed sends are reaped by :meth:`progress`, :meth:`poll` and :meth:`drain`,
    #: and by :meth:`isend` only once this many are pending: testing a request enters
    #: MPI's progress engine, which yields the processor when it finds nothing to do
    #: (``mpi_yield_when_idle``) - on an oversubscribed node, a time slice lost per send
    REAP_AT = 16

    def __init__(self, comm: MPI.Intracomm, *, poll_interval_s: float = 0.0002,
                 timeout_s: float | None = None) -> None:
        if timeout_s is not None:
            bounded_barrier(comm, timeout_s, "the data plane's constructor (the channel)")
        self._comm = comm.Dup()
        self._poll = poll_interval_s
        self._pending: list[tuple[MPI.Request, np.ndarray]] = []
        self._closed = False

    @property
    def comm(self) -> MPI.Intracomm:
        return self._comm

    @property
    def rank(self) -> int:
        return self._comm.Get_rank()

    @property
    def size(self) -> int:
        return self._comm.Get_size()

    @staticmethod
    def _raw(payload: np.ndarray) -> np.ndarray:
        arr = np.ascontiguousarray(payload)
        if arr.nbytes > MAX_MESSAGE_BYTES:  # (MPI raised a bare MPI_ERR_ARG)
            raise TransportError(f"a message of {arr.nbytes} bytes is past the "
                                 f"{MAX_MESSAGE_BYTES} bytes one MPI message carries")
        return arr.reshape(-1).view(np.uint8)

    def send(self, dest: int, tag: int, payload: np.ndarray) -> None:
        """Send ``payload``'s bytes; may block until the receiver posts a match."""
        self._check()
        self._comm.Send([self._raw(payload), MPI.BYTE], dest, tag)

    def isend(self, dest: int, tag: int, payload: np.ndarray) -> None:
        """Send without blocking; the channel keeps the buffer alive until completion."""
        self._check()
        raw = self._raw(payload).copy()
        req = self._comm.Isend([raw, MPI.BYTE], dest, tag)
        self._pending.append((req, raw))  # the buffer lives until the send completes
        if len(self._pending) >= self.REAP_AT:
            self._reap()

    def progress(self) -> int:
        """Complete finished sends (a subclass may also release messages it holds, see
        :class:`~conduit_hpc.transport.link.LinkedChannel`). Returns messages released.
        Local; never blocks."""
        self._reap()
        return 0

    def release_held(self, timeout_s: float) -> None:
        """Hand over every message this channel holds back (none here; an emulated link
        holds messages until due, see :class:`~conduit_hpc.transport.link.LinkedChannel`).
        Call it before entering a collective that peers may reach only after receiving
        this rank's messages. Local; blocks at most ``timeout_s``."""

    def _reap(self) -> None:
        if self._pending:
            self._pending = [(r, b) for r, b in self._pending if not r.Test()]

    def poll(self, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG) -> Message | None:
        """Receive one matching message if one has arrived, else ``None``. Never blocks."""
        self._check()
        self._reap()
        status = MPI.Status()
        msg = self._comm.Improbe(source, tag, status)
        if msg is None:
            return None
        n = status.Get_count(MPI.BYTE)
        buf = np.empty(n, dtype=np.uint8)
        msg.Recv([buf, MPI.BYTE])
        return Message(status.Get_source(), status.Get_tag(), buf)

    def recv(self, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG, *,
             timeout_s: float, what: str = "a message",
             between: Callable[[], object] | None = None,
             detail: str | Callable[[], str] = "") -> Message:
        """Wait for a matching message. Blocks at most ``timeout_s`` seconds; runs
        ``between`` (if given) after each poll that found nothing; ``detail``: appended
        to the timeout's message.

        Raises:
            DataPlaneTimeout: nothing matching arrived in time (names ``what``).
        """
        self._check()  # (the message below asks the communicator for this rank)
        msg = wait_until(lambda: self.poll(source, tag), timeout_s=timeout_s,
                         what=f"{what} (source {source}, tag {tag}) on rank {self.rank}",
                         max_sleep_s=self._poll, between=between, detail=detail)
        assert msg is not None  # wait_until returns only a truthy value
        return msg

    def drain(self, timeout_s: float) -> None:
        """Wait for every ``isend`` to complete. Blocks at most ``timeout_s``."""
        if not self._pending:
            return
        self._check()

        def sent() -> bool:
            self._reap()
            return not self._pending

        wait_until(sent, timeout_s=timeout_s, what=f"every send to complete on rank "
                   f"{self.rank}", detail=lambda: f"{len(self._pending)} still pending",
                   max_sleep_s=self._poll)

    def _check(self) -> None:
        if self._closed:
            raise TransportError("channel used after close()")

    def close(self) -> None:
        """Free the communicator. **Collective**; idempotent. Cancels nothing: call
        :meth:`drain` first."""
        if self._closed:
            return
        self._closed = True
        for r, _ in self._pending:
            r.Cancel()
            r.Free()
        self._pending = []
        self._comm.Free()
