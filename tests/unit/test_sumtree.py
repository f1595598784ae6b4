from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_hpc.storage import MinTree, PriorityIndex, SumTree, index_kernels, tree_kernels
from conduit_hpc.storage.sumtree import prefix_search


class RefTree:
    """The obvious model: a list of leaves."""

    def __init__(self, n: int) -> None:
        self.v = np.zeros(n)

    def prefix(self, t: float) -> int:
        c = np.cumsum(self.v)
        return int(np.searchsorted(c, t, side="right"))


ops = st.lists(st.tuples(st.integers(0, 36), st.floats(0, 100, allow_nan=False)),
               min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(cap=st.integers(1, 37), updates=ops, fracs=st.lists(st.floats(0, 1), max_size=20))
def test_sum_tree_matches_reference(cap: int, updates, fracs) -> None:
    tree, ref, mt = SumTree(cap), RefTree(cap), MinTree(cap)
    idx = np.array([i % cap for i, _ in updates])
    vals = np.array([v for _, v in updates])
    # one vectorised update with duplicates (last wins) ...
    tree.update(idx, vals)
    mt.update(idx, vals)
    for i, v in zip(idx, vals, strict=True):
        ref.v[i] = v
    assert tree.total == pytest.approx(ref.v.sum(), rel=1e-12, abs=1e-9)
    assert mt.min == ref.v[np.unique(idx)].min()
    np.testing.assert_array_equal(tree.leaves, ref.v)
    if tree.total > 0:
        targets = np.array(fracs) * tree.total
        got = tree.prefix_search(targets)
        assert (ref.v[got] > 0).all()  # never an empty leaf
        cum = np.cumsum(ref.v)
        for t, g in zip(targets, got, strict=True):
            lo = cum[g] - ref.v[g]
            # the leaf's interval holds the target (up to float rounding)
            assert lo - 1e-9 * tree.total <= t <= cum[g] + 1e-9 * tree.total


@settings(max_examples=100, deadline=None)
@given(cap=st.integers(1, 20), seq=st.lists(ops, min_size=1, max_size=5))
def test_repeated_updates_do_not_drift(cap: int, seq) -> None:
    tree, ref = SumTree(cap), np.zeros(cap)
    for updates in seq:
        idx = np.array([i % cap for i, _ in updates])
        vals = np.array([v for _, v in updates])
        tree.update(idx, vals)
        for i, v in zip(idx, vals, strict=True):
            ref[i] = v
        fresh = SumTree(cap)
        fresh.load(ref)
        assert tree.total == fresh.total  # recomputed from children: bit-identical


def test_prefix_search_distribution() -> None:
    tree = SumTree(5)
    tree.update(np.arange(5), np.array([1.0, 0.0, 2.0, 0.0, 1.0]))
    u = (np.arange(4000) + 0.5) / 4000 * tree.total
    counts = np.bincount(tree.prefix_search(u), minlength=5)
    np.testing.assert_array_equal(counts, [1000, 0, 2000, 0, 1000])


def test_errors() -> None:
    t = SumTree(4)
    with pytest.raises(ValueError, match="total is 0"):
        t.prefix_search(np.array([0.1]))
    with pytest.raises(ValueError, match="finite and >= 0"):
        t.update(np.array([0]), np.array([-1.0]))
    with pytest.raises(IndexError, match="outside"):
        t.update(np.array([4]), np.array([1.0]))


def test_priority_index_generations() -> None:
    ix = PriorityIndex(4, alpha=1.0, initial_priority=1.0)
    ix.insert(np.array([0, 1]), np.array([1, 2]), np.array([np.nan, 3.0]))
    assert ix.max_priority == 3.0
    assert ix.priority[0] == 1.0  # inserted before 3.0 was seen
    ix.insert(np.array([2]), np.array([3]), np.array([np.nan]))
    assert ix.priority[2] == 3.0  # new rows enter at the running max
    assert ix.total == 7.0
    # slot 0 is overwritten by seq 4 (gen 5): an update for gen 1 is dropped
    ix.insert(np.array([0]), np.array([5]), np.array([0.5]))
    dropped = ix.update(np.array([0, 1]), np.array([1, 2]), np.array([9.0, 2.0]))
    assert dropped == 1 and ix.priority[0] == 0.5 and ix.priority[1] == 2.0
    assert ix.dropped_updates == 1
    with pytest.raises(ValueError, match=r"priorities\[0\]"):
        ix.update(np.array([1]), np.array([2]), np.array([np.nan]))
    with pytest.raises(ValueError, match="finite"):
        ix.update(np.array([1]), np.array([2]), np.array([-1.0]))
    ix.invalidate(np.array([1]))
    assert ix.count == 2 and ix.total == pytest.approx(3.5)


def test_priority_exponent() -> None:
    ix = PriorityIndex(3, alpha=0.5)
    ix.insert(np.arange(3), np.arange(1, 4), np.array([4.0, 9.0, 0.0]))
    assert ix.total == pytest.approx(5.0)
    assert ix.min.min == 2.0  # rows of zero mass cannot be drawn: they set no weight


# -- the compiled kernels (storage/tree_kernels.py) against the numpy reference ------------



def test_the_compiled_kernels_are_there() -> None:
    # numba is a dependency: a silent fallback to numpy would hide a 5x slowdown
    assert tree_kernels.available()


@settings(max_examples=80, deadline=None)
@given(cap=st.integers(1, 9000), seed=st.integers(0, 2**32 - 1),
        rounds=st.integers(1, 6), zeros=st.floats(0, 0.9))
def test_compiled_updates_and_search_equal_numpy_bit_for_bit(cap, seed, rounds, zeros) -> None:
    rng = np.random.default_rng(seed)
    for cls in (SumTree, MinTree):
        fast, ref = cls(cap), cls(cap)
        ref.compiled = False
        for _ in range(rounds):  # repeats within an update: the later one wins
            idx = rng.integers(0, cap, int(rng.integers(1, 300)))
            vals = rng.random(len(idx)) * 10
            vals[rng.random(len(idx)) < zeros] = 0.0
            fast.update(idx, vals)
            ref.update(idx, vals)
            assert np.array_equal(fast._tree, ref._tree)
    s = SumTree(cap)
    s.update(np.arange(cap), np.where(rng.random(cap) < zeros, 0.0, rng.random(cap)))
    if s.total > 0:
        # leaf boundaries too (a target equal to a left child's mass: ``t >= lv``)
        edges = np.cumsum(s._tree[len(s._tree) // 2:][:cap])[rng.integers(0, cap, 50)]
        targets = np.concatenate([rng.random(200) * s.total, edges,
                                  [0.0, s.total, -1.0, 2 * s.total]])
        for level in (1, 2, 64, 4096):  # the compiled default descends from the root (1)
            assert np.array_equal(prefix_search(s._tree, targets, level=level),
                                  prefix_search(s._tree, targets, compiled=False, level=level))
        # the fused draw: the search, then each leaf's generation and mass
        gens = rng.integers(1, 1000, cap)
        found = tree_kernels.draw(s._tree, gens, cap, targets, 1)
        assert found is not None
        slots = prefix_search(s._tree, targets, compiled=False, level=1)
        # a target at or past the total is drawn again (slot -1), never clipped onto
        # the last leaf with mass (tests/unit/test_stale_targets.py)
        past = targets >= s.total
        assert np.array_equal(found[0], np.where(past, -1, slots))
        assert np.array_equal(found[1], np.where(past, 0, gens[slots]))
        assert np.array_equal(found[2], np.where(past, 0.0,
                                                 s._tree[slots + len(s._tree) // 2]))


@settings(max_examples=60, deadline=None)
@given(cap=st.integers(1, 3000), seed=st.integers(0, 2**32 - 1), alpha=st.sampled_from(
    [0.0, 0.6, 1.0, 1.7]), rounds=st.integers(1, 5))
def test_compiled_index_update_equals_numpy_bit_for_bit(cap, seed, alpha, rounds) -> None:
    """PriorityIndex.update in one compiled call against its numpy path: live, hidden,
    dropped (overwritten, never drawn) and repeated slots; zero priorities."""
    rng = np.random.default_rng(seed)
    fast, ref = PriorityIndex(cap, alpha=alpha), PriorityIndex(cap, alpha=alpha)
    for ix in (fast, ref):
        ix.sum.compiled = ix.min.compiled = ix is fast
    gens = np.arange(1, cap + 1)
    p0 = rng.random(cap) * 3
    for ix in (fast, ref):
        ix.insert(np.arange(cap), gens, p0)
        ix.hide(np.flatnonzero(np.random.default_rng(seed + 1).random(cap) < 0.2))
    for _ in range(rounds):
        n = int(rng.integers(1, 400))
        slots = rng.integers(0, cap, n)
        g = gens[slots].copy()
        g[rng.random(n) < 0.2] += cap  # overwritten since drawn: dropped
        g[rng.random(n) < 0.05] = 0  # never drawn: dropped
        pr = rng.random(n) * 5
        pr[rng.random(n) < 0.1] = 0.0
        assert fast.update(slots, g, pr) == ref.update(slots, g, pr)
        for a, b in ((fast.sum.nodes, ref.sum.nodes), (fast.min.nodes, ref.min.nodes),
                     (fast.priority, ref.priority), (fast.gens, ref.gens),
                     (fast.hidden_gens, ref.hidden_gens), (fast._state, ref._state)):
            assert np.array_equal(a, b)


@settings(max_examples=60, deadline=None)
@given(cap=st.integers(1, 3000), seed=st.integers(0, 2**32 - 1), alpha=st.sampled_from(
    [0.0, 0.6, 1.0, 1.7]), rounds=st.integers(1, 6))
def test_compiled_owner_passes_equal_numpy_bit_for_bit(cap, seed, alpha, rounds) -> None:
    """The owner's changes of an index (insert with and without priorities, laps over
    held rows, hide, unhide, invalidate: PriorityIndex._set in one compiled call) against
    the numpy path, every array of the index after every step; repeated slots too."""
    rng = np.random.default_rng(seed)
    fast, ref = PriorityIndex(cap, alpha=alpha), PriorityIndex(cap, alpha=alpha)
    for ix in (fast, ref):
        ix.sum.compiled = ix.min.compiled = ix is fast
    seq = 0
    for _ in range(rounds):
        n = int(rng.integers(1, cap + 1))
        seqs = np.arange(seq, seq + n)
        seq += n
        slots = seqs % cap
        pr = np.full(n, np.nan) if rng.random() < 0.5 else rng.random(n) * 4
        pr[rng.random(n) < 0.1] = np.nan  # some rows given no priority: the maximum
        pr[rng.random(n) < 0.05] = 0.0
        some = rng.integers(0, cap, int(rng.integers(0, 50)))  # repeats allowed
        band = rng.integers(0, cap, int(rng.integers(0, 50)))
        steps = [lambda ix: ix.insert(slots, seqs + 1, pr),  # noqa: B023
                 # the guard band's hide: only rows that still hold the generation given
                 lambda ix: ix.hide(band, np.where(rng_b.random(len(band)) < 0.7,  # noqa: B023
                                                   ix.gens[band], ix.gens[band] + 1)),  # noqa: B023
                 lambda ix: ix.hide(some),  # noqa: B023
                 lambda ix: ix.unhide(some, ix.hidden_gens[some]),  # noqa: B023
                 lambda ix: ix.invalidate(some[: len(some) // 3])]  # noqa: B023
        for step in steps:
            rng_b = np.random.default_rng(seed + seq)  # the same draws for both
            got = step(fast)
            rng_b = np.random.default_rng(seed + seq)
            assert got == step(ref)
            for a, b in ((fast.sum.nodes, ref.sum.nodes), (fast.min.nodes, ref.min.nodes),
                         (fast.priority, ref.priority), (fast.gens, ref.gens),
                         (fast.hidden_gens, ref.hidden_gens), (fast._state, ref._state)):
                assert np.array_equal(a, b)
            assert fast.count == ref.count
    # and a pass with every priority given equals one without (the running maximum)
    m = fast.max_priority
    a, b = PriorityIndex(cap, alpha=alpha), PriorityIndex(cap, alpha=alpha)
    a.max_priority = b.max_priority = m
    a.insert(np.arange(cap), np.arange(1, cap + 1), np.full(cap, np.nan))
    b.insert(np.arange(cap), np.arange(1, cap + 1), np.full(cap, m))
    assert np.array_equal(a.sum.nodes, b.sum.nodes) and np.array_equal(a.min.nodes, b.min.nodes)


@settings(max_examples=60, deadline=None)
@given(cap=st.integers(1, 500), n=st.integers(0, 300), seed=st.integers(0, 2**32 - 1))
def test_compiled_marks_equal_numpy(cap, n, seed) -> None:
    """index_kernels.mark against numpy: -1 (nothing drawn) and slots outside the marks
    skipped, repeats keep their largest generation."""
    rng = np.random.default_rng(seed)
    marks = rng.integers(0, 50, cap)
    slots = rng.integers(-1, cap + 2, n)
    gens = rng.integers(0, 100, n)
    ref = marks.copy()
    ok = (slots >= 0) & (slots < cap)
    np.maximum.at(ref, slots[ok], gens[ok])
    assert index_kernels.mark(marks, slots, gens)
    assert np.array_equal(marks, ref)


@settings(max_examples=80, deadline=None)
@given(totals=st.lists(st.sampled_from([0.0, 1e-9, 0.5, 1.0, 3.25, 1e6]), min_size=1,
                       max_size=20), batch=st.integers(1, 600), seed=st.integers(0, 2**32 - 1))
def test_compiled_target_allocation_equals_numpy(totals, batch, seed) -> None:
    from conduit_hpc.sampling.stratified import allocate_targets

    t = np.array(totals)
    if not t.sum() > 0:
        return
    a = allocate_targets(t, batch, np.random.default_rng(seed))
    b = allocate_targets(t, batch, np.random.default_rng(seed), compiled=False)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert (t[a[0]] > 0).all()


def test_an_update_whose_scaled_priority_overflows_is_refused_whole() -> None:
    # priorities stop at 1e30 (check_priorities); 1e30 ** 12 overflows (config stops
    # priority_exponent at 10: an index built by hand)
    ix = PriorityIndex(8, alpha=12.0)
    ix.insert(np.arange(8), np.arange(1, 9), np.ones(8))
    before = ix.sum.nodes.copy()
    with pytest.raises(ValueError, match="overflows"):
        ix.update(np.array([0, 1]), np.array([1, 2]), np.array([2.0, 1e30]))
    assert np.array_equal(ix.sum.nodes, before) and ix.priority[0] == 1.0


@settings(max_examples=80, deadline=None)
@given(mass=st.lists(st.one_of(st.floats(0, 1e30), st.sampled_from([0.0, 1e-300, 5e-324])),
                     min_size=0, max_size=300),
       pmin=st.one_of(st.floats(1e-300, 1e30), st.just(float("inf"))),
       beta=st.floats(0.0, 1.0))
def test_compiled_importance_weights_equal_numpy(mass, pmin, beta) -> None:
    """importance_weights' compiled loop against its numpy path (the reference), over
    masses down to 0 and the smallest subnormal and an empty shard set (pmin inf): the
    same float32 values (to an ulp of float32: numpy's vector log/exp and libm's may
    differ in a float64's last bit), the same infinities and NaNs."""
    from conduit_hpc.sampling.stratified import ShardStats, importance_weights

    stats = [ShardStats(1.0, 1, pmin)] if np.isfinite(pmin) else []
    p = np.array(mass, dtype=np.float64)
    a = importance_weights(p, stats, beta)
    b = importance_weights(p, stats, beta, compiled=False)
    assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
    np.testing.assert_array_max_ulp(a, b, maxulp=1)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(-2**62, 2**62), st.integers(-5, 5),
                               st.integers(0, 2**40)), min_size=1, max_size=300),
       dtype=st.sampled_from([np.int64, np.int32, np.uint16]))
def test_span_equals_min_and_max(rows, dtype) -> None:
    # one compiled pass where a.min() and a.max() were two reductions: contiguous and
    # strided (a column of a batch's indices) int64 arrays, other dtypes through numpy
    idx = np.array(rows, dtype=np.int64)
    frozen = idx.copy()
    frozen.flags.writeable = False  # a read-only array: the same answer
    for col in (idx[:, 0], idx[:, 1], idx[:, 2].copy(), idx[::-1, 1], frozen[:, 1]):
        a = col if dtype is np.int64 else (col % 30000).astype(dtype)
        lo, hi = tree_kernels.span(a)
        assert (lo, hi) == (int(a.min()), int(a.max()))
        assert type(lo) is int and type(hi) is int
