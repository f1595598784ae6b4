"""The bulk-synchronous scheduler: supersteps, prefetch, the rate limiter.

Time on a learner is cut into supersteps, one learner update each: the ``k``-th call of
``next_batch()`` returns batch ``k`` and ends superstep ``k - 1``. Priority updates of
superstep ``j`` are sent before ``next_batch(j + 1)`` returns control to the data plane.

* :class:`PrefetchClock` decides which batch may be prepared when: batch ``t`` only once
  ``next_batch(t - depth)`` was called, so the priorities it is sampled with miss at
  most ``depth`` supersteps of updates (its *staleness*).
* :class:`RateLimiter` is Reverb's ``SampleToInsertRatio``: learners wait while too few
  rows were inserted for the samples they took, actors wait while too many.
* :class:`DataPlaneThread` runs the experience path of a learner rank ahead of it, and
  is the only thread of that rank that makes MPI calls while it runs.

The first two are plain state machines (unit-tested without MPI); the thread runs work
that the delivery layer hands it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conduit_hpc.errors import DataPlaneTimeout

__all__ = ["DataPlaneThread", "LimiterState", "PrefetchClock", "RateLimiter"]


@dataclass(frozen=True, slots=True)
class LimiterState:
    """Counters the limiter decides on.

    Attributes:
        inserts (int): rows admitted by actors (all actors together).
        samples (int): rows sampled by learners (all learners together).
        held (int): rows held in the buffers (for the minimum fill).
    """

    inserts: int
    samples: int
    held: int


@dataclass(frozen=True, slots=True)
class RateLimiter:
    """Samples-per-insert ratio with tolerance (Reverb's ``SampleToInsertRatio``).

    With ``diff = inserts * samples_per_insert - samples``, an insert of ``n`` rows is
    allowed while fewer than ``min_size_to_sample`` rows were inserted or
    ``diff + n * spi <= max_diff``, and a sample of ``n`` rows while ``diff - n >=
    min_diff`` and at least ``min_size_to_sample`` rows are held, where
    ``min_diff, max_diff = spi * min_size_to_sample -/+ error_buffer``.
    ``samples_per_insert = 0`` disables the ratio (only the minimum fill remains).

    Inserts are free until the fill is reached (as in Reverb, whose inserts are one item
    each; here the batch that crosses the fill is free too, so ``diff`` may pass
    ``max_diff`` by up to ``spi * (max_insert_batch - 1)`` once, and learners sample it
    back): no learner can sample before the fill, so an actor held back there would wait
    forever. With ``2 * error_buffer >= spi * max_insert_batch + batch_rows`` (checked by
    :class:`~conduit_hpc.config.SchedulerConfig`) one side can always move afterwards.

    Args:
        samples_per_insert (float): target ratio (>= 0).
        min_size_to_sample (int): rows held before any sample.
        error_buffer (float): tolerance in rows.
    """

    samples_per_insert: float
    min_size_to_sample: int = 1
    error_buffer: float = 0.0

    @property
    def enabled(self) -> bool:
        return self.samples_per_insert > 0

    @property
    def min_diff(self) -> float:
        return self.samples_per_insert * self.min_size_to_sample - self.error_buffer

    @property
    def max_diff(self) -> float:
        return self.samples_per_insert * self.min_size_to_sample + self.error_buffer

    def diff(self, s: LimiterState) -> float:
        return s.inserts * self.samples_per_insert - s.samples

    def can_insert(self, s: LimiterState, n: int) -> bool:
        """Whether ``n`` more rows may be admitted now."""
        if not self.enabled or s.inserts < self.min_size_to_sample:
            return True
        return self.diff(s) + n * self.samples_per_insert <= self.max_diff

    def can_sample(self, s: LimiterState, n: int) -> bool:
        """Whether ``n`` more rows may be sampled now."""
        if s.held < self.min_size_to_sample:
            return False
        if not self.enabled:
            return True
        return self.diff(s) - n >= self.min_diff

    def explain(self, s: LimiterState) -> str:
        """The state in words, for wait and timeout messages."""
        return (f"inserts={s.inserts} samples={s.samples} held={s.held} "
                f"diff={self.diff(s):g} allowed=[{self.min_diff:g}, {self.max_diff:g}] "
                f"min_size_to_sample={self.min_size_to_sample}")


class PrefetchClock:
    """Which batch may be prepared, and how stale it is.

    Args:
        depth (int): batches prepared ahead of the learner (0: inline).
    """

    def __init__(self, depth: int) -> None:
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth!r}")
        self.depth = depth
        self.requested = 0  # next_batch() calls so far
        self.prepared = 0  # batches whose preparation has started

    def request(self) -> int:
        """The learner asks for its next batch; returns its superstep number."""
        self.requested += 1
        return self.requested - 1

    def may_prepare(self) -> bool:
        """Whether batch ``prepared`` may start now: only once ``next_batch`` was called
        for batch ``prepared - depth``."""
        return self.prepared < self.requested + self.depth

    def start(self) -> tuple[int, int]:
        """Start preparing the next batch; returns (superstep, staleness), where the
        staleness is the number of supersteps whose priority updates the batch misses
        (at most ``depth``)."""
        if not self.may_prepare():
            raise RuntimeError("PrefetchClock.start() called while not allowed")
        t = self.prepared
        self.prepared += 1
        # supersteps 0 .. requested-2 are finished (their updates sent)
        return t, max(0, t - self.requested + 1)


class DataPlaneThread:
    """A worker thread that runs the experience path of one learner rank.

    The owner hands it callables with :meth:`call` (run in order, results through a
    future) and a ``background`` callable it runs whenever the queue is empty (the
    prefetch step). Exceptions in the thread are re-raised in the caller at the next
    :meth:`call`/:meth:`raise_if_failed`.

    Args:
        background (Callable[[], bool]): one unit of ahead-of-time work; returns whether
            it did anything (if not, the thread waits briefly for new calls).
        idle_sleep_s (float): longest wait for new calls when idle.
    """

    def __init__(self, background: Callable[[], bool], *, idle_sleep_s: float = 0.0005,
                 name: str = "conduit-dataplane") -> None:
        self._background = background
        self._idle = idle_sleep_s
        self._calls: queue.Queue[tuple[Callable[[], Any], _Future]] = queue.Queue()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    fn, fut = self._calls.get_nowait()
                except queue.Empty:
                    if not self._background():
                        try:
                            fn, fut = self._calls.get(timeout=self._idle)
                        except queue.Empty:
                            continue
                    else:
                        continue
                try:
                    fut.set(fn())
                except BaseException as err:
                    fut.fail(err)
                    raise
        except BaseException as err:
            self._error = err
            # wake anyone waiting on a queued call
            while True:
                try:
                    _, fut = self._calls.get_nowait()
                except queue.Empty:
                    break
                fut.fail(err)

    def raise_if_failed(self) -> None:
        """Re-raise an exception the thread died of (in the caller's thread)."""
        if self._error is not None:
            raise self._error

    def call(self, fn: Callable[[], Any], *, timeout_s: float, what: str) -> Any:
        """Run ``fn`` on the thread, after every call queued before it; blocks for its
        result at most ``timeout_s``.

        Raises:
            DataPlaneTimeout: no result in time (names ``what``).
        """
        self.raise_if_failed()
        fut = _Future()
        self._calls.put((fn, fut))
        return fut.result(timeout_s, what, self)

    def post(self, fn: Callable[[], Any]) -> None:
        """Queue ``fn`` without waiting for it (errors surface at the next call)."""
        self.raise_if_failed()
        self._calls.put((fn, _Future()))

    def stop(self, timeout_s: float) -> None:
        """Finish the queued calls, stop, and join. Blocks at most ``timeout_s``."""
        if not self._thread.is_alive():
            self.raise_if_failed()
            return
        done = _Future()
        self._calls.put((lambda: None, done))
        done.result(timeout_s, "the data-plane thread to drain", self)
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise DataPlaneTimeout(f"data-plane thread did not stop within {timeout_s:.1f} s")
        self.raise_if_failed()


class _Future:
    __slots__ = ("_error", "_event", "_value")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def set(self, value: Any) -> None:
        self._value = value
        self._event.set()

    def fail(self, err: BaseException) -> None:
        self._error = err
        self._event.set()

    def result(self, timeout_s: float, what: str, thread: DataPlaneThread) -> Any:
        deadline = time.monotonic() + timeout_s
        while not self._event.wait(0.05):
            thread.raise_if_failed()
            if time.monotonic() > deadline:
                raise DataPlaneTimeout(f"waited {timeout_s:.1f} s for {what}")
        if self._error is not None:
            raise self._error
        return self._value
