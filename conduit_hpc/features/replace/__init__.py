"""Adaptive placement acting in a running job. Composition layer (MPI ranks + placement).

With ``[placement] adaptive = true`` the job re-places its replay while actors ingest and
learners sample: every ``interval_supersteps`` the lead learner reports what it measured,
the :class:`~conduit_hpc.placement.AdaptivePolicy` looks, and when it decides to move,
actors are re-routed and rows move between shards at once - hottest rows to the shard
learners read fastest.

**Why in place, with no new windows.** Windows are collective, and after its first
``next_batch`` a learner's MPI calls belong to its data-plane thread while buffers sit
in ``serve()``: a mid-run collective would have to stop every rank. Instead every shard
a plan can use exists from the start - one per buffer rank, at that rank's location
(:mod:`conduit_hpc.placement.inplace`): with ``[layout] emulate_nodes = 2``, a buffer on
the learner's node and one on the other node. Every learner samples every shard by its
total mass (global prioritized sampling), so *where* a row lives changes what a batch
costs, never its probability. A re-placement is:

1. **routing** - the coordinator publishes each actor's new row weights on a small
   one-sided *placement board* (an RMA window with a seqlock, like the weights board);
   actors look at it every few ms and send later batches where it says. Which shard an
   actor writes never affects correctness, only cost;
2. **moving rows** - each source shard's owner, inside its progress loop, takes its rows
   hottest first (:func:`~conduit_hpc.storage.migrate.select_rows`) and moves the runs
   the plan assigns elsewhere with :func:`~conduit_hpc.storage.migrate.move_rows`, one
   chunk per pass (so it keeps committing, answering samples and applying updates in
   between), hiding the moved rows in its index inside the shard's seqlock. Owners move
   one after another, so no two owners wait on each other's commits;
3. **late priority updates** - an update for a row that moved since it was sampled is
   forwarded by the old owner to the new one (``MoveRecord.forward``), chains included.
   A forwarded update never overwrites one the row got at its new place (a learner
   updates in superstep order, so that one is for a later batch). Every forward is
   acknowledged only once applied (Dijkstra-Scholten), so at the end buffer ranks know
   that nothing is in flight (:attr:`Tag.REPLACE_QUIET`) before they stop serving.

**Roles.** The *coordinator* is the first buffer rank (it owns the control block and the
board). It runs the policy in its progress loop on telemetry the job measures: per-shard
sample counts from the lead learner's batches, the learner's compute and iteration time,
the actors' insert rate (control block), the rows every owner holds by sampling mass (a
``REPLACE_STATS`` round trip: the heat of the replay and where its hottest rows are), and
the links of the cluster model (``[placement] cluster``, or the start-up probe). While the
policy cools down after a move, looks are skipped (no round trip, no LP).

**Guarantees** (tested under MPI with concurrent ingest and sampling): a moved row is
never lost, duplicated or torn; once a move is over, every row is held by exactly one
shard at the priority it had (later updates included), so sampling is again exactly
proportional to ``priority ** alpha`` over the whole replay. *While* a chunk is in flight
a row can be visible in both shards, or (until the destination's next commit pass) in
neither, for a moment - one chunk at a time. A move appends rows to the destination ring
like a writer: into a full ring, it evicts that ring's oldest rows, as ingest would.
Every wait is bounded by ``run.timeout_s``; a failure raises on the rank that sees it and
``python -m mpi4py`` aborts the job.

Modules: :mod:`.board` (the placement board, actors' routing, the lead learner's
telemetry, message layouts), :mod:`.owner` (a buffer rank's moves, forwarding and
stopping), :mod:`.coordinator` (looks and the policy); the pure parts - which rows go
where, the job's shards as the cost model sees them - are
:mod:`conduit_hpc.placement.inplace`.

**Start plan.** The policy starts from the placement the job executes - round robin, or
the static plan (``[placement] planner = "static"``): its shards' capacities and expected
shares, and the actors' row weights (actors follow them until the first move). The cost
model sees each shard at its owner's buffer location, so a ``learner_host`` shard (owned
by a buffer rank on the learner's node, see :mod:`conduit_hpc.plane.planning`) counts as
that node's buffer memory - the same links.

Not supported (refused by the config): partitioned sampling, the sequence sampler (moves
would cut windows), several shards per buffer rank (a static plan that puts two shards on
one buffer rank is refused with that message), a static plan with ``learner_gpu`` shards
(their learner's device mirror drops rows in the ring's FIFO order only: a row moved out
would stay drawable there beside its new place), and checkpoints (a shard that rows
left holds them in a non-contiguous run, which the checkpoint format does not store).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conduit_hpc.errors import ConfigError
from conduit_hpc.features.replace.board import ActorRouter, PlacementBoard, TelemetryTap
from conduit_hpc.features.replace.coordinator import Coordinator
from conduit_hpc.features.replace.owner import ShardMover
from conduit_hpc.placement.adaptive import AdaptiveKnobs, AdaptivePolicy
from conduit_hpc.placement.cluster import ClusterModel, Roster
from conduit_hpc.placement.inplace import job_cluster, job_placement, planned_rows
from conduit_hpc.placement.model import Workload, sampling_of
from conduit_hpc.placement.placement import Placement
from conduit_hpc.plane.extensions import Feature
from conduit_hpc.plane.roles import Role
from conduit_hpc.transport.rma import RmaWindow

if TYPE_CHECKING:
    from conduit_hpc.config import Config
    from conduit_hpc.plane.host import FeatureHost
    from conduit_hpc.plane.roles import RoleComms
    from conduit_hpc.spec import Spec

__all__ = ["ActorRouter", "Coordinator", "PlacementBoard", "Replacement", "ReplacementPlan",
           "ShardMover", "TelemetryTap", "job_workload", "plan_replacement"]

# ---------------------------------------------------------------------------------
# the whole thing, per rank


def job_workload(config: Config, spec: Spec, job: Placement) -> Workload:
    """The workload the policy plans for: the job's rows, batch and sampling; rates and
    compute come from telemetry at each look."""
    sch = config.scheduler
    return Workload(capacity_rows=planned_rows(job), row_bytes=spec.row_bytes,
                    stored_row_bytes=spec.stored_row_bytes,
                    batch_rows=sch.batch_rows, update_rate_hz=100.0, actor_rows_per_s=0.0,
                    sampling=sampling_of(sch, config.storage), scope="global",
                    tiers=("buffer_host",))


@dataclass(frozen=True, slots=True)
class ReplacementPlan:
    """What adaptive re-placement plans with, decided before any window exists.

    Attributes:
        cluster (ClusterModel): the model with the job's shard capacities
            (:func:`~conduit_hpc.placement.inplace.job_cluster`).
        roster (Roster): the job's ranks on its nodes.
        job (Placement): the job's shards at their locations.
        workload (Workload): what the policy plans for.
    """

    cluster: ClusterModel
    roster: Roster
    job: Placement
    workload: Workload


def plan_replacement(config: Config, roles: RoleComms, placement: Placement, spec: Spec,
                     cluster: ClusterModel | None = None) -> ReplacementPlan:
    """Load (or probe) the cluster model and check it against the job. Deterministic
    from the config, so every rank raises alike; **collective** only when it probes
    (``[placement] cluster`` empty and no ``cluster`` given).

    Raises:
        ConfigError: the cluster file is missing or bad, it describes fewer nodes than
            the job runs on, or a buffer rank holds other than one shard.
    """
    pc = config.placement
    if cluster is None:
        if pc.cluster:
            cluster = ClusterModel.from_toml(pc.cluster)
        else:
            from conduit_hpc.plane.probe import probe_cluster

            cluster, _, _ = probe_cluster(roles)
    roster = Roster.from_ranks(cluster, roles.node_of, roles.learner_ranks,
                               roles.buffer_ranks, roles.actor_ranks)
    job = job_placement(placement, cluster, roster)
    workload = job_workload(config, spec, job)
    return ReplacementPlan(job_cluster(cluster, roster, job, workload), roster, job, workload)


class Replacement(Feature):
    """Adaptive re-placement on one rank of a running job (see the module docstring), a
    :class:`~conduit_hpc.plane.extensions.Feature` the plane builds when
    ``[placement] adaptive = true``.

    :meth:`check` loads (or probes) the cluster model and checks it against the job
    before any window exists; :meth:`attach` makes the placement board (**collective**:
    its window) and this rank's part: the owners' movers and the coordinator on buffer
    ranks, the actors' routers, the lead learner's telemetry.

    Args:
        config (Config): the job's config.
        roles (RoleComms): this rank's roles.
    """

    name = "replacement"
    priority_messages = True  # its owners see every update (forward, count)

    @classmethod
    def wanted(cls, config: Config) -> bool:
        return config.placement.adaptive

    def __init__(self, config: Config, roles: RoleComms) -> None:
        self.config, self.roles = config, roles
        self.plan: ReplacementPlan | None = None
        self._window: RmaWindow | None = None
        self.mover: ShardMover | None = None
        self.coordinator: Coordinator | None = None
        self.router: ActorRouter | None = None
        self.tap: TelemetryTap | None = None

    def check(self, placement: Placement, spec: Spec) -> None:
        gpu = [s.shard_id for s in placement.shards if s.tier == "learner_gpu"]
        if gpu:
            # the learner's device mirror keeps a row until the ring hands its slot on
            # (FIFO); a move hides the row in the owner's index only, so the row would
            # stay drawable on the device and at its new place (delivered twice)
            raise ConfigError(
                f"placement.adaptive = true with a static plan that puts shards {gpu} in "
                f"the learner_gpu tier: live re-placement moves rows out of a shard by "
                f"hiding them in its owner's index, which the learner's device mirror of "
                f"that shard does not see (the rows would stay drawable there and at "
                f"their new place); expected placement.tiers without 'learner_gpu' "
                f"(now {list(self.config.placement.tiers)}) or placement.adaptive = false",
                key="placement.adaptive")
        self.plan = plan_replacement(self.config, self.roles, placement, spec)

    def attach(self, edp: FeatureHost) -> None:
        plan = self.plan
        assert plan is not None
        cfg, roles = edp.config, edp.roles
        pc = cfg.placement
        self.job, workload, self.cluster, self.roster = (plan.job, plan.workload,
                                                         plan.cluster, plan.roster)
        roster = plan.roster
        me = roles.world_rank
        self.coordinator_rank = roles.buffer_ranks[0]
        n_shards = len(self.job.shards)
        nb = PlacementBoard.nbytes(len(roles.actor_ranks), n_shards)
        self._window = RmaWindow(roles.world, nb if me == self.coordinator_rank else 0,
                                 node_comm=roles.node,
                                 shared=cfg.transport.shared_memory == "auto",
                                 timeout_s=cfg.run.timeout_s,
                                 what="the data plane's constructor (the placement board)")
        self.board = PlacementBoard(self._window, self.coordinator_rank, roles.actor_ranks,
                                    n_shards, cfg.run.timeout_s)
        if roles.role is Role.BUFFER:
            self.mover = ShardMover(edp)
            if me == self.coordinator_rank:
                order = "hottest" if workload.sampling == "prioritized" else "oldest"
                policy = AdaptivePolicy(self.cluster, workload, self.job,
                                        knobs=AdaptiveKnobs.from_config(pc), roster=roster)
                self.coordinator = Coordinator(edp, self.mover, self.board, policy,
                                               self.job, order)
        elif roles.role is Role.ACTOR:
            self.router = ActorRouter(self.board, me, edp.placement.actor_shards[me])
            # until the first move, the start plan's row weights (a static plan's split)
            self.router.weights = (edp.placement.actor_weights or {}).get(me)
        elif me == roles.learner_ranks[0]:
            assert edp.learner is not None
            self.tap = TelemetryTap(edp.learner, edp.channel, self.coordinator_rank, n_shards,
                                    pc.interval_supersteps)
            edp.learner.add_hook(self.tap)

    def route(self, batches: int) -> int | None:
        return self.router.shard(batches) if self.router is not None else None

    def shard_for(self, batch_index: int) -> int:
        """Actors: the shard for this actor's ``batch_index``-th batch. Local but for an
        atomic read every few ms."""
        assert self.router is not None
        return self.router.shard(batch_index)

    def moves_done(self) -> int:
        """Re-placements completed so far (one atomic read). Any rank - on a learner in
        ``edp`` mode only through ``learner.run_on_thread`` once batches flow."""
        return self.board.moves_done()

    def summary(self) -> dict[str, Any]:
        """This rank's part: the coordinator's decisions (``history``: the latest
        :data:`~conduit_hpc.features.replace.coordinator.HISTORY_KEEP` looks; ``looks`` and
        ``moves`` count them all), an owner's counters, an actor's routing version. Local."""
        out: dict[str, Any] = {}
        if self.coordinator is not None:
            out["history"] = list(self.coordinator.history)  # the latest looks
            out["looks"] = self.coordinator.looks_done
            out["moves"] = self.coordinator.moves
            out["skipped_looks"] = self.coordinator.skipped_looks
        if self.mover is not None:
            out["counters"] = dict(self.mover.counters)
        if self.router is not None:
            out["routing_version"] = self.router.version
        if self.tap is not None:
            out["reports"] = self.tap.reports
        return out

    def close(self) -> None:
        """Free the board. **Collective** on the job's ranks; idempotent."""
        if self._window is not None:
            self._window.close()
            self._window = None

