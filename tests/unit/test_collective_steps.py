"""The bounded wait of a gloo collective (:func:`conduit_hpc.transport.collective_steps.
wait_work`) against the ways torch's ``Work.wait(timeout)`` ends.

``Work`` below stands in for torch's c10d work object only (the thing under test is the
wait around it): ``Work.wait(timeout)`` raises ``RuntimeError("Operation timed out!")``
when the timeout runs out with the work not completed - also when it completes a moment
later, before the caller looks at ``is_completed()``. Under load that moment came: a
rank read a collective that had succeeded as failed and left the group while the others
waited for it in the next one (tests/mpi/test_collectives.py at 5 ranks).
"""

from __future__ import annotations

import time

import pytest

from conduit_hpc.transport import collective_steps
from conduit_hpc.transport.collective_steps import wait_work


class Work:
    """Completes (``error``: with that error) ``after`` waits that ran out; the wait on
    which it completes still raises the slice's timeout, as a completion just after the
    timeout does."""

    def __init__(self, after: int, error: str = "") -> None:
        self.after, self.error, self.waits, self.done = after, error, 0, False

    def wait(self, timeout: object) -> bool:
        self.waits += 1
        if self.done:
            if self.error:
                raise RuntimeError(self.error)
            return True
        if self.waits > self.after:
            self.done = True
        else:
            time.sleep(0.01)  # a slice of waiting
        raise RuntimeError("Operation timed out!")

    def is_completed(self) -> bool:
        return self.done


@pytest.mark.parametrize("after", [0, 3])
def test_a_work_that_completes_as_its_slice_runs_out_is_a_success(after: int) -> None:
    work = Work(after)
    wait_work(work, "gloo", timeout_s=10.0)  # before: raised "Operation timed out!"
    assert work.done and work.waits == after + 2


def test_a_work_that_completes_with_an_error_raises_that_error() -> None:
    work = Work(2, error="[gloo] Connection closed by peer")
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        wait_work(work, "gloo", timeout_s=10.0)


def test_a_work_that_never_completes_raises_at_its_deadline(monkeypatch) -> None:
    monkeypatch.setattr(collective_steps, "MARGIN_S", 0.0)
    work = Work(10 ** 9)
    idle: list[float] = []
    with pytest.raises(RuntimeError, match="Operation timed out"):
        wait_work(work, "gloo", timeout_s=0.3, idle=lambda: idle.append(1.0))
    assert not work.done and work.waits > 1  # not given up at the first slice that ran out
    assert len(idle) == work.waits - 1  # idle after every slice that ran out but the last
