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

Metrics (definitions in :mod:`conduit_hpc.features.longhaul.metrics`): buffer ranks publish their
link counters on a small board in the learner's memory (one-sided atomics every
``publish_every_s``) and append them to ``metrics/link-<rank>.csv``; the learner adds
per-superstep link columns to ``learner-<rank>.csv``; :meth:`LongHaul.local_stats`
feeds ``ExperienceDataPlane.summary()["longhaul"]``.

What the link model does not pace: one-sided reads and atomics (the job's control
counters, a shard's published statistics that the learner reads before sampling - a
few dozen bytes per batch) and the weights actors pull; they cost the same in both
placements.

Composition layer (like ``edp``): uses the transport, the buffer loop and the wire
formats together.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from conduit_hpc.config import Config
from conduit_hpc.errors import ConfigError
from conduit_hpc.features.longhaul.metrics import LinkSnapshot, merge_link_stats, superstep_columns
from conduit_hpc.placement.placement import Placement, ShardPlacement
from conduit_hpc.plane.buffer import BufferServer, OwnedShard
from conduit_hpc.plane.extensions import BufferExtension, Feature, LearnerHook
from conduit_hpc.plane.metrics import CsvSink
from conduit_hpc.plane.roles import Role, RoleComms
from conduit_hpc.protocol import SampleReply, Tag, pack_rows, unpack_rows
from conduit_hpc.spec import Spec
from conduit_hpc.transport.channel import Message
from conduit_hpc.transport.link import LinkedChannel, LinkParams
from conduit_hpc.transport.rma import RmaWindow

if TYPE_CHECKING:
    from conduit_hpc.plane.front import ExperienceDataPlane

__all__ = [
    "CloudReceiver",
    "EdgeForwarder",
    "LongHaul",
    "Topology",
    "crossing_priorities",
    "forward_message_bytes",
    "pack_forward",
    "unpack_forward",
]

EDGE_SHARD = 0  # the edge buffer's shard: the replay (edge_replay) or a FIFO (forward)
CLOUD_SHARD = 1  # forward only: the replay beside the learner

# the board: int64[world_size, BOARD_FIELDS] in the learner's memory, one row per rank
(B_BYTES_OUT, B_MESSAGES_OUT, B_BYTES_IN, B_ROWS, B_PRIORITY_SUM, B_DROPPED, B_BACKLOG,
 B_RECEIVED) = range(8)
BOARD_FIELDS = 8
LINK_CSV_COLUMNS = ("time_s", "clock_s", "bytes_out", "messages_out", "bytes_in",
                    "held_messages", "held_bytes", "rows_crossed", "priority_sum",
                    "rows_dropped", "backlog_rows", "rows_received")

# forward messages: int64 [first_seq, rows, flags], float64 priorities[rows], packed rows
FORWARD_HEAD = 24
F_END = 1  # flag: the edge buffer will forward nothing more


# ---------------------------------------------------------------------------------
# topology and placement


@dataclass(frozen=True, slots=True)
class Topology:
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
              buffer_ranks: Sequence[int], learner_ranks: Sequence[int]) -> Topology:
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


def plan_longhaul(config: Config, topo: Topology, actor_ranks: Sequence[int]) -> Placement:
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


# ---------------------------------------------------------------------------------
# forwarded rows


def forward_message_bytes(spec: Spec, rows: int) -> int:
    """Bytes of a forward message of ``rows`` rows."""
    return FORWARD_HEAD + 8 * rows + spec.row_bytes * rows


def pack_forward(spec: Spec, first_seq: int, priorities: np.ndarray,
                 columns: Mapping[str, np.ndarray], flags: int = 0) -> np.ndarray:
    """A forward message: header, the rows' priorities, the rows (no pickle)."""
    head = np.array([first_seq, len(priorities), flags], dtype=np.int64)
    parts = [head.view(np.uint8), np.ascontiguousarray(priorities, np.float64).view(np.uint8)]
    if len(priorities):
        parts.append(pack_rows(spec, columns))
    return np.concatenate(parts)


