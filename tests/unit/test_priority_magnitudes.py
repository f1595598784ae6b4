"""Priorities at the ends of float64: a huge finite priority is refused by name before
it reaches a sum-tree (before: 1e308 made a shard's total ``inf``, and every later draw
from it meaningless), and a tiny positive one is drawn with a finite weight (before:
``(N * pmin / total) ** -beta`` underflowed to ``0.0 ** -beta``, a ZeroDivisionError in
the learner's ``next_batch``, or NaN weights in the single-process replay)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit_hpc import Config, ConfigError, SpecError
from conduit_hpc.config.checks import MAX_PRIORITY
from conduit_hpc.rl.replay import PrioritizedReplay
from conduit_hpc.sampling import PrioritizedSampler
from conduit_hpc.sampling.stratified import ShardStats, importance_weights
from conduit_hpc.storage.priority import (
    PriorityIndex,
    check_masses,
    check_priorities,
    least_drawable,
)

FAST = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
magnitudes = st.one_of(st.floats(0, MAX_PRIORITY), st.sampled_from(
    [5e-324, 1e-320, 1e-300, 1e-200, 1e-30, 1.0, 1e30]))


@pytest.mark.parametrize("value", [1e31, 1e308, np.finfo(np.float64).max])
def test_a_priority_above_the_bound_is_refused_by_name(value: float) -> None:
    with pytest.raises(SpecError, match=r"priorities\[1\] must be finite, >= 0 and <= 1e\+30"):
        check_priorities([1.0, value])
    index = PriorityIndex(4, alpha=1.0)
    index.insert(np.arange(4), np.ones(4, np.int64), np.ones(4))
    with pytest.raises(SpecError, match="priorities"):
        index.update(np.arange(2), np.ones(2, np.int64), np.array([value, value]))
    assert index.total == 4.0  # nothing applied


@FAST
@given(st.lists(magnitudes, min_size=1, max_size=8), st.sampled_from([0.5, 1.0, 2.0]))
def test_the_totals_stay_finite_at_the_bound(prios: list[float], alpha: float) -> None:
    index = PriorityIndex(8, alpha=alpha)
    n = len(prios)
    index.insert(np.arange(n), np.ones(n, np.int64), np.asarray(prios))
    assert np.isfinite(index.total)


@FAST
@given(st.lists(magnitudes.filter(lambda x: x > 0), min_size=1, max_size=8),
       st.floats(0.01, 1.0))
def test_weights_of_any_held_priorities_are_finite_and_at_most_one(prios: list[float],
                                                                   beta: float) -> None:
    p = np.asarray(prios)
    w = importance_weights(p, [ShardStats(float(p.sum()), len(p), float(p.min()))], beta)
    assert w.dtype == np.float32 and np.isfinite(w).all()
    assert (w > 0).all() and (w <= 1).all() and w[int(np.argmin(p))] == 1
    with np.errstate(over="ignore", under="ignore"):  # the formula, in logs
        want = np.exp(-beta * (np.log(p) - np.log(p.min()))).astype(np.float32)
    np.testing.assert_allclose(w, want, rtol=1e-5, atol=1e-30)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize(("heavy", "light", "alpha"), [(1e30, 1e-20, 1.0), (1e30, 1e-300, 0.6),
                                                       (1e30, 5e-324, 1.0)])
def test_a_weight_too_small_for_float32_stays_above_zero(compiled: bool, heavy: float,
                                                         light: float, alpha: float) -> None:
    """Priorities 1e30 and 1e-20 are both accepted; the heavy row's weight (1e-50 at beta
    1) underflowed float32 to 0.0, outside the (0, 1] importance weights promise (a loss
    dividing by it, or taking its log, got inf). It is now float32's smallest normal."""
    mass = np.array([heavy, light, 1.0]) ** alpha
    stats = [ShardStats(float(mass.sum()), 3, float(mass.min()))]
    w = importance_weights(mass, stats, 1.0, compiled=compiled)
    assert (w > 0).all() and (w <= 1).all(), w
    assert w[0] == np.finfo(np.float32).tiny and w[1] == 1


