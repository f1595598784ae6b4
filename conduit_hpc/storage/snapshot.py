"""Consistent cuts of a shard, their restore, and resharding. Plain numpy; no MPI, no h5py.

A :class:`ShardSnapshot` is everything a shard's owner holds about its rows at one
moment (the *cut*): the rows themselves (oldest first, with their sequence numbers; the
stored columns: with frame stacks, frames once and references, sealed so that no row
refers to a frame before the cut), their current priorities, the priorities the writers
gave them, the cursors and the priority index's counters. It is what a checkpoint stores
per shard and what a restore writes back.

The cut (:func:`take_snapshot`, run by the owner right after a commit pass) contains every
row with ``seq < commit`` that the shard still holds, and none after; rows that a writer
has already been handed for overwriting (``seq + capacity < reserve``, read *after* the
copy) are left out, exactly as a reader would refuse them. The rows held always form one
contiguous run of sequence numbers, so the copy is at most two ``memcpy`` per field into a
reusable :class:`SnapshotStaging` (fresh allocations would cost a page fault per 4 KiB,
20x slower than the copy itself).

:func:`restore_snapshot` writes a snapshot into an empty ring and a fresh
:class:`~conduit_hpc.storage.priority.PriorityIndex` so that the shard continues exactly
where it was: same slots, same stamps, same sum- and min-tree leaves (hence the same
samples for the same random numbers).

:func:`plan_reshard` spreads the rows of ``m`` old shards over ``n`` new ones (a different
number of buffer ranks, or a different capacity): every row exactly once, with its
priority, in a global age order, interleaved so that each new shard holds a fair mix of
every old shard's rows, old and new. Sampling proportional to ``priority ** alpha``
across shards therefore sees the same distribution as before.

Everything here is local (no MPI, no collective) and never blocks; the cut and the
restore run on the shard's owner, the plans are pure functions (the same on every rank).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from conduit_hpc.config.checks import MAX_PRIORITY
from conduit_hpc.spec import Spec
from conduit_hpc.storage.frames import LAG_COLUMN, seal_cut
from conduit_hpc.storage.priority import PriorityIndex
from conduit_hpc.storage.ring import H_COMMIT, H_FREE, H_RESERVE, ShardRing, ring_segments

__all__ = [
    "ReshardPlan",
    "ShardSnapshot",
    "SnapshotStaging",
    "plan_reshard",
    "reshard",
    "restore_snapshot",
    "take_snapshot",
]


@dataclass(eq=False)
class ShardSnapshot:
    """The state of one shard at a cut.

    Attributes:
        shard_id (int): global shard number.
        capacity (int): ring slots.
        commit (int): commit cursor at the cut; every row held has ``seq < commit``.
        seqs (np.ndarray): int64 ``[n]``, the held rows' sequence numbers, ascending and
            contiguous (``commit - n .. commit - 1``).
        columns (dict[str, np.ndarray]): per spec field, ``[n, *shape]``.
        priority (np.ndarray): float64 ``[n]``, current raw priority (before alpha).
        init_priority (np.ndarray): float64 ``[n]``, the priority the writer gave (NaN
            for none).
        max_priority (float): the index's running maximum (priority of rows inserted
            without one).
        applied_updates (int), dropped_updates (int): the index's update counters.
        reserve (int): reserve cursor read after the copy (informational).
    """

    shard_id: int
    capacity: int
    commit: int
    seqs: np.ndarray
    columns: dict[str, np.ndarray]
    priority: np.ndarray
    init_priority: np.ndarray
    max_priority: float
    applied_updates: int = 0
    dropped_updates: int = 0
    reserve: int = 0

    @property
    def rows(self) -> int:
        """Rows held."""
        return len(self.seqs)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays."""
        return int(self.seqs.nbytes + self.priority.nbytes + self.init_priority.nbytes
                   + sum(c.nbytes for c in self.columns.values()))

    def check(self, spec: Spec) -> None:
        """Raise ``ValueError`` naming what is inconsistent (shapes, dtypes, seqs)."""
        n = self.rows
        if self.capacity <= 0:
            raise ValueError(f"shard {self.shard_id}: capacity must be > 0, got "
                             f"{self.capacity}")
        if n > self.capacity:
            raise ValueError(f"shard {self.shard_id}: {n} rows exceed the capacity of "
                             f"{self.capacity}")
        want = np.arange(self.commit - n, self.commit, dtype=np.int64)
        if self.seqs.shape != (n,) or not np.array_equal(self.seqs, want):
            raise ValueError(f"shard {self.shard_id}: seqs must be the contiguous run "
                             f"{self.commit - n} .. {self.commit - 1}")
        for name in ("priority", "init_priority"):
            arr = getattr(self, name)
            if arr.shape != (n,) or arr.dtype != np.float64:
                raise ValueError(f"shard {self.shard_id}: {name} must be float64 [{n}], got "
                                 f"{arr.dtype} {arr.shape}")
        # what an index may hold (check_priorities' bound: sums of priority ** alpha stay
        # finite); an initial priority may also be NaN (none given: the running maximum)
        for name, arr, nan_ok in (("priority", self.priority, False),
                                  ("init_priority", self.init_priority, True),
                                  ("max_priority", np.array([self.max_priority]), False)):
            ok = (arr >= 0) & (arr <= MAX_PRIORITY)  # False for NaN
            if nan_ok:
                ok |= np.isnan(arr)
            if not ok.all():
                i = int(np.flatnonzero(~ok)[0])
                at = "" if name == "max_priority" else f"[{i}]"
                raise ValueError(f"shard {self.shard_id}: {name}{at} must be finite, >= 0 "
                                 f"and <= {MAX_PRIORITY:g}"
                                 f"{' (or NaN: none given)' if nan_ok else ''}, got "
                                 f"{float(arr[i])!r}")
        if set(self.columns) != set(spec.names):
            raise ValueError(f"shard {self.shard_id}: columns {sorted(self.columns)} do not "
                             f"match the spec fields {sorted(spec.names)}")
        for f in spec:
            c = self.columns[f.name]
            if c.dtype != f.dtype or c.shape != (n, *f.shape):
                raise ValueError(f"shard {self.shard_id}: column {f.name!r} must be "
                                 f"{f.dtype.name} {(n, *f.shape)}, got {c.dtype.name} "
                                 f"{c.shape}")


