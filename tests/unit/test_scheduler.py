"""Scheduler state machines: rate limiter, prefetch clock, data-plane thread."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_hpc import ConfigError, DataPlaneTimeout
from conduit_hpc.config import SchedulerConfig
from conduit_hpc.protocol import PriorityUpdate, SampleReply, SampleRequest, pack_rows, unpack_rows
from conduit_hpc.sampling import check_update
from conduit_hpc.scheduler import DataPlaneThread, LimiterState, PrefetchClock, RateLimiter
from conduit_hpc.testing import make_config


def test_rate_limiter_both_sides_wait() -> None:
    lim = RateLimiter(samples_per_insert=2.0, min_size_to_sample=10, error_buffer=20.0)
    # min_diff = 0, max_diff = 40
    s = LimiterState(inserts=5, samples=0, held=5)
    assert not lim.can_sample(s, 1)  # below the minimum fill
    assert lim.can_insert(s, 16)  # below the fill inserts are free (10 + 32 > 40)
    s = LimiterState(inserts=10, samples=0, held=10)
    assert lim.can_insert(s, 10)  # diff 20 + 20 <= 40
    assert not lim.can_insert(s, 11)  # 20 + 22 > 40: actors wait
    s = LimiterState(inserts=20, samples=0, held=20)
    assert lim.can_sample(s, 40)  # diff 40 - 40 >= 0
    assert not lim.can_sample(s, 41)  # the learner waits
    s = LimiterState(inserts=20, samples=40, held=20)
    assert lim.can_insert(s, 20) and not lim.can_sample(s, 1)
    assert "diff=0" in lim.explain(s)


def test_rate_limiter_tolerance_and_disabled() -> None:
    off = RateLimiter(samples_per_insert=0, min_size_to_sample=3)
    assert off.can_insert(LimiterState(10**9, 0, 0), 10**6)
    assert not off.can_sample(LimiterState(2, 0, 2), 1)
    assert off.can_sample(LimiterState(3, 10**9, 3), 10**6)


def test_rate_limiter_refuses_impossible_settings() -> None:
    with pytest.raises(ConfigError, match=r"scheduler\.error_buffer"):
        make_config(scheduler={"samples_per_insert": 4.0, "error_buffer": 100.0,
                               "max_insert_batch": 64, "batch_rows": 32})


def stuck_state(lim: RateLimiter, max_insert_batch: int, batch_rows: int,
                limit: int = 20_000) -> LimiterState | None:
    """A limiter state reachable from empty in which an actor with a batch of up to
    ``max_insert_batch`` rows and a learner asking for ``batch_rows`` rows both wait, or
    ``None`` (exhaustive search). Model: one actor and one learner, no eviction (``held ==
    inserts``); the limiter decides on the ratio's diff and on whether the fill is reached,
    so states are told apart by ``(min(inserts, min_size_to_sample), diff)``."""
    def key(s: LimiterState) -> tuple[int, float]:
        return min(s.inserts, lim.min_size_to_sample), lim.diff(s)

    start = LimiterState(0, 0, 0)
    seen, todo = {key(start)}, [start]
    while todo:
        s = todo.pop()
        nexts = [LimiterState(s.inserts + n, s.samples, s.held + n)
                 for n in range(1, max_insert_batch + 1) if lim.can_insert(s, n)]
        if lim.can_sample(s, batch_rows):
            nexts.append(LimiterState(s.inserts, s.samples + batch_rows, s.held))
        # an actor holds its next batch, of any size up to the largest: it is stuck when
        # that batch may not go in and the learner may not sample
        if not lim.can_insert(s, max_insert_batch) and not lim.can_sample(s, batch_rows):
            return s
        for t in nexts:
            if key(t) not in seen:
                seen.add(key(t))
                todo.append(t)
        assert len(seen) < limit, "the reachable states did not close: the search is wrong"
    return None


# ratios and tolerances that are multiples of 1/4 keep every diff exact in binary
RATIOS = st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0, 4.0])


@settings(max_examples=300, deadline=None)
@given(spi=RATIOS, batch_rows=st.integers(1, 24), max_insert_batch=st.integers(1, 24),
       min_fill_rows=st.integers(1, 60), quarters=st.integers(0, 400))
def test_an_accepted_ratio_never_deadlocks_and_a_deadlocking_one_is_refused(
        spi: float, batch_rows: int, max_insert_batch: int, min_fill_rows: int,
        quarters: int) -> None:
    # the limiter the data plane builds from the config (plane/front.py)
    lim = RateLimiter(spi, min_fill_rows, quarters / 4)
    stuck = stuck_state(lim, max_insert_batch, batch_rows)
    try:
        SchedulerConfig(samples_per_insert=spi, error_buffer=quarters / 4,
                        max_insert_batch=max_insert_batch, batch_rows=batch_rows,
                        min_fill_rows=min_fill_rows)
    except ConfigError as err:
        assert "error_buffer" in str(err)
        return
    assert stuck is None, f"accepted, yet actors and learners both wait at {stuck}: " \
                          f"{lim.explain(stuck)}"


@pytest.mark.parametrize(("error_buffer", "refused"), [(10.0, True), (13.0, False)])
def test_the_deadlock_search_finds_the_narrow_tolerance(error_buffer, refused) -> None:
    # the property above is not vacuous: a tolerance narrower than (1 * 16 + 10) / 2 = 13
    # rows lets actors and learners wait for each other, and the config refuses it
    lim = RateLimiter(1.0, 4, error_buffer)
    assert (stuck_state(lim, 16, 10) is not None) is refused
    kwargs = {"samples_per_insert": 1.0, "min_fill_rows": 4, "error_buffer": error_buffer,
              "max_insert_batch": 16, "batch_rows": 10}
    if refused:
        with pytest.raises(ConfigError, match="error_buffer"):
            SchedulerConfig(**kwargs)
    else:
        SchedulerConfig(**kwargs)


def test_policy_lag_must_cover_the_weights_cadence() -> None:
    with pytest.raises(ConfigError, match="max_policy_lag"):
        make_config(scheduler={"max_policy_lag": 2, "weights_every": 5})


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_prefetch_clock_bounds_staleness(depth: int) -> None:
    c = PrefetchClock(depth)
    rng = np.random.default_rng(depth)
    seen = []
    for _ in range(200):
        if rng.random() < 0.5 and c.may_prepare():
            t, stale = c.start()
            assert stale <= depth
            assert t < c.requested + depth
            seen.append(t)
        elif c.prepared > c.requested or (depth == 0 and c.prepared == c.requested):
            c.request()
    assert seen == list(range(len(seen)))  # in order, none skipped
    if depth == 0:
        assert not c.may_prepare() or c.prepared < c.requested


def test_prefetch_clock_sync_has_zero_staleness() -> None:
    c = PrefetchClock(0)
    for s in range(5):
        assert not c.may_prepare()
        assert c.request() == s
        assert c.start() == (s, 0)


def test_data_plane_thread_orders_calls_and_surfaces_errors() -> None:
    log: list[str] = []
    work = iter(range(3))

    def background() -> bool:
        i = next(work, None)
        if i is None:
            return False
        log.append(f"bg{i}")
        return True

    th = DataPlaneThread(background)
    th.start()
    th.post(lambda: log.append("a"), timeout_s=5)
    assert th.call(lambda: log.append("b") or 42, timeout_s=5, what="b") == 42
    assert log.index("a") < log.index("b")
    with pytest.raises(ZeroDivisionError):
        th.call(lambda: 1 / 0, timeout_s=5, what="boom")
    with pytest.raises(ZeroDivisionError):  # the thread is dead: later calls re-raise
        th.call(lambda: None, timeout_s=5, what="after")


def test_data_plane_thread_call_times_out() -> None:
    gate = threading.Event()
    th = DataPlaneThread(lambda: False)
    th.start()
    th.post(lambda: gate.wait(2), timeout_s=5)
    t0 = time.monotonic()
    with pytest.raises(DataPlaneTimeout, match="slow thing"):
        th.call(lambda: None, timeout_s=0.2, what="the slow thing")
    assert time.monotonic() - t0 < 1.5
    gate.set()
    th.stop(5)


def test_data_plane_thread_posts_wait_for_room_and_never_starve_its_background() -> None:
    # a thread that posts without pause: the queue holds at most max_posted of its
    # calls (post waits, bounded, naming the queue), and the background step still runs
    # between calls (it ran only when nothing was queued: a flood of priority updates
    # starved the prefetch, and next_batch waited out its timeout)
    gate = threading.Event()
    steps: list[int] = []
    ran: list[int] = []

    def background() -> bool:
        steps.append(len(ran))
        return False

    th = DataPlaneThread(background, max_posted=4)
    th.start()
    busy = threading.Event()
    th.post(lambda: busy.set() or gate.wait(5), timeout_s=1)  # the thread is busy in this
    assert busy.wait(5)  # ... once it took it (bounded)
    for i in range(4):
        th.post(lambda i=i: ran.append(i), timeout_s=1)
    with pytest.raises(DataPlaneTimeout, match="room in the data-plane thread's queue"):
        th.post(lambda: None, timeout_s=0.2)  # full: bounded, named
    gate.set()
    for i in range(4, 40):  # the flood: each post waits for room, none is refused
        th.post(lambda i=i: ran.append(i), timeout_s=5)
    th.stop(5)
    assert ran == list(range(40))
    # between each two calls that were queued together, a background step ran
    assert all(k in steps for k in range(1, 40)), sorted(set(steps))


def test_update_priorities_validation() -> None:
    shards = {0: 10, 3: 5}
    idx = np.array([[0, 1, 2], [3, 4, 9]])
    got, p = check_update(idx, [1.0, 2.0], shards)
    assert got.dtype == np.int64 and p.tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match=r"shape \[n, 3\]"):
        check_update(np.array([1, 2]), [1.0], shards)
    with pytest.raises(ValueError, match="2 entries but indices has 1"):
        check_update(idx[:1], [1.0, 2.0], shards)
    with pytest.raises(ValueError, match=r"priorities\[1\] must be finite"):
        check_update(idx, [1.0, np.nan], shards)
    with pytest.raises(ValueError, match=r"priorities\[0\] must be finite, >= 0 and <= 1e\+30"):
        check_update(idx, [-1.0, 1.0], shards)
    with pytest.raises(ValueError, match=r"priorities\[0\]"):
        check_update(idx, [np.inf, 1.0], shards)
    with pytest.raises(ValueError, match="shard 7"):
        check_update(np.array([[7, 0, 1]]), [1.0], shards)
    with pytest.raises(ValueError, match=r"slot 5 outside shard 3's \[0, 5\)"):
        check_update(np.array([[3, 5, 1]]), [1.0], shards)


def test_wire_round_trips() -> None:
    from conduit_hpc.spec import Spec

    req = SampleRequest(7, 2, np.array([0.5, 1.5]))
    back = SampleRequest.unpack(req.pack())
    assert (back.request_id, back.shard_id, back.targets.tolist()) == (7, 2, [0.5, 1.5])
    rep = SampleReply(7, 2, np.array([1, 2]), np.array([5, 6]), np.array([0.1, 0.2]), 9, 3.5,
                      0.1)
    spec = Spec.from_dict({"a": ("float32", (2,)), "b": ("int64", ())})
    cols = {"a": np.arange(4, dtype=np.float32).reshape(2, 2), "b": np.array([3, 4])}
    r2, rest = SampleReply.unpack(rep.pack(pack_rows(spec, cols)))
    assert r2.slots.tolist() == [1, 2] and r2.gens.tolist() == [5, 6] and r2.held == 9
    assert (r2.total, r2.min_mass) == (3.5, 0.1)
    got = unpack_rows(spec, rest, 2)
    np.testing.assert_array_equal(got["a"], cols["a"])
    np.testing.assert_array_equal(got["b"], cols["b"])
    up = PriorityUpdate.unpack(PriorityUpdate(3, np.array([1]), np.array([2]),
                                              np.array([0.5])).pack())
    assert (up.shard_id, up.slots.tolist(), up.gens.tolist(), up.priorities.tolist()) == (
        3, [1], [2], [0.5])


def test_a_call_that_timed_out_in_the_queue_never_runs() -> None:
    """A call still queued when its caller's wait ran out is dropped: before, it ran
    whenever the thread got to it, after the caller was told it timed out (an ingest
    on a learner then wrote the arrays its caller had reused meanwhile)."""
    gate = threading.Event()
    ran: list[str] = []
    th = DataPlaneThread(lambda: False)
    th.start()
    th.post(lambda: gate.wait(30), timeout_s=5)  # the thread is busy
    with pytest.raises(DataPlaneTimeout, match="the late write"):
        th.call(lambda: ran.append("late"), timeout_s=0.2, what="the late write")
    gate.set()
    assert th.call(lambda: ran.append("next") or 7, timeout_s=30, what="next") == 7
    th.stop(30)
    assert ran == ["next"]


def test_a_call_begun_before_its_timeout_is_waited_for() -> None:
    """A call the thread began before its caller's deadline is not abandoned mid-way:
    its caller waits one more period for its result."""
    began, gate = threading.Event(), threading.Event()

    def slow() -> int:
        began.set()
        gate.wait(30)
        return 5

    th = DataPlaneThread(lambda: False)
    th.start()
    threading.Timer(0.0, lambda: began.wait(30) and threading.Timer(
        2.5, gate.set).start()).start()  # release it after the first period
    assert th.call(slow, timeout_s=2.0, what="slow") == 5
    th.stop(30)


def test_a_thread_that_fails_leaves_no_cancelled_call_in_its_way() -> None:
    gate = threading.Event()
    th = DataPlaneThread(lambda: False)
    th.start()
    th.post(lambda: gate.wait(30) and 1 / 0, timeout_s=5)
    with pytest.raises(DataPlaneTimeout):
        th.call(lambda: None, timeout_s=0.2, what="dropped")
    gate.set()
    with pytest.raises(ZeroDivisionError):  # the thread's own error, not a state error
        th.call(lambda: None, timeout_s=30, what="after")