def test_the_single_process_replay_weights_a_tiny_priority() -> None:
    replay = PrioritizedReplay({"x": ((), "float32")}, 4, alpha=1.0)
    replay.add({"x": np.zeros(2, np.float32)}, np.array([1e-320, 1e5]))
    sample = replay.sample(8, beta=0.4, rng=np.random.default_rng(0))
    assert np.isfinite(sample.weights).all() and (sample.weights <= 1).all()


def test_the_learner_refuses_an_update_whose_mass_would_overflow() -> None:
    sampler = PrioritizedSampler(batch_rows=2, seed=0, alpha=10.0, beta=0.4, beta_final=1.0,
                                 beta_anneal_supersteps=0)
    idx = np.array([[0, 0, 1], [0, 1, 1]])
    with pytest.raises(SpecError, match=r"priorities: 1e\+30 \*\* priority_exponent 10.0 "
                                        r"over 2147483648 rows overflows"):
        sampler.check_update(idx, [1.0, 1e30], {0: 2**31})
    got, p = sampler.check_update(idx, [1.0, 1e29], {0: 2**31})
    assert got.shape == (2, 3) and p[1] == 1e29


@pytest.mark.parametrize("shape", [(2, 2), (4, 1, 2)])
def test_priorities_of_another_shape_than_one_per_row_are_refused(shape: tuple[int, ...]
                                                                  ) -> None:
    with pytest.raises(SpecError, match=r"one priority per row, of shape \[n\] or \[n, 1\]"):
        check_priorities(np.ones(shape))
    assert check_priorities(np.ones((4, 1))).shape == (4,)
    assert check_priorities(np.ones((1, 4))).shape == (4,)


@pytest.mark.parametrize("initial,alpha", [(1e-200, 2.0), (1e-170, 2.0), (5e-324, 1.0),
                                           (1e-40, 10.0)])
def test_an_initial_priority_whose_mass_underflows_is_refused_at_load(initial: float,
                                                                      alpha: float) -> None:
    # rows inserted without a priority get initial_priority ** priority_exponent: 0 (or
    # a subnormal) there made every such row undrawable, and learners waited out their
    # timeout told "every row held has priority 0"
    with pytest.raises(ConfigError, match=r"storage.initial_priority must be such that "
                       r"initial_priority \*\* priority_exponent .* is a normal float64 .*"
                       r"could never be drawn\), got " + f"{initial!r}".replace("+", r"\+")
                       ) as err:
        Config.from_dict({"storage": {"initial_priority": initial,
                                      "priority_exponent": alpha}})
    assert err.value.key == "storage.initial_priority"


@pytest.mark.parametrize("initial,alpha", [(1e-200, 1.5), (5e-324, 0.5), (5e-324, 0.0),
                                           (1e-30, 10.0)])
def test_an_initial_priority_of_a_drawable_mass_loads(initial: float, alpha: float) -> None:
    cfg = Config.from_dict({"storage": {"initial_priority": initial,
                                        "priority_exponent": alpha}})
    index = PriorityIndex(4, alpha=alpha, initial_priority=cfg.storage.initial_priority)
    index.insert(np.arange(4), np.arange(1, 5), np.full(4, np.nan))  # no priorities given
    assert index.total > 0 and index.count == 4


@pytest.mark.parametrize("capacity,alpha,limit", [(2**40, 10.0, "9.873"),
                                                  (2**40, 9.9, "9.873"),
                                                  (2**28, 10.0, "9.994")])
