"""The immutable result of planning: where each shard lives and who talks to it.

Plain Python; no MPI. The static planner and the adaptive re-planner produce
:class:`Placement` objects; the data plane compiles one into rings and transfers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigError

__all__ = ["Placement", "ShardPlacement", "plan_round_robin"]

TIERS = ("learner_gpu", "learner_host", "buffer_host")


@dataclass(frozen=True, slots=True)
class ShardPlacement:
    """One shard.

    Attributes:
        shard_id (int): global shard number.
        owner_rank (int): world rank that holds its memory.
        tier (str): ``learner_gpu``, ``learner_host`` or ``buffer_host``.
        capacity_rows (int): ring slots.
    """

    shard_id: int
    owner_rank: int
    tier: str
    capacity_rows: int


@dataclass(frozen=True, slots=True)
class Placement:
    """Where shards live and which actors write and learners read them.

    Attributes:
        shards (tuple[ShardPlacement, ...]): indexed by ``shard_id``.
        actor_shards (dict[int, int]): actor world rank -> shard it writes.
        learner_shards (dict[int, tuple[int, ...]]): learner world rank -> shards it reads.
    """

    shards: tuple[ShardPlacement, ...]
    actor_shards: dict[int, int]
    learner_shards: dict[int, tuple[int, ...]]

    def __post_init__(self) -> None:
        for i, s in enumerate(self.shards):
            if s.shard_id != i:
                raise ConfigError(f"shards[{i}].shard_id must be {i}, got {s.shard_id}",
                                  key="shards")
            if s.capacity_rows <= 0:
                raise ConfigError(f"shards[{i}].capacity_rows must be > 0, got "
                                  f"{s.capacity_rows}", key="shards")
            if s.tier not in TIERS:
                raise ConfigError(f"shards[{i}].tier must be one of {TIERS}, got {s.tier!r}",
                                  key="shards")
        n = len(self.shards)
        for a, sid in self.actor_shards.items():
            if not 0 <= sid < n:
                raise ConfigError(f"actor {a} writes shard {sid}, outside [0, {n})",
                                  key="actor_shards")

    def shards_of(self, owner_rank: int) -> tuple[ShardPlacement, ...]:
        """Shards whose memory ``owner_rank`` holds, by shard id."""
        return tuple(s for s in self.shards if s.owner_rank == owner_rank)

    @property
    def capacity_rows(self) -> int:
        return sum(s.capacity_rows for s in self.shards)


def plan_round_robin(*, actor_ranks: Sequence[int], buffer_ranks: Sequence[int],
                     learner_ranks: Sequence[int], capacity_rows: int,
                     shards_per_buffer: int = 1) -> Placement:
    """The default static plan: ``shards_per_buffer`` shards on each buffer rank in
    host memory, capacity split evenly, actor ``i`` writes shard ``i mod shards``, every
    learner reads every shard.

    Raises:
        ConfigError: capacity smaller than the number of shards, or no buffer rank.
    """
    if not buffer_ranks:
        raise ConfigError("layout.buffers must be >= 1, got 0", key="layout.buffers")
    nshards = len(buffer_ranks) * shards_per_buffer
    if capacity_rows < nshards:
        raise ConfigError(f"storage.capacity_rows must be >= the number of shards "
                          f"({nshards}), got {capacity_rows}", key="storage.capacity_rows")
    base, extra = divmod(capacity_rows, nshards)
    shards = tuple(
        ShardPlacement(shard_id=i, owner_rank=buffer_ranks[i // shards_per_buffer],
                       tier="buffer_host", capacity_rows=base + (1 if i < extra else 0))
        for i in range(nshards))
    actor_shards = {a: i % nshards for i, a in enumerate(actor_ranks)}
    every = tuple(range(nshards))
    return Placement(shards=shards, actor_shards=actor_shards,
                     learner_shards={r: every for r in learner_ranks})
