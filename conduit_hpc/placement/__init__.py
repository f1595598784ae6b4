"""Placement: where experience lives. Plain Python; no MPI."""

from .placement import Placement, ShardPlacement, plan_round_robin

__all__ = ["Placement", "ShardPlacement", "plan_round_robin"]