def test_an_exponent_whose_masses_could_sum_past_float64_is_refused(capacity: int, alpha: float,
                                                                    limit: str) -> None:
    # every priority <= MAX_PRIORITY is taken (actors' too): with 1e30 ** 10 = 1e300 a
    # row, 2**28 rows sum past float64's range, the shard's total turns inf and every
    # draw from it is meaningless - refused when the config loads
    with pytest.raises(ConfigError, match=rf"storage.priority_exponent must be <= {limit} "
                       rf"with capacity_rows = {capacity} .*must stay finite") as err:
        Config.from_dict({"storage": {"capacity_rows": capacity, "priority_exponent": alpha}})
    assert err.value.key == "storage.priority_exponent"
    top = float(limit)
    cfg = Config.from_dict({"storage": {"capacity_rows": capacity, "priority_exponent": top}})
    assert np.isfinite(np.float64(MAX_PRIORITY) ** cfg.storage.priority_exponent * capacity)
    assert Config.from_dict({"storage": {"priority_exponent": 10.0}}).storage.capacity_rows


@pytest.mark.parametrize("alpha", [1.0001, 1.5, 2.0, 7.0, 10.0])
def test_the_least_priority_with_a_mass_is_exact(alpha: float) -> None:
    x = least_drawable(alpha)
    with np.errstate(under="ignore"):
        assert np.power(x, alpha) > 0 and np.power(np.nextafter(x, 0.0), alpha) == 0


@pytest.mark.parametrize("alpha", [2.0, 10.0])
def test_a_positive_priority_whose_mass_underflows_is_refused(alpha: float) -> None:
    """Exponents above 1 take a tiny positive priority to a mass of 0: its row could
    never be drawn (before: accepted, and the learner waited out its timeout on "every
    row held has priority 0" - tests/mpi/test_numeric_edges.py runs the plane)."""
    sampler = PrioritizedSampler(batch_rows=2, seed=0, alpha=alpha, beta=0.4,
                                 beta_final=1.0, beta_anneal_supersteps=0)
    idx = np.array([[0, 0, 1], [0, 1, 1], [0, 2, 1]])
    least = least_drawable(alpha)
    bad = float(np.nextafter(least, 0.0))
    with pytest.raises(SpecError, match=r"priorities\[2\] = .* raised to "
                                        r"storage.priority_exponent .* underflows"):
        sampler.check_update(idx, [1.0, 0.0, bad], {0: 8})
    _, p = sampler.check_update(idx, [1.0, 0.0, least], {0: 8})  # 0: never drawn, kept
    assert p[2] == least
    with pytest.raises(SpecError, match="underflows"):
        check_masses(np.array([bad]), alpha)
    check_masses(np.array([5e-324]), 1.0)  # an exponent up to 1 never underflows


@pytest.mark.parametrize("bad", [
    {"prios": np.array([1.0, -1.0])},  # a negative priority
    {"prios": np.array([1.0, 1e-40]), "alpha": 10.0},  # a mass that underflows to 0
    {"prios": np.array([1.0, 1.0, 1.0])},  # one priority too many
    {"x": np.zeros((2, 3), np.float32)},  # rows of another shape
])
def test_a_refused_add_to_the_single_process_replay_stores_nothing(bad: dict) -> None:
    """The single-process replay wrote a batch's rows before its index refused the
    priorities: the oldest rows were overwritten while the index still held them with
    their old priorities (a sample then returned the refused batch's values); a
    positive priority without mass (alpha 10) was accepted and never drawn."""
    replay = PrioritizedReplay({"x": ((), "float32")}, 4, alpha=bad.get("alpha", 0.6))
    replay.add({"x": np.arange(4, dtype=np.float32)}, np.ones(4))
    with pytest.raises(ValueError):
        replay.add({"x": bad.get("x", np.full(2, 9, np.float32))},
                   bad.get("prios", np.ones(2)))
    assert replay._data["x"].tolist() == [0, 1, 2, 3] and replay.inserted == 4
    with pytest.raises(ValueError, match="underflows"):
        PrioritizedReplay({"x": ((), "float32")}, 4, alpha=10.0).update_priorities(
            np.array([0]), np.array([1]), np.array([1e-40]))
