"""Moving rows between shards owned by different ranks while several ranks write to both."""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc.config import FieldConfig
from conduit_hpc.plane.buffer import OwnedShard
from conduit_hpc.spec import Spec
from conduit_hpc.storage import PriorityIndex, ShardLayout, ShardRing
from conduit_hpc.storage.migrate import held_slots, move_rows, select_rows
from conduit_hpc.testing import CHECKED_SPEC, checked_batch, row_consistent
from conduit_hpc.transport.rma import RmaWindow

SPEC = Spec.from_config({k: FieldConfig(**v) for k, v in CHECKED_SPEC.items()})
CAP = 50_000


def prio_of(writer: np.ndarray, wseq: np.ndarray) -> np.ndarray:
    return 1.0 + ((writer.astype(np.int64) * 1000 + wseq) % 97)


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("transport", ["shm", "rma", "hybrid"])
def test_rows_move_between_ranks_under_concurrent_writes(transport: str) -> None:
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    if transport == "hybrid":  # two emulated nodes: shared memory within, RMA across
        node = comm.Split(rank * 2 // size, rank)
    else:
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    lay = ShardLayout(SPEC, CAP)
    # rank 0 owns the source shard, rank 1 the destination; the others write into both
    win = RmaWindow(comm, lay.nbytes if rank < 2 else 0, node_comm=node,
                    shared=transport != "rma")
    rings = [ShardRing(win, owner, 0, lay, timeout_s=30.0) for owner in (0, 1)]
    mine = None
    if rank < 2:
        rings[rank].views = lay.views(win.own_segment(), 0)
        mine = OwnedShard(rank, rings[rank], PriorityIndex(CAP, alpha=0.7))
    rng = np.random.default_rng(1234 + rank)
    written: list[tuple[int, int]] = []
    updated: dict[tuple[int, int], float] = {}
    moves = moved_rows = 0
    # two non-blocking barriers, posted in the same order everywhere: "mid" (rank 0 has
    # moved rows; writers have written half), then "done" (writers have written all)
    mid = done = None
    if rank == 1:
        mid, done = comm.Ibarrier(), comm.Ibarrier()
    if rank >= 2:
        wseq = 0
        for b in range(80):
            if b == 40:  # the second half is written while rank 0 is moving rows
                comm.Ibarrier().Wait()
            n = int(rng.integers(1, 18))
            batch = SPEC.validate(checked_batch(rank, wseq, n))
            target = rings[0] if rng.random() < 0.7 else rings[1]
            target.write(batch, prio_of(batch["writer"], batch["wseq"]))
            written.extend((rank, w) for w in range(wseq, wseq + n))
            wseq += n
            if b % 10 == 0:
                time.sleep(0.001)
        comm.Ibarrier().Wait()  # pairs with the owners' Ibarrier (the writers are done)
    else:
        assert mine is not None
        deadline = time.monotonic() + 120
        step = 0
        while done is None or not done.Test():
            assert time.monotonic() < deadline, "writers did not finish"
            mine.poll()
            if rank == 0 and step % 3 == 0:
                slots, gens = held_slots(mine.ring, mine.index)
                if len(slots):
                    # change some priorities, then move (oldest and hottest alternately)
                    pick = rng.choice(len(slots), size=min(4, len(slots)), replace=False)
                    newp = rng.uniform(0.1, 50.0, len(pick))
                    mine.index.update(slots[pick], gens[pick], newp)
                    rows, _ = mine.ring.gather(slots[pick])
                    for w, s, p in zip(rows["writer"], rows["wseq"], newp, strict=True):
                        updated[(int(w), int(s))] = float(p)
                    order = "oldest" if step % 2 == 0 else "hottest"
                    rec = move_rows(mine.ring, mine.index, rings[1],
                                    select_rows(mine.ring, mine.index, 7, order))
                    moves += 1
                    moved_rows += rec.count
                    if mid is None and rec.count:
                        mid, done = comm.Ibarrier(), comm.Ibarrier()
            step += 1
        if rank == 0:  # one last move of what is left, after the writers finished
            mine.poll()
            rec = move_rows(mine.ring, mine.index, rings[1],
                            select_rows(mine.ring, mine.index, 25, "hottest"))
            moved_rows += rec.count
    comm.Barrier()  # every move has been written (write() flushes) before this
    held: dict[tuple[int, int], float] = {}
    torn = 0
    if mine is not None:
        mine.poll()
        slots, _ = held_slots(mine.ring, mine.index)
        rows, _ = mine.ring.gather(slots)
        torn = int(np.count_nonzero(~row_consistent(rows)))
        for w, s, p in zip(rows["writer"], rows["wseq"], mine.index.priority[slots],
                           strict=True):
            key = (int(w), int(s))
            assert key not in held, f"{key} held twice by shard {rank}"
            held[key] = float(p)
    if mid is not None:
        mid.Wait()
    everything = comm.allgather((written, held, updated, moved_rows, torn))
    all_written = [k for w, *_ in everything for k in w]
    assert len(set(all_written)) == len(all_written)
    src, dst = everything[0][1], everything[1][1]
    assert not set(src) & set(dst), "a row is held by both shards"
    assert set(src) | set(dst) == set(all_written), "a row was lost"
    assert sum(t for *_, t in everything) == 0, "a torn row"
    assert everything[0][3] > 0, "no row moved"
    expected_upd = everything[0][2]
    for key, p in {**src, **dst}.items():
        want = expected_upd.get(key, float(prio_of(np.asarray([key[0]]),
                                                   np.asarray([key[1]]))[0]))
        assert p == pytest.approx(want), (key, p, want)
    comm.Barrier()
    win.close()
    node.Free()
    comm.Free()
