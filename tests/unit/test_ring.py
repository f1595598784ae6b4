"""Ring arithmetic, and the shard protocol on one rank (COMM_SELF windows)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mpi4py import MPI

from conduit_hpc import SpecError
from conduit_hpc.config import FieldConfig
from conduit_hpc.plane.buffer import OwnedShard
from conduit_hpc.spec import Spec
from conduit_hpc.storage import PriorityIndex, ShardLayout, ShardRing, ring_segments
from conduit_hpc.testing import CHECKED_SPEC, checked_batch, row_consistent
from conduit_hpc.transport.rma import RmaWindow

SPEC = Spec.from_config({k: FieldConfig(**v) for k, v in CHECKED_SPEC.items()})


@given(first=st.integers(0, 10_000), cap=st.integers(1, 50), data=st.data())
def test_ring_segments_cover_exactly(first: int, cap: int, data) -> None:
    n = data.draw(st.integers(0, cap))
    segs = ring_segments(first, n, cap)
    assert len(segs) <= 2
    slots = np.concatenate([np.arange(s.slot, s.slot + s.count) for s in segs] or [[]])
    srcs = np.concatenate([np.arange(s.src, s.src + s.count) for s in segs] or [[]])
    np.testing.assert_array_equal(slots, (first + np.arange(n)) % cap)
    np.testing.assert_array_equal(srcs, np.arange(n))


def test_ring_segments_refuse() -> None:
    with pytest.raises(ValueError, match="n must be"):
        ring_segments(0, 5, 4)
    with pytest.raises(ValueError, match="first_seq"):
        ring_segments(-1, 1, 4)


def test_layout_is_aligned_and_disjoint() -> None:
    lay = ShardLayout(SPEC, 10)
    offs = sorted([0, lay.stamps_offset, lay.priority_offset, *lay.column_offsets.values()])
    assert all(o % 64 == 0 for o in offs)
    ends = [lay.stamps_offset + 80, lay.priority_offset + 80] + [
        lay.column(f.name) + 10 * f.row_bytes for f in SPEC]
    assert max(ends) <= lay.nbytes


@pytest.fixture(params=["direct", "rma"])
def shard(request):
    lay = ShardLayout(SPEC, 8)
    win = RmaWindow(MPI.COMM_SELF, lay.nbytes, node_comm=MPI.COMM_SELF,
                    shared=request.param == "direct")
    ring = ShardRing(win, 0, 0, lay, timeout_s=2.0)
    owner_ring = ShardRing(win, 0, 0, lay, timeout_s=2.0)
    owner_ring.views = lay.views(win.own_segment(), 0)
    owned = OwnedShard(0, owner_ring, PriorityIndex(8, alpha=1.0))
    yield ring, owned
    win.close()


def test_write_commit_read_and_fifo_eviction(shard) -> None:
    ring, owned = shard
    assert ring.direct == (ring.views is not None)
    first = ring.write(SPEC.validate(checked_batch(1, 0, 5)))
    assert first == 0
    assert owned.index.count == 0  # invisible until the owner commits
    assert owned.poll() == 5
    assert owned.index.count == 5
    ring.write(SPEC.validate(checked_batch(1, 5, 6)), np.arange(6, dtype=float) + 1)
    owned.poll()
    seqs, cols, prio = owned.ring.read_committed()
    np.testing.assert_array_equal(seqs, np.arange(3, 11))  # newest 8 of 11
    np.testing.assert_array_equal(cols["wseq"], np.arange(3, 11))
    assert row_consistent(cols).all()
    np.testing.assert_array_equal(prio[-6:], np.arange(1, 7.0))
    assert owned.index.count == 8
    # gather by slot, and the intact-row rule against the reserve cursor
    slots = np.array([3 % 8, 10 % 8])
    out, cursor = ring.gather(slots)
    np.testing.assert_array_equal(out["wseq"], [3, 10])
    assert cursor == 11
    gens = ring.stamps_of(slots)
    np.testing.assert_array_equal(gens, [4, 11])


def test_oversized_batch_refused_and_nothing_written(shard) -> None:
    ring, owned = shard
    with pytest.raises(SpecError, match="exceeds the shard capacity"):
        ring.write(SPEC.validate(checked_batch(1, 0, 9)))
    assert ring.reserve_cursor() == 0
    owned.poll()
    assert owned.index.count == 0


def test_lapped_writer_waits_for_commit_and_times_out(shard) -> None:
    ring, _owned = shard
    ring.write(SPEC.validate(checked_batch(1, 0, 8)))
    # the owner has not committed seqs 0..7: a writer lapping them must wait, then time out
    from conduit_hpc import DataPlaneTimeout

    ring.timeout_s = 0.2
    with pytest.raises(DataPlaneTimeout, match="commit"):
        ring.write(SPEC.validate(checked_batch(1, 8, 1)))


def test_rows_being_overwritten_are_hidden_from_sampling(shard) -> None:
    ring, owned = shard
    ring.write(SPEC.validate(checked_batch(1, 0, 8)))
    owned.poll()
    # a writer reserves seqs 8..9 (overwriting slots 0 and 1) but has not committed yet
    ring.transport.fetch_add(0, 0, 2)
    owned.poll()
    assert owned.index.gens[0] == 0 and owned.index.gens[1] == 0
    assert owned.index.count == 6


def test_a_tree_read_mid_rewrite_never_indexes_past_the_capacity() -> None:
    # capacity 5 -> 8 leaves, 3 of them padding; a reader that loads the tree while the
    # owner rewrites it can see a node with mass whose children have none (the seqlock
    # makes it retry) - the search must not fail on the padding slot it is led to
    lay = ShardLayout(SPEC, 5)
    win = RmaWindow(MPI.COMM_SELF, lay.nbytes, node_comm=MPI.COMM_SELF, shared=True)
    try:
        ring = ShardRing(win, 0, 0, lay, timeout_s=2.0)
        owner_ring = ShardRing(win, 0, 0, lay, timeout_s=2.0)
        owner_ring.views = lay.views(win.own_segment(), 0)
        v = owner_ring.views
        owned = OwnedShard(0, owner_ring, PriorityIndex(5, alpha=1.0, sum_buffer=v.tree,
                                                        gens_buffer=v.gens))
        ring.write(SPEC.validate(checked_batch(1, 0, 5)))
        owned.poll()
        assert ring.views is not None and len(ring.views.tree) == 16
        slots, gens, mass, held, total, _ = ring.search(np.array([0.5, 4.5]))
        assert held == 5 and total == 5.0
        assert ((slots >= 0) & (slots < 5)).all() and (mass == 1.0).all()
        tree = ring.views.tree
        tree[2] = tree[6] = tree[7] = 0.0  # torn: the root still holds mass, no leaf does
        slots, gens, mass, *_ = ring.search(np.array([0.5, 4.5]))
        # a slot inside the capacity (small trees are searched at their leaves' level,
        # which still holds mass here) or -1 (nothing drawn), never a padding slot
        drawn = slots >= 0
        assert (slots < 5).all() and (slots >= -1).all()
        assert (gens[~drawn] == 0).all() and (mass[~drawn] == 0).all()
    finally:
        win.close()


@given(gens=st.lists(st.integers(-3, 40), max_size=12), cursor=st.integers(0, 60),
       per_row=st.booleans(), data=st.data())
def test_all_intact_is_intact_on_every_row(gens, cursor, per_row, data) -> None:
    """ShardRing.all_intact (the delivery's one-reduction check) agrees with the ring's
    rule row by row, for one cursor and for one cursor per row (frame stacks)."""
    lay = ShardLayout(SPEC, 8)
    win = RmaWindow(MPI.COMM_SELF, lay.nbytes, node_comm=MPI.COMM_SELF)
    try:
        ring = ShardRing(win, 0, 0, lay, timeout_s=2.0)
        g = np.array(gens, dtype=np.int64)
        cur = (np.array(data.draw(st.lists(st.integers(0, 60), min_size=len(g),
                                            max_size=len(g))), dtype=np.int64)
               if per_row else cursor)
        assert ring.all_intact(g, cur) == bool(ring.intact(g, cur).all())
        # a column of a batch's indices (strided), as the delivery passes it: the
        # compiled pass for a cursor per row reads it in place
        col = np.stack([g, g, g], axis=1)[:, 2]
        assert ring.all_intact(col, cur) == bool(ring.intact(g, cur).all())
    finally:
        win.close()


def test_a_reader_of_an_owner_stuck_mid_write_times_out_naming_it(shard) -> None:
    # the seqlock's readers retry while the owner writes (odd stats version) and give up
    # after timeout_s, naming what never settled; then, the write done, they read again
    from conduit_hpc import DataPlaneTimeout
    from conduit_hpc.storage.layout import H_STATS_VERSION

    ring, owned = shard
    ring.write(SPEC.validate(checked_batch(1, 0, 4)))
    owned.poll()
    header = owned.ring.views.header
    header[H_STATS_VERSION] += 1  # mid-write, for good
    ring.timeout_s = 0.2
    with pytest.raises(DataPlaneTimeout, match="shard stats on rank 0 to settle"):
        ring.read_header()
    if ring.views is not None:  # the direct search (RMA readers ask the owner)
        with pytest.raises(DataPlaneTimeout, match="tree of the shard on rank 0 to settle"):
            ring.search(np.array([0.5]))
    header[H_STATS_VERSION] += 1  # the write ends
    assert int(ring.read_header()[H_STATS_VERSION]) % 2 == 0
    if ring.views is not None:  # (this fixture's index is not the shared tree: -1)
        slots, *_ = ring.search(np.array([0.5]))
        assert slots.shape == (1,) and -1 <= int(slots[0]) < 4
