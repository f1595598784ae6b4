"""The shared bounded wait."""

from __future__ import annotations

import time

import pytest

from conduit_hpc.errors import ConfigError, DataPlaneTimeout
from conduit_hpc.wait import Backoff, Deadline, seconds, wait_until


def test_wait_until_returns_the_first_truthy_value() -> None:
    calls = iter([0, None, "", 7, 8])
    assert wait_until(lambda: next(calls), timeout_s=5, what="a value") == 7


def test_wait_until_gives_up_naming_what_and_the_detail() -> None:
    t0 = time.monotonic()
    with pytest.raises(DataPlaneTimeout, match=r"waited 0.1 s for the owner: cursor at 3"):
        wait_until(lambda: False, timeout_s=0.1, what="the owner", detail=lambda: "cursor at 3")
    assert time.monotonic() - t0 >= 0.1  # not before the deadline (pytest-timeout bounds it)


def test_wait_until_raises_the_error_type_asked_for() -> None:
    with pytest.raises(ConfigError):
        wait_until(lambda: False, timeout_s=0.0, what="x", error=ConfigError)


def test_between_runs_after_each_empty_poll() -> None:
    seen: list[int] = []
    n = iter(range(100))
    wait_until(lambda: len(seen) >= 3, timeout_s=5, what="3 calls",
               between=lambda: seen.append(next(n)))
    assert seen == [0, 1, 2]


def test_backoff_spins_then_yields_then_sleeps_growing_to_the_ceiling(monkeypatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("conduit_hpc.wait.time.sleep", slept.append)
    b = Backoff(0.004, min_sleep_s=0.001, spins=2)
    for _ in range(12):
        b.pause()
    # 2 spins (no call), 4 yields (sleep(0)), then 0.001, 0.002, 0.004, 0.004, ...
    assert slept == [0, 0, 0, 0, 0.001, 0.002, 0.004, 0.004, 0.004, 0.004]
    b.reset()
    slept.clear()
    b.pause()
    b.pause()
    assert slept == []  # spinning again
    with pytest.raises(ValueError, match="max_sleep_s"):
        Backoff(-1.0)


def test_deadline() -> None:
    d = Deadline(10, "nothing")
    assert not d.expired and 9 < d.remaining_s <= 10
    d.check()
    e = Deadline(0, "the end")
    time.sleep(0.001)
    assert e.expired and e.remaining_s == 0
    with pytest.raises(DataPlaneTimeout, match="the end"):
        e.check()


def test_a_bound_below_a_tenth_of_a_second_is_named_as_it_was_given() -> None:
    """``run.timeout_s = 0.01`` read "waited 0.0 s for every rank ..." before."""
    with pytest.raises(DataPlaneTimeout, match=r"^waited 0.01 s for x$"):
        wait_until(lambda: False, timeout_s=0.01, what="x")
    assert [seconds(t) for t in (0.0, 0.01, 0.25, 1.0, 120.0)] == [
        "0.0", "0.01", "0.25", "1.0", "120.0"]
