"""Replay storage: shard rings, priority trees. Plain numpy; no MPI import."""

from .migrate import MoveRecord, free_slots, held_slots, move_rows, select_rows
from .priority import PriorityIndex, check_priorities
from .ring import ShardLayout, ShardRing, ring_segments
from .sumtree import MinTree, SumTree

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
