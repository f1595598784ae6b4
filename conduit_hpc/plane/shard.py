"""The owner's side of one shard: commits, the guard band, the free cursor, drawing.

:class:`OwnedShard` is what a buffer rank keeps per shard it owns; the
:class:`~conduit_hpc.plane.buffer.BufferServer` loop runs its :meth:`~OwnedShard.poll`
every pass and draws rows through it. Local: no collective, no message.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from conduit_hpc.plane.frame_breaks import FrameBreaks
from conduit_hpc.protocol import SampleReply
from conduit_hpc.sampling import ShardDrawer
from conduit_hpc.storage.priority import PriorityIndex
from conduit_hpc.storage.ring import H_COMMIT, H_FREE, ShardRing
from conduit_hpc.storage.shared_index import lock_index, unlock_index

__all__ = ["OwnedShard"]


@dataclass(eq=False)
class OwnedShard:
    """A shard this rank owns: its ring client, priority index and drawer, and the
    owner's side of the ring protocol (commits, the guard band, the free cursor).

    **Guard band** (when ``guarded``: the job has learners). Each pass measures the
    committed rows per second (``rate``, over windows of at least 2 ms) and the time
    between passes (``gap``), and hides from the index the oldest rows that writers
    will reach within ``guard_s + gap``:
    ``guard = min(capacity // 2, ceil(rate * (guard_s + gap)))`` rows ahead of the
    reserve cursor (once writers are past the first lap), so that at least half of the
    ring past the writers stays sampleable.
    Only then does it publish the **free cursor** ``F = min(commit + capacity // 2,
    reserved + guard)`` - held where a learner's read pin holds it, and the rows hidden
    are exactly those below ``F`` (a learner that redraws under a pin always finds the
    rows between ``F`` and the writers it holds back). Hidden rows keep their
    generation and priority (:meth:`PriorityIndex.hide`): once writers have reserved
    nothing for ``idle_s`` the owner takes ``F`` back to the reserve cursor
    (:meth:`_revoke`) and the band's rows are drawable again with the priority last
    given to them (``unhidden_rows``; ``guard_row_s`` counts the row-seconds rows spent
    hidden ahead of the writers). Writers wait for ``F`` before they write a slot, so a row a
    learner could draw is never being written, one drawn at time ``t`` is not
    overwritten before ``t + guard_s`` (while passes keep their pace), and at least half
    of a full ring stays committed and drawable (writers cannot run more than half a
    ring ahead of the owner's commits; see :meth:`_keep` for batches larger than that).
    When not ``guarded``, only rows already handed to writers are hidden and
    ``F = commit + capacity`` (the plain one-lap rule).
    With frame stacks (``storage/frames.py``) a row breaks when the slot of its oldest
    frame is handed to a writer, which comes before its own (by its lag): the owner
    remembers at commit where each row breaks and hides it with the band that reaches
    that slot (``frame_hidden_rows``: times a row was hidden for its frames), so that
    learners do not draw rows whose frames are gone (each such draw cost a redraw
    round, under a read pin). A band given back to idle writers gives back the rows it
    hid for their frames too, and keeps hidden those whose frames' slots were handed
    to a writer: after every pass a row is hidden iff its break is below the hidden
    cursor.
    A write from the owner's own process (a feature storing rows) that waits for ``F``
    runs the owner's pass itself (``ring.on_wait``).

    **Commit interval** (when ``guarded``): a bounded pass (the buffer loop's) is
    skipped while fewer than ``max_commit_rows`` rows wait to be committed, no writer
    waits for ``F`` and the last pass was less than ``commit_interval_s`` ago: each
    pass that commits takes the index lock and rewrites the tree, and node-local
    learners wait for the lock or search again (with actors inserting flat out, nearly
    every pass of a spinning loop would).
    Rows become drawable at most that much later; the pass gap the guard band adds
    grows with it. Unbounded passes (a request's, a writer's ``on_wait``) always run.

    **Ingest policy** ``block``: ``F`` also stops at the first row that is drawable
    (in the index with mass > 0) and that no learner has drawn yet (its mark is older):
    writers wait until a learner draws it. While writers wait on such a row for
    ``block_timeout_s``, the owner lets them overwrite it anyway (counted in
    ``block_releases``); once every learner is done (``block`` set False) nothing blocks.

    **Overwritten unsampled**: rows committed into this shard whose slot received a
    newer committed row while the slot's mark showed no learner had drawn them (counted
    when the newer row commits; a draw counts once it is searched or sampled, even if
    its row then proved overwritten).

    Attributes:
        shard_id (int): global shard number.
        ring (ShardRing): direct access to the memory.
        index (PriorityIndex): priorities of visible rows.
        drawer (ShardDrawer | None): the sampler's owner side (default: tree search).
        hidden_upto (int): the rows that seqs below this overwrite are hidden.
        restored_commit (int): the commit cursor a checkpoint restored (0: none); the
            rows below it are an earlier run's.
        guarded (bool): keep a guard band and gate writers on it (see above).
        guard_s (float): safety time of the guard band.
        block (bool): the ``block`` ingest policy is in force.
        block_timeout_s (float): longest hold of writers on one undrawn row.
        max_commit_rows (int): commits (and index inserts) per bounded pass.
        commit_interval_s (float): longest wait of committed rows for a bounded pass
            (see above; 0: every bounded pass runs).
        pins (np.ndarray | None): int64 ``[ranks, 2]`` read pins in this rank's memory:
            ``(shard id + 1, F)`` while a learner redraws rows of this shard - the free
            cursor does not pass ``F`` (the one the learner read) until it unpins, so
            the rows it draws meanwhile stay intact (writers wait that long).
    """

    shard_id: int
    ring: ShardRing
    index: PriorityIndex
    drawer: ShardDrawer | None = None
    hidden_upto: int = 0
    restored_commit: int = 0
    guarded: bool = False
    guard_s: float = 0.005
    block: bool = False
    block_timeout_s: float = 1.0
    max_commit_rows: int = 1 << 12
    commit_interval_s: float = 0.0
    pins: np.ndarray | None = field(default=None, repr=False)
    overwritten_unsampled: int = 0
    block_releases: int = 0
    rate_rows_s: float = 0.0
    guard_rows: int = 0
    #: give the guard band back to sampling once writers are idle this long
    idle_s: float = 0.02
    restore_idle: bool = True
    #: every writer of the job is done: the band is given back without waiting idle_s
    writers_gone: bool = False
    revocations: int = 0  # times idle writers' free cursor was taken back
    unhidden_rows: int = 0  # guard-band rows made drawable again (writers went idle)
    guard_row_s: float = 0.0  # row-seconds rows spent hidden ahead of the writers
    guard_rows_max: int = 0  # the most rows hidden ahead of the writers at once
    frame_hidden_rows: int = 0  # rows hidden because their oldest frame's slot was due
    #: where rows of frame stacks break (plane/frame_breaks.py)
    frames: FrameBreaks = field(init=False, repr=False)
    _dirty: bool = True
    _free: int = field(default=-1, repr=False)
    _rate_at: tuple[float, int] | None = field(default=None, repr=False)
    _last_pass: float = field(default=0.0, repr=False)
    _gap_s: float = field(default=0.0, repr=False)
    _stuck_since: float | None = field(default=None, repr=False)
    _stall_since: float | None = field(default=None, repr=False)
    _last_reserved: int = field(default=-1, repr=False)
    _reserved_at: float = field(default=0.0, repr=False)
    _guard_at: float = field(default=0.0, repr=False)
    _guard_n: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        self.frames = FrameBreaks(self.ring)
        if self.drawer is None:
            from conduit_hpc.sampling import TreeDrawer

            self.drawer = TreeDrawer()
        self.ring.on_wait = self.poll  # this process's own writes may not wait on itself
        v = self.ring.views
        if self.guarded and v is not None and int(v.header[H_FREE]) == 0:
            # gate the second lap on this owner from the start: writers never use the
            # plain one-lap rule, which could run ahead of a free cursor published later
            self.ring.publish_free(self.ring.capacity)
            self._free = self.ring.capacity

    @property
    def committed(self) -> int:
        """Rows committed into this shard since it was created (or restored)."""
        assert self.ring.views is not None
        return int(self.ring.views.header[1])

    def _measure(self, now: float, commit: int) -> None:
        """Update the insert rate and the pass gap."""
        if self._last_pass:
            gap = now - self._last_pass
            self._gap_s = gap if gap > self._gap_s else 0.9 * self._gap_s + 0.1 * gap
        self._last_pass = now
        if self._rate_at is None or commit < self._rate_at[1]:
            self._rate_at = (now, commit)
            return
        t0, c0 = self._rate_at
        if now - t0 >= 0.002:
            rate = (commit - c0) / (now - t0)
            self.rate_rows_s = max(rate, 0.5 * self.rate_rows_s) if rate > 0 else 0.0
            self._rate_at = (now, commit)

    def _guard(self, reserved: int) -> int:
        if not self.guarded or self.rate_rows_s <= 0 or reserved < self.ring.capacity:
            return 0  # no measured inserts, or the writers are still in the first lap
        want = math.ceil(self.rate_rows_s * (self.guard_s + min(self._gap_s, 0.1)))
        return min(self.ring.capacity // 2, want)

    def _keep(self, old: int, new: int, reserved: int, now: float) -> int:
        """Rows of the ring that writers may not run ahead of the commit cursor into:
        half of it, so that at least half stays committed and sampleable (writers
        then wait for the owner's commits), unless commits have stalled for 20 ms
        while writers wait (a batch larger than half the ring needs it all)."""
        if new > old or reserved <= self._free:
            self._stall_since = None
            return self.ring.capacity // 2
        if self._stall_since is None:
            self._stall_since = now
        return 0 if now - self._stall_since > 0.02 else self.ring.capacity // 2

    def _held_back(self, free: int, want: int, reserved: int, now: float, old: int) -> int:
        """``block`` policy: ``want`` cut at the first drawable row no learner drew
        (released after ``block_timeout_s`` of writers waiting on it). Rows committed
        in this pass (seqs from ``old`` on) count as drawable: they are about to be."""
        cap = self.ring.capacity
        v = self.ring.views
        assert v is not None
        seqs = np.arange(max(free, cap), want, dtype=np.int64)
        if seqs.size == 0:
            self._stuck_since = None
            return want
        victims = seqs - cap
        slots = victims % cap
        drawable = (((self.index.gens[slots] == victims + 1) & (self.index.sum[slots] > 0))
                    | (victims >= old))
        undrawn = np.flatnonzero(drawable & (v.marks[slots] < victims + 1))
        if undrawn.size == 0:
            self._stuck_since = None
            return want
        cut = int(seqs[undrawn[0]])
        if reserved <= cut:  # no writer waits on it yet
            self._stuck_since = None
            return cut
        if self._stuck_since is None:
            self._stuck_since = now
        elif now - self._stuck_since >= self.block_timeout_s:
            self.block_releases += 1
            self._stuck_since = None
            return want
        return cut

    def _pinned(self) -> int:
        """The smallest free cursor a learner's read pin on this shard holds (a huge
        number when none does)."""
        if self.pins is not None:
            mine = self.pins[:, 0] == self.shard_id + 1
            if mine.any():
                return int(self.pins[mine, 1].min())
        return 1 << 62

    def _idle(self, reserved: int, now: float) -> bool:
        """Whether writers have reserved nothing for :attr:`idle_s` (``reserved`` is
        the reserve cursor read in this pass)."""
        if reserved != self._last_reserved:
            self._last_reserved, self._reserved_at = reserved, now
            return False
        return now - self._reserved_at >= self.idle_s

    def band_held(self) -> bool:
        """Whether a guard band hides rows that no writer has reserved (and idle
        writers would be given back)."""
        return self.restore_idle and self.hidden_upto > max(self.ring.reserve_cursor(),
                                                            self.ring.capacity)

    def _revoke(self, published: int, reserved: int) -> bool:
        """Writers are idle: take the free cursor back to the reserve cursor, so that
        the guard band's rows (hidden, not yet written) can be drawn again. Safe against
        a writer reserving meanwhile: the cursor is lowered first, then the reserve
        cursor read again (both MPI atomics, in that order); a writer that reserved in
        between may have read the old value, and then it is put back. Returns whether
        the lower value stands."""
        ring = self.ring
        ring.publish_free(reserved)
        if ring.reserve_cursor() == reserved:
            return True
        ring.publish_free(published)  # a writer came: it may rely on the old cursor
        return False

    def poll(self, *, bounded: bool = False, writers_done: bool = False) -> int:
        """One owner pass over the shard: advance commits (at most ``max_commit_rows``
        when ``bounded``), count overwritten-unsampled rows, make the new rows visible,
        move the guard band (hide the rows writers may take next, or give back to
        sampling those that idle writers will not take; ``writers_done``: every writer
        said it is done, so they are idle now, however recently they wrote), publish
        stats and the free cursor. Returns rows made visible. Local; never blocks."""
        ring, cap = self.ring, self.ring.capacity
        v = ring.views
        assert v is not None
        if bounded and self.guarded and self.commit_interval_s and self._coalesce():
            return 0
        old, new = ring.advance_commits(self.max_commit_rows if bounded else None)
        now = time.monotonic()
        self._measure(now, new)
        if new > old and new > cap:
            victims = np.arange(max(old, cap) - cap, new - cap, dtype=np.int64)
            self.overwritten_unsampled += int(np.count_nonzero(
                v.marks[victims % cap] < victims + 1))
        reserved = ring.reserve_cursor()
        self.guard_rows = guard = self._guard(reserved)
        limit = new + cap  # two writers never write one slot
        ring.transport.sync()
        # never below what writers may already have been let write (readers' intact
        # check relies on it) - unless idle writers give it back (_revoke)
        published = int(v.header[H_FREE])
        hide_from = self.hidden_upto
        if writers_done:  # for good: a later pass must not hide the band again
            self.writers_gone = True
        idle = (self._idle(reserved, now) or self.writers_gone) and self.restore_idle
        if not self.guarded:  # the plain one-lap rule
            hide_to, free = max(hide_from, min(limit, reserved)), limit
        else:
            bound = limit - self._keep(old, new, reserved, now)
            free = min(bound, reserved + guard)
            if idle:  # no band ahead of idle writers (it comes back with their next
                # reservation): else each pass after a revocation hid it again
                free = min(free, max(published, reserved))
            if self.block:
                free = self._held_back(hide_from, free, reserved, now, old)
            # a read pin holds the cursor where its learner read it; the rows hidden
            # are exactly those writers may take (hiding more would leave a learner
            # that redraws under a pin nothing to draw while writers wait for the pin)
            free = min(max(min(free, self._pinned()), published), limit)
            if (idle and published > reserved
                    and hide_from > max(reserved, cap) and self._revoke(published, reserved)):
                self.revocations += 1
                free = published = reserved
            hide_to = free
        self._account_guard(now, max(0, min(hide_to, limit) - reserved))
        self.hidden_upto = hide_to
        if new > old or hide_to != hide_from or self._dirty:
            # the slots, generations and initial priorities are worked out before the
            # lock is taken (node-local learners wait for it): committed rows' are the
            # writers' and final
            lo = max(old, new - cap)
            gens = np.arange(lo + 1, new + 1, dtype=np.int64)  # seq + 1
            ins = (gens - 1) % cap
            ins_prio = v.priority[ins]
            band = max(hide_from, cap), hide_to  # seqs whose slots' old rows are hidden
            if hide_to < hide_from:  # idle writers: the band's rows are drawable again
                band = max(hide_to, cap), hide_from
            seqs = np.arange(*band, dtype=np.int64)
            slots, olds = seqs % cap, seqs - cap + 1
            fb = self.frames
            fb.track(ins, gens - 1)
            broken = fb.due(hide_to)
            back = fb.back(hide_to, reserved) if hide_to < hide_from else None
            fb.forget(reserved)
            if hide_to < hide_from:  # a band row whose oldest frame is gone stays hidden
                brk = fb.breaks(slots, olds - 1)
                if brk is not None:
                    keep = brk >= hide_to
                    slots, olds = slots[keep], olds[keep]
            with self.writing():
                if len(ins):
                    self.index.insert(ins, gens, ins_prio)
                if broken is not None:  # (before the band: a row it hides is counted)
                    self.frame_hidden_rows += self.index.hide(*broken)
                if hide_to > hide_from:  # (after the insert: a row just committed stays)
                    self.index.hide(slots, olds)
                elif hide_to < hide_from:
                    self.unhidden_rows += self.index.unhide(slots, olds)
                    if back is not None:  # rows whose frames were due only for the band
                        self.unhidden_rows += self.index.unhide(*back)
        ring.publish_unsampled(self.overwritten_unsampled)
        ring.transport.sync()
        if self.guarded:
            # a pin that appeared during the hide: hold the cursor there (never below
            # what is published); the rows hidden beyond it are given back next pass
            free = min(max(min(free, self._pinned()), published), limit)
        else:
            free = max(free, published)
        if free != published:
            ring.publish_free(free)
            self._free = free
        return new - old

    def _coalesce(self) -> bool:
        """Whether a bounded pass may wait (see "Commit interval" above): the last
        pass was less than ``commit_interval_s`` ago, fewer than ``max_commit_rows``
        rows wait for a commit, no writer waits for the free cursor (one that reserved
        past it: a small ring's writers reach it between passes), and no earlier
        change waits to be applied."""
        v = self.ring.views
        assert v is not None
        if self._dirty or time.monotonic() - self._last_pass >= self.commit_interval_s:
            return False
        reserved = self.ring.reserve_cursor()
        return (reserved - int(v.header[H_COMMIT]) < self.max_commit_rows
                and reserved <= int(v.header[H_FREE]))

    def track_held_frames(self) -> None:
        """Forget which rows break early and track those the index holds now (after a
        restore wrote the ring and the index; :meth:`FrameBreaks.track_held`)."""
        self.frames.track_held(self.index)
        self._dirty = True  # the next pass hides what broke

    def _account_guard(self, now: float, rows: int) -> None:
        """Row-seconds that rows spent hidden ahead of the writers (the guard band)."""
        if self._guard_at:
            self.guard_row_s += self._guard_n * (now - self._guard_at)
        self._guard_at, self._guard_n = now, rows
        self.guard_rows_max = max(self.guard_rows_max, rows)

    def mark(self, slots: np.ndarray, gens: np.ndarray, window: int = 1) -> None:
        """Record that the rows of ``slots`` (and the ``window - 1`` after each) were
        drawn for a learner. Local."""
        slots = np.asarray(slots, dtype=np.int64)
        if window > 1:
            ok = slots >= 0
            offs = np.arange(window)[None, :]
            slots = ((slots[ok][:, None] + offs) % self.ring.capacity).reshape(-1)
            gens = (np.asarray(gens)[ok][:, None] + offs).reshape(-1)
        self.ring.mark_sampled(slots, gens)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the shard's index lock (no node-local learner writes the index
        meanwhile): for a consistent copy of it, e.g. a checkpoint's cut. Without
        learners (not ``guarded``) nobody else writes it, and no lock is taken: its
        atomics would only compete with the writers' for the window."""
        if self.guarded:
            lock_index(self.ring, self.ring.owner)
        try:
            yield
        finally:
            if self.guarded:
                unlock_index(self.ring, self.ring.owner)

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Change the index under the shard's index lock (node-local learners write
        their priority updates into it too) and inside its seqlock, then publish its
        stats, so that node-local readers searching the tree see a consistent state or
        retry."""
        ring = self.ring
        with self.locked():
            ring.index_write_begin()
            try:
                yield
            finally:
                assert self.drawer is not None
                self.drawer.changed()
                ring.index_write_end(*self.drawer.stats(self.index))
                self._dirty = False

    def span(self) -> float:
        """The range the sampler's targets for this shard are drawn from."""
        assert self.drawer is not None
        return self.drawer.span(self.index)

    def sample(self, targets: np.ndarray) -> SampleReply:
        """Rows for ``targets``: slot, generation and mass of each; slot -1 where the
        shard has nothing to draw right now (every row hidden while being overwritten) -
        the learner draws again. Local."""
        assert self.drawer is not None
        slots, gens, mass = self.drawer.draw(self.index, targets)
        held, total, mn, _ = self.drawer.stats(self.index)
        return SampleReply(0, self.shard_id, slots, gens, mass, held, total, mn)