class SnapshotStaging:
    """Preallocated, pre-faulted arrays that cuts of one shard are copied into.

    A cut into fresh memory runs at page-fault speed (~0.3 GB/s); into touched memory at
    memcpy speed. One staging per shard, reused by every checkpoint (a checkpoint must
    finish writing before the next cut reuses it).

    Args:
        spec (Spec): the row schema.
        capacity (int): rows (the shard's capacity).
    """

    def __init__(self, spec: Spec, capacity: int) -> None:
        self.capacity = int(capacity)
        self.seqs = np.ones(capacity, dtype=np.int64)
        self.priority = np.ones(capacity, dtype=np.float64)
        self.init_priority = np.ones(capacity, dtype=np.float64)
        # scratch for the cut's checks: no large temporary is allocated (and faulted in)
        self.iota = np.arange(capacity, dtype=np.int64)
        self.scratch = np.ones(capacity, dtype=np.int64)
        self.held = np.ones(capacity, dtype=bool)
        self.columns: dict[str, np.ndarray] = {}
        for f in spec:
            arr = np.empty((capacity, *f.shape), dtype=f.dtype)
            arr.reshape(-1).view(np.uint8)[:] = 1  # touch every page now, not at the cut
            self.columns[f.name] = arr

    @property
    def nbytes(self) -> int:
        return int(self.seqs.nbytes + self.priority.nbytes + self.init_priority.nbytes
                   + sum(c.nbytes for c in self.columns.values()))

    @staticmethod
    def bytes_for(row_bytes: int, capacity: int) -> int:
        """Bytes a staging of ``capacity`` rows of ``row_bytes`` stored bytes allocates:
        its columns, five int64/float64 arrays and one of bools per row (what a job's
        memory check counts before any is made)."""
        return int(capacity) * (int(row_bytes) + 5 * 8 + 1)


