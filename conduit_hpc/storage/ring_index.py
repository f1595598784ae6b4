"""The reads of a shard's header and priority index that node-local readers make
without asking the owner: consistent snapshots under the index seqlock (a mixin of
:class:`~conduit_hpc.storage.ring.ShardRing`; see its protocol). Plain numpy; no MPI."""

from __future__ import annotations

import time

import numpy as np

from conduit_hpc.storage import tree_kernels
from conduit_hpc.storage.layout import (
    H_HELD,
    H_MAXP,
    H_MIN,
    H_STATS_VERSION,
    H_TOTAL,
    HEADER_WORDS,
    ShardViews,
)
from conduit_hpc.storage.sumtree import prefix_search, search_level
from conduit_hpc.transport.base import Transport
from conduit_hpc.wait import NO_HOSTS, Deadline, Hosts

__all__ = ["SPINS", "IndexReads", "settle"]


class IndexReads:
    """Seqlocked reads of the owner's published stats and tree (retries while the
    owner writes, bounded by ``timeout_s``)."""

    transport: Transport
    owner: int
    base: int
    capacity: int
    timeout_s: float
    views: ShardViews | None
    #: each world rank's host, for errors (the data plane sets it; ShardMemory)
    hosts: Hosts = NO_HOSTS

    @property
    def owner_named(self) -> str:
        """``"rank R"``, and across hosts ``" (host H)"``: the owner, for an error."""
        return f"rank {self.owner}{self.hosts.of(self.owner)}"

    def read_header(self) -> np.ndarray:
        """A consistent copy of the shard's int64 header as last published by the owner
        (retries while the owner is writing the stats). Blocks only for the few reads
        that takes (bounded by ``timeout_s``)."""
        t = self.transport
        buf = np.empty(HEADER_WORDS, dtype=np.int64)
        deadline: Deadline | None = None  # made on the first retry (most reads have none)
        tries = 0
        while True:
            if self.views is not None:
                t.sync()
                buf[:] = self.views.header
                t.sync()
                again = int(self.views.header[H_STATS_VERSION])
            else:
                t.get(self.owner, self.base, buf)
                t.flush(self.owner)
                again = t.atomic_read(self.owner, self.base + 8 * H_STATS_VERSION)
            if buf[H_STATS_VERSION] % 2 == 0 and buf[H_STATS_VERSION] == again:
                return buf
            if deadline is None:
                deadline = Deadline(self.timeout_s, f"the shard stats on {self.owner_named} "
                                                    f"to settle (they stayed mid-update)")
            deadline.check()
            tries = settle(tries)

    def read_stats(self) -> tuple[int, float, float, float]:
        """(rows held, total mass, min mass, max priority) as last published by the
        owner; a consistent snapshot (see :meth:`read_header`)."""
        buf = self.read_header()
        f = buf.view(np.float64)
        return int(buf[H_HELD]), float(f[H_TOTAL]), float(f[H_MIN]), float(f[H_MAXP])

    def search(self, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                   int, float, float] | None:
        """Prefix-search the owner's tree directly (node-local readers): slots,
        generations and masses for ``targets``, with the stats they are consistent with;
        slots are -1 when the shard had nothing to draw. ``None`` if this process cannot
        load the shard's memory. Retries while the owner writes (bounded)."""
        v = self.views
        if v is None:
            return None
        t = self.transport
        deadline: Deadline | None = None  # made on the first retry (most reads have none)
        tries = 0
        while True:
            t.sync()
            before = int(v.header[H_STATS_VERSION])
            if before % 2 == 0:
                held = int(v.header[H_HELD])
                f = v.header.view(np.float64)
                total, mn = float(f[H_TOTAL]), float(f[H_MIN])
                if total > 0 and float(v.tree[1]) > 0:
                    # a tree read while the owner rewrites it (the version check below
                    # then retries) can lead the search into the padding leaves past
                    # the capacity: never index with those; -1 (nothing drawn) if a
                    # consistent read should ever give one
                    found = (tree_kernels.draw(v.tree, v.gens, self.capacity, targets,
                                               search_level(len(v.tree)))
                             if tree_kernels.available() else None)
                    if found is not None:
                        slots, gens, mass = found
                    else:
                        slots = prefix_search(v.tree, targets)
                        # a target at or past the total it searched (the tree lost mass
                        # since the learner read its stats): drawn again, as a torn slot
                        inside = (slots < self.capacity) & (np.asarray(targets) < v.tree[1])
                        safe = np.where(inside, slots, 0)
                        gens = np.where(inside, v.gens[safe], 0)
                        mass = np.where(inside, v.tree[safe + len(v.tree) // 2], 0.0)
                        slots = np.where(inside, slots, -1)
                else:
                    slots = np.full(len(targets), -1, np.int64)
                    gens, mass = np.zeros(len(targets), np.int64), np.zeros(len(targets))
                t.sync()
                if int(v.header[H_STATS_VERSION]) == before:
                    return slots, gens, mass, held, total, mn
            if deadline is None:
                deadline = Deadline(self.timeout_s, f"the tree of the shard on rank "
                                                    f"{self.owner} to settle (it stayed "
                                                    f"mid-update)")
            deadline.check()
            tries = settle(tries)

    def leaves(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The owner's index at ``slots`` (node-local readers): the generation each
        leaf is for (0: none) and its mass, one consistent snapshot (seqlock; retries
        while the owner writes, bounded by ``timeout_s``)."""
        v = self.views
        if v is None:
            raise RuntimeError("leaves() needs direct access to the shard")
        slots = np.asarray(slots, dtype=np.int64)
        deadline = Deadline(self.timeout_s, f"the index of the shard on rank {self.owner} "
                                            f"to settle (it stayed mid-update)")
        tries = 0
        while True:
            self.transport.sync()
            before = int(v.header[H_STATS_VERSION])
            if before % 2 == 0:
                gens, mass = v.gens[slots].copy(), v.tree[slots + len(v.tree) // 2].copy()
                self.transport.sync()
                if int(v.header[H_STATS_VERSION]) == before:
                    return gens, mass
            deadline.check()
            tries = settle(tries)


#: retries of a read that found the owner mid-write before the reader yields its core
#: (an owner's write of the index lasts microseconds while it runs: yielding at once gave
#: the core to a busy writer, and the reader waited out its time slice)
SPINS = 32


def settle(tries: int) -> int:
    """One more retry of a read that found the owner mid-write: at once for the first
    :data:`SPINS`, then after yielding the processor (the owner may share this core).
    Returns the retries so far."""
    if tries >= SPINS:
        time.sleep(0)
    return tries + 1
