"""The shared priority index against a single-process reference: an owner's index and
learners' writers over the same buffers (as in a shard's shared memory), their
operations interleaved at random; and the index lock on a real window (COMM_SELF)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from conduit_hpc.config import FieldConfig
from conduit_hpc.errors import DataPlaneTimeout
from conduit_hpc.spec import Spec
from conduit_hpc.storage.layout import ShardLayout
from conduit_hpc.storage.priority import PriorityIndex, index_buffers
from conduit_hpc.storage.ring import ShardRing
from conduit_hpc.storage.shared_index import SharedIndexWriter, lock_index, unlock_index
from conduit_hpc.transport.rma import RmaWindow

CAP, ALPHA = 16, 0.6


class Reference:
    """Per slot: generation drawable, generation hidden, raw priority; counters."""

    def __init__(self) -> None:
        self.gen = np.zeros(CAP, np.int64)
        self.hidden = np.zeros(CAP, np.int64)
        self.raw = np.zeros(CAP)
        self.maxp, self.applied, self.dropped = 1.0, 0, 0

    def insert(self, slot: int, gen: int, p: float) -> None:
        self.gen[slot], self.hidden[slot] = gen, 0
        self.raw[slot] = p if not np.isnan(p) else self.maxp
        if not np.isnan(p):
            self.maxp = max(self.maxp, p)

    def hide(self, slot: int) -> None:
        if self.gen[slot]:
            self.hidden[slot], self.gen[slot] = self.gen[slot], 0

    def unhide(self, slot: int, gen: int) -> None:
        if gen and self.hidden[slot] == gen:
            self.gen[slot], self.hidden[slot] = gen, 0

    def update(self, slot: int, gen: int, p: float) -> None:
        if gen and (self.gen[slot] == gen or self.hidden[slot] == gen):
            self.raw[slot] = p
            self.maxp = max(self.maxp, p)
            self.applied += 1
        else:
            self.dropped += 1

    def mass(self) -> np.ndarray:
        return np.where((self.gen > 0) & (self.raw > 0), np.power(self.raw, ALPHA), 0.0)


def _window(cap: int = CAP) -> tuple[RmaWindow, ShardRing]:
    spec = Spec.from_config({"x": FieldConfig(dtype="float32")})
    layout = ShardLayout(spec, cap)
    win = RmaWindow(MPI.COMM_SELF, layout.nbytes, node_comm=MPI.COMM_SELF)
    return win, ShardRing(win, 0, 0, layout, timeout_s=0.3)


op = st.one_of(
    st.tuples(st.just("insert"), st.integers(0, CAP - 1), st.integers(1, 50),
              st.one_of(st.just(float("nan")), st.floats(0, 10))),
    st.tuples(st.just("hide"), st.integers(0, CAP - 1)),
    st.tuples(st.just("unhide"), st.integers(0, CAP - 1), st.integers(0, 50)),
    st.tuples(st.just("update"), st.integers(0, 1), st.lists(
        st.tuples(st.integers(0, CAP - 1), st.integers(0, 50), st.floats(0, 100)),
        min_size=1, max_size=6)))


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=40))
def test_owner_and_writers_share_one_index(ops) -> None:
    win, ring = _window()
    try:
        assert ring.views is not None
        owner = PriorityIndex(CAP, alpha=ALPHA, buffers=index_buffers(ring.views))
        writers = [SharedIndexWriter(ring, r, alpha=ALPHA) for r in (1, 2)]
        ref = Reference()
        for o in ops:
            if o[0] == "insert":
                _, slot, gen, p = o
                owner.insert(np.array([slot]), np.array([gen]), np.array([p]))
                ref.insert(slot, gen, p)
            elif o[0] == "hide":
                owner.hide(np.array([o[1]]))
                ref.hide(o[1])
            elif o[0] == "unhide":
                owner.unhide(np.array([o[1]]), np.array([o[2]]))
                ref.unhide(o[1], o[2])
            else:
                _, who, rows = o
                slots, gens, prios = (np.array(c) for c in zip(*rows, strict=True))
                writers[who].apply(slots, gens, prios.astype(np.float64))
                for s, g, p in rows:  # a later duplicate wins, as in the tree
                    ref.update(s, g, p)
            # the owner's view and each writer's see one index, equal to the reference
            for ix in (owner, *(w.index for w in writers)):
                assert np.array_equal(ix.gens, ref.gen)
                assert np.array_equal(ix.hidden_gens, ref.hidden)
                assert np.allclose(ix.sum[np.arange(CAP)], ref.mass())
                assert np.isclose(ix.total, ref.mass().sum())
                live = ref.mass()
                assert ix.min.min == (live[live > 0].min() if (live > 0).any() else np.inf)
                assert ix.max_priority == ref.maxp
                assert (ix.applied_updates, ix.dropped_updates) == (ref.applied, ref.dropped)
            _, total, _, maxp = ring.read_stats()
            if o[0] == "update":  # a writer publishes the statistics samplers read
                assert np.isclose(total, ref.mass().sum()) and maxp == ref.maxp
    finally:
        win.close()


def test_index_lock_excludes_and_names_its_holder() -> None:
    win, ring = _window()
    try:
        lock_index(ring, 3)
        with pytest.raises(DataPlaneTimeout, match="held by world rank 3"):
            lock_index(ring, 5)  # another rank waits (bounded), and is told who holds it
        with pytest.raises(RuntimeError, match="held by 3"):
            unlock_index(ring, 5)
        unlock_index(ring, 3)
        lock_index(ring, 5)  # free again
        unlock_index(ring, 5)
    finally:
        win.close()


def test_writer_needs_the_shard_in_this_nodes_memory() -> None:
    win, ring = _window()
    try:
        ring.views = None
        with pytest.raises(RuntimeError, match="not in this node's shared memory"):
            SharedIndexWriter(ring, 0, alpha=ALPHA)
    finally:
        win.close()