def take_snapshot(shard_id: int, ring: ShardRing, index: PriorityIndex,
                  staging: SnapshotStaging | None = None) -> ShardSnapshot:
    """Copy the rows a shard holds at this moment: a consistent cut.

    Owner only, and call it right after the owner's commit pass (``OwnedShard.poll``) so
    that the index knows every committed row. Local; does not block (one atomic read of
    the reserve cursor after the copy).

    Args:
        shard_id (int): the shard's global number (recorded in the snapshot).
        ring (ShardRing): the owner's ring client (direct access to the memory).
        index (PriorityIndex): the shard's priorities.
        staging (SnapshotStaging | None): arrays to copy into (the snapshot's arrays are
            then views of it); ``None`` allocates fresh ones.

    Returns:
        ShardSnapshot: rows ``lo .. commit - 1`` where ``lo`` leaves out evicted rows and
        rows a writer has been handed for overwriting.

    Raises:
        RuntimeError: ``ring`` is not the owner's (no direct access).
    """
    v = ring.views
    if v is None:
        raise RuntimeError("take_snapshot() must run on the shard's owner")
    cap = ring.capacity
    ring.transport.sync()
    commit = int(v.header[H_COMMIT])
    lo = max(0, commit - cap)
    n = commit - lo
    if staging is None:
        staging = SnapshotStaging(ring.layout.stored, cap)
    elif staging.capacity < cap:
        raise ValueError(f"staging holds {staging.capacity} rows, the shard {cap}")
    segs = ring_segments(lo, n, cap)
    for seg in segs:
        src = slice(seg.slot, seg.slot + seg.count)
        dst = slice(seg.src, seg.src + seg.count)
        for name, col in v.columns.items():
            staging.columns[name][dst] = col[src]
        staging.priority[dst] = index.priority[src]
        staging.init_priority[dst] = v.priority[src]
        staging.scratch[dst] = index.gens[src]  # generation = seq + 1 of a held row
    ring.transport.sync()
    reserve = ring.reserve_cursor()  # after the copy: rows a writer now owns are torn
    keep_from = max(lo, reserve - cap)
    seqs = staging.seqs[:n]
    np.add(staging.iota[:n], lo, out=seqs)
    gens, held = staging.scratch[:n], staging.held[:n]
    np.subtract(gens, 1, out=gens)
    np.equal(gens, seqs, out=held)
    held[:max(0, keep_from - lo)] = False
    if ring.layout.frames is not None:
        # frame stacks: rows the owner hid (the guard band's, and those whose oldest
        # frame's slot was due: plane/shard.py) hold frames that later rows reference,
        # so they are in the cut too (its seal below makes the rows whose frames it
        # lacks undeliverable)
        k = max(0, keep_from - lo)
        tail = seqs[k:]
        held[k:] |= index.hidden_gens[tail % cap] == tail + 1
    # what a shard holds is always one contiguous, newest run; check rather than assume
    first = int(np.argmax(held)) if held.any() else n
    if not held[first:].all():
        raise RuntimeError(f"shard {shard_id}: the rows held are not one contiguous run "
                           f"of seqs; the index and the ring disagree")
    sl = slice(first, n)
    columns = {k: c[sl] for k, c in staging.columns.items()}
    seal_cut(ring.layout.frames, columns, int(seqs[first]) if first < n else 0)
    return ShardSnapshot(
        shard_id=shard_id, capacity=cap, commit=commit, seqs=seqs[sl], columns=columns,
        priority=staging.priority[sl], init_priority=staging.init_priority[sl],
        max_priority=float(index.max_priority), applied_updates=int(index.applied_updates),
        dropped_updates=int(index.dropped_updates), reserve=reserve)


