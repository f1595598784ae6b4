"""The long-haul placement: which shard lives on which side of the link. Local and
deterministic; no MPI."""

from __future__ import annotations

from collections.abc import Sequence

from conduit_hpc.config import Config
from conduit_hpc.errors import ConfigError
from conduit_hpc.features.longhaul.topology import LinkSides
from conduit_hpc.placement.placement import Placement, ShardPlacement

__all__ = ["CLOUD_SHARD", "EDGE_SHARD", "plan_longhaul", "require_le"]

EDGE_SHARD = 0  # the edge buffer's shard: the replay (edge_replay) or a FIFO (forward)
CLOUD_SHARD = 1  # forward only: the replay beside the learner


def plan_longhaul(config: Config, topo: LinkSides, actor_ranks: Sequence[int]) -> Placement:
    """Shard 0 on the edge buffer (written by every actor); in ``forward`` also shard 1
    on the cloud buffer. The learner reads shard 1 (``forward``) or shard 0
    (``edge_replay``). Both shards hold ``storage.capacity_rows``.

    Raises:
        ConfigError: ``longhaul.queue_rows`` or ``forward_rows`` larger than a shard.
    """
    cap = config.storage.capacity_rows
    lh = config.longhaul
    if lh.mode == "forward":
        require_le(lh.queue_rows, cap, "longhaul.queue_rows")
    shards = [ShardPlacement(shard_id=EDGE_SHARD, owner_rank=topo.edge_buffer,
                             tier="buffer_host", capacity_rows=cap)]
    reads = (EDGE_SHARD,)
    if lh.mode == "forward":
        shards.append(ShardPlacement(shard_id=CLOUD_SHARD, owner_rank=topo.cloud_buffer,
                                     tier="buffer_host", capacity_rows=cap))
        reads = (CLOUD_SHARD,)
    return Placement(shards=tuple(shards), actor_shards={a: EDGE_SHARD for a in actor_ranks},
                     learner_shards={topo.learner: reads})


def require_le(value: int, limit: int, key: str) -> None:
    if value > limit:
        raise ConfigError(f"{key} must be <= storage.capacity_rows ({limit}), got {value}",
                          key=key)

