"""The prefetch clock: which batch may be prepared when, and how stale it is.

Time on a learner is cut into supersteps, one learner update each: the ``k``-th call of
``next_batch()`` returns batch ``k`` and ends superstep ``k - 1``. Batch ``t`` may only be
prepared once ``next_batch(t - depth)`` was called, so the priorities it is sampled with
miss at most ``depth`` supersteps of updates (its *staleness*).
"""

from __future__ import annotations

__all__ = ["PrefetchClock"]


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