def unpack_forward(spec: Spec, payload: np.ndarray
                   ) -> tuple[int, int, np.ndarray, dict[str, np.ndarray]]:
    """``(first_seq, flags, priorities, columns)`` of a forward message (views)."""
    head = payload[:FORWARD_HEAD].view(np.int64)
    n = int(head[1])
    prio = payload[FORWARD_HEAD:FORWARD_HEAD + 8 * n].view(np.float64)
    cols = unpack_rows(spec, payload[FORWARD_HEAD + 8 * n:], n) if n else {}
    return int(head[0]), int(head[2]), prio, cols


def crossing_priorities(tag: int, payload: np.ndarray, spec: Spec,
                        priorities: Mapping[int, np.ndarray]) -> np.ndarray | None:
    """The priorities of the rows a message from the edge buffer hands to the link -
    the one definition used in both placements (see :mod:`conduit_hpc.features.longhaul.metrics`):
    the raw priority the edge replay holds for each row at that moment. A forward
    message carries them (read from the edge index when forwarded); a service reply
    names (shard, slot, generation) and they are read from ``priorities`` (shard id ->
    the index's raw priority per slot) now. ``None`` for messages that carry no rows.
    Local; pure but for reading ``priorities``."""
    if tag == Tag.FORWARD:
        _, _, prio, _ = unpack_forward(spec, payload)
        return np.array(prio, copy=True)
    if tag == Tag.SERVICE_REPLY:
        rep, _ = SampleReply.unpack(payload)
        held = priorities.get(rep.shard_id)
        if held is None:
            return None
        return held[rep.slots].copy()
    return None


# ---------------------------------------------------------------------------------
# counters and their publication


class LinkCounters:
    """What one rank counts about the link besides its channel's byte counts."""

    __slots__ = ("priority_sum", "rows_backlog", "rows_crossed", "rows_dropped",
                 "rows_forwarded", "rows_received", "rows_unsent")

    def __init__(self) -> None:
        self.rows_crossed = 0
        self.priority_sum = 0.0
        self.rows_forwarded = 0
        self.rows_dropped = 0
        self.rows_backlog = 0
        self.rows_unsent = 0
        self.rows_received = 0


class BoardPublisher:
    """A buffer rank's link counters: to the learner's board (one-sided atomics, only
    fields that changed) and to ``link-<rank>.csv``, at most every ``every_s``.

    Args:
        board (RmaWindow): the board window; ``owner`` holds it.
        owner (int): the learner's world rank.
        rank (int): this rank (its row of the board).
        channel (LinkedChannel): this rank's channel.
        counters (LinkCounters): this rank's counters.
        csv_path (Path | None): the link CSV.
        every_s (float): publication period.
        t0 (float): ``time.monotonic()`` origin of ``time_s``.
    """

    def __init__(self, board: RmaWindow, owner: int, rank: int, channel: LinkedChannel,
                 counters: LinkCounters, csv_path: Path | None, every_s: float,
                 t0: float) -> None:
        self.board, self.owner, self.rank = board, owner, rank
        self.link, self.c = channel, counters
        self.every_s, self.t0 = every_s, t0
        self.sink = CsvSink(csv_path, LINK_CSV_COLUMNS, keep=False)
        self._last = -math.inf
        self._sent = np.zeros(BOARD_FIELDS, dtype=np.int64)

    def values(self) -> np.ndarray:
        ch, c = self.link, self.c
        v = np.zeros(BOARD_FIELDS, dtype=np.int64)
        v[B_BYTES_OUT], v[B_MESSAGES_OUT], v[B_BYTES_IN] = (ch.bytes_out, ch.messages_out,
                                                           ch.bytes_in)
        v[B_ROWS] = c.rows_crossed
        v[B_PRIORITY_SUM] = np.float64(c.priority_sum).view(np.int64)
        v[B_DROPPED], v[B_BACKLOG], v[B_RECEIVED] = (c.rows_dropped, c.rows_backlog,
                                                     c.rows_received)
        return v

    def maybe(self, *, force: bool = False) -> None:
        """Publish if ``every_s`` passed (or ``force``). Blocks for a few atomics."""
        now = time.monotonic()
        if not force and now - self._last < self.every_s:
            return
        self._last = now
        v = self.values()
        base = 8 * BOARD_FIELDS * self.rank
        for i in np.flatnonzero(v != self._sent):
            self.board.atomic_write(self.owner, base + 8 * int(i), int(v[i]))
        self._sent = v
        ch, c = self.link, self.c
        self.sink.add({"time_s": now - self.t0, "clock_s": now, "bytes_out": ch.bytes_out,
                       "messages_out": ch.messages_out, "bytes_in": ch.bytes_in,
                       "held_messages": ch.held, "held_bytes": ch.held_bytes,
                       "rows_crossed": c.rows_crossed, "priority_sum": c.priority_sum,
                       "rows_dropped": c.rows_dropped, "backlog_rows": c.rows_backlog,
                       "rows_received": c.rows_received})
        if force:
            self.sink.flush()

    def close(self) -> None:
        self.sink.close()


