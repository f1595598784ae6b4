"""Replay storage: shard rings, priority trees. Plain numpy; no MPI import."""

from .priority import PriorityIndex, check_priorities
from .ring import ShardLayout, ShardRing, ring_segments
from .sumtree import MinTree, SumTree

__all__ = [
    "MinTree",
    "PriorityIndex",
    "ShardLayout",
    "ShardRing",
    "SumTree",
    "check_priorities",
    "ring_segments",
]
