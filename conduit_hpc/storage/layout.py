"""The byte layout of one shard: header words, blocks, numpy views, ring arithmetic.

Byte layout of one shard (every block 64-byte aligned), starting at ``base``::

    header   int64[16]        [0] reserve cursor  (next sequence number to hand out)
                              [1] commit cursor   (every seq below it is committed)
                              [2] index version (seqlock: odd while a writer holding
                              the index lock writes the index blocks and the stats)
                              [3] rows held  [4] total mass  [5] min mass  [6] max
                              priority (4-6 are float64 bit patterns), written by the
                              owner for samplers
                              [7] free cursor (writers may write every seq below it;
                              0: not managed, writers wait for the commit cursor)
                              [8] rows overwritten before any learner drew them
                              [9] the index's running maximum priority (float64 bits),
                              [10] updates applied, [11] dropped; [12] the index lock
                              (0 free, else world rank + 1 of its holder)
    stamps   int64[capacity]  stamp[slot] = seq + 1 of the row committed there (0: empty)
    priority float64[capacity] initial priority given by the writer (NaN: none)
    tree     float64[2P]      sum-tree of priority ** alpha (index block)
    gens     int64[capacity]  generation each tree leaf is for, 0: none (index block)
    marks    int64[capacity]  largest generation a learner drew from the slot (learners
                              and the owner store it; the owner reads it)
    min      float64[2P]      min-tree of the masses (index block)
    raw      float64[capacity] raw priority last given to each row (index block)
    hidden   int64[capacity]  generation of each row the guard band hides (index block)
    column   per stored field field[capacity, *shape] of the field's dtype: the spec's
                              fields, or with frame stacks the stored columns of
                              :class:`~conduit_hpc.storage.frames.FrameCodec` (frames
                              once, references, lags)

See :mod:`conduit_hpc.storage.ring` for the protocol that uses it. Plain numpy; no MPI
import.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from conduit_hpc.errors import ConfigError
from conduit_hpc.spec import Spec
from conduit_hpc.storage.frames import FrameCodec
from conduit_hpc.storage.sumtree import tree_nodes

__all__ = ["HEADER_BYTES", "HEADER_WORDS", "H_IDX_DROPPED", "H_IDX_MAXP", "H_INDEX_LOCK",
           "RingSegment", "ShardLayout", "ShardViews", "ring_segments"]

_ALIGN = 64
H_RESERVE = 0
H_COMMIT = 1
H_STATS_VERSION = 2
H_HELD = 3
H_TOTAL = 4
H_MIN = 5
H_MAXP = 6
H_FREE = 7
H_UNSAMPLED = 8
#: the priority index's own state (shared by every process that writes it): running
#: maximum priority (float64 bits), updates applied and dropped, and the lock word that
#: serialises the index's writers (0: free, else world rank + 1 of the holder)
H_IDX_MAXP = 9
H_IDX_APPLIED = 10
H_IDX_DROPPED = 11
H_INDEX_LOCK = 12
HEADER_WORDS = 16
HEADER_BYTES = 8 * HEADER_WORDS


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True, slots=True)
class RingSegment:
    """A contiguous run of slots: ``count`` rows from ``slot`` on, taken from offset
    ``src`` of the batch."""

    slot: int
    count: int
    src: int


def ring_segments(first_seq: int, n: int, capacity: int) -> tuple[RingSegment, ...]:
    """Split sequence numbers ``first_seq .. first_seq+n-1`` into at most two
    contiguous slot runs of a ring of ``capacity`` slots.

    Raises:
        ValueError: ``n`` outside ``[0, capacity]`` or a negative ``first_seq``.
    """
    if first_seq < 0:
        raise ValueError(f"first_seq must be >= 0, got {first_seq!r}")
    if not 0 <= n <= capacity:
        raise ValueError(f"n must be in [0, {capacity}], got {n!r}")
    if n == 0:
        return ()
    start = first_seq % capacity
    head = min(n, capacity - start)
    if head == n:
        return (RingSegment(start, n, 0),)
    return (RingSegment(start, head, 0), RingSegment(0, n - head, head))


class ShardLayout:
    """Byte offsets of one shard's blocks, relative to the shard's base. Immutable.

    Args:
        spec (Spec): the row schema.
        capacity (int): slots in the ring.

    Attributes:
        stamps_offset (int), priority_offset (int): block offsets.
        frames (FrameCodec | None): the frame-stack layout (each frame stored once) when
            the spec declares stacks, else None (the plain layout).
        stored (Spec): the columns the shard holds (``spec`` for the plain layout).
        column_offsets (dict[str, int]): offset of each stored column.
        nbytes (int): bytes the shard takes.
    """

    __slots__ = ("capacity", "column_offsets", "frames", "gens_offset", "hidden_offset",
                 "marks_offset", "min_offset", "nbytes", "priority_offset", "raw_offset",
                 "spec", "stamps_offset", "stored", "tree_offset")

    def __init__(self, spec: Spec, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be > 0, got {capacity!r}")
        self.spec = spec
        self.frames = FrameCodec(spec) if spec.stacks else None
        self.stored = spec if self.frames is None else self.frames.stored
        need = max((g.width for g in self.frames.groups), default=0) if self.frames else 0
        if capacity < need:  # a row may bring a new frame per reference: never written
            raise ConfigError(f"storage.capacity_rows must give each shard at least {need} "
                              f"slots with frame stacks (a row references {need} frames, "
                              f"each new one a slot), got a shard of {capacity} slots",
                              key="storage.capacity_rows")
        self.capacity = int(capacity)
        self.stamps_offset = HEADER_BYTES
        self.priority_offset = _align(self.stamps_offset + 8 * capacity)
        self.tree_offset = _align(self.priority_offset + 8 * capacity)
        self.gens_offset = _align(self.tree_offset + 8 * tree_nodes(capacity))
        self.marks_offset = _align(self.gens_offset + 8 * capacity)
        # the rest of the index, shared so that node-local learners write it too
        self.min_offset = _align(self.marks_offset + 8 * capacity)
        self.raw_offset = _align(self.min_offset + 8 * tree_nodes(capacity))
        self.hidden_offset = _align(self.raw_offset + 8 * capacity)
        off = _align(self.hidden_offset + 8 * capacity)
        self.column_offsets: dict[str, int] = {}
        for f in self.stored:
            self.column_offsets[f.name] = off
            off = _align(off + f.row_bytes * capacity)
        self.nbytes = off

    @staticmethod
    def bytes_for(spec: Spec, capacity: int) -> int:
        """Bytes a shard of ``capacity`` rows of ``spec`` takes."""
        return ShardLayout(spec, capacity).nbytes

    def column(self, name: str) -> int:
        return self.column_offsets[name]

    def views(self, segment: np.ndarray, base: int) -> ShardViews:
        """Typed numpy views of the shard inside a directly mapped ``uint8`` segment."""
        def arr(off: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
            count = int(np.prod(shape, dtype=np.int64))
            raw = segment[base + off: base + off + count * dtype.itemsize]
            return raw.view(dtype).reshape(shape)

        i64, f64 = np.dtype(np.int64), np.dtype(np.float64)
        cols = {f.name: arr(self.column(f.name), f.dtype, (self.capacity, *f.shape))
                for f in self.stored}
        return ShardViews(header=arr(0, i64, (HEADER_WORDS,)),
                          stamps=arr(self.stamps_offset, i64, (self.capacity,)),
                          priority=arr(self.priority_offset, f64, (self.capacity,)),
                          tree=arr(self.tree_offset, f64, (tree_nodes(self.capacity),)),
                          gens=arr(self.gens_offset, i64, (self.capacity,)),
                          marks=arr(self.marks_offset, i64, (self.capacity,)),
                          min_tree=arr(self.min_offset, f64, (tree_nodes(self.capacity),)),
                          raw=arr(self.raw_offset, f64, (self.capacity,)),
                          hidden=arr(self.hidden_offset, i64, (self.capacity,)),
                          columns=cols)


@dataclass(frozen=True, slots=True)
class ShardViews:
    """Numpy views of a directly mapped shard."""

    header: np.ndarray
    stamps: np.ndarray
    priority: np.ndarray
    tree: np.ndarray
    gens: np.ndarray
    marks: np.ndarray
    min_tree: np.ndarray
    raw: np.ndarray
    hidden: np.ndarray
    columns: dict[str, np.ndarray]