# ---------------------------------------------------------------------------------
# buffer-side extensions


class EdgeForwarder(BufferExtension):
    """``forward``: moves committed rows of the edge ring across the link, oldest first.

    Each pass: if more than ``queue_rows`` committed rows wait, the oldest beyond that
    are dropped (counted); then messages of up to ``forward_rows`` rows are handed to the
    link while it would finish sending them within two message times (so the link never
    idles for want of a message, at most about one waits in it, and nothing queues out of
    sight). A row found overwritten before
    it could be sent is dropped too. When the loop ends, what still waits is counted as
    unsent and an end marker follows the last message.

    Args:
        shard (OwnedShard): the edge ring (this rank owns it).
        channel (LinkedChannel): this rank's channel.
        dest (int): the cloud buffer.
        queue_rows (int), forward_rows (int): see ``[longhaul]``.
        counters (LinkCounters): updated in place.
        publisher (BoardPublisher): publishes them.
        timeout_s (float): bound on releasing the last messages when the loop ends.
    """

    def __init__(self, shard: OwnedShard, channel: LinkedChannel, dest: int, *,
                 queue_rows: int, forward_rows: int, counters: LinkCounters,
                 publisher: BoardPublisher, timeout_s: float) -> None:
        self.shard, self.link, self.dest = shard, channel, dest
        self.timeout_s = timeout_s
        self.queue_rows, self.forward_rows = queue_rows, forward_rows
        self.c, self.publisher = counters, publisher
        self.spec = shard.ring.layout.spec
        self.next_seq = 0  # oldest committed row neither forwarded nor dropped
        self.finished = False

    def on_pass(self) -> int:
        shard, ch, c = self.shard, self.link, self.c
        commit = shard.committed
        backlog = commit - self.next_seq
        if backlog > self.queue_rows:
            c.rows_dropped += backlog - self.queue_rows
            self.next_seq = commit - self.queue_rows
        cap = shard.ring.capacity
        work = 0
        while self.next_seq < commit:
            k = min(commit - self.next_seq, self.forward_rows)
            nbytes = forward_message_bytes(self.spec, k)
            if ch.ready_at(nbytes) > ch.clock() + 2 * nbytes / ch.link.params.bytes_per_s:
                break  # the link is busy: the rows wait here, where the bound applies
            seqs = np.arange(self.next_seq, self.next_seq + k, dtype=np.int64)
            slots = seqs % cap
            cols, reserved = shard.ring.gather(slots)
            torn = int(np.count_nonzero(seqs + cap < reserved))  # a prefix: oldest first
            if torn:
                c.rows_dropped += torn
                self.next_seq += torn
                continue
            prio = shard.index.priority[slots].copy()
            ch.isend(self.dest, Tag.FORWARD, pack_forward(self.spec, self.next_seq, prio, cols))
            c.rows_forwarded += k
            self.next_seq += k
            work += 1
        c.rows_backlog = commit - self.next_seq
        self.publisher.maybe()
        return work

    def on_finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        commit = self.shard.committed
        self.c.rows_unsent = commit - self.next_seq
        self.c.rows_backlog = 0
        self.next_seq = commit
        end = pack_forward(self.spec, commit, np.zeros(0), {}, flags=F_END)
        self.link.isend(self.dest, Tag.FORWARD, end)
        self.link.release_held(self.timeout_s)  # before this rank enters collectives
        self.publisher.maybe(force=True)


