"""Scheduler state machines: rate limiter, prefetch clock, data-plane thread."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from conduit_hpc import ConfigError, DataPlaneTimeout
from conduit_hpc.protocol import PriorityUpdate, SampleReply, SampleRequest, pack_rows, unpack_rows
from conduit_hpc.sampling import check_update
from conduit_hpc.scheduler import DataPlaneThread, LimiterState, PrefetchClock, RateLimiter
from conduit_hpc.testing import make_config


def test_rate_limiter_both_sides_wait() -> None:
    lim = RateLimiter(samples_per_insert=2.0, min_size_to_sample=10, error_buffer=20.0)
    # min_diff = 0, max_diff = 40
    s = LimiterState(inserts=5, samples=0, held=5)
    assert not lim.can_sample(s, 1)  # below the minimum fill
    assert lim.can_insert(s, 10)  # diff 10 + 20 <= 40
    assert not lim.can_insert(s, 16)  # 10 + 32 > 40: actors wait
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
    lim = RateLimiter(samples_per_insert=1.0, min_size_to_sample=1, error_buffer=10.0)
    with pytest.raises(ConfigError, match=r"error_buffer must be >= 144"):
        lim.check_progress(max_insert_batch=32, sample_batch=256)
    RateLimiter(1.0, 1, 144.0).check_progress(32, 256)
    with pytest.raises(ConfigError, match=r"scheduler\.error_buffer"):
        make_config(scheduler={"samples_per_insert": 4.0, "error_buffer": 100.0,
                               "max_insert_batch": 64, "batch_rows": 32})


def test_rate_limiter_never_deadlocks_when_accepted() -> None:
    # from any reachable state, one side can move (exhaustive over a small grid)
    lim = RateLimiter(samples_per_insert=1.5, min_size_to_sample=4, error_buffer=20.0)
    lim.check_progress(max_insert_batch=8, sample_batch=16)
    for inserts in range(0, 200):
        for samples in range(0, 300):
            s = LimiterState(inserts, samples, inserts)
            if lim.diff(s) > lim.max_diff or lim.diff(s) < lim.min_diff - 16:
                continue  # unreachable
            assert lim.can_insert(s, 8) or lim.can_sample(s, 16) or inserts < 4


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
    th.post(lambda: log.append("a"))
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
    th.post(lambda: gate.wait(2))
    t0 = time.monotonic()
    with pytest.raises(DataPlaneTimeout, match="slow thing"):
        th.call(lambda: None, timeout_s=0.2, what="the slow thing")
    assert time.monotonic() - t0 < 1.5
    gate.set()
    th.stop(5)


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
    with pytest.raises(ValueError, match=r"priorities\[0\] must be finite and >= 0"):
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
