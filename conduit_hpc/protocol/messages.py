"""Message layouts between learners and buffer ranks: numpy arrays packed as bytes.

No pickling: every message is a concatenation of fixed-dtype arrays whose lengths the
receiver derives from a leading int64 header. Plain numpy; no MPI.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from conduit_hpc.spec import Spec

__all__ = ["PriorityUpdate", "SampleReply", "SampleRequest", "pack_rows", "unpack_rows"]


def _cat(*arrays: np.ndarray) -> np.ndarray:
    return np.concatenate([np.ascontiguousarray(a).reshape(-1).view(np.uint8)
                           for a in arrays])


@dataclass(frozen=True, slots=True)
class SampleRequest:
    """Targets (mass offsets, or window indices for sequences) in one shard."""

    request_id: int
    shard_id: int
    targets: np.ndarray

    def pack(self) -> np.ndarray:
        head = np.array([self.request_id, self.shard_id, len(self.targets)], dtype=np.int64)
        return _cat(head, np.asarray(self.targets, dtype=np.float64))

    @classmethod
    def unpack(cls, payload: np.ndarray) -> SampleRequest:
        head = payload[:24].view(np.int64)
        n = int(head[2])
        return cls(int(head[0]), int(head[1]), payload[24:24 + 8 * n].view(np.float64))


@dataclass(frozen=True, slots=True)
class SampleReply:
    """What the owner found: per target the slot, its generation and its mass, plus the
    shard's statistics at that moment."""

    request_id: int
    shard_id: int
    slots: np.ndarray
    gens: np.ndarray
    mass: np.ndarray
    held: int
    total: float
    min_mass: float

    HEAD = 4  # int64s before the arrays

    def pack(self, rows: np.ndarray | None = None) -> np.ndarray:
        n = len(self.slots)
        head = np.array([self.request_id, self.shard_id, n, self.held], dtype=np.int64)
        stats = np.array([self.total, self.min_mass], dtype=np.float64)
        parts = [head, np.asarray(self.slots, np.int64), np.asarray(self.gens, np.int64),
                 np.asarray(self.mass, np.float64), stats]
        if rows is not None:
            parts.append(rows)
        return _cat(*parts)

    @classmethod
    def unpack(cls, payload: np.ndarray) -> tuple[SampleReply, np.ndarray]:
        """The reply and the bytes that follow it (rows, for service replies)."""
        head = payload[:32].view(np.int64)
        n = int(head[2])
        o = 32
        slots = payload[o:o + 8 * n].view(np.int64)
        o += 8 * n
        gens = payload[o:o + 8 * n].view(np.int64)
        o += 8 * n
        mass = payload[o:o + 8 * n].view(np.float64)
        o += 8 * n
        stats = payload[o:o + 16].view(np.float64)
        o += 16
        return cls(int(head[0]), int(head[1]), slots, gens, mass, int(head[3]),
                   float(stats[0]), float(stats[1])), payload[o:]


@dataclass(frozen=True, slots=True)
class PriorityUpdate:
    """New priorities for rows of one shard, each tied to the generation it was
    sampled at."""

    shard_id: int
    slots: np.ndarray
    gens: np.ndarray
    priorities: np.ndarray

    def pack(self) -> np.ndarray:
        head = np.array([self.shard_id, len(self.slots)], dtype=np.int64)
        return _cat(head, np.asarray(self.slots, np.int64), np.asarray(self.gens, np.int64),
                    np.asarray(self.priorities, np.float64))

    @classmethod
    def unpack(cls, payload: np.ndarray) -> PriorityUpdate:
        head = payload[:16].view(np.int64)
        n = int(head[1])
        o = 16
        slots = payload[o:o + 8 * n].view(np.int64)
        gens = payload[o + 8 * n:o + 16 * n].view(np.int64)
        prios = payload[o + 16 * n:o + 24 * n].view(np.float64)
        return cls(int(head[0]), slots, gens, prios)


def pack_rows(spec: Spec, columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """Field arrays, in spec order, as one byte array."""
    return _cat(*(columns[f.name] for f in spec))


def unpack_rows(spec: Spec, payload: np.ndarray, rows: int,
                lead: tuple[int, ...] = ()) -> dict[str, np.ndarray]:
    """Inverse of :func:`pack_rows` for ``rows`` rows, shaped ``(*lead, ...)`` if given."""
    out: dict[str, np.ndarray] = {}
    o = 0
    shape0 = lead or (rows,)
    for f in spec:
        nb = f.row_bytes * rows
        out[f.name] = payload[o:o + nb].view(f.dtype).reshape(*shape0, *f.shape)
        o += nb
    return out