class EdgeReplayStation(BufferExtension):
    """``edge_replay`` on the edge buffer: only publishes counters (the rows cross in
    the buffer's service replies; :func:`crossing_priorities` counts them)."""

    def __init__(self, publisher: BoardPublisher, timeout_s: float) -> None:
        self.publisher, self.timeout_s = publisher, timeout_s

    def on_pass(self) -> int:
        self.publisher.maybe()
        return 0

    def on_finish(self) -> None:
        self.publisher.link.release_held(self.timeout_s)
        self.publisher.maybe(force=True)


class CloudReceiver(BufferExtension):
    """``forward`` on the cloud buffer: writes forwarded rows, with the priorities they
    crossed with, into the replay beside the learner; the loop does not end before the
    edge buffer's end marker (so every forwarded message is received).

    Args:
        server (BufferServer): this rank's loop (a handler and a peer are added).
        shard (OwnedShard | None): the cloud replay (``None`` in ``edge_replay``).
        edge_buffer (int): the edge buffer's rank.
        counters (LinkCounters): updated in place.
        publisher (BoardPublisher): publishes them.
    """

    tags = frozenset({Tag.FORWARD})

    def __init__(self, server: BufferServer, shard: OwnedShard | None, edge_buffer: int, *,
                 counters: LinkCounters, publisher: BoardPublisher) -> None:
        self.shard, self.c, self.publisher = shard, counters, publisher
        self.server = server
        if shard is not None:
            self.spec = shard.ring.layout.spec
            server.wait_for(edge_buffer)

    def on_message(self, msg: Message) -> None:
        assert self.shard is not None
        _, flags, prio, cols = unpack_forward(self.spec, msg.payload)
        if len(prio):
            self.shard.ring.write(cols, prio)
            self.shard.poll()  # commit now: the next write never waits on this one
            self.c.rows_received += len(prio)
        if flags & F_END:
            self.server.peer_done(msg.source)

    def on_pass(self) -> int:
        self.publisher.maybe()
        return 0

    def on_finish(self) -> None:
        self.publisher.maybe(force=True)


# ---------------------------------------------------------------------------------
# the composition


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

    @classmethod
    def wanted(cls, config: Config) -> bool:
        return config.longhaul.mode != "off"

    def __init__(self, config: Config, roles: RoleComms) -> None:
        self.config, self.roles = config, roles
        self.lh = config.longhaul
        self.topology = Topology.build(config, world_size=roles.world_size,
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
                              f"do not pass a placement to ExperienceDataPlane",
                              key="longhaul.mode")
        return plan_longhaul(self.config, self.topology, self.roles.actor_ranks)

    def channel(self, comm: MPI.Intracomm, poll_interval_s: float) -> LinkedChannel:
        """This rank's channel: messages to the other side cross the link.
        **Collective** on ``comm`` (a duplicate)."""
        self.link = LinkedChannel(comm, far=self.topology.far_of(self.me),
                                     params=self.params, poll_interval_s=poll_interval_s)
        return self.link

    def attach(self, edp: ExperienceDataPlane) -> None:
        """Set up this rank's part: the counters board (**collective** on the world),
        the buffer loop's extensions, the learner's link columns."""
        roles, topo, me = self.roles, self.topology, self.me
        assert self.link is not None
        self._spec = edp.spec
        self._board = RmaWindow(roles.world,
                                8 * BOARD_FIELDS * roles.world_size if me == topo.learner else 0,
                                node_comm=roles.node,
                                shared=self.config.transport.shared_memory == "auto")
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
                        counters=self.counters, publisher=pub, timeout_s=timeout))
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
        """This rank's link counters (for ``ExperienceDataPlane.summary``). Local."""
        assert self.link is not None
        c = self.counters
        out: dict[str, Any] = {"rank": self.me, "side": self.topology.side(self.me),
                               **self.link.stats(),
                               "rows_crossed": c.rows_crossed,
                               "priority_sum_crossed": c.priority_sum,
                               "rows_forwarded": c.rows_forwarded,
                               "rows_dropped": c.rows_dropped, "rows_unsent": c.rows_unsent,
                               "rows_received": c.rows_received}
        edge = self._shards.get(EDGE_SHARD)
        if edge is not None and self.me == self.topology.edge_buffer:
            out["edge_rows_committed"] = edge.committed
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
