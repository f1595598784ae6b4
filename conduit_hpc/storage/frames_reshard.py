"""Resharding cuts of frame-once shards: rows decoded from the old cuts, dealt to the new
shards stream by stream, and each frame stored once again in the new shards. Plain
numpy; no MPI; local and never blocks.

References are sequence numbers of one shard, so rows cannot be copied slot for slot into
other shards as plain rows are (nor dealt row by row as
:func:`~conduit_hpc.storage.snapshot.plan_reshard` deals them: a stream's consecutive
rows in different shards would store its frames twice): each stream goes whole to one
new shard, and each new shard is written as a writer would write it
(:class:`~conduit_hpc.storage.frames.FrameWriter`, in the new shard's age order), from the
stacks its rows rebuild to in the old cuts. Only rows deliverable from their cut move
(a sealed row, or a slot with frames only, is not a row). When a new shard's frames and
rows need more slots than it has, its oldest slots are left out (and rows that referenced
them sealed): the newest rows always fit. Every rank reads every old cut (their frames
are stored once, so that is the old shards' size, not 8x).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from conduit_hpc.storage.frames import LAG_COLUMN, LAG_NONE, FrameCodec, FrameWriter, seal_cut
from conduit_hpc.storage.snapshot import ShardSnapshot

__all__ = ["CutRows", "reshard_frames"]


class CutRows:
    """The rows deliverable from one cut of a frame-once shard, rebuilt on demand.

    Args:
        codec (FrameCodec): the shard's stored layout.
        snap (ShardSnapshot): the cut (stored columns, sealed).
    """

    def __init__(self, codec: FrameCodec, snap: ShardSnapshot) -> None:
        self.codec, self.snap = codec, snap
        self.first = int(snap.seqs[0]) if snap.rows else 0
        frames = {g.frame for g in codec.groups}
        cols = dict(snap.columns)
        if snap.rows:  # (sealed again: a row referencing frames the cut lacks is none)
            cols[LAG_COLUMN] = cols[LAG_COLUMN].copy()
            seal_cut(codec, cols, self.first)
        lag = cols[LAG_COLUMN] if snap.rows else np.zeros(0, np.int64)
        #: per position in the cut: whether a deliverable row is there
        self.ok = lag < LAG_NONE

        def read(name: str, slots: np.ndarray, dst: np.ndarray) -> None:
            col = snap.columns[name]
            dst[...] = col[slots - self.first] if name in frames else col[slots]
        self._read = read

    def get(self, pos: np.ndarray) -> dict[str, np.ndarray]:
        """The spec's fields of the deliverable rows at positions ``pos`` of the cut."""
        pos = np.asarray(pos, np.int64)
        out = self.codec.spec.empty(len(pos))
        self.codec.gather(self._read, pos, out, 1 << 62)  # refs are the seqs themselves
        return out


