"""The host tiers (``buffer_host``, ``learner_host``) behind the tier-store interface:
a shard ring in a transport segment (an RMA window) and its owner's priority index.

Plain numpy; no MPI import (the ring talks through its transport). Owner side: the
process that maps the shard's memory (``ring.views``), as the buffer rank's progress loop
is in a running job. An insert writes like any writer (:meth:`ShardRing.write`), then
commits at once (the owner's commit scan and index insert, as ``OwnedShard.poll`` does);
a take hides rows in the index (:meth:`PriorityIndex.invalidate`), as a move of live
re-placement does. The ring stays a ring: an insert goes at the reserve cursor, so
:meth:`WindowStore.free` counts the slots from there that hold nothing (a row taken out
of the middle frees its slot only when the cursor comes round to it) - an insert never
evicts a held row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from conduit_hpc.storage.priority import PriorityIndex
from conduit_hpc.storage.ring import ShardRing

__all__ = ["WindowStore"]


class WindowStore:
    """A shard ring and its index as a tier store (owner side).

    Args:
        ring (ShardRing): the shard, mapped by this process (``ring.views`` set).
        index (PriorityIndex): the shard's priority index.
        tier (str): ``buffer_host`` or ``learner_host``.

    Raises:
        ValueError: the ring is not mapped here, or the index is for another capacity.
    """

    def __init__(self, ring: ShardRing, index: PriorityIndex, tier: str = "buffer_host"
                 ) -> None:
        if ring.views is None:
            raise ValueError("a WindowStore runs on the shard's owner (ring.views is None)")
        if index.capacity != ring.capacity:
            raise ValueError(f"index capacity {index.capacity} != ring capacity "
                             f"{ring.capacity}")
        self.ring, self.index, self.tier = ring, index, tier
        self.capacity = ring.capacity
        self.alpha = index.alpha
        self.ids = np.full(self.capacity, -1, np.int64)  # row id per slot (owner memory)

    @staticmethod
    def to_host(x: Any) -> np.ndarray:
        return np.asarray(x)

    def _held_mask(self) -> np.ndarray:
        v = self.ring.views
        assert v is not None
        self.ring.transport.sync()
        gens = self.index.gens
        return (gens > 0) & (v.stamps == gens) & (self.ids >= 0)

    def held(self) -> int:
        return int(np.count_nonzero(self._held_mask()))

    def free(self) -> int:
        start = self.ring.reserve_cursor() % self.capacity
        order = (start + np.arange(self.capacity)) % self.capacity
        taken = np.flatnonzero(self._held_mask()[order])
        return int(taken[0]) if taken.size else self.capacity

    def total(self) -> float:
        return self.index.total

    def insert(self, rows: Mapping[str, Any], ids: Any, priorities: Any) -> np.ndarray:
        ids = np.asarray(ids, np.int64).reshape(-1)
        n = len(ids)
        if n > self.free():
            raise ValueError(f"{self.tier}: {n} rows do not fit in {self.free()} free slots "
                             f"at the ring's cursor")
        batch = self.ring.layout.spec.validate(
            {k: (v.cpu().numpy() if hasattr(v, "cpu") else v) for k, v in rows.items()})
        p = np.asarray(priorities, np.float64).reshape(-1)
        first = self.ring.write(batch, p)
        _, new = self.ring.advance_commits()
        if new != first + n:
            raise RuntimeError(f"{self.tier}: commit stopped at {new}, expected {first + n}")
        seqs = np.arange(first, first + n, dtype=np.int64)
        slots = seqs % self.capacity
        self.ids[slots] = ids
        self.index.insert(slots, seqs + 1, p)
        return slots

    def search(self, targets: Any) -> np.ndarray:
        return self.index.sum.prefix_search(np.asarray(targets, np.float64))

    def gather(self, slots: Any) -> dict[str, np.ndarray]:
        rows, _ = self.ring.gather(np.asarray(slots, np.int64))
        return rows

    def ids_at(self, slots: Any) -> np.ndarray:
        s = np.asarray(slots, np.int64)
        return np.where(self._held_mask()[s], self.ids[s], -1)

    def priorities(self, slots: Any) -> np.ndarray:
        return self.index.priority[np.asarray(slots, np.int64)].copy()

    def masses(self, slots: Any) -> np.ndarray:
        return self.index.sum[np.asarray(slots, np.int64)]

    def update(self, slots: Any, ids: Any, priorities: Any) -> np.ndarray:
        s = np.asarray(slots, np.int64).reshape(-1)
        i = np.asarray(ids, np.int64).reshape(-1)
        live = (self.ids_at(s) == i) & (i >= 0)
        if live.any():
            self.index.update(s[live], self.index.gens[s[live]],
                              np.asarray(priorities, np.float64).reshape(-1)[live])
        return live

    def take(self, slots: Any) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        s = np.asarray(slots, np.int64).reshape(-1)
        s = s[self._held_mask()[s]]
        rows = self.gather(s)
        ids, prio = self.ids[s].copy(), self.index.priority[s].copy()
        self.index.invalidate(s)
        self.ids[s] = -1
        return rows, ids, prio

    def held_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s = np.flatnonzero(self._held_mask())
        return s, self.ids[s].copy(), self.index.priority[s].copy()
