"""The bulk-synchronous scheduler: the prefetch clock, the rate limiter and the
data-plane thread. The first two are plain state machines (unit-tested without MPI);
the thread runs work that the plane hands it."""

from __future__ import annotations

from conduit_hpc.scheduler.clock import PrefetchClock
from conduit_hpc.scheduler.limiter import LimiterState, RateLimiter
from conduit_hpc.scheduler.worker import DataPlaneThread

__all__ = ["DataPlaneThread", "LimiterState", "PrefetchClock", "RateLimiter"]
