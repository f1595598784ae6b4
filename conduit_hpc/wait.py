"""Bounded waiting: one helper for every place a rank waits for something.

Every blocking wait of the data plane has a deadline and says what it waited for when
the deadline passes (a hang is worse than a crash). :func:`wait_until` polls a condition
with a :class:`Backoff` - spin a little, then yield, then sleep with growing pauses up
to a ceiling - so that a short wait costs microseconds and a long one does not burn a
core that an oversubscribed rank needs (mpi4py's ``futures._core.Backoff`` is the
model). Plain Python; imports nothing of ours but :mod:`conduit_hpc.errors`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from conduit_hpc.errors import ConduitError, DataPlaneTimeout

__all__ = ["NO_HOSTS", "Backoff", "Deadline", "Hosts", "seconds", "wait_until"]

T = TypeVar("T")


class Backoff:
    """Growing pauses between polls.

    The first ``spins`` calls of :meth:`pause` return at once, the next ``yields``
    yield the processor (``sleep(0)``), then the pause doubles from ``min_sleep_s`` up
    to ``max_sleep_s``. :meth:`reset` after progress.

    Args:
        max_sleep_s (float): the longest pause (>= 0).
        min_sleep_s (float): the first real pause.
        spins (int): polls before the first yield.
        yields (int): polls that yield before the first sleep (a wait that is usually
            short and whose peer may need this core: more yields, fewer sleeps).
    """

    __slots__ = ("_n", "_sleep", "max_sleep_s", "min_sleep_s", "spins", "yields")

    def __init__(self, max_sleep_s: float = 0.001, *, min_sleep_s: float = 0.00002,
                 spins: int = 20, yields: int = 4) -> None:
        if not max_sleep_s >= 0:
            raise ValueError(f"max_sleep_s must be >= 0, got {max_sleep_s!r}")
        self.max_sleep_s = float(max_sleep_s)
        self.min_sleep_s = min(float(min_sleep_s), self.max_sleep_s)
        self.spins = int(spins)
        self.yields = int(yields)
        self._n = 0
        self._sleep = self.min_sleep_s

    def reset(self) -> None:
        """Progress was made: start again from spinning."""
        self._n = 0
        self._sleep = self.min_sleep_s

    def pause(self) -> None:
        """Wait a little (or not at all, early on). Blocks at most ``max_sleep_s``."""
        self._n += 1
        if self._n <= self.spins:
            return
        if self._n <= self.spins + self.yields or self.max_sleep_s == 0:
            time.sleep(0)
            return
        time.sleep(self._sleep)
        self._sleep = min(self._sleep * 2, self.max_sleep_s)


class Deadline:
    """A point in time after which a wait gives up with a named error.

    Args:
        timeout_s (float): seconds from now.
        what (str): what is waited for (ends up in the error message).
        error (type[ConduitError]): raised by :meth:`check` once expired.
    """

    __slots__ = ("_end", "error", "timeout_s", "what")

    def __init__(self, timeout_s: float, what: str,
                 error: type[ConduitError] = DataPlaneTimeout) -> None:
        self.timeout_s = float(timeout_s)
        self.what = what
        self.error = error
        self._end = time.monotonic() + self.timeout_s

    @property
    def expired(self) -> bool:
        return time.monotonic() > self._end

    @property
    def remaining_s(self) -> float:
        return max(0.0, self._end - time.monotonic())

    def check(self, detail: str | Callable[[], str] = "") -> None:
        """Raise :attr:`error` if the deadline passed; ``detail`` (or its result) is
        appended to the message."""
        if time.monotonic() > self._end:
            more = detail() if callable(detail) else detail
            raise self.error(f"waited {seconds(self.timeout_s)} s for {self.what}"
                             + (f": {more}" if more else ""))


class Hosts:
    """The hostname of each world rank, for the messages of waits on other ranks: an
    operator of a job across many nodes must see which node to look at.

    Filled once from the all-gather of the data plane's constructor
    (:func:`~conduit_hpc.plane.roles.check_same_config`) and held by the roles
    (``RoleComms.hosts``); read only when a message is made (never per batch).

    Args:
        names (Sequence[str]): hostname of world rank ``r`` at index ``r``; empty where
            unknown (then no host is named).
    """

    __slots__ = ("names", "several")

    def __init__(self, names: Sequence[str] = ()) -> None:
        self.names = tuple(str(n) for n in names)
        #: whether the job spans more than one host (else no message names a host)
        self.several = len(set(self.names)) > 1

    def of(self, world_rank: int) -> str:
        """``" (host H)"`` for world rank ``world_rank`` across hosts, else ``""``."""
        if self.several and 0 <= world_rank < len(self.names):
            return f" (host {self.names[world_rank]})"
        return ""

    def rank(self, world_rank: int) -> str:
        """``"world rank R (host H)"`` (``"world rank R"`` on one host)."""
        return f"world rank {world_rank}{self.of(world_rank)}"

    def of_ranks(self, world_ranks: Iterable[int]) -> str:
        """``" (on host A: 1, 3; host B: 2)"`` for a list of ranks across hosts, else
        ``""``."""
        by_host: dict[str, list[int]] = {}
        for r in sorted(set(world_ranks)):
            if self.several and 0 <= r < len(self.names):
                by_host.setdefault(self.names[r], []).append(r)
        return (" (on " + "; ".join(f"host {h}: {', '.join(map(str, rs))}"
                                     for h, rs in by_host.items()) + ")") if by_host else ""


#: no hostnames known (one process, a test): messages name ranks only
NO_HOSTS = Hosts()


def seconds(t: float) -> str:
    """``t`` for a message: one decimal from a second on, two significant digits below
    (a bound of 0.01 s read "waited 0.0 s", as if nothing had been waited for)."""
    return f"{t:.1f}" if t >= 1 or t <= 0 else f"{t:.2g}"


def wait_until(condition: Callable[[], T], *, timeout_s: float, what: str,
               error: type[ConduitError] = DataPlaneTimeout,
               max_sleep_s: float = 0.001, detail: str | Callable[[], str] = "",
               between: Callable[[], object] | None = None, yields: int = 4) -> T:
    """Poll ``condition`` until it returns something truthy, and return that.

    Blocks at most ``timeout_s`` (plus one poll). ``between`` runs after every poll
    that found nothing (e.g. to make progress on outstanding messages); ``yields``: see
    :class:`Backoff`.

    Raises:
        DataPlaneTimeout (or ``error``): the condition stayed false; the message names
            ``what`` and ``detail``.
    """
    deadline = Deadline(timeout_s, what, error)
    backoff = Backoff(max_sleep_s, yields=yields)
    while True:
        value = condition()
        if value:
            return value
        deadline.check(detail)
        if between is not None:
            between()
        backoff.pause()
