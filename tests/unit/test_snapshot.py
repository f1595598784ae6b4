"""Consistent cuts, restore into a fresh ring, and resharding (one rank, COMM_SELF)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from conduit_hpc.config import FieldConfig
from conduit_hpc.plane.buffer import OwnedShard
from conduit_hpc.spec import Spec
from conduit_hpc.storage import PriorityIndex, ShardLayout, ShardRing
from conduit_hpc.storage.snapshot import (
    SnapshotStaging,
    plan_reshard,
    reshard,
    restore_snapshot,
    take_snapshot,
)
from conduit_hpc.testing import CHECKED_SPEC, checked_batch, row_consistent
from conduit_hpc.transport.rma import RmaWindow

SPEC = Spec.from_config({k: FieldConfig(**v) for k, v in CHECKED_SPEC.items()})


class Shard:
    """A writer ring and the owner (ring + index) of one shard in a COMM_SELF window."""

    def __init__(self, cap: int, alpha: float = 0.6, shard_id: int = 0) -> None:
        lay = ShardLayout(SPEC, cap)
        self.win = RmaWindow(MPI.COMM_SELF, lay.nbytes, node_comm=MPI.COMM_SELF)
        self.writer = ShardRing(self.win, 0, 0, lay, timeout_s=2.0)
        owner = ShardRing(self.win, 0, 0, lay, timeout_s=2.0)
        self.owned = OwnedShard(shard_id, owner, PriorityIndex(cap, alpha=alpha))
        # writer and owner share this process: a write that waits for the free cursor
        # runs the owner's pass (a restore releases a full ring's slots only then)
        self.writer.on_wait = self.owned.poll

    def write(self, writer: int, first: int, n: int, prio: np.ndarray | None = None) -> None:
        self.writer.write(SPEC.validate(checked_batch(writer, first, n)), prio)
        self.owned.poll()

    def close(self) -> None:
        self.win.close()


@pytest.fixture
def shards():
    made: list[Shard] = []

    def make(cap: int, **kw) -> Shard:
        made.append(Shard(cap, **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def fill(s: Shard, batches: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    w = 0
    for _ in range(batches):
        n = int(rng.integers(1, 6))
        s.write(1, w, n, rng.uniform(0.1, 5.0, n))
        w += n


def test_cut_holds_exactly_the_committed_rows_with_their_priorities(shards) -> None:
    s = shards(16)
    fill(s, 12)  # the ring laps
    idx = s.owned.index
    idx.update(np.array([3, 4]), s.owned.ring.stamps_of(np.array([3, 4])), np.array([9.0, 0.0]))
    snap = take_snapshot(0, s.owned.ring, idx)
    seqs, cols, init = s.owned.ring.read_committed()
    np.testing.assert_array_equal(snap.seqs, seqs)
    assert snap.commit == s.owned.committed and snap.rows == 16
    for k in cols:
        np.testing.assert_array_equal(snap.columns[k], cols[k])
    np.testing.assert_array_equal(snap.init_priority, init)
    np.testing.assert_array_equal(snap.priority, idx.priority[seqs % 16])
    assert snap.max_priority == idx.max_priority == 9.0
    snap.check(SPEC)


def test_cut_leaves_out_rows_a_writer_has_claimed(shards) -> None:
    s = shards(8)
    s.write(1, 0, 8)
    s.writer.transport.fetch_add(0, 0, 3)  # a writer holds seqs 8..10: slots 0..2 are torn
    snap = take_snapshot(0, s.owned.ring, s.owned.index)
    np.testing.assert_array_equal(snap.seqs, np.arange(3, 8))
    np.testing.assert_array_equal(snap.columns["wseq"], np.arange(3, 8))


def test_staging_is_reused_and_snapshot_views_it(shards) -> None:
    s = shards(8)
    s.write(1, 0, 5)
    st_ = SnapshotStaging(SPEC, 8)
    snap = take_snapshot(0, s.owned.ring, s.owned.index, st_)
    assert np.shares_memory(snap.columns["payload"], st_.columns["payload"])
    assert st_.nbytes >= snap.nbytes


def state(sh: Shard) -> dict:
    v = sh.owned.ring.views
    idx = sh.owned.index
    held = idx.gens > 0
    return {"header": v.header[:2].copy(), "stamps": np.where(held, v.stamps, 0),
            "cols": {k: c[held].copy() for k, c in v.columns.items()},
            "gens": idx.gens.copy(), "prio": idx.priority.copy(),
            "sum": idx.sum._tree.copy(), "min": idx.min._tree.copy(),
            "max": idx.max_priority, "counts": (idx.applied_updates, idx.dropped_updates)}


def assert_same(a: dict, b: dict) -> None:
    for k in ("header", "stamps", "gens", "prio", "sum", "min"):
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    for k in a["cols"]:
        np.testing.assert_array_equal(a["cols"][k], b["cols"][k], err_msg=k)
    assert a["max"] == b["max"] and a["counts"] == b["counts"]


def test_restore_is_identical_and_continues_identically(shards) -> None:
    a, b = shards(16), shards(16)
    fill(a, 15)
    slots = np.array([1, 5, 9])
    a.owned.index.update(slots, a.owned.ring.stamps_of(slots), np.array([7.0, 0.5, 3.0]))
    a.owned.index.update(np.array([2]), np.array([1]), np.array([1.0]))  # stale: dropped
    snap = take_snapshot(0, a.owned.ring, a.owned.index)
    restore_snapshot(b.owned.ring, b.owned.index, snap)
    b.owned.hidden_upto = snap.commit
    assert_same(state(a), state(b))
    # the same random numbers sample the same slots
    targets = np.random.default_rng(3).uniform(0, a.owned.index.total, 500)
    np.testing.assert_array_equal(a.owned.index.sum.prefix_search(targets),
                                  b.owned.index.sum.prefix_search(targets))
    # and both go on the same way: the ring laps over restored rows
    for sh in (a, b):
        sh.write(2, 0, 7)
        sh.write(2, 7, 9, np.full(9, 2.5))
    assert_same(state(a), state(b))
    seqs, cols, _ = b.owned.ring.read_committed()
    assert row_consistent(cols).all() and len(seqs) == 16


def test_restore_over_a_used_index_counts_and_hides_afresh(shards) -> None:
    """The held count the index keeps (not a scan per pass) and the hidden rows start
    over with a restore: a used index (count read, rows hidden) takes a snapshot of
    another shard."""
    a, b = shards(8), shards(8)
    a.write(1, 0, 3, np.array([1.0, 2.0, 3.0]))
    snap = take_snapshot(0, a.owned.ring, a.owned.index)
    b.write(2, 0, 8)
    ix = b.owned.index
    assert ix.count == 8
    ix.hide(np.array([5, 6]))
    assert ix.count == 6 and ix.hidden_gens[5] > 0
    restore_snapshot(b.owned.ring, ix, snap)
    assert ix.count == np.count_nonzero(ix.gens) == 3
    assert not ix.hidden_gens.any()
    with pytest.raises(IndexError, match="outside"):
        ix.invalidate(np.array([-1]))
    assert ix.count == 3


def test_restore_refuses_a_snapshot_that_does_not_fit(shards) -> None:
    a, b = shards(8), shards(9)
    a.write(1, 0, 4)
    snap = take_snapshot(0, a.owned.ring, a.owned.index)
    with pytest.raises(ValueError, match="does not fit"):
        restore_snapshot(b.owned.ring, b.owned.index, snap)
    snap.seqs = snap.seqs + 1
    with pytest.raises(ValueError, match="contiguous run"):
        snap.check(SPEC)


@pytest.mark.parametrize(("name", "value", "named"), [
    ("priority", 1e31, r"priority\[2\] must be finite, >= 0 and <= 1e\+30, got 1e\+31"),
    ("priority", np.nan, r"priority\[2\] .* got nan"),
    ("priority", -1.0, r"priority\[2\] .* got -1.0"),
    ("init_priority", np.inf, r"init_priority\[2\] .* \(or NaN: none given\), got inf"),
    ("init_priority", 2e30, r"init_priority\[2\]"),
    ("max_priority", np.inf, r"max_priority must be .* got inf"),
    ("max_priority", -0.5, r"max_priority must be .* got -0.5"),
])
def test_a_snapshot_with_priorities_no_index_may_hold_is_refused(shards, name, value,
                                                                  named) -> None:
    """A checkpoint's priorities (checksums recomputed by whoever changed them) pass
    the same bounds as a learner's update: a priority above 1e30 made the sum-tree's
    totals overflow after a restore, unchecked."""
    a = shards(8)
    a.write(1, 0, 4, np.array([1.0, 2.0, 3.0, 4.0]))
    snap = take_snapshot(0, a.owned.ring, a.owned.index)
    snap.check(SPEC)  # as cut: fine
    if name == "max_priority":
        snap.max_priority = value
    else:
        getattr(snap, name)[2] = value
    with pytest.raises(ValueError, match=named):
        snap.check(SPEC)


def test_a_snapshot_with_initial_priorities_not_given_is_taken(shards) -> None:
    a = shards(8)
    a.write(1, 0, 4)  # no priorities: NaN initial priorities, the running maximum
    snap = take_snapshot(0, a.owned.ring, a.owned.index)
    assert np.isnan(snap.init_priority).all()
    snap.check(SPEC)


@settings(max_examples=60, deadline=None)
@given(old=st.lists(st.integers(0, 60), min_size=1, max_size=5),
       caps=st.lists(st.integers(1, 70), min_size=1, max_size=6))
def test_plan_reshard_places_every_row_once(old: list[int], caps: list[int]) -> None:
    plan = plan_reshard(old, caps)
    total, room = sum(old), sum(caps)
    assert plan.dropped == max(0, total - room)
    seen = [(int(s), int(i)) for src, idx in plan.sources for s, i in zip(src, idx,
                                                                          strict=True)]
    assert len(seen) == len(set(seen)) == total - plan.dropped
    for s, i in seen:
        assert 0 <= i < old[s]
    for k, (src, idx) in enumerate(plan.sources):
        assert len(src) <= caps[k]
        # proportional share: within one row of capacity * rows / room
        assert abs(len(src) - (total - plan.dropped) * caps[k] / room) < 1 + 1e-9
        for s in set(src.tolist()):  # each old shard's rows keep their order
            assert (np.diff(idx[src == s]) > 0).all()
    if plan.dropped:  # what is dropped is the oldest of every old shard
        kept = {(s, i) for s, i in seen}
        for s, n in enumerate(old):
            missing = [i for i in range(n) if (s, i) not in kept]
            assert missing == list(range(len(missing)))


def test_plan_reshard_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="new_capacities"):
        plan_reshard([3], [])
    with pytest.raises(ValueError, match="old_rows"):
        plan_reshard([-1], [4])


def test_reshard_keeps_rows_priorities_and_the_sampling_distribution(shards) -> None:
    alpha = 0.6
    old = [shards(20, alpha=alpha, shard_id=i) for i in range(3)]
    for i, s in enumerate(old):
        fill(s, 4 + 3 * i, seed=i)
    snaps = [take_snapshot(i, s.owned.ring, s.owned.index) for i, s in enumerate(old)]

    def probabilities(ss: list[Shard]) -> dict[tuple[int, int], float]:
        """(old shard, wseq) -> probability under sampling proportional to
        priority ** alpha across shards (stratified by their totals)."""
        total = sum(s.owned.index.total for s in ss)
        out = {}
        for s in ss:
            seqs, cols, _ = s.owned.ring.read_committed()
            leaves = s.owned.index.sum.leaves
            for q, slot in zip(cols["wseq"], seqs % s.owned.ring.capacity, strict=True):
                out[(s.owned.shard_id, int(q))] = leaves[slot] / total
        return out

    before = probabilities(old)
    new, plan = reshard(snaps, [30, 31])
    assert plan.dropped == 0
    fresh = [shards(c, alpha=alpha, shard_id=k) for k, c in enumerate((30, 31))]
    for s, snap in zip(fresh, new, strict=True):
        restore_snapshot(s.owned.ring, s.owned.index, snap)
    total_after = sum(s.owned.index.total for s in fresh)
    after: dict[tuple[int, int], float] = {}
    for k, (src, idx) in enumerate(plan.sources):
        leaves = fresh[k].owned.index.sum.leaves
        for pos, (o, i) in enumerate(zip(src, idx, strict=True)):
            wseq = int(snaps[o].columns["wseq"][i])
            assert fresh[k].owned.ring.views.columns["wseq"][pos] == wseq
            assert fresh[k].owned.index.priority[pos] == snaps[o].priority[i]
            after[(int(o), wseq)] = leaves[pos] / total_after
    assert set(after) == set(before)
    for key, p in before.items():
        assert after[key] == pytest.approx(p, rel=1e-12)
    assert max(s.owned.index.max_priority for s in fresh) == max(s.max_priority for s in snaps)
