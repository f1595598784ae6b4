"""Where a shard's rows of frame stacks break: the owner's record of it.

With frame stacks (``storage/frames.py``) a row breaks when the slot of its oldest frame
is handed to a writer, which comes before its own slot's turn (by the row's lag). The
owner (:class:`~conduit_hpc.plane.shard.OwnedShard`) remembers at commit where each such
row breaks (:meth:`FrameBreaks.track`) and hides it once its hidden cursor reaches that
point (:meth:`FrameBreaks.due`), so that learners never draw a row whose frames are gone.
When idle writers give the guard band back, the rows hidden only because their frames'
slots were in the band become drawable again and are tracked anew
(:meth:`FrameBreaks.back`): after every pass a row is hidden iff its break lies below
the hidden cursor. Local; plain numpy. The plain layout tracks nothing.
"""

from __future__ import annotations

import heapq

import numpy as np

from conduit_hpc.storage.frames import LAG_COLUMN, LAG_NONE
from conduit_hpc.storage.priority import PriorityIndex
from conduit_hpc.storage.ring import ShardRing

__all__ = ["FrameBreaks"]

Rows = tuple[np.ndarray, np.ndarray]  # (slots, generations)


class FrameBreaks:
    """The rows of one shard that break before their own slot comes round.

    Args:
        ring (ShardRing): the owner's ring client (its lag column is read).

    Attributes:
        pending (list): a heap of (least break, order, int64 ``[3, rows]``: breaks,
            slots, generations), one entry per pass that committed such rows (~100
            bytes per entry besides the 24 per row).
        fired (list[np.ndarray]): the rows :meth:`due` handed out to be hidden (int64
            ``[3, rows]`` each, in that order), kept while a give-back of the band could
            make them drawable again.
    """

    def __init__(self, ring: ShardRing) -> None:
        self.ring = ring
        self.pending: list[tuple[int, int, np.ndarray]] = []
        self.fired: list[np.ndarray] = []
        self._n = 0

    def breaks(self, slots: np.ndarray, seqs: np.ndarray, *,
               sealed: bool = False) -> np.ndarray | None:
        """For committed rows (their ``slots`` and ``seqs``), the reserve cursor past
        which a row breaks (its oldest frame's slot handed to a writer: ``seq - lag +
        capacity``; a row without older frames: its own slot's, ``seq + capacity``; lag
        :data:`LAG_NONE`, a slot with frames only, too - or, with ``sealed``, at once: a
        restored row whose frames the cut lacked). ``None`` for the plain layout."""
        v = self.ring.views
        col = None if v is None else v.columns.get(LAG_COLUMN)
        if col is None:
            return None
        lag = col[slots]
        brk = seqs - np.where((lag > 0) & (lag < LAG_NONE), lag, 0) + self.ring.capacity
        if sealed:
            brk[lag >= LAG_NONE] = -1
        return brk

    def _push(self, rows: np.ndarray) -> None:
        heapq.heappush(self.pending, (int(rows[0].min()), self._n, rows))
        self._n += 1

    def track(self, slots: np.ndarray, seqs: np.ndarray, *, sealed: bool = False) -> None:
        """Remember where the rows just committed (their ``slots`` and ``seqs``) break,
        those that break before their own slot is reached (frame stacks only; the plain
        layout returns at once)."""
        if not len(seqs) or self.ring.layout.frames is None:
            return
        brk = self.breaks(slots, seqs, sealed=sealed)
        if brk is None:
            return
        early = brk < seqs + self.ring.capacity
        if early.any():
            self._push(np.stack([brk[early], slots[early], seqs[early] + 1]))

    def track_held(self, index: PriorityIndex) -> None:
        """Forget what was tracked and track the rows ``index`` holds now (after a
        restore wrote the ring and the index); those with mass only (a slot with frames
        only is never drawn, and needs no hiding)."""
        self.pending.clear()
        self.fired.clear()
        held = np.flatnonzero((index.gens > 0) & (index.sum.leaves > 0))
        self.track(held, index.gens[held] - 1, sealed=True)

    def due(self, upto: int) -> Rows | None:
        """The tracked rows that break below hidden cursor ``upto``, to hide (a row
        since overwritten is left alone by the index's generation filter); the rest stay
        tracked."""
        h, out = self.pending, []
        while h and h[0][0] < upto:
            _, n, rows = heapq.heappop(h)
            now = rows[0] < upto
            out.append(rows[:, now])
            if not now.all():
                later = rows[:, ~now]
                heapq.heappush(h, (int(later[0].min()), n, later))
        if not out:
            return None
        both = np.concatenate(out, axis=1)
        self.fired.append(both)
        return both[1], both[2]

    def back(self, upto: int, reserved: int) -> Rows | None:
        """The hidden cursor goes back to ``upto`` (idle writers): the rows hidden by
        :meth:`due` whose break is at or past ``upto`` (their frames' slots are no longer
        due), to make drawable again; they are tracked anew. Rows whose break lies below
        ``reserved`` (their frames' slots were handed to a writer) are forgotten: they
        stay hidden until overwritten."""
        if not self.fired:
            return None
        rows = np.concatenate(self.fired, axis=1)
        self.fired.clear()
        again = rows[0] >= upto
        held = rows[:, ~again]
        held = held[:, held[0] >= reserved]
        if held.shape[1]:
            self.fired.append(held)
        if not again.any():
            return None
        rows = rows[:, again]
        self._push(rows)
        return rows[1], rows[2]

    def forget(self, reserved: int) -> None:
        """Drop the rows :meth:`due` handed out whose break lies below ``reserved``
        (their frames' slots were handed to a writer): no give-back can make them
        drawable."""
        f = self.fired
        while f and int(f[0][0].max()) < reserved:
            f.pop(0)
