"""The immutable result of planning: where each shard lives and who talks to it.

Plain Python; no MPI. The planners (:func:`plan_round_robin`,
:func:`~conduit_hpc.placement.static.plan_static`, the adaptive re-planner) produce
:class:`Placement` objects; the data plane compiles one into rings and transfers.

A plan from the static planner also carries its :class:`PlanPrediction`: the bytes each
learner moves over each link per superstep, the predicted experience-path time and
exposed latency per learner, and the plan's bottleneck.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conduit_hpc.config import FrozenDict
from conduit_hpc.errors import ConfigError

__all__ = [
    "Bottleneck",
    "LearnerPrediction",
    "Placement",
    "PlanPrediction",
    "ShardPlacement",
    "ShardWeights",
    "plan_round_robin",
]

TIERS = ("learner_gpu", "learner_host", "buffer_host")
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


@dataclass(frozen=True, slots=True)
class ShardPlacement:
    """One shard.

    Attributes:
        shard_id (int): global shard number.
        owner_rank (int): world rank that holds its memory.
        tier (str): ``learner_gpu``, ``learner_host`` or ``buffer_host``.
        capacity_rows (int): ring slots.
        partition (int): learner world rank whose partition this shard belongs to
            (partitioned sampling), or -1 when every learner samples it.
        location (str): where it lives, e.g. ``node3.gpu2``, ``node3.host``,
            ``node3.buf0`` ("" when unknown).
        share (float): expected fraction of its partition's samples drawn from it
            (0 when unknown).
    """

    shard_id: int
    owner_rank: int
    tier: str
    capacity_rows: int
    partition: int = -1
    location: str = ""
    share: float = 0.0


@dataclass(frozen=True, slots=True)
class ShardWeights:
    """Shards an actor writes, with the fraction of its rows for each.

    Attributes:
        shards (tuple[int, ...]): shard ids, ascending.
        weights (tuple[float, ...]): fractions (sum 1).
        cumulative (tuple[float, ...]): running sums of ``weights`` (last is 1).
    """

    shards: tuple[int, ...]
    weights: tuple[float, ...]
    cumulative: tuple[float, ...] = ()

    @classmethod
    def of(cls, pairs: Mapping[int, float]) -> ShardWeights:
        """From shard -> weight (any positive scale); zero weights are dropped.

        Raises:
            ConfigError: no positive weight, or a negative/non-finite one.
        """
        items = sorted((int(s), float(w)) for s, w in pairs.items() if w != 0)
        if any(not math.isfinite(w) or w < 0 for _, w in items) or not items:
            raise ConfigError(f"shard weights must be finite, >= 0 and not all 0, got "
                              f"{dict(pairs)!r}", key="actor_weights")
        total = math.fsum(w for _, w in items)
        ws = tuple(w / total for _, w in items)
        cum, acc = [], 0.0
        for w in ws:
            acc += w
            cum.append(acc)
        cum[-1] = 1.0
        return cls(tuple(s for s, _ in items), ws, tuple(cum))

    def pick(self, k: int) -> int:
        """The shard for an actor's ``k``-th batch: a deterministic low-discrepancy
        sequence, so that every prefix of batches splits close to ``weights``."""
        if len(self.shards) == 1:
            return self.shards[0]
        u = (k * _GOLDEN) % 1.0
        i = bisect.bisect_right(self.cumulative, u)
        return self.shards[min(i, len(self.shards) - 1)]


@dataclass(frozen=True, slots=True)
class LearnerPrediction:
    """What the plan predicts for one learner, per superstep.

    Attributes:
        rank (int): learner world rank.
        node (str): its node.
        path_s (float): experience-path time: the slowest of its parallel reads (each:
            its busiest link's time plus a round trip of latency).
        exposed_s (float): ``max(0, path_s - compute_s)``: what the learner waits when
            the path runs ahead of compute (``edp``).
        read_bytes (float): bytes it reads per superstep.
        bytes_per_link (dict[str, float]): its read bytes over each link it uses
            (links of other nodes it reads from are summed as ``remote.*``).
        slowest_link (str): the link that sets ``path_s`` ("" when all reads are local).
    """

    rank: int
    node: str
    path_s: float
    exposed_s: float
    read_bytes: float
    bytes_per_link: dict[str, float]
    slowest_link: str


@dataclass(frozen=True, slots=True)
class Bottleneck:
    """The busiest link of a plan.

    Attributes:
        link (str): link name (``node3.nic.in``, ``node0.gpu1.h2d``, ...).
        kind (str): ``h2d``, ``d2h``, ``nvl_out``, ``nvl_in``, ``shm``, ``nic_out``,
            ``nic_in`` or ``path``.
        time_s (float): seconds per superstep it is busy.
        utilisation (float): ``time_s`` over the superstep period (> 1: the link cannot
            carry one superstep's traffic within a superstep).
        read_bytes (float), ingest_bytes (float): its bytes per superstep by cause.
    """

    link: str
    kind: str
    time_s: float
    utilisation: float
    read_bytes: float
    ingest_bytes: float

    def describe(self) -> str:
        total = self.read_bytes + self.ingest_bytes
        if total <= 0:
            return "no link carries experience traffic (every read is from the learner's GPU)"
        ing = 100.0 * self.ingest_bytes / total
        return (f"{self.link} ({self.kind}) is busy {self.time_s * 1e3:.3f} ms per superstep "
                f"({self.utilisation:.0%} of the period); {_fmt_bytes(total)} per superstep, "
                f"{ing:.0f}% of it ingest")


@dataclass(frozen=True, slots=True)
class PlanPrediction:
    """The cost model's view of a plan.

    Attributes:
        superstep_s (float): superstep period (1 / learner update rate).
        compute_s (float): learner compute time per superstep used for ``exposed_s``.
        objective_s (float): busiest link's time per superstep (what the planner
            minimises).
        learners (tuple[LearnerPrediction, ...]): per learner, by rank.
        bottleneck (Bottleneck): the busiest link.
        tier_bytes (dict[str, tuple[int, int]]): tier -> (bytes used, bytes available).
        link_time_s (dict[str, float]): every link with traffic -> seconds per superstep.
        method (str): how the plan was found.
        planning_s (float): wall time of planning.
    """

    superstep_s: float
    compute_s: float
    objective_s: float
    learners: tuple[LearnerPrediction, ...]
    bottleneck: Bottleneck
    tier_bytes: dict[str, tuple[int, int]]
    link_time_s: dict[str, float]
    method: str = ""
    planning_s: float = 0.0

    @property
    def max_path_s(self) -> float:
        return max((lp.path_s for lp in self.learners), default=0.0)

    @property
    def max_exposed_s(self) -> float:
        return max((lp.exposed_s for lp in self.learners), default=0.0)

    @property
    def slowest_learner(self) -> LearnerPrediction | None:
        if not self.learners:
            return None
        return max(self.learners, key=lambda lp: (lp.path_s, -lp.rank))


@dataclass(frozen=True, slots=True)
class Placement:
    """Where shards live and which actors write and learners read them.

    Attributes:
        shards (tuple[ShardPlacement, ...]): indexed by ``shard_id``.
        actor_shards (dict[int, int]): actor world rank -> the shard it writes (its
            main one when it writes several, see ``actor_weights``).
        learner_shards (dict[int, tuple[int, ...]]): learner world rank -> shards it reads.
        actor_weights (dict[int, ShardWeights] | None): actor world rank -> every shard
            it writes and the fraction of its rows for each (None: ``actor_shards``).
        prediction (PlanPrediction | None): the cost model's prediction, when planned
            against a cluster model.
    """

    shards: tuple[ShardPlacement, ...]
    actor_shards: dict[int, int]
    learner_shards: dict[int, tuple[int, ...]]
    actor_weights: dict[int, ShardWeights] | None = field(default=None, compare=True)
    prediction: PlanPrediction | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # tables of its own that cannot change: checked here, read at every ingest (a
        # caller's dict changed after the data plane was built routed rows unchecked)
        object.__setattr__(self, "shards", tuple(self.shards))
        object.__setattr__(self, "actor_shards", FrozenDict(self.actor_shards))
        object.__setattr__(self, "learner_shards", FrozenDict(
            {r: tuple(s) for r, s in self.learner_shards.items()}))
        if self.actor_weights is not None:
            object.__setattr__(self, "actor_weights", FrozenDict(self.actor_weights))
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
        seen: set[int] = set()  # learners and actors often share one tuple: check it once
        for a, sid in self.actor_shards.items():
            if not 0 <= sid < n:
                raise ConfigError(f"actor {a} writes shard {sid}, outside [0, {n})",
                                  key="actor_shards")
        for a, w in (self.actor_weights or {}).items():
            if id(w) in seen:
                continue
            seen.add(id(w))
            if w.shards and not (w.shards[0] >= 0 and w.shards[-1] < n):
                raise ConfigError(f"actor {a} writes shards {w.shards}, outside [0, {n})",
                                  key="actor_weights")
        for r, sids in self.learner_shards.items():
            if id(sids) in seen:
                continue
            seen.add(id(sids))
            if sids and not (min(sids) >= 0 and max(sids) < n):
                raise ConfigError(f"learner {r} reads shards outside [0, {n})",
                                  key="learner_shards")

    def shards_of(self, owner_rank: int) -> tuple[ShardPlacement, ...]:
        """Shards whose memory ``owner_rank`` holds, by shard id."""
        return tuple(s for s in self.shards if s.owner_rank == owner_rank)

    def shard_for(self, actor_rank: int, batch_index: int) -> int:
        """The shard an actor's ``batch_index``-th batch goes to. Local; deterministic."""
        if self.actor_weights is not None and actor_rank in self.actor_weights:
            return self.actor_weights[actor_rank].pick(batch_index)
        return self.actor_shards[actor_rank]

    @property
    def capacity_rows(self) -> int:
        return sum(s.capacity_rows for s in self.shards)

    def tier_rows(self) -> dict[str, int]:
        """Rows of capacity per tier."""
        out = dict.fromkeys(TIERS, 0)
        for s in self.shards:
            out[s.tier] += s.capacity_rows
        return out

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible mapping of the plan (without the prediction), sparse:
        actors that write the same shards with the same weights are one entry of
        ``actor_weights`` (``{"actors": [...], "shards": [...], "weights": [...]}``),
        learners that read the same shards one entry of ``learner_shards``
        (``{"learners": [...], "shards": [...]}``). A shard's ``share`` is the expected
        fraction of its partition's sampled rows drawn from it (of every learner's draws
        in global scope)."""
        def groups(table: Mapping[int, Any]) -> list[tuple[list[int], Any]]:
            out: list[tuple[list[int], Any]] = []
            by_id: dict[int, int] = {}  # shared objects are hashed once
            by_value: dict[Any, int] = {}
            for rank, value in sorted(table.items()):
                g = by_id.get(id(value))
                if g is None:
                    g = by_value.setdefault(value, len(out))
                    if g == len(out):
                        out.append(([], value))
                    by_id[id(value)] = g
                out[g][0].append(int(rank))
            return out

        return {
            "shards": [{"shard_id": s.shard_id, "owner_rank": s.owner_rank, "tier": s.tier,
                        "capacity_rows": s.capacity_rows, "partition": s.partition,
                        "location": s.location, "share": s.share} for s in self.shards],
            "actor_shards": {str(a): s for a, s in sorted(self.actor_shards.items())},
            "actor_weights": None if self.actor_weights is None else [
                {"actors": ranks, "shards": list(w.shards), "weights": list(w.weights)}
                for ranks, w in groups(self.actor_weights)],
            "learner_shards": [{"learners": ranks, "shards": list(sids)}
                               for ranks, sids in groups(self.learner_shards)],
        }


def _fmt_bytes(n: float) -> str:
    for unit, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f} B"


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
