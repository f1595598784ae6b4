"""Moving committed rows from one shard ring to another without loss, duplication or tears.

Plain numpy; no MPI import (the rings talk through their transport). Run by the **owner**
of the source shard (it holds the source's :class:`~conduit_hpc.storage.PriorityIndex`),
typically from the buffer progress loop at a superstep boundary; the destination may be
any shard of any rank that a :class:`~conduit_hpc.storage.ShardRing` client can write.

What a shard *holds* is what its owner's index says: a slot is held when the index
carries a generation for it that the ring's stamp still shows (:func:`held_slots`). A move

1. takes the selected slots that are still held (others were evicted meanwhile),
2. copies their rows and checks, like any reader, that no writer had been handed the
   sequence number that overwrites them (a row caught being overwritten is skipped: the
   ring's FIFO eviction took it, not the move),
3. appends them to the destination ring like any writer, each with the priority it has
   *now* in the source index (so the destination's owner inserts it at exactly that
   priority when it commits), and
4. only then hides them in the source index.

Between 3 and 4 a row is briefly held twice; at no moment is it held nowhere. Moves run at a
superstep boundary, while learners do not sample, so the sampling distribution is the
same before and after the move (each row keeps its priority). The source ring keeps the
bytes (the stamps still show them) until writers recycle the slots or the ring is freed;
audits and checkpoints must therefore read shards through :func:`held_slots`, not through
the stamps alone. The returned :class:`MoveRecord` forwards late priority updates
(``(source slot, generation) -> (destination slot, generation)``).

A move appends to the destination like any writer: if the destination has fewer free slots
than rows arriving, its own oldest rows are evicted (FIFO) - :func:`free_slots` says how
many rows it can take without that; re-placement moves into fresh rings sized for them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from conduit_hpc.storage.priority import PriorityIndex
from conduit_hpc.storage.ring import H_COMMIT, ShardRing

__all__ = ["MoveRecord", "free_slots", "held_slots", "move_rows", "select_rows"]

Order = Literal["oldest", "newest", "hottest", "coldest"]


def held_slots(ring: ShardRing, index: PriorityIndex) -> tuple[np.ndarray, np.ndarray]:
    """Slots the shard holds and their generations (``seq + 1``), oldest first. Owner only.

    Raises:
        RuntimeError: ``ring`` is not mapped directly (not the owner).
    """
    v = ring.views
    if v is None:
        raise RuntimeError("held_slots() must run on the shard's owner")
    ring.transport.sync()
    gens = index.gens
    live = np.flatnonzero((gens > 0) & (v.stamps == gens))
    order = np.argsort(gens[live], kind="stable")
    slots = live[order]
    return slots, gens[slots].copy()


def select_rows(ring: ShardRing, index: PriorityIndex, count: int,
                order: Order = "oldest") -> np.ndarray:
    """Up to ``count`` held slots: the oldest/newest by sequence number, or the
    hottest/coldest by priority (ties: older first). Owner only; deterministic."""
    slots, gens = held_slots(ring, index)
    if count <= 0 or len(slots) == 0:
        return np.zeros(0, np.int64)
    if order == "oldest":
        return slots[:count]
    if order == "newest":
        return slots[::-1][:count]
    p = index.priority[slots]
    key = -p if order == "hottest" else p
    pick = np.lexsort((gens, key))[:count]
    return slots[pick]


def free_slots(ring: ShardRing) -> int:
    """Rows ``ring`` can take before a writer would overwrite a row it has ever held
    (``capacity - reserve cursor`` while the ring has not lapped; 0 after). Any rank."""
    return max(0, ring.capacity - ring.reserve_cursor())


@dataclass(frozen=True, slots=True)
class MoveRecord:
    """Where moved rows went.

    Attributes:
        src_slots (np.ndarray): source slots moved, in destination order.
        src_gens (np.ndarray): their source generations.
        dst_seqs (np.ndarray): destination sequence number of each (generation - 1).
        dst_capacity (int): the destination ring's capacity.
        priorities (np.ndarray): the priority each row carried.
        skipped (int): selected rows not moved because they were no longer held or were
            being overwritten (evicted by the source ring, not lost by the move).
    """

    src_slots: np.ndarray
    src_gens: np.ndarray
    dst_seqs: np.ndarray
    dst_capacity: int
    priorities: np.ndarray
    skipped: int

    @property
    def count(self) -> int:
        return len(self.src_slots)

    @property
    def dst_slots(self) -> np.ndarray:
        return self.dst_seqs % self.dst_capacity

    @property
    def dst_gens(self) -> np.ndarray:
        return self.dst_seqs + 1

    def forward(self, slots: np.ndarray, gens: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Map (source slot, generation) pairs to their new place.

        Returns:
            tuple: (moved mask, destination slots, destination generations) - the last
            two only for the pairs where the mask is true.
        """
        slots = np.asarray(slots, np.int64).reshape(-1)
        gens = np.asarray(gens, np.int64).reshape(-1)
        if self.count == 0:
            return np.zeros(len(slots), bool), np.zeros(0, np.int64), np.zeros(0, np.int64)
        key = self.src_gens  # generations are unique within one source shard
        order = np.argsort(key)
        pos = np.searchsorted(key[order], gens)
        pos = np.minimum(pos, len(key) - 1)
        hit = (key[order][pos] == gens) & (self.src_slots[order][pos] == slots)
        idx = order[pos[hit]]
        return hit, self.dst_slots[idx], self.dst_gens[idx]


