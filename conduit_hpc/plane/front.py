"""The Experience Data Plane: the ingest, place and deliver control points.

One :class:`ExperienceDataPlane` per rank, built by every rank of the job together. It
splits the world into roles, agrees on the config, decides the placement (with the
features that place shards themselves), lays shards out in RMA windows, builds this
rank's endpoint and lets the features attach. Then it dispatches:

* on **actor** ranks (and learners with ``layout.learners_ingest``),
  :meth:`~ExperienceDataPlane.ingest` (the :class:`~conduit_hpc.plane.actor.ActorEndpoint`);
* on **buffer** and **delivery** ranks (:attr:`~ExperienceDataPlane.serves`),
  :meth:`~ExperienceDataPlane.serve` (the buffer loop, or the delivery loop);
* on **learner** ranks, :meth:`~ExperienceDataPlane.next_batch` and
  :meth:`~ExperienceDataPlane.update_priorities` (the
  :class:`~conduit_hpc.plane.learner.LearnerEndpoint`);
* every rank calls :meth:`~ExperienceDataPlane.close` (collective) at the end.

Features (checkpointing, live re-placement, long-haul) plug in through
:mod:`conduit_hpc.plane.extensions`; this module imports none of them. What they may use
of it is :class:`~conduit_hpc.plane.host.FeatureHost`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI
from numpy.typing import ArrayLike

from conduit_hpc.config import Config
from conduit_hpc.errors import ConduitError, ConfigError, DataPlaneClosed, UsedAfterClose
from conduit_hpc.placement.placement import Placement
from conduit_hpc.plane.actor import ActorEndpoint, IngestReceipt, IngestStats, make_actor
from conduit_hpc.plane.buffer import BufferServer, OwnedShard, make_server
from conduit_hpc.plane.collector import GcFreeze
from conduit_hpc.plane.control import C_LEARNERS_DONE
from conduit_hpc.plane.delivery_rank import (
    DeliveryServer,
    ProcessMode,
    learner_delivery,
    make_delivery_server,
    open_staging,
)
from conduit_hpc.plane.extensions import Feature, feature_factories
from conduit_hpc.plane.host import FeatureHost
from conduit_hpc.plane.learner import LearnerEndpoint
from conduit_hpc.plane.memory import ShardMemory
from conduit_hpc.plane.modes import MODES, EdpMode
from conduit_hpc.plane.planning import decide_placement, write_plan
from conduit_hpc.plane.roles import Role, check_arguments, check_same_config, split_roles
from conduit_hpc.plane.staging import Batch, Stager, agreed_device, import_torch
from conduit_hpc.plane.summary import merge_summaries, rank_summary
from conduit_hpc.plane.weights import WeightsBoard, check_share, open_board
from conduit_hpc.protocol import Tag
from conduit_hpc.scheduler import RateLimiter
from conduit_hpc.spec import Spec
from conduit_hpc.transport.channel import Channel
from conduit_hpc.transport.objects import allgather_json, bounded_barrier
from conduit_hpc.transport.rma import RmaWindow

__all__ = ["ExperienceDataPlane"]


class ExperienceDataPlane:
    """The data plane of one rank.

    **Collective** on ``comm`` (construction, :meth:`share_weights`, :meth:`summary`
    and :meth:`close`).

    Args:
        config (Config): the job configuration; must be equal on every rank.
        comm (MPI.Intracomm | None): the job's ranks (default ``COMM_WORLD``); a private
            duplicate is used.
        placement (Placement | None): where shards live; default: ``[placement]
            planner`` (:func:`~conduit_hpc.plane.planning.decide_placement`).
        run_dir (str | Path | None): where metrics files (``metrics/``) and the executed
            plan (``plan.json``) go; None keeps metrics in memory only.
        transform (callable | None): on learners, applied to each numpy batch (a dict
            of arrays) before it is handed to torch (an array it keeps, e.g. a buffer it
            reuses, is copied first); runs on the data-plane thread in ``edp`` mode.

    Raises:
        ConfigMismatch: ranks hold different configs (on every rank).
        WorldTooSmall: the layout needs more ranks (on every rank).
        SpecError: the config's spec is empty or invalid (on every rank).
        ConfigError: ``edp`` mode without MPI_THREAD_SERIALIZED, a feature the config
            asks for cannot run with this layout, ``device = "cuda"`` without a GPU (on
            every rank, except the last: on the learner).
    """

    def __init__(self, config: Config, comm: MPI.Intracomm | None = None, *,
                 placement: Placement | None = None, run_dir: str | Path | None = None,
                 transform: Any = None) -> None:
        comm = MPI.COMM_WORLD if comm is None else comm
        # deterministic checks first, so that every rank raises the same error
        check_arguments(config, comm, transform, placement, run_dir)
        self.config = config
        self.spec = Spec.from_config(config.spec)
        sch = config.scheduler
        if MODES[sch.mode] is EdpMode and MPI.Query_thread() < MPI.THREAD_SERIALIZED:
            raise ConfigError("scheduler.mode = 'edp' needs MPI_THREAD_SERIALIZED or "
                              "better (a data-plane thread makes the learner's MPI calls); "
                              f"MPI granted level {MPI.Query_thread()}",
                              key="scheduler.mode")
        import_torch(config.layout.learners)  # every rank at once: see its docstring
        hosts = check_same_config(comm, config)  # each rank's host, for errors
        roles = self.roles = split_roles(comm, config.layout, sch.delivery,
                                         config.run.timeout_s, hosts)
        try:
            self.features: list[Feature] = [make(config, roles) for cls, make in
                                            feature_factories().values() if cls.wanted(config)]
            for f in self.features:
                placement = f.placement(placement) or placement
            placement, self.plan_record = decide_placement(config, self.spec, roles, placement)
            for f in self.features:
                f.check(placement, self.spec)
            if lost := sorted(set(roles.writer_ranks) - set(placement.actor_shards)):
                raise ConfigError(f"ranks {lost} ingest but have no shard", key="layout")
        except ConduitError:
            roles.close()  # every rank raises alike (decided from shared data)
            raise
        self.placement: Placement = placement
        self.run_dir = Path(run_dir) if run_dir else None
        if self.run_dir is not None and roles.world_rank == 0:
            write_plan(self.run_dir, placement, self.plan_record)
        self.started_at = time.perf_counter()
        try:
            self.memory = ShardMemory(config, self.spec, roles, placement)
        except ConduitError:
            roles.close()  # every rank raises alike (agreed inside)
            raise
        self.window, self.control, self.rings = (self.memory.window, self.memory.control,
                                                 self.memory.rings)
        self.channel: Channel = next(
            (c for f in self.features
             if (c := f.channel(roles.world, config.transport.poll_interval_s)) is not None),
            None) or Channel(roles.world, poll_interval_s=config.transport.poll_interval_s,
                             timeout_s=config.run.timeout_s)
        self.limiter = RateLimiter(sch.samples_per_insert, sch.min_fill_rows, sch.error_buffer)
        self._done_sent = self._closed = False
        self._ending = threading.RLock()  # done() and close(): one thread at a time
        self._weights_window: RmaWindow | None = None
        self.weights: WeightsBoard | None = None
        self._model: Any = None
        self.server: BufferServer | None = None
        self.learner: LearnerEndpoint | None = None
        self.actor: ActorEndpoint | None = None
        self._learner_summary: dict[str, float] = {}
        self.delivery: DeliveryServer | None = None
        try:
            self._device = agreed_device(roles, sch.device, config.run.timeout_s)
            self.staging = open_staging(roles, config, self.spec)  # delivery = "process"
        except ConfigError:
            for part in (self.memory, self.channel, roles):
                part.close()
            raise
        if roles.role is Role.BUFFER:
            self._init_buffer()
        elif roles.role is Role.LEARNER:
            self._init_learner(transform)
        elif roles.role is Role.DELIVERY:
            assert self.staging is not None
            self.delivery = make_delivery_server(self, self.staging, transform)
        if (me := roles.world_rank) in roles.writer_ranks:  # actors, learners that ingest
            self.actor = make_actor(self, me, self._metrics_file(f"actor-{me}.csv"))
        host: FeatureHost = self  # all a feature may use (mypy checks the front has it)
        for f in self.features:
            f.attach(host)  # collective where a feature makes windows
        self._gc = GcFreeze(config.run.gc_freeze)  # plane/collector.py

    # -- construction --------------------------------------------------------------
    def _metrics_file(self, name: str) -> Path | None:
        return self.run_dir / "metrics" / name if self.run_dir else None

    def _init_buffer(self) -> None:
        r = self.roles
        self.server = make_server(self, partial(self.control.count_done, r.learner_ranks,
                                                r.writer_ranks)
                                  if r.world_rank == self.memory.control_owner else None)

    def _init_learner(self, transform: Any) -> None:
        cfg, roles, me = self.config, self.roles, self.roles.world_rank
        mine = tuple(self.placement.learner_shards.get(me, ()))
        assert self._device is not None  # a learner's (see agreed_device)
        self.device = self._device
        mode, sampler = learner_delivery(self, mine, Stager(self.device), transform)
        self.learner = LearnerEndpoint(mode, sampler, {s: self.rings[s].capacity for s in mine},
                                       cfg.scheduler, self.control,
                                       lead=me == roles.learner_ranks[0],
                                       metrics_path=self._metrics_file(f"learner-{me}.csv"),
                                       timeout_s=cfg.run.timeout_s,
                                       status=me == 0 and self.run_dir is not None,
                                       budget_s=cfg.run.duration_s,
                                       metrics_full_rows=cfg.run.metrics_full_rows)

    # -- context -------------------------------------------------------------------
    def __enter__(self) -> ExperienceDataPlane:
        self._require(None, "entering the with-block", after_done=True)  # after close()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # on an exception, no collective others may never reach; tell them (RemoteFailure)
        self._gc.thaw()  # first: what follows may raise
        if exc_type is None:
            return self.close()
        if self.learner is not None and isinstance(self.learner.mode, ProcessMode):
            self.learner.mode.fail(f"{exc_type.__name__}: {exc}")  # first: its rank names it
        if self.delivery is not None:  # its learner raises it (not a timeout)
            self.delivery.fail(f"{exc_type.__name__}: {exc}")
        self.control.left_on_error(self.world_rank, exc, self._done_sent)

    # -- introspection -------------------------------------------------------------
    @property
    def role(self) -> Role:
        """This rank's role (a learner's delivery rank: ``Role.DELIVERY``)."""
        return self.roles.role

    @property
    def serves(self) -> bool:
        """A buffer or delivery rank: it only calls :meth:`serve` (jobs dispatch on it,
        ``elif edp.serves: edp.serve()``, and run unchanged with a delivery rank)."""
        return self.roles.role in (Role.BUFFER, Role.DELIVERY)

    @property
    def world_rank(self) -> int:
        return self.roles.world_rank

    def feature(self, name: str) -> Feature | None:
        """The attached feature called ``name`` (``None`` if the config has it off)."""
        return next((f for f in self.features if f.name == name), None)

    def _require(self, role: Role | None, what: str, *, after_done: bool = False) -> None:
        # done(): the buffers were told it is finished; close(): the memory is freed
        if self._closed or (self._done_sent and not after_done):
            raise UsedAfterClose(f"{what} called after {'close' if self._closed else 'done'}"
                                  f"() on world rank {self.world_rank}")
        if role is not None and self.roles.role is not role:
            raise ConduitError(f"{what} is for {role.value} ranks; world rank "
                               f"{self.world_rank} has the role {self.roles.role.value!r}")

    @property
    def should_stop(self) -> bool:
        """True once every learner has finished, or a rank left on an error (actors
        should stop producing), or this plane was closed. Local; two atomic reads."""
        if self._closed:  # its memory is freed: a loop `while not should_stop` ends
            return True
        n = len(self.roles.learner_ranks)
        return (n > 0 and self.control.read(C_LEARNERS_DONE) >= n) or self.control.failed()

    # -- ingest (actors) -----------------------------------------------------------
    def ingest(self, batch: Mapping[str, object],
               priorities: ArrayLike | None = None) -> IngestReceipt:
        """Validate a batch and append it to this actor's shard.

        Local (one-sided). Blocks only while the rate limiter holds actors back, while
        this actor's weights lag the learner by more than ``max_policy_lag`` (it then
        pulls fresher ones into the model given to :meth:`share_weights`), or while a
        writer a full ring behind finishes - each bounded by ``run.timeout_s``. Actors,
        and learners with ``layout.learners_ingest`` (on the data-plane thread in edp).
        Threads of one rank may call it at once: they take turns to write.

        Args:
            batch (Mapping[str, array-like]): one array per spec field, leading batch
                dimension; dtypes must cast safely to the spec's.
            priorities (array-like | None): initial priority per row (finite, >= 0, <= 1e30);
                ``None`` inserts at the shard's running maximum.

        Returns:
            IngestReceipt: rows written, the shard and the first sequence number.

        Raises:
            SpecError: the batch does not match the spec, priorities are bad, or the
                batch is larger than the shard or than ``scheduler.max_insert_batch``
                with the rate limiter on; nothing is written.
            DataPlaneTimeout: a wait ran past ``run.timeout_s``.
            UsedAfterClose: after ``done()``/``close()``, also one called on another
                thread while this call waited; nothing is written.
        """
        self._require(self.role if self.actor is not None else Role.ACTOR, "ingest()")
        assert self.actor is not None
        if self.learner is None:
            return self.actor.ingest(batch, priorities)
        return self.actor.ingest_on(self.learner.run_on_thread, batch, priorities)

    @property
    def ingest_stats(self) -> IngestStats:
        """A snapshot of this actor's ingest counters (all zero on other roles). Local."""
        return self.actor.stats.copy() if self.actor is not None else IngestStats()

    # -- weights (learners -> actors) ----------------------------------------------
    def share_weights(self, model: Any) -> None:
        """Set up weight publication: the lead learner publishes ``model``'s parameters
        now and every ``scheduler.weights_every`` supersteps; actors load the first
        ones here and newer ones with :meth:`pull_weights`. **Collective**: every rank
        calls it once, before its first ``next_batch``; buffers pass ``None``, actors
        and learners a model of the same architecture.

        Raises:
            ConfigError: actors' and the lead learner's models differ in size (every rank).
            ConduitError: a second call (every rank that makes it; the first stays).
            CollectiveFailed: a rank did not call it within ``run.timeout_s``.
        """
        self._require(None, "share_weights()", after_done=True)
        check_share(self._weights_window, self.learner is not None and self.learner.started,
                    self.world_rank)  # a second call, or one after next_batch(): refused
        roles, t = self.roles, self.config.run.timeout_s
        failed = partial(self.control.raise_if_failed, self.world_rank)  # a rank left
        board = open_board(roles, model, t, self.config.transport.shared_memory == "auto",
                           failed)  # collective
        if board is None:  # no learner
            return
        self._weights_window, self.weights = board
        self._model = model
        if self.learner is not None:
            self.learner.weights, self.learner.model = self.weights, model
            self.learner.publish_now()
        if self.actor is not None:
            self.actor.weights, self.actor.pull = self.weights, self.pull_weights
        bounded_barrier(roles.world, t, "share_weights()", failed)  # the first weights out
        if roles.role is Role.ACTOR:
            self.pull_weights()  # every actor starts from the learner's weights

    def pull_weights(self, model: Any = None) -> bool:
        """Load published weights newer than ``model`` holds into it (default: the one
        given to :meth:`share_weights`, whose version :attr:`policy_version` is). Returns
        whether there were newer ones. Threads take turns. Actors; local, one-sided."""
        self._require(Role.ACTOR, "pull_weights()", after_done=True)  # a learner: reverted
        if self.weights is None:
            raise DataPlaneClosed("pull_weights() needs share_weights() first" if
                                  self.roles.learner_ranks else "pull_weights(): this job "
                                  "has no learner, so no weights are published")
        return self.weights.load_newer(model if model is not None else self._model, self._model)

    @property
    def policy_version(self) -> int:
        """Learner superstep of the weights this actor last pulled (-1: none)."""
        return self.weights.seen_superstep if self.weights is not None else -1

    # -- deliver (learners) ----------------------------------------------------------
    def next_batch(self) -> Batch:
        """The batch for this learner's next superstep (a
        :class:`~conduit_hpc.plane.staging.Batch`: torch tensors on the learner's device,
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
        assert self.learner is not None
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
        assert self.learner is not None
        self.learner.update_priorities(indices, priorities)  # by spec.as_array's rule

    def log(self, **values: float) -> None:
        """Add job columns (``loss=...``) to this learner's current superstep metrics."""
        self._require(Role.LEARNER, "log()")
        assert self.learner is not None
        self.learner.log(**values)

    # -- serve (buffers) -----------------------------------------------------------
    def serve(self) -> None:
        """Run the buffer progress loop until every non-buffer rank is done (a delivery
        rank: deliver until its learner stops, then :meth:`done`). Blocks (bounded)."""
        self._require(None if self.delivery else Role.BUFFER, "serve()", after_done=True)
        if self.delivery is None:  # after close(): refused above, on either role
            assert self.server is not None
            self.server.serve()
        self.done()  # a delivery rank's serves (once); a no-op on a buffer

    def owned_shards(self) -> list[OwnedShard]:
        """Shards this rank owns (empty unless a buffer); not after :meth:`close`."""
        self._require(None, "owned_shards()", after_done=True)
        return [] if self.server is None else list(self.server.shards)

    def summary(self) -> dict[str, Any]:
        """Counters of the whole job, the same dict on every rank. **Collective**, bounded
        by ``run.timeout_s`` (after :meth:`serve` on buffers, :meth:`done` elsewhere).

        Returns:
            dict: ``actors`` (world rank -> ingest counters), ``shards`` (shard id ->
            counters: :func:`~conduit_hpc.plane.summary.shard_counters`), ``learners``
            (world rank -> latency summary), ``rows_ingested``, ``bytes_ingested``, and
            one entry per attached feature (its ``merge`` of every rank's part).
        """
        self._require(None, "summary()", after_done=True)
        mine = rank_summary(self.world_rank, self.roles.role.value, self.actor, self.server,
                            self._learner_summary if self.learner else None, self.features)
        every = allgather_json(self.roles.world, mine, self.config.run.timeout_s, "summary()",
                               partial(self.control.raise_if_failed, self.world_rank))
        return merge_summaries(every, self.features, feature_factories())

    # -- lifetime ------------------------------------------------------------------
    def done(self) -> None:
        """This rank will send, write or ask for nothing more: learners stop their
        data-plane thread; actors flush metrics; both tell the buffers. Non-buffer
        ranks; idempotent; blocks only to drain the data-plane thread and to let an
        ingest in flight on another thread finish (bounded): its rows reach the buffers,
        later ones raise :class:`UsedAfterClose`. Calls from several threads take turns."""
        if self._done_sent or self.roles.role is Role.BUFFER:
            return
        with self._ending:  # a second thread's call waits for the first's (bounded)
            if self._done_sent:
                return
            if self.delivery is not None:
                self.delivery.serve()  # until its learner stops (no-op once served)
            self._done_sent = True
            if self.learner is not None:
                self._learner_summary = self.learner.stop()
            if self.actor is not None:
                self.actor.close()  # after an ingest in flight: the buffers see its rows
            for b in self.roles.buffer_ranks:
                self.channel.isend(b, Tag.DONE, np.zeros(0, np.uint8))
            for f in self.features:
                f.before_done()  # e.g. messages held for a link: the buffers must see them

    def close(self) -> None:
        """Finish and free everything. **Collective** on the job's ranks; idempotent.

        Non-buffer ranks say they are done; buffer ranks serve until everyone has;
        then windows and communicators are freed in the same order everywhere.
        """
        if self._closed:
            return
        with self._ending:  # done() takes it again; a second thread's waits, then returns
            if not self._closed:
                self._close()

    def _close(self) -> None:
        self._gc.thaw()  # first: what follows may raise (RemoteFailure, a timeout)
        timeout = self.config.run.timeout_s
        if self.server is None:
            self.done()
        elif not self.server.finished:
            self.server.serve()
        self.channel.drain(timeout)
        me = self.world_rank
        bounded_barrier(self.roles.world, timeout, "close()",
                        lambda: self.control.raise_if_failed(me))
        self._closed = True
        for f in self.features:
            f.close()
        if self._weights_window is not None:
            self._weights_window.close()
        if self.staging is not None:
            self.staging.close()  # collective on the pair
        self.memory.close()
        self.channel.close()
        self.roles.close()