def restore_snapshot(ring: ShardRing, index: PriorityIndex, snap: ShardSnapshot) -> None:
    """Write a snapshot into an owner's ring and replace the index's state.

    Owner only, before any writer touches the shard (restore is collective at start-up).
    Local; does not block. Slots that the snapshot does not fill are emptied (stamp 0),
    both cursors are set to ``snap.commit``.

    Raises:
        ValueError: the snapshot does not fit the ring (capacity, spec, seqs).
        RuntimeError: ``ring`` is not the owner's.
    """
    v = ring.views
    if v is None:
        raise RuntimeError("restore_snapshot() must run on the shard's owner")
    cap = ring.capacity
    if snap.capacity != cap or index.capacity != cap:
        raise ValueError(f"shard {snap.shard_id}: snapshot of capacity {snap.capacity} does "
                         f"not fit a ring of {cap} slots")
    snap.check(ring.layout.stored)
    n = snap.rows
    slots = snap.seqs % cap
    columns = dict(snap.columns)
    if ring.layout.frames is not None:  # rows referencing frames it lacks: never delivered
        columns[LAG_COLUMN] = columns[LAG_COLUMN].copy()
        seal_cut(ring.layout.frames, columns, snap.commit - n)
    v.stamps[:] = 0
    v.priority[:] = np.nan
    for seg in ring_segments(snap.commit - n, n, cap):
        dst = slice(seg.slot, seg.slot + seg.count)
        src = slice(seg.src, seg.src + seg.count)
        for name, col in v.columns.items():
            col[dst] = columns[name][src]
        v.priority[dst] = snap.init_priority[src]
        v.stamps[dst] = snap.seqs[src] + 1
    ring.transport.sync()
    ring.transport.atomic_write(ring.owner, ring.base + 8 * H_RESERVE, snap.commit)
    ring.transport.atomic_write(ring.owner, ring.base + 8 * H_COMMIT, snap.commit)
    # writers may take the empty slots of a first lap; a full ring's slots only once the
    # owner's next pass has hidden the rows in them (it hides exactly the rows below the
    # free cursor it publishes: see OwnedShard)
    ring.transport.atomic_write(ring.owner, ring.base + 8 * H_FREE, max(snap.commit, cap))
    v.marks[:] = 0  # no restored row has been drawn in this run
    # the index: same leaves as the original, so the same trees bit for bit
    gens = np.zeros(cap, dtype=np.int64)
    prio = np.zeros(cap, dtype=np.float64)
    gens[slots] = snap.seqs + 1
    prio[slots] = snap.priority
    scaled = np.zeros(cap, dtype=np.float64)
    scaled[slots] = index._scaled(snap.priority)
    index.load(gens, prio, scaled)
    index.max_priority = float(snap.max_priority)
    index.applied_updates = int(snap.applied_updates)
    index.dropped_updates = int(snap.dropped_updates)


# ---------------------------------------------------------------------------------
# resharding


@dataclass(frozen=True, eq=False)
class ReshardPlan:
    """Where each row of the old shards goes.

    Attributes:
        sources (tuple[tuple[np.ndarray, np.ndarray], ...]): per new shard, the old shard
            (int64) and the row index within it (int64, position in the old shard's
            snapshot) of each of its rows, in the new shard's seq order (oldest first).
        dropped (int): oldest rows left out because the new capacity is smaller.
    """

    sources: tuple[tuple[np.ndarray, np.ndarray], ...]
    dropped: int = 0
    old_rows: tuple[int, ...] = field(default=())

    def rows_of(self, new_shard: int) -> int:
        return len(self.sources[new_shard][0])

    def needed_from(self, new_shards: Sequence[int], old_shard: int) -> np.ndarray:
        """Sorted, unique row indices of ``old_shard`` that ``new_shards`` need."""
        parts = [idx[src == old_shard] for k in new_shards
                 for src, idx in [self.sources[k]]]
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)