def move_rows(src: ShardRing, src_index: PriorityIndex, dst: ShardRing,
              slots: np.ndarray, *, chunk_rows: int = 4096,
              hide: Callable[[np.ndarray], None] | None = None) -> MoveRecord:
    """Move the rows held at ``slots`` of ``src`` to the end of ``dst``. Owner of ``src``
    only; blocks while it writes (like :meth:`ShardRing.write`, bounded by the ring's
    ``timeout_s``); local otherwise (no collective).

    Args:
        src (ShardRing): the source, mapped directly (this rank owns it).
        src_index (PriorityIndex): the source's index (current priorities).
        dst (ShardRing): a client of the destination shard (any owner).
        slots (np.ndarray): source slots to move (see :func:`select_rows`).
        chunk_rows (int): rows per destination write (bounded copies).
        hide (Callable[[np.ndarray], None] | None): hides the moved source slots (default:
            ``src_index.invalidate``); a running owner passes one that does it inside the
            shard's seqlock (``OwnedShard.writing``), so that readers searching the tree
            in shared memory never see it half-changed.

    Returns:
        MoveRecord: what moved where, for forwarding late priority updates.

    Raises:
        RuntimeError: ``src`` is not mapped directly.
        ValueError: ``src`` and ``dst`` have different specs.
        DataPlaneTimeout: the destination's owner did not commit a lapped writer's rows.
    """
    v = src.views
    if v is None:
        raise RuntimeError("move_rows() must run on the source shard's owner")
    if src.layout.spec != dst.layout.spec:
        raise ValueError("source and destination shards hold different specs")
    slots = np.unique(np.asarray(slots, np.int64))
    if slots.size and (slots.min() < 0 or slots.max() >= src.capacity):
        raise ValueError(f"slot outside [0, {src.capacity})")
    src.transport.sync()
    gens = src_index.gens[slots]
    held = (gens > 0) & (v.stamps[slots] == gens)
    slots, gens = slots[held], gens[held]
    order = np.argsort(gens, kind="stable")  # keep the rows' age order in the destination
    slots, gens = slots[order], gens[order]
    skipped = int(np.count_nonzero(~held))
    # copy, then check that no writer was handed the seq that overwrites a row
    rows, reserve_after = src.gather(slots)
    intact = src.intact(gens, reserve_after)
    if not intact.all():
        skipped += int(np.count_nonzero(~intact))
        slots, gens = slots[intact], gens[intact]
        rows = {k: c[intact] for k, c in rows.items()}
    prio = src_index.priority[slots].copy()
    cap = max(1, min(chunk_rows, dst.capacity))
    dst_seqs = np.empty(len(slots), np.int64)
    for lo in range(0, len(slots), cap):
        hi = min(lo + cap, len(slots))
        piece = {k: np.ascontiguousarray(c[lo:hi]) for k, c in rows.items()}
        first = dst.write(piece, prio[lo:hi])
        dst_seqs[lo:hi] = np.arange(first, first + hi - lo)
    # the rows are now in the destination: hide them here (only where still ours)
    still = src_index.gens[slots] == gens
    (src_index.invalidate if hide is None else hide)(slots[still])
    return MoveRecord(src_slots=slots, src_gens=gens, dst_seqs=dst_seqs,
                      dst_capacity=dst.capacity, priorities=prio, skipped=skipped)


def commit_cursor_of(ring: ShardRing) -> int:
    """The commit cursor read directly (owner) or atomically (anyone)."""
    v = ring.views
    if v is not None:
        ring.transport.sync()
        return int(v.header[H_COMMIT])
    return ring.commit_cursor()
