"""A shard: a ring of fixed-size slots in a transport segment, with a commit protocol.

The byte layout of one shard (header words, blocks) is in
:mod:`conduit_hpc.storage.layout`.

Protocol (sequence numbers ``seq`` are global to the shard, ``slot = seq % capacity``):

* **Write** (any rank, several at once): reserve ``n`` seqs with one atomic fetch-add on
  the reserve cursor; if that laps the ring, wait until the owner's free cursor covers
  them (the owner moves it only over slots whose rows it has hidden from sampling and
  that were committed, so two writers never write the same slot at once; while the
  free cursor is 0, the commit cursor one lap back is the gate); put the columns (at
  most two contiguous pieces per field: the ring may wrap); flush; put the stamps
  ``seq + 1``; flush.
* **Commit** (owner only): scan stamps from the commit cursor and advance it over every
  slot whose stamp shows its expected seq. Rows become visible to samplers only then.
* **Free** (owner only): hide from the index the rows that the next seqs will overwrite
  (a guard band ahead of the writers, see :class:`~conduit_hpc.plane.buffer.OwnedShard`),
  then publish the free cursor that lets writers take those slots.
* **Search** (node-local readers): prefix-search the owner's tree in shared memory
  under the index seqlock, instead of asking the owner.
* **Index writes** (owner's commits and hides, node-local learners' updates): one
  writer at a time under the index lock (:mod:`conduit_hpc.storage.shared_index`),
  inside the seqlock; learners on other nodes send updates to the owner instead.
* **Read** (any rank): copy rows of sampled slots, then read the reserve cursor ``R``
  and the free cursor ``F``; a row of sequence ``q`` is intact iff
  ``q + capacity >= min(R, F)`` (``R`` alone while ``F`` is 0) - no writer has yet been
  handed, and let write, the seq that overwrites it. Stale or torn rows are therefore
  detected, never returned.

Storage never sees an ``MPI.Win``: it talks to a :class:`~conduit_hpc.transport.base.Transport`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from conduit_hpc.errors import SpecError
from conduit_hpc.storage import tree_kernels
from conduit_hpc.storage.layout import (
    H_COMMIT,
    H_FREE,
    H_HELD,
    H_MAXP,
    H_MIN,
    H_RESERVE,
    H_STATS_VERSION,
    H_TOTAL,
    H_UNSAMPLED,
    HEADER_WORDS,
    RingSegment,
    ShardLayout,
    ShardViews,
    ring_segments,
)
from conduit_hpc.storage.sumtree import prefix_search, search_level
from conduit_hpc.transport.base import Transport
from conduit_hpc.wait import Deadline

__all__ = ["H_COMMIT", "H_FREE", "H_RESERVE", "H_UNSAMPLED", "RingSegment", "ShardLayout",
           "ShardRing", "ShardViews", "ring_segments"]

class ShardRing:
    """Client of one shard: writes (actors), commit scans (owner) and reads (learners).

    Local object; the operations are one-sided through ``transport``. Uses direct numpy
    loads/stores when the transport maps the owner's segment into this process.

    Args:
        transport (Transport): the byte mover.
        owner_rank (int): rank that holds the shard's memory.
        base (int): byte displacement of the shard inside the owner's segment.
        layout (ShardLayout): the shard's layout.
        timeout_s (float): bound on waiting for a lapped writer.
        poll_interval_s (float): sleep between polls while waiting.
    """

    def __init__(self, transport: Transport, owner_rank: int, base: int, layout: ShardLayout,
                 *, timeout_s: float = 60.0, poll_interval_s: float = 0.0002) -> None:
        self.transport = transport
        self.owner = owner_rank
        self.base = base
        self.layout = layout
        self.capacity = layout.capacity
        self.timeout_s = timeout_s
        self.poll_interval_s = poll_interval_s
        seg = transport.local_view(owner_rank)
        self.views: ShardViews | None = layout.views(seg, base) if seg is not None else None
        self.rows_written = 0
        self.lap_waits = 0  # writes that waited for the free (or commit) cursor
        self.lap_wait_s = 0.0  # ... and the seconds they waited
        #: run while a write waits for the free cursor (the owner's pass, when this
        #: process owns the shard: its own writes must not wait on itself)
        self.on_wait: Callable[[], object] | None = None

    @property
    def direct(self) -> bool:
        """Whether this process loads/stores the shard directly."""
        return self.views is not None

    # -- cursors -------------------------------------------------------------------
    def reserve_cursor(self) -> int:
        """Next sequence number a writer will be handed (atomic read)."""
        return self.transport.atomic_read(self.owner, self.base + 8 * H_RESERVE)

    def commit_cursor(self) -> int:
        """Every seq below this is committed (atomic read)."""
        return self.transport.atomic_read(self.owner, self.base + 8 * H_COMMIT)

    # -- writer --------------------------------------------------------------------
    def write(self, batch: dict[str, np.ndarray], priorities: np.ndarray | None = None) -> int:
        """Append a validated batch; returns the first sequence number. Blocks only while
        a writer one lap behind finishes (bounded by ``timeout_s``).

        Args:
            batch (dict[str, np.ndarray]): output of :meth:`Spec.validate`.
            priorities (np.ndarray | None): float64 initial priority per row, or None.

        Raises:
            SpecError: more rows than the shard's capacity.
            DataPlaneTimeout: a lapped writer did not commit within ``timeout_s``.
        """
        n = self.layout.spec.rows_of(batch)
        if n > self.capacity:
            raise SpecError(f"batch of {n} rows exceeds the shard capacity of "
                            f"{self.capacity} rows; split it or raise storage.capacity_rows")
        if n == 0:
            return self.reserve_cursor()
        prio = (None if priorities is None
                else np.ascontiguousarray(priorities, dtype=np.float64))
        t = self.transport
        first = t.fetch_add(self.owner, self.base + 8 * H_RESERVE, n)
        self._wait_lap(first + n)
        segs = ring_segments(first, n, self.capacity)
        gens = np.arange(first + 1, first + n + 1, dtype=np.int64)
        lay = self.layout
        if self.views is not None:
            v = self.views
            for s in segs:
                dst, src = slice(s.slot, s.slot + s.count), slice(s.src, s.src + s.count)
                for name, col in v.columns.items():
                    col[dst] = batch[name][src]
                v.priority[dst] = np.nan if prio is None else prio[src]
            t.sync()
            for s in segs:
                v.stamps[s.slot:s.slot + s.count] = gens[s.src:s.src + s.count]
            t.sync()
        else:
            if prio is None:
                prio = np.full(n, np.nan)
            for s in segs:
                for f in lay.spec:
                    off = self.base + lay.column(f.name) + s.slot * f.row_bytes
                    t.put(self.owner, off, batch[f.name][s.src:s.src + s.count])
                t.put(self.owner, self.base + lay.priority_offset + 8 * s.slot,
                      prio[s.src:s.src + s.count])
            t.flush(self.owner)
            for s in segs:
                t.put(self.owner, self.base + lay.stamps_offset + 8 * s.slot,
                      gens[s.src:s.src + s.count])
            t.flush(self.owner)
        self.rows_written += n
        return first

    def free_cursor(self) -> int:
        """Writers may write every seq below this (atomic read; 0: not managed)."""
        return self.transport.atomic_read(self.owner, self.base + 8 * H_FREE)

    def _may_write(self, end: int) -> bool:
        """Whether seqs below ``end`` may be written: the owner's free cursor covers
        them, or (free cursor not managed) the rows one lap back are committed."""
        free = self.free_cursor()
        if free:
            return free >= end
        # not managed: the plain one-lap rule - unless the owner published one meanwhile
        if self.commit_cursor() < end - self.capacity:
            return False
        again = self.free_cursor()
        return again == 0 or again >= end

    def _wait_lap(self, end: int) -> None:
        """Wait until seqs below ``end`` may be written (bounded by ``timeout_s``)."""
        if end <= self.capacity or self._may_write(end):
            return
        t0 = time.monotonic()
        deadline = Deadline(self.timeout_s, f"the owner (rank {self.owner}) to free the "
                                            f"slots of seqs before {end}")
        pause = min(self.poll_interval_s, 0.00005)
        while not self._may_write(end):
            if self.on_wait is not None:
                self.on_wait()
                if self._may_write(end):
                    break
            deadline.check(lambda: f"commit cursor {self.commit_cursor()}, free cursor "
                                   f"{self.free_cursor()}; is its owner still serving?")
            time.sleep(pause)
            pause = min(2 * pause, self.poll_interval_s)
        self.lap_waits += 1
        self.lap_wait_s += time.monotonic() - t0

    # -- owner ---------------------------------------------------------------------
    def advance_commits(self, max_rows: int | None = None) -> tuple[int, int]:
        """Owner only: move the commit cursor over newly committed rows (at most
        ``max_rows`` of them, to bound the work of one call).

        Returns:
            tuple[int, int]: the old and new commit cursor; seqs in between became
            visible.
        """
        v = self.views
        if v is None:
            raise RuntimeError("advance_commits() must run on the shard's owner")
        old = int(v.header[H_COMMIT])
        reserved = self.reserve_cursor()
        if max_rows is not None:
            reserved = min(reserved, old + max_rows)
        if reserved == old:
            return old, old
        self.transport.sync()
        seqs = np.arange(old, reserved, dtype=np.int64)
        ok = v.stamps[seqs % self.capacity] == seqs + 1
        bad = np.flatnonzero(~ok)
        new = old + (int(bad[0]) if bad.size else len(seqs))
        if new != old:
            self.transport.atomic_write(self.owner, self.base + 8 * H_COMMIT, new)
        return old, new

    def index_write_begin(self) -> None:
        """The index blocks (trees, gens) and stats are about to change (the owner, or
        a node-local writer holding the index lock)."""
        v = self.views
        if v is None:
            raise RuntimeError("index_write_begin() needs direct access to the shard")
        v.header[H_STATS_VERSION] += 1
        self.transport.sync()

    def index_write_end(self, held: int, total: float, min_mass: float,
                        max_priority: float) -> None:
        """Publish the stats and close the write (seqlock; see :meth:`index_write_begin`)."""
        v = self.views
        assert v is not None
        self.transport.sync()
        v.header[H_HELD] = held
        f = v.header.view(np.float64)
        f[H_TOTAL], f[H_MIN], f[H_MAXP] = total, min_mass, max_priority
        self.transport.sync()
        v.header[H_STATS_VERSION] += 1
        self.transport.sync()

    def publish_free(self, free: int) -> None:
        """Owner only: let writers write every seq below ``free`` (after the rows those
        seqs overwrite were hidden from the index)."""
        self.transport.sync()
        self.transport.atomic_write(self.owner, self.base + 8 * H_FREE, int(free))

    def publish_unsampled(self, rows: int) -> None:
        """Owner only: the overwritten-unsampled count that readers see in
        :meth:`read_header` (a plain store; read without the seqlock)."""
        v = self.views
        if v is None:
            raise RuntimeError("publish_unsampled() must run on the shard's owner")
        v.header[H_UNSAMPLED] = rows

    def read_header(self) -> np.ndarray:
        """A consistent copy of the shard's int64 header as last published by the owner
        (retries while the owner is writing the stats). Blocks only for the few reads
        that takes (bounded by ``timeout_s``)."""
        t = self.transport
        buf = np.empty(HEADER_WORDS, dtype=np.int64)
        deadline = Deadline(self.timeout_s, f"the shard stats on rank {self.owner} to "
                                            f"settle (they stayed mid-update)")
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
            deadline.check()
            time.sleep(0)  # the owner is mid-write: let it run (it may share this core)

    def read_stats(self) -> tuple[int, float, float, float]:
        """(rows held, total mass, min mass, max priority) as last published by the
        owner; a consistent snapshot (see :meth:`read_header`)."""
        buf = self.read_header()
        f = buf.view(np.float64)
        return int(buf[H_HELD]), float(f[H_TOTAL]), float(f[H_MIN]), float(f[H_MAXP])

    def mark_sampled(self, slots: np.ndarray, gens: np.ndarray) -> bool:
        """Record that rows (``slots`` holding generations ``gens``; slot -1: nothing)
        were drawn, in the shard's marks block. Node-local readers and the owner only
        (returns False, nothing stored, when this process cannot load the shard's
        memory: the owner then marks what it draws for that reader). Plain stores: two
        readers marking one slot at once keep one of their generations."""
        v = self.views
        if v is None:
            return False
        slots = np.asarray(slots, dtype=np.int64)
        ok = slots >= 0
        if not ok.all():
            slots, gens = slots[ok], np.asarray(gens)[ok]
        if slots.size:
            v.marks[slots] = np.maximum(v.marks[slots], gens)
        return True

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
        deadline = Deadline(self.timeout_s, f"the tree of the shard on rank {self.owner} "
                                            f"to settle (it stayed mid-update)")
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
                        inside = slots < self.capacity
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
            deadline.check()
            time.sleep(0)  # the owner is mid-write: let it run (it may share this core)

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
        while True:
            self.transport.sync()
            before = int(v.header[H_STATS_VERSION])
            if before % 2 == 0:
                gens, mass = v.gens[slots].copy(), v.tree[slots + len(v.tree) // 2].copy()
                self.transport.sync()
                if int(v.header[H_STATS_VERSION]) == before:
                    return gens, mass
            deadline.check()
            time.sleep(0)  # the owner is mid-write: let it run (it may share this core)

    # -- reader --------------------------------------------------------------------
    def stamps_of(self, slots: np.ndarray) -> np.ndarray:
        """Current stamps (``seq + 1``, 0 empty) of ``slots``."""
        slots = np.asarray(slots, dtype=np.int64)
        if self.views is not None:
            self.transport.sync()
            return self.views.stamps[slots].copy()
        out = np.empty(len(slots), dtype=np.int64)
        for i, s in enumerate(slots):  # small, used by tests and checks only
            self.transport.get(self.owner, self.base + self.layout.stamps_offset + 8 * int(s),
                               out[i:i + 1])
        self.transport.flush(self.owner)
        return out

    def gather(self, slots: np.ndarray,
               out: dict[str, np.ndarray] | None = None) -> tuple[dict[str, np.ndarray], int]:
        """Copy the rows of ``slots`` and return them with the first seq that writers
        may have written, read *after* the copy: the reserve cursor, or the free cursor
        when that is smaller (writers wait for it); a row of seq ``q`` is intact iff
        ``q + capacity >= cursor``.

        One indexed get per field when remote, ``np.take`` when direct. Blocks until the
        data is here.

        Args:
            slots (np.ndarray): slot indices (any order, repeats allowed).
            out (dict[str, np.ndarray] | None): preallocated destination arrays.
        """
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        n = len(slots)
        spec = self.layout.spec
        if out is None:
            out = spec.empty(n)
        t = self.transport
        if self.views is not None:
            if n and (slots.min() < 0 or slots.max() >= self.capacity):
                raise IndexError(f"slots outside [0, {self.capacity})")
            for f in spec:
                # mode="clip" (after the check above): numpy buffers a take with
                # out= and mode="raise", which is ~10x slower on large rows
                np.take(self.views.columns[f.name], slots, axis=0, out=out[f.name][:n],
                        mode="clip")
            t.sync()
        elif n:
            for f in spec:
                t.get_blocks(self.owner, self.base + self.layout.column(f.name), f.row_bytes,
                             slots * f.row_bytes, out[f.name][:n])
            t.flush(self.owner)
        reserved = self.reserve_cursor()
        if self.views is not None:
            t.sync()
            free = int(self.views.header[H_FREE])
        else:
            free = self.free_cursor()
        return out, min(reserved, free) if free else reserved

    def intact(self, gens: np.ndarray, cursor: int) -> np.ndarray:
        """The ring's one rule for copied rows: per generation (``seq + 1``; 0 or less:
        nothing was drawn), whether that row was still intact when it was copied, given
        the writers' ``cursor`` that :meth:`gather` returned with the copy
        (``seq + capacity >= cursor``: no writer was handed, or let write, its slot)."""
        g = np.asarray(gens, dtype=np.int64)
        return (g > 0) & ((g - 1) + self.capacity >= cursor)

    def read_committed(self) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """Every committed row currently held, oldest first (owner or direct readers).

        Returns:
            tuple: (seqs, columns, initial priorities).
        """
        v = self.views
        if v is None:
            raise RuntimeError("read_committed() needs direct access to the shard")
        self.transport.sync()
        commit = int(v.header[H_COMMIT])
        lo = max(0, commit - self.capacity)
        seqs = np.arange(lo, commit, dtype=np.int64)
        slots = seqs % self.capacity
        keep = v.stamps[slots] == seqs + 1
        seqs, slots = seqs[keep], slots[keep]
        cols = {n: c[slots].copy() for n, c in v.columns.items()}
        return seqs, cols, v.priority[slots].copy()
