"""How batches reach a learner: the delivery modes (a strategy, :data:`MODES`, picked by
``scheduler.mode``).

* :class:`EdpMode` - a :class:`~conduit_hpc.scheduler.DataPlaneThread` prepares batches
  ``s+1 .. s+depth`` while the learner computes on batch ``s``; it is the only thread of
  the rank that makes MPI calls while it runs (MPI_THREAD_SERIALIZED or better needed).
* :class:`SyncMode` - ``next_batch`` samples, fetches, transforms and copies inline.
* :class:`ServiceMode` - ``next_batch`` asks the owners for the rows and waits.

These three run the experience path in this process (:class:`InlineMode`: a
:class:`~conduit_hpc.plane.delivery.Deliverer` and a fetch strategy); with
``scheduler.delivery = "process"`` a delivery rank runs it and the learner's mode
(:class:`~conduit_hpc.plane.delivery_rank.ProcessMode`) only reads the staging ring:
the learner then keeps just the sampler (to check its priority updates).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import numpy as np

from conduit_hpc.config import SchedulerConfig
from conduit_hpc.errors import DataPlaneClosed
from conduit_hpc.plane.delivery import Deliverer
from conduit_hpc.plane.fetch import FETCHES, Fetch, OwnerFetch
from conduit_hpc.plane.prefetch import Prefetcher
from conduit_hpc.plane.staging import Batch
from conduit_hpc.sampling import Sampler
from conduit_hpc.scheduler import DataPlaneThread, PrefetchClock
from conduit_hpc.wait import Deadline

__all__ = ["MODES", "DeliveryMode", "EdpMode", "Endpoint", "InlineMode", "ServiceMode",
           "SyncMode", "inline_mode"]


class Endpoint(Protocol):
    """What a mode uses of its learner's endpoint
    (:class:`~conduit_hpc.plane.learner.LearnerEndpoint`)."""

    cfg: SchedulerConfig
    clock: PrefetchClock
    timeout_s: float
    sampler: Sampler


class DeliveryMode:
    """How batches reach the learner (see the module docstring). Defaults: no
    prefetch, every call runs in the caller's thread."""

    name: ClassVar[str]
    depth: int = 0

    def __init__(self, endpoint: Endpoint) -> None:
        self.ep = endpoint

    @classmethod
    def fetch_for(cls, config: SchedulerConfig) -> Fetch:
        """The fetch strategy this mode uses under ``config``."""
        return FETCHES[config.fetch]()

    def start(self) -> None:
        """Before the first batch (collectives before it ran on one thread)."""

    def next_batch(self, s: int) -> Batch:
        """Batch ``s`` (superstep ``s - 1`` has ended). Blocks (bounded)."""
        raise NotImplementedError

    def post(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` where this rank's MPI calls are made, without waiting."""
        fn()

    def call(self, fn: Callable[[], Any], what: str) -> Any:
        """Run ``fn`` where this rank's MPI calls are made; its result."""
        return fn()

    def send_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Carry checked updates to the owners, behind every call posted before."""
        raise NotImplementedError

    def updates_through_owners(self) -> None:
        """Send the next priority updates to the owners as messages (a checkpoint's
        cut). Where MPI calls are made."""
        raise NotImplementedError(f"{type(self).__name__}: no checkpoint cut")

    def counters(self) -> dict[str, float]:
        """What the experience path counted, for the learner's summary: resampled rows,
        limiter wait, rows overwritten unsampled, pinned rounds, priority rows written
        directly and as messages (and the device tier's, where it has one)."""
        return {}

    def stop(self) -> None:
        """No more batches: finish what is in flight."""


class InlineMode(DeliveryMode):
    """The experience path in this process: a :class:`Deliverer` (:attr:`d`) and a
    fetch strategy."""

    def __init__(self, endpoint: Endpoint, d: Deliverer, fetch: Fetch) -> None:
        super().__init__(endpoint)
        self.d, self.fetch = d, fetch

    def next_batch(self, s: int) -> Batch:
        self.d.mark()
        self.ep.clock.request()
        t, staleness = self.ep.clock.start()
        return self.fetch.prepare(self.d, t, staleness)

    def send_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        d = self.d
        self.post(lambda: d.send_priorities(indices, priorities))

    def updates_through_owners(self) -> None:
        self.d.prio.through_owners()

    def counters(self) -> dict[str, float]:
        d = self.d
        out = {"resampled_rows": float(d.resampled), "limiter_wait_s": d.limiter_wait_s,
               "overwritten_unsampled": float(d.overwritten_unsampled),
               "pinned_rounds": float(d.pinned_rounds),
               # priority-update rows written into node-local indexes / sent to owners
               "priority_rows_direct": float(d.prio.direct_rows),
               "priority_rows_messaged": float(d.prio.message_rows)}
        pol = d.device_policy  # promotions (plane/device_policy.py)
        if d.device_shards or pol is not None:  # the device tier (plane/device_tier.py)
            devs = d.device_shards.values()
            for key, attr in (("drawn", "drawn"), ("in", "rows_in"), ("evicted", "evicted"),
                              ("missed", "missed")):  # mirrors demoted since count too
                out[f"device_rows_{key}"] = float(
                    sum(getattr(x, attr) for x in devs) + (pol.retired[attr] if pol else 0))
        if pol is not None:
            out.update(pol.counters())
        return out


class SyncMode(InlineMode):
    """``scheduler.mode = "sync"``: the experience path inline, as a framework-embedded
    buffer does."""

    name = "sync"


class ServiceMode(InlineMode):
    """``scheduler.mode = "service"``: ask the owners for the rows and wait, as a replay
    server's client does (always :class:`~conduit_hpc.plane.fetch.OwnerFetch`)."""

    name = "service"

    @classmethod
    def fetch_for(cls, config: SchedulerConfig) -> Fetch:
        return OwnerFetch()


class EdpMode(InlineMode):
    """``scheduler.mode = "edp"``: a data-plane thread prepares batches ahead (see the
    module docstring). With a pipelined fetch (owner), the requests of every batch the
    clock allows are in flight at once, so a long link's latency overlaps (batches
    still complete in order)."""

    name = "edp"

    def __init__(self, endpoint: Endpoint, d: Deliverer, fetch: Fetch) -> None:
        super().__init__(endpoint, d, fetch)
        self.depth = endpoint.cfg.prefetch_depth
        self._ready: dict[int, Batch] = {}
        self._cv = threading.Condition()
        self._stopping = False  # stop() began: no new batch may start
        self._thread: DataPlaneThread | None = None
        self._prefetch: Prefetcher | None = None  # made in start(), with the clock

    def start(self) -> None:
        self._prefetch = Prefetcher(self.d, self.fetch, self.ep.clock, self._deliver,
                                    self._closed)
        self._thread = DataPlaneThread(self._prefetch_step, busy_with=self._prefetch.waiting_on)
        self._thread.start()

    # -- thread side -----------------------------------------------------------------
    def _prefetch_step(self) -> bool:
        assert self._prefetch is not None
        self.d.channel.progress()  # e.g. release messages held for a long link
        # across nodes this rank may be its node's osc rdma leader, whose progress every
        # atomic on the node's segments waits for: enter MPI even when idle (while the
        # learner computes or waits in a gloo allreduce, nothing else here does)
        self.d.mpi_progress()
        return self._prefetch.step(start_new=not self._stopping)

    def _deliver(self, batch: Batch, t: int) -> None:
        with self._cv:
            self._ready[t] = batch
            self._cv.notify_all()

    def _closed(self, err: DataPlaneClosed) -> None:
        # calls (done, checkpoints, stop checks) still run on the thread
        with self._cv:
            self._cv.notify_all()

    def _request(self) -> None:
        """On the thread, after every update queued before it: end the superstep."""
        assert self._prefetch is not None
        self._prefetch.request()

    # -- caller side -----------------------------------------------------------------
    def next_batch(self, s: int) -> Batch:
        assert self._thread is not None
        self._thread.post(self._request, timeout_s=self.ep.timeout_s)
        deadline = Deadline(self.ep.timeout_s, f"batch {s}")
        pf = self._prefetch
        assert pf is not None
        with self._cv:
            while s not in self._ready:
                self._thread.raise_if_failed()
                if pf.closed is not None and not pf.in_flight:
                    raise DataPlaneClosed(str(pf.closed))
                deadline.check(pf.waiting_on)
                self._cv.wait(0.05)
            return self._ready.pop(s)

    def post(self, fn: Callable[[], Any]) -> None:
        if self._thread is None:
            fn()
        else:
            self._thread.post(fn, timeout_s=self.ep.timeout_s)

    def call(self, fn: Callable[[], Any], what: str) -> Any:
        if self._thread is None:
            return fn()
        return self._thread.call(fn, timeout_s=self.ep.timeout_s, what=what)

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stopping = True  # else a batch begun after finish() below would leave the
        # owners' replies unreceived, and their (rendezvous) sends would never complete
        assert self._prefetch is not None
        if self._thread.failed_and_reported:
            # the thread died of an error the learner was given (e.g. its transform
            # raised) and chose to end: as in sync mode, the end is clean - the owners'
            # replies are received here, on the one thread left
            self._thread = None
            self._prefetch.finish()
            return
        self._thread.call(self._prefetch.finish, timeout_s=self.ep.timeout_s,
                          what="replies of prefetched batches")
        self._thread.stop(self.ep.timeout_s)
        self._thread = None


#: ``scheduler.mode`` -> strategy
MODES: dict[str, type[InlineMode]] = {"edp": EdpMode, "sync": SyncMode,
                                      "service": ServiceMode}


def inline_mode(d: Deliverer, config: SchedulerConfig
                ) -> Callable[[Endpoint], DeliveryMode]:
    """The mode ``config.mode`` running the experience path ``d`` in this process."""
    cls = MODES[config.mode]
    fetch = cls.fetch_for(config)
    return lambda ep: cls(ep, d, fetch)
