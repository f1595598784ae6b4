"""Which world ranks sit on which side of the long link (``longhaul.edge_ranks``), checked
against the job's roles. Plain Python; no MPI.

Named :class:`LinkSides` so as not to be confused with
:class:`conduit_hpc.placement.model.Topology` (the cluster's nodes and tiers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conduit_hpc.config import Config
from conduit_hpc.errors import ConfigError

__all__ = ["LinkSides"]


@dataclass(frozen=True, slots=True)
class LinkSides:
    """Which world ranks are on which side of the link.

    Attributes:
        edge (frozenset[int]): ranks at the edge (every actor and one buffer).
        cloud (frozenset[int]): ranks in the data centre (the learner and one buffer).
        edge_buffer (int), cloud_buffer (int), learner (int): world ranks.
    """

    edge: frozenset[int]
    cloud: frozenset[int]
    edge_buffer: int
    cloud_buffer: int
    learner: int

    def side(self, rank: int) -> str:
        return "edge" if rank in self.edge else "cloud"

    def far_of(self, rank: int) -> frozenset[int]:
        """The ranks across the link from ``rank``."""
        return self.cloud if rank in self.edge else self.edge

    @classmethod
    def build(cls, config: Config, *, world_size: int, actor_ranks: Sequence[int],
              buffer_ranks: Sequence[int], learner_ranks: Sequence[int]) -> LinkSides:
        """Check the deployment against the roles. Deterministic: every rank raises the
        same :class:`ConfigError` together. Local.

        Raises:
            ConfigError: naming ``longhaul.edge_ranks`` or ``layout.*`` and what is needed.
        """
        lh = config.longhaul
        n = world_size
        key = "longhaul.edge_ranks"
        if any(r >= n for r in lh.edge_ranks):
            raise ConfigError(f"{key} must name world ranks below the world size {n}, got "
                              f"{list(lh.edge_ranks)!r}", key=key)
        if len(learner_ranks) != 1:
            raise ConfigError(f"layout.learners must be 1 with longhaul.mode = {lh.mode!r} "
                              f"(one learner in the data centre), got "
                              f"{len(learner_ranks)}", key="layout.learners")
        if len(buffer_ranks) != 2:
            raise ConfigError(f"layout.buffers must be 2 with longhaul.mode = {lh.mode!r} "
                              f"(one at the edge, one in the data centre), got "
                              f"{len(buffer_ranks)}", key="layout.buffers")
        if config.storage.shards_per_buffer != 1:
            raise ConfigError(f"storage.shards_per_buffer must be 1 with longhaul.mode = "
                              f"{lh.mode!r}, got {config.storage.shards_per_buffer}",
                              key="storage.shards_per_buffer")
        edge = (frozenset(lh.edge_ranks) if lh.edge_ranks
                else frozenset((*actor_ranks, buffer_ranks[-1])))
        (learner,) = learner_ranks
        if learner in edge:
            raise ConfigError(f"{key} must not hold the learner (world rank {learner}), got "
                              f"{sorted(edge)}", key=key)
        missing = sorted(set(actor_ranks) - edge)
        if missing:
            raise ConfigError(f"{key} must hold every actor rank; {missing} are missing "
                              f"from {sorted(edge)}", key=key)
        edge_buffers = [b for b in buffer_ranks if b in edge]
        if len(edge_buffers) != 1:
            raise ConfigError(f"{key} must hold exactly one of the buffer ranks "
                              f"{list(buffer_ranks)}, got {sorted(edge)}", key=key)
        (cloud_buffer,) = [b for b in buffer_ranks if b not in edge]
        cloud = frozenset(range(n)) - edge
        return cls(edge=edge, cloud=cloud, edge_buffer=edge_buffers[0],
                   cloud_buffer=cloud_buffer, learner=learner)

