"""Placement: where experience lives. Plain Python; no MPI.

* :mod:`.cluster` - the cluster model (nodes, tiers, links), from TOML or measurements
  (the file's schema and byte sizes in :mod:`.clusterfile`, the roles' ranks per node in
  :mod:`.roster`, the numbered directed links in :mod:`.links`);
* :mod:`.model` - the cost model: predicted path times, built on :mod:`.workload` (what
  the experience path carries, from a job), :mod:`.topology` (learners, locations,
  routes) and :mod:`.loads` (bytes per link per superstep of an allocation);
* :mod:`.static` - the capacity-constrained, bandwidth-aware static planner (its LP's
  variables, partitions and placement patterns, in :mod:`.columns`);
* :mod:`.adaptive` - the adaptive re-placement policy driven by telemetry (which rows
  move where between two plans: :mod:`.moves`);
* :mod:`.placement` - the immutable :class:`Placement` every planner returns.
"""

from conduit_hpc.placement.cluster import ClusterModel, LinkSpec, NodeSpec, Roster
from conduit_hpc.placement.placement import (
    Bottleneck,
    LearnerPrediction,
    Placement,
    PlanPrediction,
    ShardPlacement,
    ShardWeights,
    plan_round_robin,
)


def __getattr__(name: str) -> object:
    # the planners need scipy; load them on first use so that importing the data plane
    # (which only needs Placement) stays cheap on every rank
    if name == "Workload":
        from conduit_hpc.placement.workload import Workload

        return Workload
    if name == "plan_static":
        from conduit_hpc.placement.static import plan_static

        return plan_static
    raise AttributeError(f"module 'conduit_hpc.placement' has no attribute {name!r}")

__all__ = [
    "Bottleneck",
    "ClusterModel",
    "LearnerPrediction",
    "LinkSpec",
    "NodeSpec",
    "Placement",
    "PlanPrediction",
    "Roster",
    "ShardPlacement",
    "ShardWeights",
    "Workload",
    "plan_round_robin",
    "plan_static",
]