def plan_reshard(old_rows: Sequence[int], new_capacities: Sequence[int]) -> ReshardPlan:
    """Deal the rows of old shards over new shards. Pure and deterministic: every rank
    computes the same plan from the same counts.

    Rows are merged into one global age order (row ``i`` of an old shard of ``n`` rows
    has age ``(i + 0.5) / n``; ties by old shard), the oldest are dropped if they do not
    fit, each new shard gets a share proportional to its capacity (largest remainder),
    and rows are dealt to shards in that order by a smooth weighted round-robin, so that
    every new shard holds a proportional, age-ordered mix.

    Args:
        old_rows (Sequence[int]): rows held by each old shard.
        new_capacities (Sequence[int]): capacity of each new shard.

    Raises:
        ValueError: no new shard, or a negative count or capacity.
    """
    old = np.asarray(old_rows, dtype=np.int64)
    caps = np.asarray(new_capacities, dtype=np.int64)
    if len(caps) == 0 or (caps <= 0).any():
        raise ValueError(f"new_capacities must be a non-empty list of positive integers, "
                         f"got {list(new_capacities)}")
    if (old < 0).any():
        raise ValueError(f"old_rows must be >= 0, got {list(old_rows)}")
    src = np.repeat(np.arange(len(old), dtype=np.int64), old)
    idx = np.concatenate([np.arange(n, dtype=np.int64) for n in old]) if len(old) else \
        np.zeros(0, np.int64)
    age = (idx + 0.5) / np.maximum(old[src], 1) if len(src) else np.zeros(0)
    order = np.argsort(age, kind="stable")  # ties: old shard order (concatenation)
    src, idx = src[order], idx[order]
    total, room = len(src), int(caps.sum())
    dropped = max(0, total - room)
    src, idx = src[dropped:], idx[dropped:]
    n = len(src)
    # largest-remainder shares proportional to capacity (never above a capacity)
    exact = n * caps / room
    share = np.floor(exact).astype(np.int64)
    rest = n - int(share.sum())
    if rest:
        frac = exact - share
        share[np.argsort(-frac, kind="stable")[:rest]] += 1
    # smooth weighted round-robin: shard k's j-th row sits at virtual time (j+0.5)/share_k
    labels = np.repeat(np.arange(len(caps), dtype=np.int64), share)
    times = np.concatenate([(np.arange(s) + 0.5) / s for s in share if s] or [np.zeros(0)])
    labels = labels[np.argsort(times, kind="stable")]
    sources = tuple((src[labels == k], idx[labels == k]) for k in range(len(caps)))
    return ReshardPlan(sources=sources, dropped=dropped,
                       old_rows=tuple(int(x) for x in old))


def reshard(snapshots: Sequence[ShardSnapshot], new_capacities: Sequence[int],
            *, first_shard_id: int = 0) -> tuple[list[ShardSnapshot], ReshardPlan]:
    """Reshard in memory: the new shards' snapshots (seqs ``0 .. rows-1``).

    The running maximum priority of every new shard is the largest of the old shards';
    update counters restart at 0.

    Args:
        snapshots (Sequence[ShardSnapshot]): the old shards, in shard order.
        new_capacities (Sequence[int]): capacity of each new shard.
        first_shard_id (int): shard id of the first new shard.
    """
    plan = plan_reshard([s.rows for s in snapshots], new_capacities)
    names = list(snapshots[0].columns) if snapshots else []
    max_p = max((s.max_priority for s in snapshots), default=1.0)
    out = []
    for k, (src, idx) in enumerate(plan.sources):
        cols = {name: gather_rows([s.columns[name] for s in snapshots], src, idx)
                for name in names}
        out.append(build_resharded(first_shard_id + k, int(new_capacities[k]), cols,
                                   gather_rows([s.priority for s in snapshots], src, idx),
                                   gather_rows([s.init_priority for s in snapshots], src,
                                               idx), max_p))
    return out, plan


def gather_rows(arrays: Sequence[np.ndarray], src: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Rows ``arrays[src[i]][idx[i]]`` stacked in order."""
    if not len(arrays):
        return np.zeros(0)
    out = np.empty((len(src), *arrays[0].shape[1:]), dtype=arrays[0].dtype)
    for s, arr in enumerate(arrays):
        mask = src == s
        if mask.any():
            out[mask] = arr[idx[mask]]
    return out


def build_resharded(shard_id: int, capacity: int, columns: Mapping[str, np.ndarray],
                    priority: np.ndarray, init_priority: np.ndarray,
                    max_priority: float) -> ShardSnapshot:
    """A snapshot for a new shard holding ``len(priority)`` rows with seqs from 0."""
    n = len(priority)
    return ShardSnapshot(shard_id=shard_id, capacity=capacity, commit=n,
                         seqs=np.arange(n, dtype=np.int64), columns=dict(columns),
                         priority=np.asarray(priority, dtype=np.float64),
                         init_priority=np.asarray(init_priority, dtype=np.float64),
                         max_priority=float(max_priority), reserve=n)
