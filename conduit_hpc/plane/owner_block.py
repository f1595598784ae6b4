"""The block at the start of every shard owner's window segment, before its shards.

Layout (int64 words; ``W`` = ranks in the world; the block is rounded up to 64 bytes)::

    acks   int64[W]     update messages the owner applied from each rank (a learner
                        that searches the owner's trees waits for its own count)
    pins   int64[W, 2]  each rank's read pin on this owner: (shard id + 1, free cursor);
                        (0, _) when it holds none (see ``OwnedShard``: the free cursor does
                        not pass a pin while it is held)

Written: ``acks[r]`` by the owner only; ``pins[r]`` by rank ``r`` only (MPI atomics,
since the owner may be on another node), read by the owner with plain loads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["OwnerBlock"]


@dataclass(frozen=True, slots=True)
class OwnerBlock:
    """Byte offsets of the owner block for a world of ``world_size`` ranks."""

    world_size: int

    @property
    def acks_offset(self) -> int:
        return 0

    @property
    def pins_offset(self) -> int:
        return 8 * self.world_size

    @property
    def nbytes(self) -> int:
        """Bytes the block takes (64-byte aligned: the first shard follows)."""
        return (24 * self.world_size + 63) // 64 * 64

    def pin_displacement(self, rank: int) -> int:
        """Byte offset of ``rank``'s pin (shard id + 1; the cursor follows)."""
        return self.pins_offset + 16 * rank

    def acks(self, segment: np.ndarray) -> np.ndarray:
        """The acknowledgement counters in an owner's mapped ``uint8`` segment."""
        return segment[:self.pins_offset].view(np.int64)

    def pins(self, segment: np.ndarray) -> np.ndarray | None:
        """The pins ``[world, 2]`` in an owner's mapped segment (``None`` when the
        segment is empty: a buffer rank that owns no shard)."""
        end = self.pins_offset + 16 * self.world_size
        if len(segment) < end:
            return None
        return segment[self.pins_offset:end].view(np.int64).reshape(self.world_size, 2)
