"""The device tier's promotion policy (``plane/device_policy.py``): the pure choice of
shards to mirror, and the ``[placement] device_rows`` config checks."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_hpc.config import Config
from conduit_hpc.errors import ConfigError
from conduit_hpc.plane.device_policy import Agreement, DevicePolicy, choose

masses = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
heats = st.dictionaries(st.integers(0, 40), st.tuples(masses, st.integers(1, 64)),
                        max_size=10)


@settings(max_examples=300, deadline=None)
@given(heat=heats, budget=st.integers(0, 300), inc=st.sets(st.integers(0, 40), max_size=5))
def test_the_choice_fits_the_budget_and_takes_only_candidates_with_mass(heat, budget, inc):
    got = choose(heat, budget, inc)
    assert got <= set(heat)
    assert sum(heat[s][1] for s in got) <= budget
    assert all(heat[s][0] > 0 for s in got)
    # greedy: a candidate left out either had no mass or no longer fitted when its turn
    # came, i.e. every denser-or-equal shard taken plus it would overflow
    for s in set(heat) - got:
        m, c = heat[s]
        if m > 0:
            denser = [t for t in got if heat[t][0] / heat[t][1] >= m / c]
            assert sum(heat[t][1] for t in denser) + c > budget


@settings(max_examples=300, deadline=None)
@given(ms=st.lists(masses, max_size=7), cap=st.integers(1, 50), k=st.integers(0, 8))
def test_the_choice_is_optimal_for_equal_capacities(ms, cap, k):
    heat = {i: (m, cap) for i, m in enumerate(ms)}
    budget = k * cap + cap // 2  # room for k shards, not k + 1
    got = choose(heat, budget)
    best = max((sum(heat[s][0] for s in sub)
                for n in range(min(k, len(ms)) + 1)
                for sub in itertools.combinations(heat, n)), default=0.0)
    assert sum(heat[s][0] for s in got) == pytest.approx(best)
    assert len(got) == min(k, sum(m > 0 for m in ms))


def test_incumbents_win_ties_and_the_densest_shard_wins() -> None:
    heat = {0: (10.0, 4), 1: (10.0, 4), 2: (1.0, 4)}
    assert choose(heat, 4) == {0}
    assert choose(heat, 4, incumbents={1}) == {1}
    assert choose(heat, 8, incumbents={2}) == {0, 1}
    assert choose({0: (50.0, 10), 1: (9.0, 1)}, 10) == {1}  # density, not mass
    assert choose({0: (0.0, 4)}, 100) == frozenset()


def test_a_move_waits_for_patience_agreeing_looks() -> None:
    a, b, none = frozenset({1}), frozenset({2}), frozenset()
    ag = Agreement(3)
    assert [ag.look(a, none) for _ in range(3)] == [False, False, True]
    # a look that wants something else, or what is held, starts the count again
    assert [ag.look(a, none), ag.look(b, none), ag.look(a, none), ag.look(a, none)] == [
        False, False, False, False]
    assert ag.look(none, none) is False and ag.count == 0
    assert [ag.look(b, a) for _ in range(3)] == [False, False, True]
    assert Agreement(1).look(a, none) is True


@settings(max_examples=200, deadline=None)
@given(patience=st.integers(1, 5), seq=st.lists(st.sampled_from([0, 1, 2]), max_size=30))
def test_a_move_happens_exactly_after_patience_equal_looks(patience, seq) -> None:
    sets = [frozenset(), frozenset({1}), frozenset({2})]
    ag, run, last = Agreement(patience), 0, None
    for k in seq:
        want = sets[k]
        moved = ag.look(want, frozenset())
        run = 0 if not want else (run + 1 if want == last else 1)
        last = want if want else None
        assert moved == (run == patience)
        if moved:
            run, last = 0, None


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"placement": {"device_rows": -1}}, "placement.device_rows must be >= 0"),
        ({"placement": {"device_rows": 2**41}}, "placement.device_rows must be >= 0"),
        ({"placement": {"device_rows": "many"}}, "placement.device_rows must be an integer"),
        ({"placement": {"device_rows": 1.5}}, "placement.device_rows must be an integer"),
        ({"placement": {"device_rows": True}}, "placement.device_rows must be an integer"),
        ({"placement": {"device_rows": 64}, "scheduler": {"delivery": "process"}},
         "scheduler.delivery must be 'thread' with placement.device_rows = 64"),
        ({"placement": {"device_rows": 64},
          "scheduler": {"sampler": "sequence", "sequence_length": 4}},
         "scheduler.sampler must be 'uniform' or 'prioritized' with placement.device_rows"),
        ({"placement": {"device_rows": 64, "adaptive": True}},
         "placement.adaptive must be false with placement.device_rows = 64"),
        ({"placement": {"device_rows": 64}, "transport": {"shared_memory": "never"}},
         "transport.shared_memory must be 'auto' with placement.device_rows = 64"),
    ],
)
def test_bad_device_rows_are_named(raw: dict, fragment: str) -> None:
    raw = {"checkpoint": {"on_stop": False}, **raw}
    with pytest.raises(ConfigError) as info:
        Config.from_dict(raw)
    assert fragment in str(info.value), str(info.value)


def test_device_rows_loads() -> None:
    assert Config.from_dict({}).placement.device_rows == 0
    cfg = Config.from_dict({"placement": {"device_rows": 256, "patience": 1}})
    assert cfg.placement.device_rows == 256


def test_the_log_of_moves_keeps_the_latest_and_counts_every_one() -> None:
    """``DevicePolicy.moves`` grew by one entry a move for as long as the learner ran; it
    keeps the latest 1,024 now, and ``demotions`` still counts every one."""
    pol = DevicePolicy([0], budget=10, interval=1, patience=1, seed=0)
    mirror = SimpleNamespace(drawn=1, rows_in=0, evicted=0, missed=0)
    d = SimpleNamespace(device_shards={0: mirror}, place=lambda sid, dev: None)
    for look in range(3000):
        pol.looks = look
        pol.held.add(0)
        pol.demote(d, 0)
    assert len(pol.moves) == 1024 and pol.demotions == 3000
    assert pol.moves[0] == (3000 - 1024, "demote", 0) and pol.moves[-1] == (2999, "demote", 0)
    assert pol.retired["drawn"] == 3000
