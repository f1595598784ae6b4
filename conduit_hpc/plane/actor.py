"""The actor endpoint: ingest (validate, admit, write), the policy-lag bound, metrics.

:meth:`ActorEndpoint.ingest` validates a batch against the spec, waits where the rate
limiter or the policy-lag bound says so, and appends the rows to the actor's shard with
one atomic reservation, one put per field and one commit stamp
(:meth:`~conduit_hpc.storage.ShardRing.write`).

Threads of one rank may ingest at once: each validates its batch in parallel, then they
take turns (a lock, waited for within ``run.timeout_s``) for the rest, which keeps
state per rank (the frame writer's memory of stored frames, the weights pulled into
the model, the counters). :meth:`ActorEndpoint.close` (``done()``) takes the last turn:
an ingest in flight on another thread finishes first (its rows reach the buffers
before this rank says it is done), and any later one raises
:class:`~conduit_hpc.errors.UsedAfterClose` with nothing written.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from conduit_hpc.config import Config
from conduit_hpc.errors import ConfigError, SpecError, UsedAfterClose
from conduit_hpc.plane.control import (
    C_INSERTS,
    C_LEARNER_VERSION,
    C_RESERVED,
    C_SAMPLES,
    ControlBlock,
)
from conduit_hpc.plane.metrics import ACTOR_CARRY, ACTOR_COLUMNS, CsvSink
from conduit_hpc.plane.weights import WeightsBoard
from conduit_hpc.sampling import make_sampler
from conduit_hpc.scheduler import LimiterState, RateLimiter
from conduit_hpc.spec import Spec
from conduit_hpc.storage.priority import check_priorities
from conduit_hpc.storage.ring import ShardRing
from conduit_hpc.wait import Backoff, Deadline

__all__ = ["ActorEndpoint", "IngestReceipt", "IngestStats", "make_actor"]


class IngestReceipt(NamedTuple):
    """What one ingest call wrote.

    Attributes:
        rows (int): rows written.
        shard_id (int): the shard they went to.
        first_seq (int): shard sequence number of the first row (rows are consecutive).
    """

    rows: int
    shard_id: int
    first_seq: int


class IngestStats:
    """Counters of one actor's ingest.

    Attributes:
        rows (int): rows ingested.
        batches (int): calls that wrote rows.
        bytes (int): payload bytes written into the shards: with frame stacks, of the
            stored columns (each frame once; ``Spec.stored_row_bytes`` a slot), not the
            rows' whole stacks (``Spec.row_bytes``).
        seconds (float): wall time spent inside ``ingest``.
        span_s (float): wall time from the actor's start (the data plane's constructor)
            to its latest row: what its rows per second are taken over.
        limiter_wait_s (float): part of it spent waiting for the rate limiter.
        lag_wait_s (float): part of it spent waiting for fresher weights.
        ring_wait_s (float): part of it spent waiting for the shard's owner to free the
            slots a write takes (``block`` ingest policy: mostly for learners to draw
            the rows there; ``overwrite``: for the owner's pass to catch up).
        ring_waits (int): writes that waited so.
    """

    __slots__ = ("batches", "bytes", "lag_wait_s", "limiter_wait_s", "ring_wait_s",
                 "ring_waits", "rows", "seconds", "span_s")

    def __init__(self) -> None:
        self.rows = 0
        self.batches = 0
        self.bytes = 0
        self.seconds = 0.0
        self.span_s = 0.0
        self.limiter_wait_s = 0.0
        self.lag_wait_s = 0.0
        self.ring_wait_s = 0.0
        self.ring_waits = 0

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__slots__}

    def copy(self) -> IngestStats:
        """A snapshot: later ingests do not change it, nor does changing it reach the
        actor's counters."""
        out = IngestStats()
        for k in self.__slots__:
            setattr(out, k, getattr(self, k))
        return out


class ActorEndpoint:
    """Ingest on one actor rank.

    Args:
        config (Config): the job's config.
        spec (Spec): the row schema.
        rank (int): this actor's world rank.
        rings (Mapping[int, ShardRing]): ring clients of every shard.
        home (int): the shard the placement gives this actor.
        route (Callable[[int], int | None]): a feature's choice of shard for the next
            batch (given the batches written so far), ``None``: ``home``.
        control (ControlBlock): job-wide counters.
        limiter (RateLimiter): the samples-per-insert limiter.
        should_stop (Callable[[], bool]): every learner has finished.
        metrics_path (Path | None): the actor's CSV of running totals.
    """

    def __init__(self, config: Config, spec: Spec, rank: int, rings: Mapping[int, ShardRing],
                 home: int, route: Callable[[int], int | None], control: ControlBlock,
                 limiter: RateLimiter, should_stop: Callable[[], bool],
                 metrics_path: Path | None) -> None:
        self.config, self.spec, self.rank = config, spec, rank
        self.rings, self.home, self.route = rings, home, route
        self.control, self.limiter, self.should_stop = control, limiter, should_stop
        self.stats = IngestStats()
        self.weights: WeightsBoard | None = None
        self.pull: Callable[[], bool] = lambda: False
        self.metrics = CsvSink(metrics_path, ACTOR_COLUMNS, keep=False, carry=ACTOR_CARRY)
        self._t0 = self._last_log = time.perf_counter()
        self._rows_at_log = 0
        #: priorities given to ingest are applied (not by a uniform sampler: there a
        #: priority of 0 would hide its row; checked, then dropped)
        self._sampler = make_sampler(config, 0)  # its checks of priorities given
        self.applies_priorities = self._sampler.applies_priorities
        self._turn = threading.Lock()  # one thread at a time past validation
        self._closing = False  # close() began: waits give up, nothing more is written
        self._closed = False
        for ring in rings.values():  # a ring's lap wait stops when a rank left on an error
            ring.on_wait = _also(ring.on_wait, lambda: control.raise_if_failed(rank))

    def ingest(self, batch: Mapping[str, object],
               priorities: ArrayLike | None = None) -> IngestReceipt:
        """See :meth:`conduit_hpc.plane.front.ExperienceDataPlane.ingest`."""
        t0 = time.perf_counter()
        data = self.spec.validate(batch)  # pure numpy: threads do this side by side
        n = self.spec.rows_of(data)
        prio = None
        if priorities is not None:
            try:
                prio = check_priorities(priorities)
            except ValueError as err:
                raise SpecError(str(err)) from err
            if len(prio) != n:
                raise SpecError(f"priorities has {len(prio)} entries but the batch has "
                                f"{n} rows")
            if not self.applies_priorities:
                prio = None  # the rows enter as rows without one: mass 1 (uniform)
            else:
                self._sampler.check_masses(prio)  # positive, yet never drawn: refused
        self._take_turn("ingest()")
        try:
            return self._write(data, n, prio, t0)
        finally:
            self._turn.release()

    def _write(self, data: dict[str, np.ndarray], n: int, prio: np.ndarray | None,
               t0: float) -> IngestReceipt:
        """The rest of :meth:`ingest`, in this thread's turn."""
        routed = self.route(self.stats.batches)
        sid = self.home if routed is None else routed
        ring = self.rings[sid]
        if n > ring.capacity:
            raise SpecError(f"batch of {n} rows exceeds the shard capacity of "
                            f"{ring.capacity} rows; split it or raise storage.capacity_rows")
        sch = self.config.scheduler
        if self.limiter.enabled and n > sch.max_insert_batch:
            raise SpecError(f"batch of {n} rows exceeds scheduler.max_insert_batch = "
                            f"{sch.max_insert_batch} (the rate limiter's tolerance is "
                            f"sized for it)")
        if n == 0:
            return IngestReceipt(0, sid, -1)
        self._wait_policy_lag()
        self._admit(n)
        waits, wait_s, slots = ring.lap_waits, ring.lap_wait_s, ring.slots_written
        first = ring.write(data, prio)
        self.control.add(C_INSERTS, n)
        st = self.stats
        st.ring_waits += ring.lap_waits - waits
        st.ring_wait_s += ring.lap_wait_s - wait_s
        st.rows += n
        st.batches += 1
        # what the ring holds of them: with frame stacks each frame once (the slots they
        # took, frames-only slots included, of the stored columns), not whole stacks
        st.bytes += (ring.slots_written - slots) * ring.layout.stored.row_bytes
        now = time.perf_counter()
        st.seconds += now - t0
        st.span_s = now - self._t0
        if now - self._last_log > 1.0:
            self.log(now)
        return IngestReceipt(n, sid, first)

    def ingest_on(self, run: Callable[[Callable[[], object], str], object],
                  batch: Mapping[str, object],
                  priorities: ArrayLike | None = None) -> IngestReceipt:
        """:meth:`ingest` run by ``run`` (a learner's ``run_on_thread``: where that
        rank makes its MPI calls). A bad batch raises :class:`SpecError` here, in the
        caller's thread, and leaves ``run``'s thread running; nothing is written."""

        def write() -> IngestReceipt | SpecError | UsedAfterClose:
            try:
                return self.ingest(batch, priorities)
            except (SpecError, UsedAfterClose) as err:  # raised before anything is written
                return err

        got = run(write, f"ingest on learner rank {self.rank}")
        if isinstance(got, SpecError | UsedAfterClose):
            raise got
        assert isinstance(got, IngestReceipt)
        return got

    def _admit(self, n: int) -> None:
        """With the ratio on, reserve ``n`` inserts and wait until the ratio allows
        them. Reserving first means concurrent actors never overshoot together."""
        if not self.limiter.enabled:
            return
        old = self.control.add(C_RESERVED, n)
        lim = self.limiter
        t0 = time.perf_counter()
        deadline = Deadline(self.config.run.timeout_s,
                            f"the rate limiter to let actor {self.rank} insert {n} rows")
        backoff = Backoff(self.config.transport.poll_interval_s * 5)
        while True:
            state = LimiterState(old, self.control.read(C_SAMPLES), 0)
            if lim.can_insert(state, n) or self.should_stop():
                break
            if self._closing:  # nothing written: the reservation is given back
                self.control.add(C_RESERVED, -n)
                raise self._closed_error("ingest() waited for the rate limiter")
            deadline.check(lambda: lim.explain(state))  # noqa: B023 - called at once
            backoff.pause()
        self.stats.limiter_wait_s += time.perf_counter() - t0

    def _wait_policy_lag(self) -> None:
        lag = self.config.scheduler.max_policy_lag
        if not lag:
            return
        weights = self.weights
        if weights is None:
            raise ConfigError("scheduler.max_policy_lag > 0 needs share_weights(model) on "
                              "every rank before ingest", key="scheduler.max_policy_lag")
        t0 = time.perf_counter()
        deadline = Deadline(self.config.run.timeout_s,
                            f"weights newer than learner superstep {weights.seen_superstep} "
                            f"on actor {self.rank}")
        backoff = Backoff(self.config.transport.poll_interval_s * 5)
        while self.control.read(C_LEARNER_VERSION) - weights.seen_superstep > lag:
            if self.should_stop():
                break
            if self._closing:
                raise self._closed_error("ingest() waited for fresher weights")
            if not self.pull():
                deadline.check()
                backoff.pause()
        self.stats.lag_wait_s += time.perf_counter() - t0

    def log(self, now: float) -> None:
        """Append the running totals to the actor's CSV."""
        st = self.stats
        self.metrics.add({"time_s": now - self._t0, "rows": st.rows,
                          "rows_per_s": (st.rows - self._rows_at_log) / (now - self._last_log),
                          "limiter_wait_s": st.limiter_wait_s,
                          "ring_wait_s": st.ring_wait_s,
                          "policy_version": self.weights.seen_superstep if self.weights
                          else -1})
        self.metrics.flush()
        self._last_log, self._rows_at_log = now, st.rows

    def _take_turn(self, what: str, closing: bool = False) -> None:
        """Wait for this rank's turn to write (another thread's ingest to finish),
        bounded by ``run.timeout_s``; the caller releases :attr:`_turn`. Makes no MPI
        call (the thread whose turn it is may be in one on the same window).

        Raises:
            UsedAfterClose: :meth:`close` began (nothing written).
            DataPlaneTimeout: the other thread's ingest did not finish in time (its own
                waits are bounded alike, and end on a remote failure).
        """
        deadline = None if self._turn.acquire(blocking=False) else Deadline(
            self.config.run.timeout_s,
            f"another thread's ingest() on world rank {self.rank} to finish")  # contended
        while deadline is not None and not self._turn.acquire(timeout=0.05):
            if self._closing and not closing:
                raise self._closed_error(f"{what} waited for another thread's ingest()")
            deadline.check()
        if self._closing and not closing:
            self._turn.release()
            raise self._closed_error(what)

    def _closed_error(self, what: str) -> UsedAfterClose:
        return UsedAfterClose(f"{what} on world rank {self.rank}: done() or close() was "
                              f"called meanwhile (on another thread); nothing was written")

    def close(self) -> None:
        """Refuse every later ingest, wait (bounded by ``run.timeout_s``) for one in
        flight on another thread (waits for the rate limiter or for fresher weights give
        up at once: nothing written), then write the last totals and close the CSV.
        Idempotent."""
        self._closing = True
        if self._closed:
            return
        self._take_turn("close()", closing=True)
        try:
            if not self._closed:
                self._closed = True
                self.log(time.perf_counter())
                self.metrics.close()
        finally:
            self._turn.release()


def make_actor(host: Any, me: int, metrics_path: Path | None) -> ActorEndpoint:
    """The endpoint of world rank ``me`` that ingests into the data plane ``host`` (an
    ``ExperienceDataPlane``): each batch goes where the first feature that routes it
    says, else where the plan in force (``host.placement``) weighs it. Local."""
    routes = [f.route for f in host.features]

    def route(batches: int) -> int | None:  # a feature's, else the plan's weights
        return next((s for r in routes if (s := r(batches)) is not None),
                    host.placement.shard_for(me, batches))

    return ActorEndpoint(host.config, host.spec, me, host.rings,
                         host.placement.actor_shards[me], route, host.control, host.limiter,
                         lambda: host.should_stop, metrics_path)


def _also(first: Callable[[], object] | None, then: Callable[[], object]
          ) -> Callable[[], object]:
    """``first`` (if any), then ``then``: a ring's ``on_wait`` hook with one more step."""
    if first is None:
        return then
    return lambda: (first(), then())
