"""Samplers against a single-buffer reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from conduit_hpc.sampling import (
    ShardStats,
    allocate_targets,
    beta_at,
    importance_weights,
    nstep_returns,
    nstep_transform,
    valid_sequence_starts,
)
from conduit_hpc.storage import PriorityIndex, SumTree


def make_shards(sizes, rng, alpha=0.6):
    shards, prios = [], []
    for n in sizes:
        ix = PriorityIndex(n, alpha=alpha)
        p = rng.random(n) * 10 + 0.01
        ix.insert(np.arange(n), np.arange(1, n + 1), p)
        shards.append(ix)
        prios.append(p)
    return shards, prios


def sample(shards, batch, rng):
    totals = np.array([s.total for s in shards])
    shard, local = allocate_targets(totals, batch, rng)
    out = np.empty(batch, dtype=np.int64)
    offsets = np.cumsum([0] + [s.capacity for s in shards])
    for k, s in enumerate(shards):
        m = shard == k
        if m.any():
            out[m] = s.sum.prefix_search(local[m]) + offsets[k]
    return out, shard


def test_stratified_across_unequal_shards_is_exactly_the_single_buffer_draw() -> None:
    rng = np.random.default_rng(0)
    shards, prios = make_shards([3, 50, 7, 1, 20], rng)
    single = SumTree(81)
    single.update(np.arange(81), np.concatenate(prios) ** 0.6)
    # the same uniforms through the shards and through one tree over every row
    got, _ = sample(shards, 256, np.random.default_rng(5))
    u = (np.arange(256) + np.random.default_rng(5).random(256)) * (single.total / 256)
    np.testing.assert_array_equal(got, single.prefix_search(u))
    # shard ids come out in non-decreasing order (contiguous runs per shard)
    _, shard = sample(shards, 64, rng)
    assert (np.diff(shard) >= 0).all()


def test_prioritized_chi_square_goodness_of_fit() -> None:
    rng = np.random.default_rng(1)
    shards, prios = make_shards([5, 17, 2, 9], rng)
    p = np.concatenate(prios) ** 0.6
    counts = np.zeros(len(p))
    for _ in range(400):
        idx, _ = sample(shards, 100, rng)
        counts += np.bincount(idx, minlength=len(p))
    expected = p / p.sum() * counts.sum()
    stat = sps.chisquare(counts, expected)
    assert stat.pvalue > 1e-3, stat


def test_uniform_is_alpha_zero() -> None:
    rng = np.random.default_rng(2)
    shards, _ = make_shards([4, 11, 6], rng, alpha=0.0)
    counts = np.zeros(21)
    for _ in range(300):
        idx, _ = sample(shards, 70, rng)
        counts += np.bincount(idx, minlength=21)
    assert sps.chisquare(counts).pvalue > 1e-3


def test_importance_weights_exact() -> None:
    # two shards: masses (1, 3) and (4,), N = 3, total 8, min 1
    st_ = [ShardStats(total=4.0, count=2, min=1.0), ShardStats(total=4.0, count=1, min=4.0)]
    w = importance_weights(np.array([1.0, 3.0, 4.0]), st_, beta=0.5)
    raw = (3 * np.array([1, 3, 4]) / 8.0) ** -0.5
    np.testing.assert_allclose(w, raw / ((3 * 1 / 8.0) ** -0.5), rtol=1e-6)
    assert w[0] == pytest.approx(1.0)  # the minimum-priority row has the max weight
    np.testing.assert_array_equal(importance_weights(np.array([1.0, 2.0]), st_, 0.0), [1, 1])


def test_beta_annealing() -> None:
    assert beta_at(0, 0.4, 1.0, 100) == pytest.approx(0.4)
    assert beta_at(50, 0.4, 1.0, 100) == pytest.approx(0.7)
    assert beta_at(500, 0.4, 1.0, 100) == pytest.approx(1.0)
    assert beta_at(500, 0.4, 1.0, 0) == pytest.approx(0.4)


def test_allocate_refuses_empty() -> None:
    with pytest.raises(ValueError, match="empty"):
        allocate_targets(np.zeros(3), 4, np.random.default_rng(0))
    # an empty shard in the middle never receives a target
    shard, local = allocate_targets(np.array([1.0, 0.0, 1.0]), 1000, np.random.default_rng(0))
    assert 1 not in shard and (local >= 0).all() and (local < 1.0).all()


def ref_starts(held, length, ends, stream, cross):
    out = []
    for s in range(len(held) - length + 1):
        w = slice(s, s + length)
        if not held[w].all():
            continue
        if stream is not None and len(set(stream[w])) > 1:
            continue
        if ends is not None and not cross and ends[s:s + length - 1].any():
            continue
        out.append(s)
    return out


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 40), length=st.integers(1, 6), cross=st.booleans(), data=st.data())
def test_sequence_windows_match_reference(n, length, cross, data) -> None:
    held = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    ends = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    stream = np.array(data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    got = valid_sequence_starts(held, length, episode_end=ends, stream=stream,
                                cross_episode=cross)
    assert got.tolist() == ref_starts(held, length, ends, stream, cross)


def test_sequence_never_crosses_episode_end() -> None:
    ends = np.array([0, 0, 1, 0, 0, 0, 1, 0], dtype=bool)
    got = valid_sequence_starts(np.ones(8, bool), 3, episode_end=ends, stream=None)
    assert got.tolist() == [0, 3, 4]  # windows may end on an episode end, not span it
    got = valid_sequence_starts(np.ones(8, bool), 3, episode_end=ends, stream=None,
                                cross_episode=True)
    assert got.tolist() == list(range(6))


def test_nstep_returns_hand_computed() -> None:
    g = 0.9
    r = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [5.0, 1.0, 1.0]])
    term = np.array([[0, 0, 0], [0, 1, 0], [0, 0, 0], [1, 0, 0]], dtype=bool)
    trunc = np.array([[0, 0, 0], [0, 0, 0], [0, 1, 0], [0, 0, 0]], dtype=bool)
    ret, disc, last = nstep_returns(r, term, g, trunc)
    np.testing.assert_allclose(ret, [1 + 0.9 * 2 + 0.81 * 3, 1 + 0.9 * 2, 1 + 0.9 * 2, 5.0],
                               rtol=1e-6)
    np.testing.assert_allclose(disc, [0.9 ** 3, 0.0, 0.9 ** 2, 0.0], rtol=1e-6)
    assert last.tolist() == [2, 1, 1, 0]


def test_nstep_transform_picks_bootstrap_observation() -> None:
    b = {"obs": np.arange(6.0).reshape(2, 3, 1), "next_obs": np.arange(6.0).reshape(2, 3, 1) + 1,
         "action": np.array([[7, 8, 9], [1, 2, 3]]), "reward": np.ones((2, 3)),
         "terminated": np.array([[0, 0, 0], [0, 1, 0]], dtype=bool)}
    out = nstep_transform(b, gamma=0.5, truncated=None)
    np.testing.assert_array_equal(out["obs"][:, 0], [0, 3])
    np.testing.assert_array_equal(out["action"], [7, 1])
    np.testing.assert_array_equal(out["next_obs"][:, 0], [3, 5])  # after step 2; after step 1
    np.testing.assert_allclose(out["return"], [1.75, 1.5])
    np.testing.assert_allclose(out["discount"], [0.125, 0.0])


@settings(max_examples=100, deadline=None)
@given(mass=st.lists(st.floats(1e-12, 1e12), min_size=1, max_size=16),
       published_min=st.floats(1e-12, 1e12), beta=st.floats(0.01, 3.0))
def test_weights_of_rows_lighter_than_the_published_minimum_stay_at_most_one(
        mass: list[float], published_min: float, beta: float) -> None:
    # the masses are read after the statistics: a priority lowered in between (another
    # learner's update) makes a drawn row lighter than the published minimum. Before,
    # its weight was (pmin / p) ** beta > 1 (174 measured with two learners); now the
    # lightest row known (published or drawn) weighs 1, as the formula says
    p = np.asarray(mass)
    stats = [ShardStats(total=float(p.sum()) + published_min, count=len(p) + 1,
                        min=published_min)]
    lightest = min(published_min, float(p.min()))
    want = (p / lightest) ** -beta
    for compiled in (True, False):
        w = importance_weights(p, stats, beta, compiled=compiled)
        assert w.dtype == np.float32 and (w >= 0).all() and (w <= 1).all()
        np.testing.assert_allclose(w, want, rtol=1e-5, atol=1e-30)  # float32 may underflow


@settings(max_examples=30, deadline=None, derandomize=True)  # chi-square: fixed draws
@given(units=st.lists(st.lists(st.integers(0, 8), min_size=1, max_size=6), min_size=1,
                      max_size=4).filter(lambda s: sum(map(sum, s)) > 0),
       seed=st.integers(0, 2**32 - 1))
def test_subnormal_masses_are_drawn_in_proportion(units: list[list[int]], seed: int) -> None:
    # masses of a few units of float64's smallest subnormal (priorities ~1e-323 at
    # alpha 1): the stratum width grand / batch underflowed, to 0 at worst, and every
    # target fell on the first row; now each unit of mass gets its share, as in a
    # single buffer (compiled and numpy alike)
    tiny = 5e-324
    shards = []
    for u in units:
        ix = PriorityIndex(len(u), alpha=1.0)
        ix.insert(np.arange(len(u)), np.arange(1, len(u) + 1), np.asarray(u) * tiny)
        shards.append(ix)
    want = np.concatenate([np.asarray(u, float) for u in units])
    for compiled in (True, False):
        rng = np.random.default_rng(seed)
        counts = np.zeros(len(want))
        offsets = np.cumsum([0] + [len(u) for u in units])
        for _ in range(40):
            totals = np.array([s.total for s in shards])
            shard, local = allocate_targets(totals, 64, rng, compiled=compiled)
            assert (local < totals[shard]).all()
            for k, s in enumerate(shards):
                m = shard == k
                if m.any():
                    counts += np.bincount(s.sum.prefix_search(local[m]) + offsets[k],
                                          minlength=len(want))
        assert counts[want == 0].sum() == 0
        live = want > 0
        if live.sum() > 1:
            expected = want[live] / want[live].sum() * counts.sum()
            assert sps.chisquare(counts[live], expected).pvalue > 1e-4, (counts, want)


@settings(max_examples=200, deadline=None)
@given(mass=st.lists(st.one_of(st.just(0.0), st.floats(1e-300, 1e300)), max_size=16),
       published=st.lists(st.tuples(st.floats(1e-300, 1e300), st.integers(0, 3)), max_size=3),
       beta=st.floats(0.01, 3.0))
def test_compiled_weights_take_the_reference_steps(mass: list[float],
                                                   published: list[tuple[float, int]],
                                                   beta: float) -> None:
    # the compiled loop finds the lightest drawn row, the weights and their floor itself
    # (one call a batch): the same as the numpy reference, rows of mass 0 included
    p = np.asarray(mass, dtype=np.float64)
    stats = [ShardStats(total=1.0, count=c, min=m) for m, c in published]
    want = importance_weights(p, stats, beta, compiled=False)
    got = importance_weights(p, stats, beta, compiled=True)
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
