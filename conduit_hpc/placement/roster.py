"""Which world ranks play which role on each node of a cluster model.

Plain Python; no MPI.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from conduit_hpc.errors import ConfigError

if TYPE_CHECKING:
    from conduit_hpc.placement.shape import ClusterShape

__all__ = ["Roster"]


@dataclass(frozen=True, slots=True)
class Roster:
    """Which world ranks play which role on each node of a :class:`ClusterModel`.

    Attributes:
        learners (tuple[tuple[int, ...], ...]): per node, learner world ranks (learner
            ``i`` of a node owns GPU ``i``).
        buffers (tuple[tuple[int, ...], ...]): per node, buffer world ranks.
        actors (tuple[tuple[int, ...], ...]): per node, actor world ranks.
    """

    learners: tuple[tuple[int, ...], ...]
    buffers: tuple[tuple[int, ...], ...]
    actors: tuple[tuple[int, ...], ...]

    @classmethod
    def block(cls, cluster: ClusterShape) -> Roster:
        """Node-major world ranks: on each node its learners, then buffers, then actors
        (what ``[layout] per_node = true`` gives with ranks placed node by node)."""
        learners, buffers, actors = [], [], []
        r = 0
        for n in cluster.nodes:
            learners.append(tuple(range(r, r + n.learners)))
            r += n.learners
            buffers.append(tuple(range(r, r + n.buffers)))
            r += n.buffers
            actors.append(tuple(range(r, r + n.actors)))
            r += n.actors
        return cls(tuple(learners), tuple(buffers), tuple(actors))

    @classmethod
    def from_ranks(cls, cluster: ClusterShape, node_of: Sequence[int],
                   learner_ranks: Sequence[int], buffer_ranks: Sequence[int],
                   actor_ranks: Sequence[int]) -> Roster:
        """From a running job's role split (``RoleComms``): ``node_of[r]`` is the node
        index of world rank ``r``.

        Raises:
            ConfigError: the job's nodes do not match the model (count, or more learners
                on a node than it has GPUs).
        """
        nn = len(cluster.nodes)
        if node_of and max(node_of) >= nn:
            raise ConfigError(f"the job runs on {max(node_of) + 1} nodes but cluster "
                              f"{cluster.name!r} describes {nn}", key="placement.cluster")
        per: list[list[list[int]]] = [[[], [], []] for _ in range(nn)]
        for k, ranks in enumerate((learner_ranks, buffer_ranks, actor_ranks)):
            for r in ranks:
                per[node_of[r]][k].append(int(r))
        for i, (ls, _, _) in enumerate(per):
            g = cluster.nodes[i].gpus
            if g and len(ls) > g:
                raise ConfigError(f"node {cluster.nodes[i].name!r} runs {len(ls)} learners "
                                  f"but has {g} GPUs", key="placement.cluster")
        return cls(tuple(tuple(sorted(p[0])) for p in per),
                   tuple(tuple(sorted(p[1])) for p in per),
                   tuple(tuple(sorted(p[2])) for p in per))

    @property
    def all_learners(self) -> tuple[int, ...]:
        return tuple(r for ls in self.learners for r in ls)

    @property
    def all_buffers(self) -> tuple[int, ...]:
        return tuple(r for bs in self.buffers for r in bs)

    @property
    def all_actors(self) -> tuple[int, ...]:
        return tuple(r for a in self.actors for r in a)