def reshard_frames(codec: FrameCodec, old_shards: int,
                   read: Callable[[int], ShardSnapshot], new_capacities: Sequence[int],
                   new_ids: Sequence[int], max_priority: float, *,
                   chunk_rows: int = 4096) -> tuple[dict[int, ShardSnapshot], int]:
    """New shards ``new_ids`` (of ``len(new_capacities)``) from the cuts of the old shards.

    Deterministic from the cuts, so every rank that reads them deals the same way: each
    stream goes whole to one new shard (the streams with most rows first, each to the
    shard with the most room left), so that its frames are stored once there too; a new
    shard's rows are in a global age order (row ``i`` of a cut of ``n`` slots has age
    ``(i + 0.5) / n``), the oldest left out where they do not fit.

    Args:
        codec (FrameCodec): the stored layout (old and new shards alike).
        old_shards (int): how many old shards there are.
        read (Callable[[int], ShardSnapshot]): reads the cut of an old shard (each once).
        new_capacities (Sequence[int]): capacity of every new shard.
        new_ids (Sequence[int]): the new shards to build (this rank's).
        max_priority (float): the running maximum of the new shards.

    Returns:
        tuple: the new shards' snapshots by id (seqs from 0), and the deliverable rows
        left out because the new shards have fewer slots than rows (all new shards,
        the same on every rank; the slots of older frames may leave a few more out).
    """
    stream = codec.groups[0].stack.stream
    cuts = [CutRows(codec, read(old)) for old in range(old_shards)]
    parts = [(np.full(int(c.ok.sum()), o), np.flatnonzero(c.ok)) for o, c in enumerate(cuts)]
    src = np.concatenate([p[0] for p in parts] or [np.zeros(0, np.int64)]).astype(np.int64)
    pos = np.concatenate([p[1] for p in parts] or [np.zeros(0, np.int64)]).astype(np.int64)
    age = np.concatenate([(p[1] + 0.5) / max(1, len(c.ok)) for p, c in zip(parts, cuts,
                                                                            strict=True)]
                         or [np.zeros(0)])
    order = np.lexsort((src, age))  # by age, ties by old shard
    src, pos = src[order], pos[order]
    ids = np.array([cuts[o].snap.columns[stream][i] for o, i in zip(src, pos, strict=True)],
                   codec.spec[stream].dtype)  # its own integer type: uint64 ids fit
    caps = np.asarray(new_capacities, np.int64)
    where: dict[int, int] = {}
    load = np.zeros(len(caps), np.int64)
    uniq, counts = np.unique(ids, return_counts=True)
    for k in np.lexsort((uniq, -counts)):
        to = int(np.argmax(caps - load))
        where[int(uniq[k])] = to
        load[to] += counts[k]
    shard_of = np.array([where[int(i)] for i in ids], np.int64)
    # the same on every rank: rows beyond the new shards' capacities (the slots a
    # shard's older frames take may leave a few more out)
    dropped = int(np.maximum(load - caps, 0).sum())
    out: dict[int, ShardSnapshot] = {}
    for k in new_ids:
        mine = np.flatnonzero(shard_of == k)
        take = min(len(mine), int(caps[k]))
        for _ in range(8):  # the newest rows whose frames fit too (a stream's first row
            # in the shard brings its older frames)
            sel = mine[len(mine) - take:]
            out[k] = _build(codec, cuts, src[sel], pos[sel], k, int(caps[k]), max_priority,
                            chunk_rows)
            over = out[k].commit - int(caps[k])
            if over <= 0 or take == 0:
                break
            take = max(0, take - over)
    return out, dropped


def _build(codec: FrameCodec, cuts: Sequence[CutRows], src: np.ndarray, pos: np.ndarray,
           shard_id: int, cap: int, max_priority: float, chunk_rows: int) -> ShardSnapshot:
    """A new shard's cut: its rows (old shard, position; oldest first) written as a
    writer writes them; the newest ``cap`` slots kept (and sealed)."""
    writer = FrameWriter(codec)
    parts: list[dict[str, np.ndarray]] = []
    prios: list[np.ndarray] = []
    inits: list[np.ndarray] = []
    first = 0
    for lo in range(0, len(src), chunk_rows):
        s, i = src[lo:lo + chunk_rows], pos[lo:lo + chunk_rows]
        rows = codec.spec.empty(len(s))
        prio, init = np.empty(len(s)), np.empty(len(s))
        for old, cut in enumerate(cuts):
            m = s == old
            if m.any():
                for name, col in cut.get(i[m]).items():
                    rows[name][m] = col
                prio[m] = cut.snap.priority[i[m]]
                init[m] = cut.snap.init_priority[i[m]]
        p = writer.plan(rows, first, 1 << 62)  # one shard: any frame it holds is fine
        cols, slot_init = writer.columns(p, rows, first, init)
        cur = np.zeros(p.slots)
        cur[:len(s)] = prio
        parts.append({n: _pad(c, p.slots) for n, c in cols.items()})
        prios.append(cur)
        inits.append(slot_init)
        first += p.slots
    columns = {n: (np.concatenate([pt[n] for pt in parts]) if parts else
                   np.zeros((0, *codec.stored[n].shape), codec.stored[n].dtype))
               for n in codec.stored.names}
    priority = np.concatenate(prios) if prios else np.zeros(0)
    init_priority = np.concatenate(inits) if inits else np.zeros(0)
    keep = slice(max(0, first - cap), first)  # the newest slots that fit
    columns = {n: np.ascontiguousarray(c[keep]) for n, c in columns.items()}
    seal_cut(codec, columns, keep.start)
    return ShardSnapshot(shard_id=shard_id, capacity=cap, commit=first,
                         seqs=np.arange(keep.start, first, dtype=np.int64), columns=columns,
                         priority=priority[keep], init_priority=init_priority[keep],
                         max_priority=float(max_priority), reserve=first)


def _pad(col: np.ndarray, n: int) -> np.ndarray:
    """A stored column of a planned write (its head only) padded with zeros to ``n``."""
    if len(col) == n:
        return col
    out = np.zeros((n, *col.shape[1:]), col.dtype)
    out[:len(col)] = col
    return out
