"""The Experience Data Plane: the ingest, place and deliver control points.

One :class:`ExperienceDataPlane` per rank, built by every rank of the job together. It
splits the world into roles, agrees on the config, lays shards out as the placement
says in RMA windows, and then:

* on **actor** ranks, :meth:`~ExperienceDataPlane.ingest` validates a batch and appends
  it to the actor's shard (one atomic reservation, one put per field, one commit);
* on **buffer** ranks, :meth:`~ExperienceDataPlane.serve` runs the progress loop that
  commits rows and answers requests until every other rank is done;
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

from .buffer import BufferServer, OwnedShard, Tag
from .config import Config
from .errors import ConduitError, DataPlaneClosed, SpecError
from .placement.placement import Placement, plan_round_robin
from .roles import Role, RoleComms, check_same_config, split_roles
from .spec import Spec
from .storage.priority import PriorityIndex, check_priorities
from .storage.ring import ShardLayout, ShardRing
from .transport.channel import Channel
from .transport.rma import RmaWindow

if TYPE_CHECKING:
    from .checkpointing import SaveResult
    from .resume import RestoreResult

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
    """

    __slots__ = ("batches", "bytes", "rows", "seconds")

    def __init__(self) -> None:
        self.rows = 0
        self.batches = 0
        self.bytes = 0
        self.seconds = 0.0

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__slots__}


