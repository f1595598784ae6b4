"""The steps of one collective of :mod:`conduit_hpc.transport.collectives` (the header,
then the data): each step's wait, bounded, and the rule that keeps a group's ranks in
step.

A collective is several backend operations, and the backend pairs the ranks' operations
by their order alone. A rank that leaves a collective between or inside its steps (an
interrupt the job catches: Ctrl-C, an exception from a signal handler) while the others
are still in it would have its next call paired with the step they are in: gloo then
averaged the next header's bytes as data (silently, when their sizes matched), or this
rank's repeated values with the others' next ones (silently, any size), or aborted the
process ("Received data size doesn't match expected size"). :func:`in_step` makes such a
group *out of step* on that rank: it is ended there, word in its store names the rank and
why (the others' :class:`~conduit_hpc.errors.CollectiveFailed` says it, at once or within
their timeout), and every later collective on it raises ``CollectiveFailed`` saying why.
"""

from __future__ import annotations

import datetime
import functools
import time
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from conduit_hpc.errors import CollectiveFailed, CollectiveMismatch

__all__ = ["MARGIN_S", "in_step", "wait_work"]

#: one wait of a gloo collective between looks at the clock; the margin over gloo's own
#: deadline (which ends a collective whose peer never came) before this side gives up
SLICE = datetime.timedelta(seconds=0.05)
MARGIN_S = 5.0

_P = ParamSpec("_P")
_R = TypeVar("_R")


def wait_work(work: Any, backend: str, timeout_s: float,
              idle: Callable[[], object] | None = None) -> None:
    """Wait for ``work``: gloo in short slices (a slice that runs out leaves the work
    going; one that failed has completed), bounded by ``timeout_s`` and a margin over
    the backend's own deadline, calling ``idle`` after each slice that ran out; NCCL in
    one wait (a timed-out wait aborts it)."""
    if backend != "gloo":
        work.wait(datetime.timedelta(seconds=timeout_s))
        return
    deadline = time.monotonic() + timeout_s + MARGIN_S
    while True:
        try:
            work.wait(SLICE)
            return
        except RuntimeError:
            if work.is_completed():
                # it ended after the slice ran out, before this look (a slice that runs
                # out raises "Operation timed out!" whether or not the work then
                # completes): its own outcome decides - this wait returns at once, or
                # raises the work's error. Raising the slice's error here failed a
                # collective that had succeeded on this rank, which then left while the
                # others waited in its next one (seen under load, tests at 5 ranks)
                work.wait(SLICE)
                return
            if time.monotonic() >= deadline:
                raise
        if idle is not None:
            idle()


def in_step(method: Callable[Concatenate[Any, _P], _R]) -> Callable[Concatenate[Any, _P], _R]:
    """Around a collective of a ``Collectives`` group: refuses it where the group is out
    of step on this rank (``_left`` says why), and makes it so (``_leave``) when an
    exception leaves the collective after a step of it began (``_run`` sets ``_began``) -
    any but a :class:`CollectiveMismatch` (every rank raises it after the same steps:
    they are still in step) or one that already ended the group (``_group`` is
    ``None``). The cost on the normal path: two attribute looks and a ``try``."""
    op = method.__name__

    @functools.wraps(method)
    def collective(self: Any, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if self._left:
            raise CollectiveFailed(f"{op} on rank {self.rank} of the {self.backend} group: "
                                   f"this rank left {self._left} unfinished, so the ranks of "
                                   f"the group are out of step (the others may still be in "
                                   f"it) and no collective on it can run: the job must stop")
        self._began = False
        try:
            return method(self, *args, **kwargs)
        except CollectiveMismatch:
            raise
        except BaseException as err:
            if self._began and self._group is not None:
                self._leave(f"{op} ({type(err).__name__})")
            raise

    return collective
