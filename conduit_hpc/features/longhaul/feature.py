"""The long-haul edge/cloud deployment: actors and a buffer at the edge, the learner in a
data centre, one long link between them (``[longhaul]``; see ``docs/longhaul.md``).

Ranks: one learner and one buffer in the data centre ("cloud"), one buffer and every
actor at the edge (``longhaul.edge_ranks``). Every channel message between the two
sides crosses an emulated link (:class:`~conduit_hpc.transport.link.LinkedChannel`:
bandwidth, one-way latency, token bucket, sender-side pacing). Two placements of the
same job:

* ``forward`` - the usual design. Actors write into a ring on the edge buffer; the edge
  buffer forwards every committed row, oldest first, across the link into the replay
  on the cloud buffer (:class:`EdgeForwarder` -> :class:`CloudReceiver`), handing a
  message to the link only when the link can start it. Rows wait in the edge ring; when
  more than ``queue_rows`` wait, the oldest are dropped and counted. The learner samples
  the cloud replay.
* ``edge_replay`` - the studied design. The prioritized replay lives on the edge buffer;
  the learner's batches are sampled there and sent across (``scheduler.fetch = "owner"``,
  prefetched ahead of the learner in ``edp`` mode so the link's latency hides behind
  compute); priority updates cross back. The cloud buffer holds nothing.

Metrics (definitions in :mod:`conduit_hpc.features.longhaul.metrics`): buffer ranks publish
their link counters on a small board in the learner's memory (one-sided atomics every
``publish_every_s``) and append them to ``metrics/link-<rank>.csv``; the learner adds
per-superstep link columns to ``learner-<rank>.csv``; :meth:`LongHaul.local_stats`
feeds ``FeatureHost.summary()["longhaul"]``.

What the link model does not pace: one-sided reads and atomics (the job's control
counters, a shard's published statistics that the learner reads before sampling - a
few dozen bytes per batch) and the weights actors pull; they cost the same in both
placements.

Composition layer (like ``edp``): uses the transport, the buffer loop and the wire
formats together.

This module holds the :class:`LongHaul` feature and its learner hook; the pieces it
composes are in ``topology`` (:class:`LinkSides`), ``plan`` (:func:`plan_longhaul`),
``board`` (counters and their publication), ``stations`` (the buffer-loop extensions)
and :mod:`conduit_hpc.protocol.forward` (the forward message).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from conduit_hpc.config import Config
from conduit_hpc.errors import ConfigError
from conduit_hpc.features.longhaul.board import (
    B_BACKLOG,
    B_BYTES_OUT,
    B_DROPPED,
    B_PRIORITY_SUM,
    B_ROWS,
    BOARD_FIELDS,
    BoardPublisher,
    LinkCounters,
    crossing_priorities,
)
from conduit_hpc.features.longhaul.metrics import LinkSnapshot, merge_link_stats, superstep_columns
from conduit_hpc.features.longhaul.plan import CLOUD_SHARD, EDGE_SHARD, plan_longhaul
from conduit_hpc.features.longhaul.stations import CloudReceiver, EdgeForwarder, EdgeReplayStation
from conduit_hpc.features.longhaul.topology import LinkSides
from conduit_hpc.placement.placement import Placement
from conduit_hpc.plane.buffer import OwnedShard
from conduit_hpc.plane.extensions import Feature, LearnerHook
from conduit_hpc.plane.roles import Role, RoleComms
from conduit_hpc.spec import Spec
from conduit_hpc.transport.link import LinkedChannel, LinkParams
from conduit_hpc.transport.rma import RmaWindow

if TYPE_CHECKING:
    from conduit_hpc.plane.host import FeatureHost

__all__ = ["LongHaul"]


class LongHaul(Feature):
    """The long-haul deployment of one rank's data plane, a
    :class:`~conduit_hpc.plane.extensions.Feature` the plane builds when
    ``longhaul.mode != "off"``: it places the shards, makes the linked channel, attaches
    the buffer loops' extensions and the learner's link columns.

    Args:
        config (Config): the job's config.
        roles (RoleComms): this rank's roles.

    Raises:
        ConfigError: the layout does not fit the deployment (on every rank).
    """

    name = "longhaul"
    priority_messages = True  # its owners see every update (forward, count)

    @classmethod
    def wanted(cls, config: Config) -> bool:
        return config.longhaul.mode != "off"

    def __init__(self, config: Config, roles: RoleComms) -> None:
        self.config, self.roles = config, roles
        self.lh = config.longhaul
        self.topology = LinkSides.build(config, world_size=roles.world_size,
                                        actor_ranks=roles.actor_ranks,
                                        buffer_ranks=roles.buffer_ranks,
                                        learner_ranks=roles.learner_ranks)
        self.me = roles.world_rank
        self.params = LinkParams(self.lh.bytes_per_s, self.lh.latency_s, self.lh.burst_bytes)
        self.counters = LinkCounters()
        self.link: LinkedChannel | None = None
        self._board: RmaWindow | None = None
        self._publisher: BoardPublisher | None = None
        self._shards: dict[int, OwnedShard] = {}
        self._spec: Spec | None = None
        self._log: Callable[..., None] | None = None
        self._prev: LinkSnapshot | None = None
        self._edge_committed = 0

    # -- construction hooks (edp) --------------------------------------------------
    def placement(self, given: Placement | None = None) -> Placement:
        """The deployment's placement (see :func:`plan_longhaul`). Local.

        Raises:
            ConfigError: a placement was given (the deployment places shards itself).
        """
        if given is not None:
            raise ConfigError(f"longhaul.mode = {self.lh.mode!r} places the shards itself; "
                              f"do not pass a placement to FeatureHost",
                              key="longhaul.mode")
        return plan_longhaul(self.config, self.topology, self.roles.actor_ranks)

    def channel(self, comm: MPI.Intracomm, poll_interval_s: float) -> LinkedChannel:
        """This rank's channel: messages to the other side cross the link.
        **Collective** on ``comm`` (a duplicate)."""
        self.link = LinkedChannel(comm, far=self.topology.far_of(self.me),
                                     params=self.params, poll_interval_s=poll_interval_s,
                                     timeout_s=self.config.run.timeout_s)
        return self.link

    def attach(self, edp: FeatureHost) -> None:
        """Set up this rank's part: the counters board (**collective** on the world),
        the buffer loop's extensions, the learner's link columns."""
        roles, topo, me = self.roles, self.topology, self.me
        assert self.link is not None
        self._spec = edp.spec
        self._board = RmaWindow(roles.world,
                                8 * BOARD_FIELDS * roles.world_size if me == topo.learner else 0,
                                node_comm=roles.node,
                                shared=self.config.transport.shared_memory == "auto",
                                timeout_s=self.config.run.timeout_s,
                                what="the data plane's constructor (the long-haul board)")
        t0 = time.monotonic()
        timeout = self.config.run.timeout_s
        server = edp.server
        if server is not None:
            csv = edp.run_dir / "metrics" / f"link-{me}.csv" if edp.run_dir else None
            pub = BoardPublisher(self._board, topo.learner, me, self.link, self.counters,
                                 csv, self.lh.publish_every_s, t0)
            self._publisher = pub
            self._shards = {s.shard_id: s for s in server.shards}
            if me == topo.edge_buffer:
                self.link.on_send.append(self._count_crossing)
                if self.lh.mode == "forward":
                    server.add_extension(EdgeForwarder(
                        self._shards[EDGE_SHARD], self.link, topo.cloud_buffer,
                        queue_rows=self.lh.queue_rows, forward_rows=self.lh.forward_rows,
                        counters=self.counters, publisher=pub, timeout_s=timeout,
                        compress=self.lh.compression == "zlib"))
                else:
                    server.add_extension(EdgeReplayStation(pub, timeout))
            else:
                server.add_extension(CloudReceiver(
                    server, self._shards.get(CLOUD_SHARD), topo.edge_buffer,
                    counters=self.counters, publisher=pub))
        elif roles.role is Role.LEARNER:
            assert edp.learner is not None
            self._log = edp.learner.log
            edp.learner.add_hook(_LinkColumns(self))

    def _count_crossing(self, dest: int, tag: int, payload: np.ndarray) -> None:
        assert self._spec is not None
        prio = crossing_priorities(tag, payload, self._spec,
                                   {sid: s.index.priority for sid, s in self._shards.items()})
        if prio is not None:
            self.counters.rows_crossed += len(prio)
            self.counters.priority_sum += float(prio.sum())

    # -- learner -------------------------------------------------------------------
    def snapshot(self) -> LinkSnapshot:
        """The job's cumulative link counters as the learner sees them now: its own
        channel's, the buffers' from the board (as last published). Learner only;
        local, no MPI call (the board is in this rank's memory)."""
        assert self._board is not None and self.link is not None
        topo = self.topology
        b = self._board.own_segment()[:8 * BOARD_FIELDS * self.roles.world_size]
        board = b.view(np.int64).reshape(self.roles.world_size, BOARD_FIELDS)
        edge = sorted(topo.edge)
        cloud = [r for r in sorted(topo.cloud) if r != self.me]
        e2c = int(board[edge, B_BYTES_OUT].sum())
        c2e = self.link.bytes_out + int(board[cloud, B_BYTES_OUT].sum())
        prio = board[:, B_PRIORITY_SUM].copy().view(np.float64)
        eb = topo.edge_buffer
        return LinkSnapshot(time_s=time.monotonic(), e2c_bytes=e2c, c2e_bytes=c2e,
                            rows=int(board[:, B_ROWS].sum()), priority_sum=float(prio.sum()),
                            dropped=int(board[eb, B_DROPPED]),
                            backlog=int(board[eb, B_BACKLOG]))

    def end_superstep(self) -> None:
        """Learner: add the link columns of the superstep that ends now to its metrics
        row (called as ``next_batch`` starts, and by ``done``). Local."""
        if self._log is None:
            return
        cur = self.snapshot()
        if self._prev is not None:
            self._log(**superstep_columns(self._prev, cur, self.lh.bytes_per_s))
        self._prev = cur

    # -- summary and lifetime --------------------------------------------------------
    def before_done(self) -> None:
        self.release_held()

    def summary(self) -> dict[str, Any] | None:
        return self.local_stats()

    def release_held(self) -> None:
        """Hand every message held for the link to MPI once due (``done`` calls it, so
        that the buffers get this rank's last messages even while it then waits in a
        collective). Blocks at most ``run.timeout_s``."""
        if self.link is not None:
            self.link.release_held(self.config.run.timeout_s)

    def local_stats(self) -> dict[str, Any]:
        """This rank's link counters (for ``FeatureHost.summary``). Local."""
        assert self.link is not None
        c = self.counters
        out: dict[str, Any] = {"rank": self.me, "side": self.topology.side(self.me),
                               **self.link.stats(),
                               "rows_crossed": c.rows_crossed,
                               "priority_sum_crossed": c.priority_sum,
                               "rows_forwarded": c.rows_forwarded,
                               "forwarded_nominal_bytes": c.forwarded_nominal_bytes,
                               "rows_dropped": c.rows_dropped, "rows_unsent": c.rows_unsent,
                               "rows_received": c.rows_received}
        edge = self._shards.get(EDGE_SHARD)
        if edge is not None and self.me == self.topology.edge_buffer:
            out["edge_rows_committed"] = edge.committed - edge.restored_commit  # this run's
        return out

    def merge(self, per_rank: list[dict[str, Any] | None]) -> dict[str, Any]:
        """Job totals from every rank's :meth:`local_stats`. Local."""
        return merge_link_stats(per_rank, mode=self.lh.mode, bytes_per_s=self.lh.bytes_per_s,
                                latency_s=self.lh.latency_s)

    def close(self) -> None:
        """Free the board. **Collective** on the world, after the last publication."""
        if self._publisher is not None:
            self._publisher.close()
        if self._board is not None:
            self._board.close()
            self._board = None


class _LinkColumns(LearnerHook):
    """The learner's link columns, added as each superstep ends."""

    def __init__(self, feature: LongHaul) -> None:
        self.feature = feature

    def on_boundary(self, superstep: int) -> None:
        self.feature.end_superstep()

    def on_stop(self) -> None:
        self.feature.end_superstep()
