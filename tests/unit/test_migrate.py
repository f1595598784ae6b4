"""Moving committed rows between shard rings (real RMA windows on COMM_SELF)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc.config import FieldConfig
from conduit_hpc.plane.buffer import OwnedShard
from conduit_hpc.spec import Spec
from conduit_hpc.storage import PriorityIndex, ShardLayout, ShardRing
from conduit_hpc.storage.migrate import free_slots, held_slots, move_rows, select_rows
from conduit_hpc.testing import CHECKED_SPEC, checked_batch, row_consistent
from conduit_hpc.transport.rma import RmaWindow

SPEC = Spec.from_config({k: FieldConfig(**v) for k, v in CHECKED_SPEC.items()})


@pytest.fixture(params=["direct", "rma"])
def two_shards(request):
    """A source (16 slots) and a destination (40 slots) in one window on COMM_SELF:
    owner-side OwnedShards, and plain clients (direct or through MPI RMA) for writers."""
    src_lay, dst_lay = ShardLayout(SPEC, 16), ShardLayout(SPEC, 40)
    win = RmaWindow(MPI.COMM_SELF, src_lay.nbytes + dst_lay.nbytes, node_comm=MPI.COMM_SELF,
                    shared=request.param == "direct")
    owned = []
    clients = []
    for base, lay in ((0, src_lay), (src_lay.nbytes, dst_lay)):
        o = ShardRing(win, 0, base, lay, timeout_s=2.0)
        o.views = lay.views(win.own_segment(), base)
        owned.append(OwnedShard(len(owned), o, PriorityIndex(lay.capacity, alpha=0.5)))
        clients.append(ShardRing(win, 0, base, lay, timeout_s=2.0))
    yield owned, clients
    win.close()


def held(shard: OwnedShard) -> dict[tuple[int, int], float]:
    """(writer, wseq) -> priority of every row the shard holds; checks rows are whole."""
    slots, gens = held_slots(shard.ring, shard.index)
    rows, _ = shard.ring.gather(slots)
    assert row_consistent(rows).all()
    keys = list(zip(rows["writer"].tolist(), rows["wseq"].tolist(), strict=True))
    assert len(set(keys)) == len(keys)
    np.testing.assert_array_equal(shard.ring.views.stamps[slots], gens)
    return dict(zip(keys, shard.index.priority[slots].tolist(), strict=True))


def test_move_keeps_every_row_once_with_its_priority(two_shards) -> None:
    (src, dst), (src_w, dst_w) = two_shards
    src_w.write(SPEC.validate(checked_batch(1, 0, 12)), np.arange(12.0) + 1)
    dst_w.write(SPEC.validate(checked_batch(2, 0, 5)), np.full(5, 0.5))
    src.poll()
    dst.poll()
    # priorities change after insert: the move carries the current ones
    slots, gens = held_slots(src.ring, src.index)
    src.index.update(slots[:3], gens[:3], np.asarray([9.0, 8.0, 7.0]))
    before = {**held(src), **held(dst)}
    mass_before = src.index.total + dst.index.total
    assert free_slots(dst_w) == 35
    rec = move_rows(src.ring, src.index, dst_w, select_rows(src.ring, src.index, 6, "oldest"))
    assert rec.count == 6 and rec.skipped == 0
    dst.poll()
    after_src, after_dst = held(src), held(dst)
    assert not set(after_src) & set(after_dst), "a row held twice"
    assert {**after_src, **after_dst} == before, "a row lost or its priority changed"
    assert {(1, w) for w in range(6)} <= set(after_dst)
    assert src.index.total + dst.index.total == pytest.approx(mass_before)
    # late priority updates for moved rows are forwarded to their new place
    hit, dslots, dgens = rec.forward(slots[:8], gens[:8])
    assert hit.tolist() == [True] * 6 + [False] * 2
    assert dst.index.update(dslots, dgens, np.full(6, 3.0)) == 0
    assert src.index.update(slots[:6], gens[:6], np.full(6, 3.0)) == 6  # dropped there
    assert all(after == 3.0 for k, after in held(dst).items() if k[0] == 1)


def test_hottest_rows_go_first(two_shards) -> None:
    (src, dst), (src_w, dst_w) = two_shards
    prio = np.asarray([5, 1, 9, 3, 9, 2, 7, 4.0])
    src_w.write(SPEC.validate(checked_batch(1, 0, 8)), prio)
    src.poll()
    picked = select_rows(src.ring, src.index, 3, "hottest")
    rows, _ = src.ring.gather(picked)
    assert rows["wseq"].tolist() == [2, 4, 6]  # 9, 9 (older first), 7
    rec = move_rows(src.ring, src.index, dst_w, picked)
    dst.poll()
    assert sorted(held(dst).values()) == [7.0, 9.0, 9.0]
    assert rec.priorities.tolist() == [9.0, 9.0, 7.0]


def test_rows_being_overwritten_are_skipped_never_torn(two_shards) -> None:
    (src, dst), (src_w, dst_w) = two_shards
    src_w.write(SPEC.validate(checked_batch(1, 0, 16)))
    src.poll()
    picked = select_rows(src.ring, src.index, 6, "oldest")  # seqs 0..5
    # a writer laps slots 0..2 (completed) and has reserved slots 3..4 (not written)
    src_w.write(SPEC.validate(checked_batch(3, 0, 3)))
    src.ring.transport.fetch_add(0, 0, 2)
    rec = move_rows(src.ring, src.index, dst_w, picked)
    # 0..2 were overwritten (stamps changed), 3..4 are being overwritten: only seq 5 moves
    assert rec.count == 1 and rec.skipped == 5
    dst.poll()
    assert list(held(dst)) == [(1, 5)]


def test_move_into_a_full_ring_evicts_its_oldest(two_shards) -> None:
    (src, dst), (src_w, dst_w) = two_shards
    dst_w.write(SPEC.validate(checked_batch(2, 0, 38)))
    dst.poll()
    src_w.write(SPEC.validate(checked_batch(1, 0, 4)))
    src.poll()
    assert free_slots(dst_w) == 2
    move_rows(src.ring, src.index, dst_w, select_rows(src.ring, src.index, 4))
    dst.poll()
    got = set(held(dst))
    assert {(1, w) for w in range(4)} <= got
    assert (2, 0) not in got and (2, 1) not in got and (2, 2) in got  # FIFO, documented


def test_move_refuses_non_owner_and_other_spec(two_shards) -> None:
    (src, _dst), (src_w, dst_w) = two_shards
    with pytest.raises(RuntimeError, match="owner"):
        move_rows(src_w if src_w.views is None else _no_views(src_w), src.index, dst_w,
                  np.arange(2))
    other = ShardRing(src.ring.transport, 0, 0,
                      ShardLayout(Spec.from_dict({"x": ("float32", ())}), 4))
    with pytest.raises(ValueError, match="different specs"):
        move_rows(src.ring, src.index, other, np.arange(2))


def _no_views(ring: ShardRing) -> ShardRing:
    ring.views = None
    return ring
