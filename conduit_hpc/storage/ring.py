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
  detected, never returned. With frame stacks (each frame stored once, see
  :mod:`conduit_hpc.storage.frames`) a row also references the slots of its frames, and
  the same rule is applied to its oldest frame: the gather returns the cursor per row,
  raised by the row's lag (``seq - oldest frame's seq``).

Storage never sees an ``MPI.Win``: it talks to a :class:`~conduit_hpc.transport.base.Transport`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping

import numpy as np

from conduit_hpc.errors import IngestAbandoned, SpecError
from conduit_hpc.storage import index_kernels, tree_kernels
from conduit_hpc.storage.frames import FrameWriter
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
    RingSegment,
    ShardLayout,
    ShardViews,
    ring_segments,
)
from conduit_hpc.storage.ring_index import IndexReads
from conduit_hpc.transport.base import Transport
from conduit_hpc.wait import Deadline

__all__ = ["H_COMMIT", "H_FREE", "H_RESERVE", "H_UNSAMPLED", "RingSegment", "ShardLayout",
           "ShardRing", "ShardViews", "ring_segments"]

class ShardRing(IndexReads):
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
        self.rows_written = self.slots_written = 0  # slots: frames-only ones included
        self.lap_waits = 0  # writes that waited for the free (or commit) cursor
        self.lap_wait_s = 0.0  # ... and the seconds they waited
        #: run while a write waits for the free cursor (the owner's pass, when this
        #: process owns the shard: its own writes must not wait on itself)
        self.on_wait: Callable[[], object] | None = None
        #: the frames this client wrote (frame-stack layout only; see storage/frames)
        self.frames: FrameWriter | None = None
        #: seqs a write reserved, left uncommitted (no commit passes: later writes refused)
        self.abandoned: str | None = None
        #: run (best effort) with the error when a write fails after reserving its seqs:
        #: the data plane marks the job failed there, so every rank stops
        self.on_abandon: Callable[[BaseException], object] | None = None

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

        A write that fails after reserving (lap wait timed out, interrupt, transport)
        leaves a gap no later commit passes: it runs :attr:`on_abandon` and re-raises
        (a note names the seqs); later writes raise :class:`IngestAbandoned`.

        Args:
            batch (dict[str, np.ndarray]): output of :meth:`Spec.validate`.
            priorities (np.ndarray | None): float64 initial priority per row, or None.

        Raises:
            SpecError: more rows than the shard's capacity.
            DataPlaneTimeout: a lapped writer did not commit within ``timeout_s``.
            IngestAbandoned: an earlier write of this client failed after reserving.
        """
        if self.abandoned is not None:
            raise IngestAbandoned(
                f"an earlier write reserved {self.abandoned} of the shard at rank "
                f"{self.owner} and failed before committing them; the shard's commit "
                f"cursor cannot pass them, so the job stops (its first error says why)")
        n = self.layout.spec.rows_of(batch)
        lay, plan = self.layout, None
        if lay.frames is not None and n:  # each frame once: which frames are new
            if self.frames is None:
                self.frames = FrameWriter(lay.frames)
            plan = self.frames.plan(batch, self.reserve_cursor(), self.capacity)
        slots = n if plan is None else plan.slots
        if slots > self.capacity:
            raise SpecError(f"batch of {n} rows (taking {slots} slots) exceeds the shard "
                            f"capacity of {self.capacity} rows; split it or raise "
                            f"storage.capacity_rows")
        if n == 0:
            return self.reserve_cursor()
        prio = None if priorities is None else np.ascontiguousarray(priorities, dtype=np.float64)
        try:  # an interrupt may land after the add, inside the call: reserved, unknown
            first = self.transport.fetch_add(self.owner, self.base + 8 * H_RESERVE, slots)
        except BaseException as err:
            self._abandon(None, slots, err)
            raise
        try:
            self._wait_lap(first + slots)
            cols: Mapping[str, np.ndarray] = batch
            if plan is not None:
                assert self.frames is not None
                cols, prio = self.frames.columns(plan, batch, first, prio)
            self._fill(cols, prio, n, first, slots)
        except BaseException as err:
            self._abandon(first, slots, err)
            raise
        self.rows_written, self.slots_written = self.rows_written + n, self.slots_written + slots
        return first

    def _abandon(self, first: int | None, slots: int, err: BaseException) -> None:
        """A write failed after reserving ``first`` (``None``: inside the add) on."""
        self.abandoned = (f"seqs {first}..{first + slots - 1}" if first is not None else
                          f"(maybe: interrupted inside the atomic add) {slots} seqs")
        err.add_note(f"{self.abandoned} of the shard at rank {self.owner} were reserved by this "
                     f"write, left uncommitted: no later row can become visible; the job stops")
        if self.on_abandon is not None:
            with contextlib.suppress(Exception):  # best effort: the transport may be gone
                self.on_abandon(err)

    def _fill(self, cols: Mapping[str, np.ndarray], prio: np.ndarray | None, n: int,
              first: int, slots: int) -> None:
        """Copy the columns and priorities into the reserved slots, then stamp them."""
        t, lay = self.transport, self.layout
        segs = ring_segments(first, slots, self.capacity)
        gens = np.arange(first + 1, first + slots + 1, dtype=np.int64)
        if self.views is not None:
            v = self.views
            for s in segs:
                for name, col in v.columns.items():  # a column may be shorter: its head
                    m = max(0, min(s.count, len(cols[name]) - s.src))
                    col[s.slot:s.slot + m] = cols[name][s.src:s.src + m]
                v.priority[s.slot:s.slot + s.count] = (np.nan if prio is None
                                                       else prio[s.src:s.src + s.count])
            t.sync()
            for s in segs:
                v.stamps[s.slot:s.slot + s.count] = gens[s.src:s.src + s.count]
            t.sync()
            return
        if prio is None:
            prio = np.full(n, np.nan)
        for s in segs:
            for f in lay.stored:
                m = max(0, min(s.count, len(cols[f.name]) - s.src))
                if m:
                    t.put(self.owner, self.base + lay.column(f.name) + s.slot * f.row_bytes,
                          cols[f.name][s.src:s.src + m])
            t.put(self.owner, self.base + lay.priority_offset + 8 * s.slot,
                  prio[s.src:s.src + s.count])
        t.flush(self.owner)
        for s in segs:
            t.put(self.owner, self.base + lay.stamps_offset + 8 * s.slot,
                  gens[s.src:s.src + s.count])
        t.flush(self.owner)

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
        deadline = Deadline(self.timeout_s, f"the owner ({self.owner_named}) to free the "
                                            f"slots of seqs before {end}")
        pause = min(self.poll_interval_s, 0.00005)
        while not self._may_write(end):
            if self.on_wait is not None:
                self.on_wait()
                if self._may_write(end):
                    break
            deadline.check(self._stall)
            time.sleep(pause)
            pause = min(2 * pause, self.poll_interval_s)
        self.lap_waits += 1
        self.lap_wait_s += time.monotonic() - t0

    def _stall(self) -> str:
        """Why a lapped writer still waits (its timeout's message)."""
        c, f = self.commit_cursor(), self.free_cursor()
        if c < self.reserve_cursor() and self.stamps_of(np.array([c % self.capacity]))[0] <= c:
            return (f"commit cursor {c}, free cursor {f}: seq {c} was reserved by a writer "
                    f"that has not written it (stopped between reserving and committing?)")
        return f"commit cursor {c}, free cursor {f}; is its owner still serving?"

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
        v.header[H_STATS_VERSION] |= 1  # odd, also after a write an interrupt left open
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
        v.header[H_STATS_VERSION] = (int(v.header[H_STATS_VERSION]) | 1) + 1  # even: not a
        self.transport.sync()  # toggle, so an interrupted write never inverts the parity

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

    def mark_sampled(self, slots: np.ndarray, gens: np.ndarray) -> bool:
        """Record that rows (``slots`` holding generations ``gens``; slot -1: nothing)
        were drawn, in the shard's marks block. Node-local readers and the owner only
        (returns False, nothing stored, when this process cannot load the shard's
        memory: the owner then marks what it draws for that reader). Plain stores: two
        readers marking one slot at once keep one of their generations."""
        v = self.views
        if v is None:
            return False
        if index_kernels.mark(v.marks, slots, gens):  # compiled, where numba is there
            return True
        slots = np.asarray(slots, dtype=np.int64)
        ok = slots >= 0
        if not ok.all():
            slots, gens = slots[ok], np.asarray(gens)[ok]
        if slots.size:
            np.maximum.at(v.marks, slots, np.asarray(gens, dtype=np.int64))
        return True

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

    def gather(self, slots: np.ndarray, out: dict[str, np.ndarray] | None = None
               ) -> tuple[dict[str, np.ndarray], int | np.ndarray]:
        """Copy the rows of ``slots`` and return them with the first seq that writers
        may have written, read *after* the copy: the reserve cursor, or the free cursor
        when that is smaller (writers wait for it); a row of seq ``q`` is intact iff
        ``q + capacity >= cursor`` (:meth:`intact`). With frame stacks the stacks are
        rebuilt from the frames the rows reference, and the cursor is one per row,
        raised by the row's lag (how far its oldest frame lies before it).

        One indexed get per stored column when remote, ``np.take`` when direct. Blocks
        until the data is here.

        Args:
            slots (np.ndarray): slot indices (any order, repeats allowed).
            out (dict[str, np.ndarray] | None): preallocated destination arrays.
        """
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        n = len(slots)
        if out is None:
            out = self.layout.spec.empty(n)
        if n:
            lo, hi = tree_kernels.span(slots)
            if lo < 0 or hi >= self.capacity:
                raise IndexError(f"slots outside [0, {self.capacity})")
        codec = self.layout.frames
        if codec is not None:
            lag = codec.gather(self._read_column, slots, out, self.capacity)
            return out, self._writers_cursor() + lag
        if n:
            for f in self.layout.spec:
                self._read_column(f.name, slots, out[f.name][:n], flush=False)
            if self.views is None:  # the gets complete here (a direct copy is done)
                self.transport.flush(self.owner)
        return out, self._writers_cursor()

    def _read_column(self, name: str, slots: np.ndarray, dst: np.ndarray,
                     flush: bool = True) -> None:
        """Copy the rows ``slots`` (checked) of stored column ``name`` into ``dst``."""
        if self.views is not None:
            # mode="clip" (slots are checked): numpy buffers a take with out= and
            # mode="raise", which is ~10x slower on large rows
            # (the method, not np.take: its wrapper costs a call per column per batch)
            self.views.columns[name].take(slots, axis=0, out=dst, mode="clip")
        elif len(slots):
            f = self.layout.stored[name]
            self.transport.get_blocks(self.owner, self.base + self.layout.column(name),
                                      f.row_bytes, slots * f.row_bytes, dst)
            if flush:
                self.transport.flush(self.owner)

    def _writers_cursor(self) -> int:
        """After a copy: the first seq writers may have written (see :meth:`gather`)."""
        t = self.transport
        t.sync()
        if self.views is not None:  # loads after the barrier (the atomics' memory)
            head = self.views.header
            reserved, free = int(head[H_RESERVE]), int(head[H_FREE])
        else:
            reserved, free = self.reserve_cursor(), self.free_cursor()
        return min(reserved, free) if free else reserved

    def intact(self, gens: np.ndarray, cursor: int | np.ndarray) -> np.ndarray:
        """The ring's one rule for copied rows: per generation (``seq + 1``; 0 or less:
        nothing was drawn), whether that row was still intact when it was copied, given
        the writers' ``cursor`` that :meth:`gather` returned with the copy
        (``seq + capacity >= cursor``: no writer was handed, or let write, its slot -
        nor, with frame stacks, the slot of any frame it references: that cursor is
        per row, raised by the row's lag)."""
        g = np.asarray(gens, dtype=np.int64)
        return (g > 0) & ((g - 1) + self.capacity >= cursor)

    def all_intact(self, gens: np.ndarray, cursor: int | np.ndarray) -> bool:
        """Whether :meth:`intact` holds for every row of ``gens`` (one reduction where
        the cursor is one for all rows: the rule is monotone in the generation)."""
        g = np.asarray(gens, dtype=np.int64)
        if not g.size:
            return True
        if isinstance(cursor, int) or np.ndim(cursor) == 0:
            low = tree_kernels.span(g)[0] if g.ndim == 1 else int(g.min())
            return low > 0 and (low - 1) + self.capacity >= int(cursor)
        if isinstance(cursor, np.ndarray):  # a cursor per row: one compiled pass
            done = tree_kernels.rows_intact(g, cursor, self.capacity)
            if done is not None:
                return done
        return bool(self.intact(g, cursor).all())

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
        if self.layout.frames is None:
            return seqs, {n: c[slots].copy() for n, c in v.columns.items()}, \
                v.priority[slots].copy()
        cols, cursor = self.gather(slots)  # frames: only rows whose frames are held
        ok = self.intact(seqs + 1, cursor)
        return seqs[ok], {n: c[ok] for n, c in cols.items()}, v.priority[slots[ok]]