class ExperienceDataPlane:
    """The data plane of one rank.

    **Collective** on ``comm`` (construction and :meth:`close`).

    Args:
        config (Config): the job configuration; must be equal on every rank.
        comm (MPI.Intracomm | None): the job's ranks (default ``COMM_WORLD``); a private
            duplicate is used.
        placement (Placement | None): where shards live; default: round-robin over
            buffer ranks (see :func:`~conduit_hpc.placement.plan_round_robin`).

    Raises:
        ConfigMismatch: ranks hold different configs (on every rank).
        WorldTooSmall: the layout needs more ranks (on every rank).
        SpecError: the config's spec is empty or invalid (on every rank).
    """

    def __init__(self, config: Config, comm: MPI.Intracomm | None = None, *,
                 placement: Placement | None = None) -> None:
        comm = MPI.COMM_WORLD if comm is None else comm
        self.config = config
        # deterministic checks first, so that every rank raises the same error
        self.spec = Spec.from_config(config.spec)
        check_same_config(comm, config)
        self.roles: RoleComms = split_roles(comm, config.layout)
        roles = self.roles
        if placement is None:
            placement = plan_round_robin(
                actor_ranks=roles.actor_ranks, buffer_ranks=roles.buffer_ranks,
                learner_ranks=roles.learner_ranks,
                capacity_rows=config.storage.capacity_rows,
                shards_per_buffer=config.storage.shards_per_buffer)
        self.placement = placement
        me = roles.world_rank
        layouts = [ShardLayout(self.spec, s.capacity_rows) for s in placement.shards]
        bases: dict[int, int] = {}
        used: dict[int, int] = {}
        for s, lay in zip(placement.shards, layouts, strict=True):
            bases[s.shard_id] = used.get(s.owner_rank, 0)
            used[s.owner_rank] = bases[s.shard_id] + lay.nbytes
        tcfg = config.transport
        self._window = RmaWindow(roles.world, used.get(me, 0), node_comm=roles.node,
                                 shared=tcfg.shared_memory == "auto")
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
        self.channel = Channel(roles.world, poll_interval_s=tcfg.poll_interval_s)
        self.ingest_stats = IngestStats()
        self._done_sent = False
        self._closed = False
        self.server: BufferServer | None = None
        if roles.role is Role.BUFFER:
            scfg = config.storage
            owned = [OwnedShard(s.shard_id, self.rings[s.shard_id],
                                PriorityIndex(s.capacity_rows, alpha=scfg.priority_exponent,
                                              initial_priority=scfg.initial_priority))
                     for s in placement.shards_of(me)]
            peers = tuple(r for r in range(roles.world_size) if r not in roles.buffer_ranks)
            self.server = BufferServer(owned, self.channel, peers,
                                       poll_interval_s=tcfg.poll_interval_s)

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

    # -- ingest (actors) -----------------------------------------------------------
    def ingest(self, batch: Mapping[str, object],
               priorities: ArrayLike | None = None) -> IngestReceipt:
        """Validate a batch and append it to this actor's shard.

        Local (one-sided); blocks only while a writer a full ring behind finishes.
        Actor ranks only.

        Args:
            batch (Mapping[str, array-like]): one array per spec field, leading batch
                dimension; dtypes must cast safely to the spec's.
            priorities (array-like | None): initial priority per row (finite, >= 0);
                ``None`` inserts at the shard's running maximum.

        Returns:
            IngestReceipt: rows written, the shard and the first sequence number.

        Raises:
            SpecError: the batch does not match the spec, or priorities are bad;
                nothing is written.
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
        sid = self.placement.actor_shards[self.world_rank]
        if n == 0:
            return IngestReceipt(0, sid, -1)
        first = self.rings[sid].write(data, prio)
        st = self.ingest_stats
        st.rows += n
        st.batches += 1
        st.bytes += n * self.spec.row_bytes
        st.seconds += time.perf_counter() - t0
        return IngestReceipt(n, sid, first)

    # -- serve (buffers) -----------------------------------------------------------
    def serve(self) -> None:
        """Run the buffer progress loop until every non-buffer rank is done. Buffer
        ranks only; blocks (see :mod:`conduit_hpc.buffer` for why not forever)."""
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
            committed rows and rows held), ``rows_ingested``, ``bytes_ingested``.
        """
        mine: dict[str, Any] = {"rank": self.world_rank, "role": self.role.value}
        if self.role is Role.ACTOR:
            mine["ingest"] = self.ingest_stats.as_dict()
        if self.server is not None:
            for s in self.server.shards:
                s.poll()
            mine["shards"] = {s.shard_id: {"committed": s.committed, "held": s.index.count}
                              for s in self.server.shards}
        everyone = self.roles.world.allgather(mine)
        actors = {d["rank"]: d["ingest"] for d in everyone if "ingest" in d}
        shards: dict[int, Any] = {}
        for d in everyone:
            shards.update(d.get("shards", {}))
        return {"actors": actors, "shards": dict(sorted(shards.items())),
                "rows_ingested": sum(a["rows"] for a in actors.values()),
                "bytes_ingested": sum(a["bytes"] for a in actors.values())}

    # -- checkpoints (conduit_hpc.checkpointing holds the logic) ----------------------
    def restore(self, source: str | Path = "latest", *,
                roots: Sequence[Path] = ()) -> RestoreResult | None:
        """Restore the replay state from a checkpoint. **Collective** on the job's
        ranks; call right after construction, before any ingest. Blocks for the reads.
        See :func:`conduit_hpc.resume.restore_data_plane`."""
        from .resume import restore_data_plane

        return restore_data_plane(self, source, roots=roots)

    def checkpoint(self, root: Path, **kwargs: Any) -> SaveResult:
        """Write a complete checkpoint now. **Collective** on the job's ranks (buffers
        outside ``serve``); blocks until it is on disk. See
        :func:`conduit_hpc.checkpointing.save_checkpoint` for the arguments."""
        from .checkpointing import save_checkpoint

        return save_checkpoint(self, root, **kwargs)

    # -- lifetime ------------------------------------------------------------------
    def done(self) -> None:
        """Tell the buffers this rank will send or write nothing more. Non-buffer
        ranks; idempotent; does not block."""
        if self._done_sent or self.roles.role is Role.BUFFER:
            return
        self._done_sent = True
        for b in self.roles.buffer_ranks:
            self.channel.isend(b, Tag.DONE, np.zeros(0, np.uint8))

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
        self._window.close()
        self.channel.close()
        self.roles.close()
