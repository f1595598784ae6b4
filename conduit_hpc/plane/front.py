"""The Experience Data Plane: the ingest, place and deliver control points.

One :class:`ExperienceDataPlane` per rank, built by every rank of the job together. It
splits the world into roles, agrees on the config, lays shards out as the placement
says in RMA windows, and then:

* on **actor** ranks, :meth:`~ExperienceDataPlane.ingest` validates a batch and appends
  it to the actor's shard (one atomic reservation, one put per field, one commit),
  waiting only where the rate limiter or the policy-lag bound says so;
* on **buffer** ranks, :meth:`~ExperienceDataPlane.serve` runs the progress loop that
  commits rows and answers requests until every other rank is done;
* on **learner** ranks, :meth:`~ExperienceDataPlane.next_batch` returns a ready batch
  and :meth:`~ExperienceDataPlane.update_priorities` feeds back TD errors;
* every rank calls :meth:`~ExperienceDataPlane.close` (collective) at the end.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from mpi4py import MPI
from numpy.typing import ArrayLike

from conduit_hpc.config import Config
from conduit_hpc.errors import (
    ConduitError,
    ConfigError,
    DataPlaneClosed,
    DataPlaneTimeout,
    SpecError,
)
from conduit_hpc.features.longhaul.feature import LongHaul
from conduit_hpc.placement.placement import Placement, plan_round_robin
from conduit_hpc.plane.buffer import BufferServer, OwnedShard, SequenceWindow
from conduit_hpc.plane.delivery import (
    C_ACTORS_DONE,
    C_INSERTS,
    C_LEARNER_VERSION,
    C_LEARNERS_DONE,
    C_RESERVED,
    C_SAMPLES,
    ControlBlock,
    Deliverer,
    WeightsBoard,
    flat_parameters,
    load_flat,
    select_device,
)
from conduit_hpc.plane.learner import LearnerEndpoint
from conduit_hpc.plane.metrics import ACTOR_COLUMNS, CsvSink
from conduit_hpc.plane.roles import Role, RoleComms, check_same_config, split_roles
from conduit_hpc.protocol import Tag
from conduit_hpc.scheduler import LimiterState, RateLimiter
from conduit_hpc.spec import Spec
from conduit_hpc.storage.priority import PriorityIndex, check_priorities
from conduit_hpc.storage.ring import ShardLayout, ShardRing
from conduit_hpc.transport.channel import Channel
from conduit_hpc.transport.rma import RmaWindow

if TYPE_CHECKING:
    from conduit_hpc.features.checkpointing.agent import SaveResult
    from conduit_hpc.features.checkpointing.resume import RestoreResult
    from conduit_hpc.features.replace import Replacement

__all__ = ["ExperienceDataPlane", "IngestReceipt", "IngestStats"]


class IngestReceipt(NamedTuple):
    """What one :meth:`ExperienceDataPlane.ingest` call wrote.

    Attributes:
        rows (int): rows written.
        shard_id (int): the shard they went to.
        first_seq (int): shard sequence number of the first row (rows are consecutive).
    """

    rows: int
    shard_id: int
    first_seq: int


class IngestStats:
    """Counters of one actor's ingest.

    Attributes:
        rows (int): rows ingested.
        batches (int): calls that wrote rows.
        bytes (int): payload bytes written.
        seconds (float): wall time spent inside ``ingest``.
        limiter_wait_s (float): part of it spent waiting for the rate limiter.
        lag_wait_s (float): part of it spent waiting for fresher weights.
    """

    __slots__ = ("batches", "bytes", "lag_wait_s", "limiter_wait_s", "rows", "seconds")

    def __init__(self) -> None:
        self.rows = 0
        self.batches = 0
        self.bytes = 0
        self.seconds = 0.0
        self.limiter_wait_s = 0.0
        self.lag_wait_s = 0.0

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__slots__}


class ExperienceDataPlane:
    """The data plane of one rank.

    **Collective** on ``comm`` (construction, :meth:`share_weights`, :meth:`summary`
    and :meth:`close`).

    Args:
        config (Config): the job configuration; must be equal on every rank.
        comm (MPI.Intracomm | None): the job's ranks (default ``COMM_WORLD``); a private
            duplicate is used.
        placement (Placement | None): where shards live; default: round-robin over
            buffer ranks (see :func:`~conduit_hpc.placement.plan_round_robin`).
        run_dir (str | Path | None): where metrics files go (``metrics/``); None keeps
            metrics in memory only.
        transform (callable | None): on learners, applied to each numpy batch (a dict
            of arrays) before it is handed to torch; runs on the data-plane thread in
            ``edp`` mode.

    Raises:
        ConfigMismatch: ranks hold different configs (on every rank).
        WorldTooSmall: the layout needs more ranks (on every rank).
        SpecError: the config's spec is empty or invalid (on every rank).
        ConfigError: ``edp`` mode without MPI_THREAD_SERIALIZED (on every rank).
    """

    def __init__(self, config: Config, comm: MPI.Intracomm | None = None, *,
                 placement: Placement | None = None, run_dir: str | Path | None = None,
                 transform: Any = None) -> None:
        comm = MPI.COMM_WORLD if comm is None else comm
        self.config = config
        # deterministic checks first, so that every rank raises the same error
        self.spec = Spec.from_config(config.spec)
        sch = config.scheduler
        if sch.mode == "edp" and MPI.Query_thread() < MPI.THREAD_SERIALIZED:
            raise ConfigError("scheduler.mode = 'edp' needs MPI_THREAD_SERIALIZED or "
                              "better (a data-plane thread makes the learner's MPI calls); "
                              f"MPI granted level {MPI.Query_thread()}",
                              key="scheduler.mode")
        check_same_config(comm, config)
        self.roles: RoleComms = split_roles(comm, config.layout)
        roles = self.roles
        # long-haul deployment (edge / data centre across one emulated link), if on
        self._longhaul = LongHaul(config, roles) if config.longhaul.mode != "off" else None
        if self._longhaul is not None:
            placement = self._longhaul.placement(placement)
        if placement is None:
            placement = plan_round_robin(
                actor_ranks=roles.actor_ranks, buffer_ranks=roles.buffer_ranks,
                learner_ranks=roles.learner_ranks,
                capacity_rows=config.storage.capacity_rows,
                shards_per_buffer=config.storage.shards_per_buffer)
        self.placement = placement
        replan = None
        if config.placement.adaptive:  # the cluster model against the job, before windows
            from conduit_hpc.features.replace import plan_replacement

            try:
                replan = plan_replacement(config, roles, placement, self.spec)
            except ConduitError:
                roles.close()  # every rank raises alike (decided from shared data)
                raise
        self.run_dir = Path(run_dir) if run_dir else None
        me = roles.world_rank
        layouts = [ShardLayout(self.spec, s.capacity_rows) for s in placement.shards]
        # each owner's segment starts with int64[world_size] acknowledgements: how many
        # priority-update messages it has applied from each rank (see Deliverer.mark)
        self._ack_bytes = (8 * roles.world_size + 63) // 64 * 64
        bases: dict[int, int] = {}
        used: dict[int, int] = {}
        for s, lay in zip(placement.shards, layouts, strict=True):
            bases[s.shard_id] = used.get(s.owner_rank, self._ack_bytes)
            used[s.owner_rank] = bases[s.shard_id] + lay.nbytes
        tcfg = config.transport
        shared = tcfg.shared_memory == "auto"
        self._window = RmaWindow(roles.world, used.get(me, 0), node_comm=roles.node,
                                 shared=shared)
        self._control_owner = roles.buffer_ranks[0]
        self._control_window = RmaWindow(roles.world, 64 if me == self._control_owner else 0,
                                         node_comm=roles.node, shared=shared)
        self.control = ControlBlock(self._control_window, self._control_owner)
        timeout = config.run.timeout_s
        self.rings: dict[int, ShardRing] = {
            s.shard_id: ShardRing(self._window, s.owner_rank, bases[s.shard_id], lay,
                                  timeout_s=timeout, poll_interval_s=tcfg.poll_interval_s)
            for s, lay in zip(placement.shards, layouts, strict=True)}
        # the owner always maps its own memory, whatever the sharing policy
        for s in placement.shards_of(me):
            ring = self.rings[s.shard_id]
            if ring.views is None:
                ring.views = ring.layout.views(self._window.own_segment(), ring.base)
        self.channel = (Channel(roles.world, poll_interval_s=tcfg.poll_interval_s)
                        if self._longhaul is None else
                        self._longhaul.make_channel(roles.world, tcfg.poll_interval_s))
        self.limiter = RateLimiter(sch.samples_per_insert, sch.min_fill_rows, sch.error_buffer)
        self.ingest_stats = IngestStats()
        self._done_sent = False
        self._closed = False
        self._weights_window: RmaWindow | None = None
        self.weights: WeightsBoard | None = None
        self._model: Any = None
        self.server: BufferServer | None = None
        self.learner: Any = None
        self._learner_summary: dict[str, float] = {}
        self._actor_metrics: CsvSink | None = None
        self._t0 = time.perf_counter()
        self._last_actor_log = self._t0
        self._rows_at_log = 0
        if roles.role is Role.BUFFER:
            self._init_buffer()
        elif roles.role is Role.LEARNER:
            self._init_learner(transform)
        else:
            self._actor_metrics = CsvSink(self._metrics_file(f"actor-{me}.csv"), ACTOR_COLUMNS,
                                          keep=False)
        #: adaptive re-placement in the running job (``[placement] adaptive``), collective
        self.replacement: Replacement | None = None
        if replan is not None:
            from conduit_hpc.features.replace import Replacement

            self.replacement = Replacement(self, replan)
        if self._longhaul is not None:
            self._longhaul.attach(self)  # collective

    def _metrics_file(self, name: str) -> Path | None:
        return self.run_dir / "metrics" / name if self.run_dir else None

    def _init_buffer(self) -> None:
        cfg, roles, me = self.config, self.roles, self.roles.world_rank
        scfg, sch = cfg.storage, cfg.scheduler
        alpha = 0.0 if sch.sampler == "uniform" else scfg.priority_exponent
        seqwin = (SequenceWindow(sch.window, sch.episode_field, sch.stream_field,
                                 sch.cross_episode) if sch.sampler == "sequence" else None)
        owned = []
        for s in self.placement.shards_of(me):
            ring = self.rings[s.shard_id]
            assert ring.views is not None
            # the tree and generations live in the window: node-local learners search
            # them directly (under the shard's seqlock) instead of asking
            index = PriorityIndex(s.capacity_rows, alpha=alpha,
                                  initial_priority=scfg.initial_priority,
                                  sum_buffer=ring.views.tree, gens_buffer=ring.views.gens)
            owned.append(OwnedShard(s.shard_id, ring, index, sequence=seqwin))
        peers = tuple(r for r in range(roles.world_size) if r not in roles.buffer_ranks)
        on_done = self._count_done if me == self._control_owner else None
        seg = self._window.own_segment()
        acks = seg[:8 * roles.world_size].view(np.int64)
        self.server = BufferServer(owned, self.channel, peers, on_done=on_done,
                                   poll_interval_s=cfg.transport.poll_interval_s,
                                   seed=cfg.run.seed + me, acks=acks,
                                   sync=self._window.sync)

    def _count_done(self, rank: int) -> None:
        slot = C_LEARNERS_DONE if rank in self.roles.learner_ranks else C_ACTORS_DONE
        self.control.add(slot, 1)

    def _init_learner(self, transform: Any) -> None:
        cfg, roles, me = self.config, self.roles, self.roles.world_rank
        mine = self.placement.learner_shards.get(me, ())
        local = [r for r in roles.learner_ranks if roles.same_node(r, me)].index(me)
        self.device = select_device(cfg.scheduler.device, local)
        owners = {s: self.placement.shards[s].owner_rank for s in mine}
        acks = {}
        for o in set(owners.values()):
            view = self._window.local_view(o)
            if view is not None:
                acks[o] = view[:8 * roles.world_size].view(np.int64)
        d = Deliverer(spec=self.spec, rings={s: self.rings[s] for s in mine}, owners=owners,
                      acks=acks, sync=self._window.sync, rank=me,
                      channel=self.channel, control=self.control, limiter=self.limiter,
                      config=cfg.scheduler, n_actors=len(roles.actor_ranks),
                      device=self.device, transform=transform, seed=cfg.run.seed + me,
                      timeout_s=cfg.run.timeout_s,
                      poll_interval_s=cfg.transport.poll_interval_s)
        self.learner = LearnerEndpoint(d, cfg.scheduler, self.control,
                                       lead=me == roles.learner_ranks[0],
                                       metrics_path=self._metrics_file(f"learner-{me}.csv"),
                                       timeout_s=cfg.run.timeout_s,
                                       status=me == 0 and self.run_dir is not None)

    # -- context -------------------------------------------------------------------
    def __enter__(self) -> ExperienceDataPlane:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # on an exception, do not enter collectives that other ranks may never reach;
        # the job aborts (python -m mpi4py) and the OS reclaims everything
        if exc_type is None:
            self.close()

    # -- introspection -------------------------------------------------------------
    @property
    def role(self) -> Role:
        return self.roles.role

    @property
    def world_rank(self) -> int:
        return self.roles.world_rank

    def _require(self, role: Role, what: str) -> None:
        if self._closed:
            raise DataPlaneClosed(f"{what} called after close()")
        if self.roles.role is not role:
            raise ConduitError(f"{what} is for {role.value} ranks; world rank "
                               f"{self.world_rank} is a {self.roles.role.value}")

    @property
    def should_stop(self) -> bool:
        """True once every learner has finished (actors should stop producing). Local;
        one atomic read."""
        n = len(self.roles.learner_ranks)
        return n > 0 and self.control.read(C_LEARNERS_DONE) >= n

    # -- ingest (actors) -----------------------------------------------------------
    def ingest(self, batch: Mapping[str, object],
               priorities: ArrayLike | None = None) -> IngestReceipt:
        """Validate a batch and append it to this actor's shard.

        Local (one-sided). Blocks only while the rate limiter holds actors back, while
        this actor's weights lag the learner by more than ``max_policy_lag`` (it then
        pulls fresher ones into the model given to :meth:`share_weights`), or while a
        writer a full ring behind finishes - each bounded by ``run.timeout_s``. Actor
        ranks only.

        Args:
            batch (Mapping[str, array-like]): one array per spec field, leading batch
                dimension; dtypes must cast safely to the spec's.
            priorities (array-like | None): initial priority per row (finite, >= 0);
                ``None`` inserts at the shard's running maximum.

        Returns:
            IngestReceipt: rows written, the shard and the first sequence number.

        Raises:
            SpecError: the batch does not match the spec, priorities are bad, or the
                batch is larger than the shard or than ``scheduler.max_insert_batch``
                with the rate limiter on; nothing is written.
            DataPlaneTimeout: a wait ran past ``run.timeout_s``.
        """
        self._require(Role.ACTOR, "ingest()")
        t0 = time.perf_counter()
        data = self.spec.validate(batch)
        n = self.spec.rows_of(data)
        prio = None
        if priorities is not None:
            try:
                prio = check_priorities(priorities)
            except ValueError as err:
                raise SpecError(str(err)) from err
            if len(prio) != n:
                raise SpecError(f"priorities has {len(prio)} entries but the batch has "
                                f"{n} rows")
        sid = (self.placement.actor_shards[self.world_rank] if self.replacement is None
               else self.replacement.shard_for(self.ingest_stats.batches))
        ring = self.rings[sid]
        if n > ring.capacity:
            raise SpecError(f"batch of {n} rows exceeds the shard capacity of "
                            f"{ring.capacity} rows; split it or raise storage.capacity_rows")
        sch = self.config.scheduler
        if self.limiter.enabled and n > sch.max_insert_batch:
            raise SpecError(f"batch of {n} rows exceeds scheduler.max_insert_batch = "
                            f"{sch.max_insert_batch} (the rate limiter's tolerance is "
                            f"sized for it)")
        if n == 0:
            return IngestReceipt(0, sid, -1)
        self._wait_policy_lag()
        self._admit(n)
        first = ring.write(data, prio)
        self.control.add(C_INSERTS, n)
        st = self.ingest_stats
        st.rows += n
        st.batches += 1
        st.bytes += n * self.spec.row_bytes
        now = time.perf_counter()
        st.seconds += now - t0
        if now - self._last_actor_log > 1.0:
            self._log_actor(now)
        return IngestReceipt(n, sid, first)

    def _admit(self, n: int) -> None:
        """With the ratio on, reserve ``n`` inserts and wait until the ratio allows
        them. Reserving first means concurrent actors never overshoot together."""
        if not self.limiter.enabled:
            return
        old = self.control.add(C_RESERVED, n)
        lim = self.limiter
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.config.run.timeout_s
        while True:
            state = LimiterState(old, self.control.read(C_SAMPLES), 0)
            if lim.can_insert(state, n) or self.should_stop:
                break
            if time.monotonic() > deadline:
                raise DataPlaneTimeout(f"actor {self.world_rank} waited "
                                       f"{self.config.run.timeout_s:.1f} s to insert {n} "
                                       f"rows: {lim.explain(state)}")
            time.sleep(self.config.transport.poll_interval_s * 5)
        self.ingest_stats.limiter_wait_s += time.perf_counter() - t0

    def _wait_policy_lag(self) -> None:
        lag = self.config.scheduler.max_policy_lag
        if not lag:
            return
        if self.weights is None:
            raise ConfigError("scheduler.max_policy_lag > 0 needs share_weights(model) on "
                              "every rank before ingest", key="scheduler.max_policy_lag")
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.config.run.timeout_s
        while self.control.read(C_LEARNER_VERSION) - self.weights.seen_superstep > lag:
            if self.should_stop:
                break
            if not self.pull_weights():
                if time.monotonic() > deadline:
                    raise DataPlaneTimeout(
                        f"actor {self.world_rank} waited {self.config.run.timeout_s:.1f} s "
                        f"for weights newer than learner superstep "
                        f"{self.weights.seen_superstep}")
                time.sleep(self.config.transport.poll_interval_s * 5)
        self.ingest_stats.lag_wait_s += time.perf_counter() - t0

    def _log_actor(self, now: float) -> None:
        st = self.ingest_stats
        sink = self._actor_metrics
        if sink is None:
            return
        sink.add({"time_s": now - self._t0, "rows": st.rows,
                  "rows_per_s": (st.rows - self._rows_at_log) / (now - self._last_actor_log),
                  "limiter_wait_s": st.limiter_wait_s,
                  "policy_version": self.weights.seen_superstep if self.weights else -1})
        sink.flush()
        self._last_actor_log, self._rows_at_log = now, st.rows

    # -- weights (learners -> actors) ----------------------------------------------
    def share_weights(self, model: Any) -> None:
        """Set up weight publication: the lead learner publishes ``model``'s parameters
        now and every ``scheduler.weights_every`` supersteps; actors load the first
        ones here and newer ones with :meth:`pull_weights`. **Collective**: every rank
        calls it once, before its first ``next_batch``; buffers pass ``None``, actors
        and learners a model of the same architecture.

        Raises:
            ConfigError: actors' and the lead learner's models differ in size (on every
                rank).
        """
        if self.learner is not None and self.learner.started:
            raise DataPlaneClosed("share_weights() must come before the first next_batch() "
                                  "(it is collective, and the data-plane thread owns MPI "
                                  "from then on)")
        roles = self.roles
        n = int(flat_parameters(model).size) if model is not None else -1
        sizes = roles.world.allgather(n)
        lead = roles.learner_ranks[0] if roles.learner_ranks else -1
        if lead < 0:
            return
        want = sizes[lead]
        bad = [r for r in (*roles.actor_ranks, *roles.learner_ranks) if sizes[r] != want]
        if bad:
            raise ConfigError(f"share_weights: ranks {bad} passed models with "
                              f"{[sizes[r] for r in bad]} parameters, the lead learner "
                              f"{want}", key="model")
        me = roles.world_rank
        self._weights_window = RmaWindow(roles.world, 64 + 4 * want if me == lead else 0,
                                         node_comm=roles.node,
                                         shared=self.config.transport.shared_memory == "auto")
        self.weights = WeightsBoard(self._weights_window, lead, want)
        self._model = model
        if self.learner is not None:
            self.learner.weights, self.learner.model = self.weights, model
            self.learner.publish_now()
        roles.world.Barrier()  # the first weights are out before any actor pulls
        if roles.role is Role.ACTOR:
            self.pull_weights()  # every actor starts from the learner's weights

    def pull_weights(self, model: Any = None) -> bool:
        """Load newer published weights into ``model`` (default: the one given to
        :meth:`share_weights`). Returns whether there were newer ones. Actors; local,
        one-sided."""
        if self.weights is None:
            raise DataPlaneClosed("pull_weights() needs share_weights() first")
        flat = self.weights.pull()
        if flat is None:
            return False
        load_flat(model if model is not None else self._model, flat)
        return True

    @property
    def policy_version(self) -> int:
        """Learner superstep of the weights this actor last pulled (-1: none)."""
        return self.weights.seen_superstep if self.weights is not None else -1

    # -- deliver (learners) ----------------------------------------------------------
    def next_batch(self) -> Any:
        """The batch for this learner's next superstep (a
        :class:`~conduit_hpc.plane.delivery.Batch`: torch tensors on the learner's device,
        ``indices`` and importance ``weights``). Ends the current superstep. Blocks
        until the batch is ready (bounded by ``run.timeout_s``). Learner ranks only.

        Raises:
            DataPlaneClosed: every actor finished (e.g. on a stop request) while fewer
                than ``scheduler.min_fill_rows`` rows were held, so no batch can come.
                The data plane stays usable for the end of the run (``done``, a final
                checkpoint): a job that asked to stop treats it as the end of its loop.
            DataPlaneTimeout: no batch within ``run.timeout_s``.
        """
        self._require(Role.LEARNER, "next_batch()")
        if self._longhaul is not None:
            self._longhaul.end_superstep()
        return self.learner.next_batch()

    def update_priorities(self, indices: ArrayLike, priorities: ArrayLike) -> None:
        """New priorities for delivered rows (``indices`` from ``Batch.indices``). They
        reach the owners before any later sample of this learner; an update for a row
        overwritten since it was sampled is dropped and counted. Never blocks on the
        network. Learner ranks only.

        Raises:
            ValueError: bad indices, a length mismatch, or a negative, NaN or infinite
                priority (nothing is sent).
        """
        self._require(Role.LEARNER, "update_priorities()")
        self.learner.update_priorities(np.asarray(indices), priorities)

    def log(self, **values: float) -> None:
        """Add job columns (``loss=...``) to this learner's current superstep metrics."""
        self._require(Role.LEARNER, "log()")
        self.learner.log(**values)

    # -- serve (buffers) -----------------------------------------------------------
    def serve(self) -> None:
        """Run the buffer progress loop until every non-buffer rank is done. Buffer
        ranks only; blocks (see :mod:`conduit_hpc.plane.buffer` for why not forever)."""
        self._require(Role.BUFFER, "serve()")
        assert self.server is not None
        self.server.serve()

    def owned_shards(self) -> list[OwnedShard]:
        """Shards this rank owns (empty unless a buffer)."""
        return [] if self.server is None else list(self.server.shards)

    def summary(self) -> dict[str, Any]:
        """Counters of the whole job, the same dict on every rank. **Collective**
        (call after :meth:`serve` returned on buffers and :meth:`done` elsewhere).

        Returns:
            dict: ``actors`` (world rank -> ingest counters), ``shards`` (shard id ->
            committed, held, dropped and applied priority updates), ``learners`` (world
            rank -> latency summary), ``rows_ingested``, ``bytes_ingested``,
            ``replacement`` (world rank -> its part of adaptive re-placement, see
            :meth:`~conduit_hpc.features.replace.Replacement.summary`; empty when off).
        """
        mine: dict[str, Any] = {"rank": self.world_rank, "role": self.role.value}
        if self.role is Role.ACTOR:
            mine["ingest"] = self.ingest_stats.as_dict()
        if self.server is not None:
            for s in self.server.shards:
                s.poll()
            mine["shards"] = {s.shard_id: {"committed": s.committed, "held": s.index.count,
                                           "dropped_updates": s.index.dropped_updates,
                                           "applied_updates": s.index.applied_updates}
                              for s in self.server.shards}
        if self.role is Role.LEARNER:
            mine["learner"] = self._learner_summary
        if self.replacement is not None:
            mine["replacement"] = self.replacement.summary()
        if self._longhaul is not None:
            mine["longhaul"] = self._longhaul.local_stats()
        everyone = self.roles.world.allgather(mine)
        actors = {d["rank"]: d["ingest"] for d in everyone if "ingest" in d}
        shards: dict[int, Any] = {}
        for d in everyone:
            shards.update(d.get("shards", {}))
        out = {"actors": actors, "shards": dict(sorted(shards.items())),
               "learners": {d["rank"]: d["learner"] for d in everyone if "learner" in d},
               "rows_ingested": sum(a["rows"] for a in actors.values()),
               "bytes_ingested": sum(a["bytes"] for a in actors.values()),
               "replacement": {d["rank"]: d["replacement"] for d in everyone
                               if "replacement" in d}}
        if self._longhaul is not None:
            out["longhaul"] = self._longhaul.merge([d.get("longhaul") for d in everyone])
        return out

    # -- checkpoints (features.checkpointing holds the logic) -----------------------
    def restore(self, source: str | Path = "latest", *,
                roots: Sequence[Path] = ()) -> RestoreResult | None:
        """Restore the replay state from a checkpoint. **Collective** on the job's
        ranks; call right after construction, before any ingest. Blocks for the reads.
        See :func:`conduit_hpc.features.checkpointing.resume.restore_data_plane`."""
        from conduit_hpc.checkpoint import rng_from_json
        from conduit_hpc.features.checkpointing.resume import restore_data_plane

        result = restore_data_plane(self, source, roots=roots)
        if result is not None and self.learner is not None:
            # the scheduler's position and the sampler's random state come back too
            mine = result.counters.get(self.world_rank, {})
            self.learner.d.superstep_offset = int(mine.get("superstep", 0))
            if result.rng_state:
                self.learner.d.rng = rng_from_json(result.rng_state)
        return result

    def checkpoint_every(self, agent: Any, every_supersteps: int,
                         provide: Any = None) -> None:
        """Learners: take part in checkpoints cut at every ``every_supersteps``-th
        superstep boundary through ``agent`` (a
        :class:`~.features.checkpointing.agent.CheckpointAgent`); ``provide()`` returns this
        learner's state (``extra_state``: named arrays such as the model and optimizer,
        lead learner only; ``counters``). Other ranks: no-op. Local."""
        if self.learner is not None and every_supersteps > 0:
            self.learner.attach_checkpoints(agent, every_supersteps, provide)

    def checkpoint(self, root: Path, **kwargs: Any) -> SaveResult:
        """Write a complete checkpoint now. **Collective** on the job's ranks (buffers
        outside ``serve``); blocks until it is on disk. See
        :func:`conduit_hpc.features.checkpointing.agent.save_checkpoint` for the arguments."""
        from conduit_hpc.features.checkpointing.agent import save_checkpoint

        return save_checkpoint(self, root, **kwargs)

    # -- lifetime ------------------------------------------------------------------
    def done(self) -> None:
        """This rank will send, write or ask for nothing more: learners stop their
        data-plane thread; actors flush metrics; both tell the buffers. Non-buffer
        ranks; idempotent; blocks only to drain the data-plane thread (bounded)."""
        if self._done_sent or self.roles.role is Role.BUFFER:
            return
        self._done_sent = True
        if self.learner is not None:
            if self._longhaul is not None:
                self._longhaul.end_superstep()
            self._learner_summary = self.learner.stop()
        if self._actor_metrics is not None:
            self._log_actor(time.perf_counter())
            self._actor_metrics.close()
        for b in self.roles.buffer_ranks:
            self.channel.isend(b, Tag.DONE, np.zeros(0, np.uint8))
        if self._longhaul is not None:
            self._longhaul.release_held()  # the buffers must see it while we wait

    def close(self) -> None:
        """Finish and free everything. **Collective** on the job's ranks; idempotent.

        Non-buffer ranks say they are done; buffer ranks serve until everyone has;
        then windows and communicators are freed in the same order everywhere.
        """
        if self._closed:
            return
        timeout = self.config.run.timeout_s
        if self.server is not None:
            if not self.server.finished:
                self.server.serve()
        else:
            self.done()
        self.channel.drain(timeout)
        self.roles.world.Barrier()
        self._closed = True
        if self.replacement is not None:
            self.replacement.close()
        if self._longhaul is not None:
            self._longhaul.close()
        if self._weights_window is not None:
            self._weights_window.close()
        self._control_window.close()
        self._window.close()
        self.channel.close()
        self.roles.close()
