"""Replay storage: shard rings, priority trees. Plain numpy; no MPI import.

The memory-tier stores are imported from their modules, not from here:
:mod:`.tiers` (the ``TierStore`` interface, ``TieredReplay``), :mod:`.windowstore` (the
host tiers) and :mod:`.device` (the ``learner_gpu`` tier, which needs torch).
"""

from conduit_hpc.storage.migrate import MoveRecord, free_slots, held_slots, move_rows, select_rows
from conduit_hpc.storage.priority import PriorityIndex, check_priorities
from conduit_hpc.storage.ring import ShardLayout, ShardRing, ring_segments
from conduit_hpc.storage.sumtree import MinTree, SumTree

__all__ = [
    "MinTree",
    "MoveRecord",
    "PriorityIndex",
    "ShardLayout",
    "ShardRing",
    "SumTree",
    "check_priorities",
    "free_slots",
    "held_slots",
    "move_rows",
    "ring_segments",
    "select_rows",
]
