"""The index lock and the writer a node-local learner uses to apply priority updates
to a shard's index itself, where it lives (no message to the owner, no wait for it).

**Protocol.** A shard's whole priority index (sum- and min-tree, generations, hidden
rows' generations, raw priorities, the running maximum and the update counters) lives
in the shard's memory (:mod:`conduit_hpc.storage.ring`). Every process that changes
it - the owner (commits, hides, restores; its own update messages) and node-local
learners or delivery ranks (their priority updates) - does so holding the **index
lock**: header word ``H_INDEX_LOCK``, 0 when free, else the holder's world rank + 1,
taken and given back with an MPI compare-and-swap through the node's shared window
(Open MPI's ``osc/sm`` does it under the target's accumulate lock, so every rank of the
node sees one order). Inside the lock the writer opens the shard's seqlock, changes the
index, publishes the statistics samplers read and closes the seqlock - so node-local
searches see a whole update or retry, exactly as they do for the owner's commits.
Generations still decide: an update for a row overwritten since it was drawn is dropped
(and counted), one for a row the guard band hides sets the priority it comes back with.

Why a lock and not a hand-off to the owner: a hand-off costs every staleness-0 batch a
message round trip plus the owner's turn (its commit work queues ahead of the update);
the lock costs two atomics when nobody else holds it, and the owner holds it only for
one bounded pass. Plain numpy; no MPI import (the compare-and-swap is the transport's).
"""

from __future__ import annotations

import contextlib

import numpy as np

from conduit_hpc.storage.layout import H_HELD, H_INDEX_LOCK
from conduit_hpc.storage.priority import PriorityIndex, index_buffers
from conduit_hpc.storage.ring import ShardRing
from conduit_hpc.storage.ring_index import settle
from conduit_hpc.wait import Deadline

__all__ = ["SharedIndexWriter", "lock_index", "unlock_index"]


def lock_index(ring: ShardRing, rank: int) -> None:
    """Take ``ring``'s index lock for world rank ``rank`` (spins, yielding the
    processor while another rank holds it; bounded by ``ring.timeout_s``). Node-local
    writers only: the owner, and ranks that map the shard.

    An exception (Ctrl-C) raised here after the compare-and-swap took the lock, before
    the caller's ``try`` could give it back, gives it back: the lock stayed held, and
    every other writer - the owner's commits too - waited out its timeout (no writer
    takes it twice, so a word holding ``rank + 1`` then is this take's).

    Raises:
        DataPlaneTimeout: another rank held it past the timeout (named).
    """
    try:
        _take_index_lock(ring, rank)
    except BaseException:
        with contextlib.suppress(Exception):
            ring.transport.compare_and_swap(ring.owner, ring.base + 8 * H_INDEX_LOCK,
                                            rank + 1, 0)
        raise


def _take_index_lock(ring: ShardRing, rank: int) -> None:
    t, disp = ring.transport, ring.base + 8 * H_INDEX_LOCK
    held = t.compare_and_swap(ring.owner, disp, 0, rank + 1)
    if held == 0:
        return
    deadline = Deadline(ring.timeout_s, f"the index lock of the shard on {ring.owner_named}")
    tries = 0
    while True:
        deadline.check(lambda: f"held by {ring.hosts.rank(held - 1)}")  # noqa: B023
        # the holder may need MPI progress from this rank (across nodes an atomic of
        # the holder's, on its own segment too, is run by its node's leader - maybe this
        # rank: a wait outside MPI deadlocked the cut of a checkpoint; docs/hosts.md)
        t.progress()
        tries = settle(tries)  # ... and, after a few tries, this core
        held = t.compare_and_swap(ring.owner, disp, 0, rank + 1)
        if held == 0:
            return


def unlock_index(ring: ShardRing, rank: int) -> None:
    """Give ``ring``'s index lock back (after a memory barrier that publishes the
    index).

    Raises:
        RuntimeError: ``rank`` did not hold it (a protocol fault).
    """
    ring.transport.sync()
    held = ring.transport.compare_and_swap(ring.owner, ring.base + 8 * H_INDEX_LOCK,
                                           rank + 1, 0)
    if held != rank + 1:
        raise RuntimeError(f"index lock of the shard on rank {ring.owner} released by "
                           f"rank {rank}, but held by {held - 1}")


class SharedIndexWriter:
    """A node-local rank's handle on one shard's index: applies priority updates there
    under the index lock (see the module docstring). Not thread-safe; local.

    Args:
        ring (ShardRing): the shard; this process must map its memory.
        rank (int): this process's world rank (the lock holder's id).
        alpha (float): the sampler's priority exponent (the owner's index uses it).

    Raises:
        RuntimeError: the shard's memory is not mapped here.
    """

    def __init__(self, ring: ShardRing, rank: int, *, alpha: float) -> None:
        if ring.views is None:
            raise RuntimeError(f"shard on rank {ring.owner} is not in this node's shared "
                               f"memory: its priority updates go to the owner")
        self.ring, self.rank = ring, rank
        self.index = PriorityIndex(ring.capacity, alpha=alpha,
                                   buffers=index_buffers(ring.views), attach=True)
        self.applied = 0  # updates this writer applied (rows)
        self.dropped = 0  # ... and dropped (their row overwritten)

    def apply(self, slots: np.ndarray, gens: np.ndarray, priorities: np.ndarray) -> int:
        """Set checked priorities (finite, >= 0) where ``slots`` still hold ``gens``;
        republish the statistics (held rows do not change; total, minimum and the
        running maximum may). Blocks only for the lock (bounded). Returns rows dropped."""
        ring, ix = self.ring, self.index
        v = ring.views
        assert v is not None
        lock_index(ring, self.rank)
        try:
            ring.index_write_begin()
            try:
                dropped = ix.update(slots, gens, priorities, checked=True)
            finally:
                held = int(v.header[H_HELD])  # the owner's count: updates keep it
                ring.index_write_end(held, ix.total, ix.min.min if held else np.inf,
                                     ix.max_priority)
        finally:
            unlock_index(ring, self.rank)
        self.applied += len(slots) - dropped
        self.dropped += dropped
        return dropped
