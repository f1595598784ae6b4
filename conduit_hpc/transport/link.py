"""An emulated long link: bandwidth and one-way latency, paid by every message crossing it.

Two node groups (say an edge site and a data centre) are joined by a link with a
bandwidth ``r`` (bytes per second, per direction) and a one-way latency ``L``. The
emulation is **sender-side pacing**: each sender keeps a :class:`LinkModel` per direction -
a token bucket of depth ``b = burst_bytes`` filled at rate ``r``, whose tokens may go
negative (a debt that later bytes queue behind), plus the latency - and holds every
message to the far side until it would have reached the far end. A message of ``n`` bytes
handed over at time ``now`` takes ``n`` tokens; with ``paid`` the time at which the bucket
has paid for every byte handed over so far:

    paid'  = max(now - b / r, paid) + n / r    (the bucket has paid for its last byte)
    depart = max(now, paid')                   (its last byte leaves)
    arrive = depart + L                        (it is released to the receiver)

With ``b = 0`` this is a store-and-forward serializer (``depart_i = max(now_i,
depart_{i-1}) + n_i / r``); with ``b >= n`` a message on an idle link departs at once; in
any interval of length ``T`` at most ``b + r * T`` bytes depart. Messages keep their
order. The bucket starts full. Everything is computed from the clock values passed in, so
the model is exact and repeatable (unit-tested against a simulated clock).

:class:`LinkedChannel` is a :class:`~conduit_hpc.transport.channel.Channel` that routes
messages to ranks on the far side through a :class:`LinkModel`: they wait in a FIFO and are
handed to MPI (``Isend``) when due. Anything that polls, receives, sends or drains on the
channel releases what is due (``progress()`` does only that), so a rank's progress loop
pumps the link. Zero-byte messages pay the latency and queue behind earlier data, as on a
real link. The receiver needs nothing special.

Nothing here knows about experience, rows or roles; node groups are sets of ranks.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from conduit_hpc.errors import TransportError
from conduit_hpc.transport.channel import Channel, Message
from conduit_hpc.wait import Deadline

__all__ = ["Crossing", "LinkModel", "LinkParams", "LinkedChannel"]

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class LinkParams:
    """One direction of a link.

    Attributes:
        bytes_per_s (float): bandwidth, > 0 (a cluster model's ``bandwidth_gbps`` * 1e9).
        latency_s (float): one-way latency every message pays, >= 0.
        burst_bytes (int): token-bucket depth, >= 0 (0: a plain serializer).
    """

    bytes_per_s: float
    latency_s: float = 0.0
    burst_bytes: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bytes_per_s) and self.bytes_per_s > 0):
            raise TransportError(f"bytes_per_s must be a finite number > 0, got "
                                 f"{self.bytes_per_s!r}")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise TransportError(f"latency_s must be a finite number >= 0, got "
                                 f"{self.latency_s!r}")
        if self.burst_bytes < 0:
            raise TransportError(f"burst_bytes must be >= 0, got {self.burst_bytes!r}")


@dataclass(frozen=True, slots=True)
class Crossing:
    """When one message crosses: its last byte leaves at ``depart_s`` and it reaches the
    far end at ``arrive_s = depart_s + latency_s``."""

    depart_s: float
    arrive_s: float
    nbytes: int


class LinkModel:
    """Token bucket plus delay for one sender and one direction. Plain Python; local.

    Args:
        params (LinkParams): rate, latency, bucket depth.
        start_s (float): clock value at which the bucket is full.

    Attributes:
        bytes_total (int), messages_total (int): what has been scheduled.
        wait_s_total (float): sum over messages of ``depart - now`` (time spent in the
            bucket, not counting the latency).
    """

    def __init__(self, params: LinkParams, *, start_s: float = 0.0) -> None:
        self.params = params
        self._rate = float(params.bytes_per_s)
        self._burst_s = params.burst_bytes / self._rate
        # the bucket holds min(b, r * (t - paid)) tokens at time t (negative: a debt)
        self._paid = start_s - self._burst_s
        self.bytes_total = 0
        self.messages_total = 0
        self.wait_s_total = 0.0

    @property
    def paid_s(self) -> float:
        """Time at which the bucket has paid for every byte scheduled so far."""
        return self._paid

    def ready_at(self, nbytes: int, now: float) -> float:
        """When the last byte of a message of ``nbytes`` handed over at ``now`` would
        depart (nothing changes)."""
        return max(now, max(now - self._burst_s, self._paid) + nbytes / self._rate)

    def schedule(self, nbytes: int, now: float) -> Crossing:
        """Take a message of ``nbytes`` at time ``now``; returns when it departs and when
        it arrives. Messages keep their order (for non-decreasing ``now``).

        Raises:
            TransportError: a negative size.
        """
        if nbytes < 0:
            raise TransportError(f"nbytes must be >= 0, got {nbytes!r}")
        self._paid = max(now - self._burst_s, self._paid) + nbytes / self._rate
        depart = max(now, self._paid)
        self.bytes_total += nbytes
        self.messages_total += 1
        self.wait_s_total += depart - now
        return Crossing(depart, depart + self.params.latency_s, nbytes)


class _Held:
    __slots__ = ("arrive_s", "dest", "raw", "tag")

    def __init__(self, arrive_s: float, dest: int, tag: int, raw: np.ndarray) -> None:
        self.arrive_s, self.dest, self.tag, self.raw = arrive_s, dest, tag, raw


class LinkedChannel(Channel):
    """A channel whose messages to ``far`` ranks cross an emulated link.

    **Collective** on ``comm`` at construction and :meth:`close` (like
    :class:`Channel`); one thread per process uses it.

    Args:
        comm (MPI.Intracomm): the ranks that talk; duplicated once.
        far (Iterable[int]): ranks of ``comm`` on the other side of the link from this
            rank (empty: no message of this rank crosses it).
        params (LinkParams): the link, in the direction away from this rank.
        poll_interval_s (float): sleep between polls while waiting.
        clock (Callable[[], float]): seconds, monotonic (default ``time.monotonic``).
        timeout_s (float | None): bound on reaching the ``Dup`` (see :class:`Channel`).

    Attributes:
        link (LinkModel): this rank's pacer.
        bytes_out, messages_out (int): released to MPI so far (reached the far end).
        bytes_in, messages_in (int): received from far ranks.
        on_send (list[Callable[[int, int, np.ndarray], None]]): called with
            ``(dest, tag, payload)`` when a message is handed to the link.
    """

    def __init__(self, comm: MPI.Intracomm, *, far: Iterable[int], params: LinkParams,
                 poll_interval_s: float = 0.0002, clock: Clock = time.monotonic,
                 timeout_s: float | None = None) -> None:
        super().__init__(comm, poll_interval_s=poll_interval_s, timeout_s=timeout_s)
        self.far = frozenset(int(r) for r in far)
        self.clock = clock
        self.link = LinkModel(params, start_s=clock())
        self._held: deque[_Held] = deque()
        self.held_bytes = 0
        self.bytes_out = 0
        self.messages_out = 0
        self.bytes_in = 0
        self.messages_in = 0
        self.late_s_max = 0.0  # longest time a message was released after it was due
        self.on_send: list[Callable[[int, int, np.ndarray], None]] = []

    # -- sending -------------------------------------------------------------------
    def ready_at(self, nbytes: int) -> float:
        """Clock time at which the last byte of a message of ``nbytes`` to a far rank
        would depart if handed over now. Local."""
        return self.link.ready_at(nbytes, self.clock())

    def isend(self, dest: int, tag: int, payload: np.ndarray) -> None:
        """Send without blocking; a message to a far rank is held until it is due (see
        the module docstring) and then handed to MPI by the next :meth:`progress`."""
        if dest not in self.far:
            super().isend(dest, tag, payload)
            return
        self._check()
        raw = self._raw(payload).copy()
        for fn in self.on_send:
            fn(dest, tag, raw)
        c = self.link.schedule(raw.size, self.clock())
        self._held.append(_Held(c.arrive_s, dest, tag, raw))
        self.held_bytes += raw.size
        self.progress()

    def send(self, dest: int, tag: int, payload: np.ndarray) -> None:
        """Blocking send; across the link, waits until the message is due (bounded by
        the link's own schedule) and then hands it to MPI."""
        if dest not in self.far:
            super().send(dest, tag, payload)
            return
        self.isend(dest, tag, payload)
        while any(h.dest == dest for h in self._held):
            self._sleep_until_due()
            self.progress()

    @property
    def held(self) -> int:
        """Messages waiting for their arrival time."""
        return len(self._held)

    def next_due(self) -> float | None:
        """Clock time of the next held message, or ``None``."""
        return self._held[0].arrive_s if self._held else None

    def progress(self) -> int:
        """Hand every due message to MPI and complete finished sends. Returns messages
        released. Local; never blocks."""
        n = 0
        if self._held:
            now = self.clock()
            while self._held and self._held[0].arrive_s <= now:
                h = self._held.popleft()
                self.late_s_max = max(self.late_s_max, now - h.arrive_s)
                self.held_bytes -= h.raw.size
                self.bytes_out += h.raw.size
                self.messages_out += 1
                Channel.isend(self, h.dest, h.tag, h.raw)
                n += 1
        self._reap()
        return n

    def _sleep_until_due(self) -> None:
        due = self.next_due()
        if due is not None:
            time.sleep(min(max(due - self.clock(), 0.0), 0.01) or self._poll)

    # -- receiving -----------------------------------------------------------------
    def poll(self, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG) -> Message | None:
        """Release what is due, then receive one matching message if one has arrived.
        Never blocks."""
        self.progress()
        msg = super().poll(source, tag)
        if msg is not None and msg.source in self.far:
            self.bytes_in += msg.payload.size
            self.messages_in += 1
        return msg

    def release_held(self, timeout_s: float) -> None:
        """Wait until every held message is due and hand it to MPI (a rank must do this
        before it enters a collective that its peers may only reach after receiving
        those messages). Blocks at most ``timeout_s``.

        Raises:
            DataPlaneTimeout: messages still held after ``timeout_s``.
        """
        deadline = Deadline(timeout_s, f"the messages held for the link on rank {self.rank} "
                                       f"to go out")
        while self._held:
            self.progress()
            if not self._held:
                break
            deadline.check(lambda: f"{len(self._held)} messages ({self.held_bytes} bytes) "
                                   f"still held for the link")
            self._sleep_until_due()

    def drain(self, timeout_s: float) -> None:
        """Release every held message when it is due, then wait for every send to
        complete. Blocks at most ``timeout_s``.

        Raises:
            DataPlaneTimeout: held messages were not due, or sends did not complete, in
                time.
        """
        deadline = time.monotonic() + timeout_s
        self.release_held(timeout_s)
        super().drain(max(deadline - time.monotonic(), 0.0))

    def close(self) -> None:
        """Free the communicator. **Collective**; idempotent. Messages still held are
        discarded: call :meth:`drain` first."""
        self._held.clear()
        self.held_bytes = 0
        super().close()

    def stats(self) -> dict[str, float]:
        """Counters of this rank's side of the link (local)."""
        return {"bytes_out": self.bytes_out, "messages_out": self.messages_out,
                "bytes_in": self.bytes_in, "messages_in": self.messages_in,
                "held_messages": len(self._held), "held_bytes": self.held_bytes,
                "scheduled_bytes": self.link.bytes_total,
                "wait_s_total": self.link.wait_s_total, "late_s_max": self.late_s_max}
