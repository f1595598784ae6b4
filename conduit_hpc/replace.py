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
   forwarded by the old owner to the new one (``MoveRecord.forward``), chains included;
   every forward is acknowledged only once applied (Dijkstra-Scholten), so at the end
   buffer ranks know that nothing is in flight (:attr:`Tag.REPLACE_QUIET`) before they
   stop serving.

**Roles.** The *coordinator* is the first buffer rank (it owns the control block and the
board). It runs the policy in its progress loop on telemetry the job measures: per-shard
sample counts from the lead learner's batches, the learner's compute and iteration time,
the actors' insert rate (control block), the rows every owner holds by sampling mass (a
``REPLACE_STATS`` round trip: the heat of the replay and where its hottest rows are), and
the links of the cluster model (``[placement] cluster``, or the start-up probe).

**Guarantees** (tested under MPI with concurrent ingest and sampling): a moved row is
never lost, duplicated or torn; once a move is over, every row is held by exactly one
shard at the priority it had (updates included), so sampling is again exactly
proportional to ``priority ** alpha`` over the whole replay. *While* a chunk is in flight
a row can be visible in both shards, or (until the destination's next commit pass) in
neither, for a moment - one chunk at a time. A move appends rows to the destination ring
like a writer: into a full ring, it evicts that ring's oldest rows, as ingest would.
Every wait is bounded by ``run.timeout_s``; a failure raises on the rank that sees it and
``python -m mpi4py`` aborts the job.

Not supported (refused by the config): partitioned sampling, the sequence sampler (moves
would cut windows), several shards per buffer rank, and checkpoints (a shard that rows
left holds them in a non-contiguous run, which the checkpoint format does not store).
"""

from __future__ import annotations

import functools
import json
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .delivery import C_INSERTS, C_SAMPLES
from .errors import DataPlaneTimeout
from .placement.adaptive import AdaptiveKnobs, AdaptivePolicy, Telemetry
from .placement.cluster import ClusterModel, Roster
from .placement.inplace import (
    HeldSample,
    heat_of,
    job_cluster,
    job_placement,
    moves_by_source,
    on_job_shards,
    plan_in_place,
    rows_moving,
)
from .placement.model import Workload
from .placement.placement import Placement, ShardWeights
from .roles import Role
from .storage.migrate import MoveRecord, held_slots, move_rows, select_rows
from .storage.ring import H_COMMIT
from .transport.rma import RmaWindow
from .wire import PriorityUpdate, Tag

if TYPE_CHECKING:
    from .buffer import BufferServer, OwnedShard
    from .delivery import Batch
    from .edp import ExperienceDataPlane
    from .learner import LearnerEndpoint
    from .transport.channel import Channel, Message

__all__ = ["ActorRouter", "PlacementBoard", "Replacement"]

#: rows per ``move_rows`` call (one per progress-loop pass)
CHUNK_ROWS = 1024
#: points per shard in a held-rows report (larger shards are summarised)
SAMPLE_POINTS = 4096
#: how often actors look at the placement board
ROUTE_CHECK_S = 0.02


def _i64(*values: int) -> np.ndarray:
    return np.asarray(values, np.int64)


def _cat(*arrays: np.ndarray) -> np.ndarray:
    return np.concatenate([np.ascontiguousarray(a).reshape(-1).view(np.uint8)
                           for a in arrays]) if arrays else np.zeros(0, np.uint8)


def _json(obj: Any) -> np.ndarray:
    return np.frombuffer(json.dumps(obj).encode(), np.uint8).copy()


def _unjson(payload: np.ndarray) -> Any:
    return json.loads(payload.tobytes().decode())


# ---------------------------------------------------------------------------------
# the placement board (coordinator -> actors)


class PlacementBoard:
    """Actors' row weights, published by the coordinator (seqlock), read one-sided.

    Layout in the owner's segment: int64 ``[lock, version, moves_done, n_actors,
    n_shards, 0, 0, 0]`` (64 bytes), then float64 ``[n_actors, n_shards]`` weights (row
    ``i`` for ``actor_ranks[i]``). ``lock`` is odd while the owner writes.

    Args:
        window (RmaWindow): the board's window (collective, created by every rank).
        owner (int): world rank holding it (the coordinator).
        actor_ranks (tuple[int, ...]): world ranks of the actors.
        n_shards (int): shards of the job.
        timeout_s (float): bound on a read that keeps meeting a write.
    """

    HEADER = 64

    def __init__(self, window: RmaWindow, owner: int, actor_ranks: tuple[int, ...],
                 n_shards: int, timeout_s: float) -> None:
        self.window, self.owner = window, owner
        self.actor_index = {a: i for i, a in enumerate(actor_ranks)}
        self.n_actors, self.n_shards = len(actor_ranks), n_shards
        self.timeout_s = timeout_s
        self._row = np.zeros(max(n_shards, 1), np.float64)

    @staticmethod
    def nbytes(n_actors: int, n_shards: int) -> int:
        return PlacementBoard.HEADER + 8 * n_actors * n_shards

    def _head_and_table(self) -> tuple[np.ndarray, np.ndarray]:
        seg = self.window.own_segment()
        head = seg[:self.HEADER].view(np.int64)
        nb = 8 * self.n_actors * self.n_shards
        table = seg[self.HEADER:self.HEADER + nb].view(np.float64).reshape(
            self.n_actors, self.n_shards)
        return head, table

    def publish(self, weights: Mapping[int, ShardWeights]) -> int:
        """Owner: new weights for every actor named; returns the new version. Local."""
        head, table = self._head_and_table()
        lock = int(head[0])
        head[0] = lock + 1
        self.window.sync()
        table[:] = 0.0
        for a, w in weights.items():
            i = self.actor_index.get(a)
            if i is not None:
                table[i, list(w.shards)] = w.weights
        head[1] += 1
        head[3], head[4] = self.n_actors, self.n_shards
        self.window.sync()
        head[0] = lock + 2
        self.window.sync()
        return int(head[1])

    def mark_moved(self) -> int:
        """Owner: one more re-placement is complete (its rows have moved). Local."""
        head, _ = self._head_and_table()
        head[2] += 1
        self.window.sync()
        return int(head[2])

    def version(self) -> int:
        """Version of the published weights (0: none yet). One atomic read."""
        return self.window.atomic_read(self.owner, 8)

    def moves_done(self) -> int:
        """Re-placements completed so far. One atomic read."""
        return self.window.atomic_read(self.owner, 16)

    def weights_of(self, actor_rank: int) -> tuple[int, ShardWeights | None]:
        """(version, this actor's weights) as published; weights None before the first
        publication. One-sided; retries while the owner writes (bounded)."""
        i = self.actor_index[actor_rank]
        w = self.window
        deadline = time.monotonic() + self.timeout_s
        off = self.HEADER + 8 * i * self.n_shards
        while True:
            lock = w.atomic_read(self.owner, 0)
            if lock % 2 == 0:
                version = w.atomic_read(self.owner, 8)
                view = w.local_view(self.owner)
                if view is not None:
                    w.sync()
                    self._row[:self.n_shards] = view[off:off + 8 * self.n_shards].view(
                        np.float64)
                    w.sync()
                else:
                    w.get(self.owner, off, self._row[:self.n_shards])
                    w.flush(self.owner)
                if w.atomic_read(self.owner, 0) == lock:
                    break
            if time.monotonic() > deadline:
                raise DataPlaneTimeout(f"the placement board on rank {self.owner} stayed "
                                       f"mid-update for {self.timeout_s:.1f} s")
            time.sleep(0.0001)
        row = self._row[:self.n_shards]
        if version == 0 or not (row > 0).any():
            return version, None
        return version, ShardWeights.of({s: float(x) for s, x in enumerate(row) if x > 0})


class ActorRouter:
    """Which shard an actor's next batch goes to: the start plan's, then the board's.

    Args:
        board (PlacementBoard): the board.
        actor_rank (int): this actor's world rank.
        start (int): its shard in the start plan.
        check_every_s (float): how often to look at the board (one atomic read).
    """

    def __init__(self, board: PlacementBoard, actor_rank: int, start: int,
                 check_every_s: float = ROUTE_CHECK_S) -> None:
        self.board, self.rank, self.start = board, actor_rank, start
        self.check_every_s = check_every_s
        self.version = 0
        self.weights: ShardWeights | None = None
        self._next = 0.0

    def shard(self, batch_index: int) -> int:
        """The shard for this actor's ``batch_index``-th batch. Local, except for an
        atomic read of the board every ``check_every_s`` (and the weights when they
        changed)."""
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.check_every_s
            if self.board.version() != self.version:
                self.version, w = self.board.weights_of(self.rank)
                if w is not None:
                    self.weights = w
        return self.start if self.weights is None else self.weights.pick(batch_index)


# ---------------------------------------------------------------------------------
# the lead learner's telemetry


class TelemetryTap:
    """Counts the lead learner's samples per shard and its timings; every ``interval``
    supersteps sends them to the coordinator (from the rank's MPI thread).

    Args:
        endpoint (LearnerEndpoint): the learner (its :meth:`post` carries the send).
        channel (Channel): the data plane's channel.
        coordinator (int): the coordinator's world rank.
        n_shards (int): shards of the job.
        interval (int): supersteps between reports.
    """

    def __init__(self, endpoint: LearnerEndpoint, channel: Channel, coordinator: int,
                 n_shards: int, interval: int) -> None:
        self.endpoint, self.channel, self.coordinator = endpoint, channel, coordinator
        self.n_shards, self.interval = n_shards, interval
        self.counts = np.zeros(n_shards, np.int64)
        self._last: float | None = None
        self._sums = np.zeros(3)  # compute, iteration, exposed
        self._steps = 0
        self.reports = 0

    def __call__(self, superstep: int, batch: Batch, exposed_s: float) -> None:
        now = time.perf_counter()
        self.counts += np.bincount(batch.indices[:, 0], minlength=self.n_shards)[
            :self.n_shards]
        if self._last is not None:
            it = now - self._last
            self._sums += (max(it - exposed_s, 0.0), it, exposed_s)
            self._steps += 1
        self._last = now
        if (superstep + 1) % self.interval:
            return
        mean = self._sums / max(self._steps, 1)
        payload = _cat(_i64(superstep + 1, self.n_shards, self._steps), self.counts,
                       mean.astype(np.float64))
        self.counts = np.zeros(self.n_shards, np.int64)
        self._sums[:] = 0.0
        self._steps = 0
        self.reports += 1
        ch, to = self.channel, self.coordinator
        self.endpoint.post(lambda: ch.isend(to, Tag.REPLACE_TELEMETRY, payload))


def _unpack_telemetry(payload: np.ndarray) -> tuple[int, np.ndarray, int, np.ndarray]:
    head = payload[:24].view(np.int64)
    n = int(head[1])
    counts = payload[24:24 + 8 * n].view(np.int64).copy()
    mean = payload[24 + 8 * n:24 + 8 * n + 24].view(np.float64).copy()
    return int(head[0]), counts, int(head[2]), mean


def pack_samples(look: int, samples: list[HeldSample]) -> np.ndarray:
    """A ``REPLACE_STATS`` payload: the look number and each shard's held rows."""
    parts = [_i64(look, len(samples))]
    for s in samples:
        parts += [_i64(s.shard_id, len(s.rows)), s.mass.astype(np.float64),
                  s.rows.astype(np.int64)]
    return _cat(*parts)


def unpack_samples(payload: np.ndarray) -> tuple[int, list[HeldSample]]:
    """Inverse of :func:`pack_samples`."""
    head = payload[:16].view(np.int64)
    look, n = int(head[0]), int(head[1])
    o, out = 16, []
    for _ in range(n):
        sid, k = (int(x) for x in payload[o:o + 16].view(np.int64))
        o += 16
        mass = payload[o:o + 8 * k].view(np.float64).copy()
        o += 8 * k
        rows = payload[o:o + 8 * k].view(np.int64).copy()
        o += 8 * k
        out.append(HeldSample(sid, mass, rows))
    return look, out


# ---------------------------------------------------------------------------------
# owners: moving rows, forwarding late updates, stopping together


@dataclass
class _Job:
    look: int
    coordinator: int
    chunks: deque[tuple[int, int, np.ndarray]]
    t0: float = field(default_factory=time.perf_counter)
    moved: int = 0
    skipped: int = 0


@dataclass
class _Pending:
    """Forwarded updates for rows the destination has been written but not committed."""

    shard_id: int
    slots: np.ndarray
    gens: np.ndarray
    priorities: np.ndarray
    parent: tuple[int, int] | None
    since: float


class ShardMover:
    """A buffer rank's part: report held rows, move rows, forward late updates, and
    keep serving until no buffer rank has anything in flight. Runs inside the rank's
    progress loop (a hook and message handlers); never blocks but for ``move_rows``'s
    bounded writes.

    Args:
        edp (ExperienceDataPlane): this buffer rank's data plane.
        chunk_rows (int): rows per ``move_rows`` call.
    """

    def __init__(self, edp: ExperienceDataPlane, *, chunk_rows: int = CHUNK_ROWS) -> None:
        server = edp.server
        assert server is not None
        self.server: BufferServer = server
        self.channel = edp.channel
        self.rings = edp.rings
        self.me = edp.world_rank
        self.buffers = frozenset(edp.roles.buffer_ranks)
        self.owner_of = {s.shard_id: s.owner_rank for s in edp.placement.shards}
        self.timeout_s = edp.config.run.timeout_s
        self.chunk_rows = chunk_rows
        #: per source shard: (look, destination shard, record) of each chunk moved
        self.records: dict[int, list[tuple[int, int, MoveRecord]]] = {}
        self.job: _Job | None = None
        self.on_local_done: Callable[[dict[str, Any]], None] | None = None
        self.busy: Callable[[], bool] = lambda: False  # the coordinator's own work
        self._fid = 0
        self.outstanding = 0  # forwards sent, not yet acknowledged
        self.child_parent: dict[int, tuple[int, int] | None] = {}
        self.open: dict[tuple[int, int], int] = {}  # received forward -> open items
        self.pending: list[_Pending] = []
        self.quiet_from: set[int] = set()
        self.declared_at: float | None = None
        self.counters = dict.fromkeys(("moved_rows", "skipped_rows", "moves", "forwarded",
                                       "forward_applied", "forward_dropped"), 0)
        h = server.handlers
        self._priority = h[Tag.PRIORITY]
        h[Tag.PRIORITY] = self._on_priority
        h[Tag.REPLACE_STATS_REQ] = self._on_stats_request
        h[Tag.REPLACE_MOVE] = self._on_move
        h[Tag.REPLACE_FWD] = self._on_forward
        h[Tag.REPLACE_FWD_ACK] = self._on_ack
        h[Tag.REPLACE_QUIET] = self._on_quiet
        server.hooks.append(self.step)
        server.keep_open.append(self.keep_open)

    # -- held rows -----------------------------------------------------------------
    def samples(self) -> list[HeldSample]:
        """What this rank's shards hold, by sampling mass. Local."""
        out = []
        for s in self.server.shards:
            slots, _ = held_slots(s.ring, s.index)
            out.append(HeldSample.of(s.shard_id, s.index.sum[slots], SAMPLE_POINTS))
        return out

    def _on_stats_request(self, msg: Message) -> None:
        look = int(msg.payload[:8].view(np.int64)[0])
        self.channel.isend(msg.source, Tag.REPLACE_STATS, pack_samples(look, self.samples()))

    # -- moving --------------------------------------------------------------------
    def _on_move(self, msg: Message) -> None:
        info = _unjson(msg.payload)
        self.start_job(int(info["look"]), msg.source,
                       {int(k): [(int(d), int(n)) for d, n in v]
                        for k, v in info["moves"].items()}, info["order"])

    def start_job(self, look: int, coordinator: int,
                  moves: Mapping[int, list[tuple[int, int]]], order: str) -> None:
        """Queue the chunks that carry ``moves`` (per source shard of this rank: runs of
        its rows in ``order``, one per destination; runs to itself stay). Local."""
        if self.job is not None:
            raise RuntimeError(f"rank {self.me} got a move for look {look} while moving "
                               f"for look {self.job.look}")
        chunks: deque[tuple[int, int, np.ndarray]] = deque()
        for src in sorted(moves):
            runs = moves[src]
            shard = self.server.by_id[src]
            slots = select_rows(shard.ring, shard.index, sum(n for _, n in runs),
                                order)  # type: ignore[arg-type]
            pos = 0
            for dst, n in runs:
                part = slots[pos:pos + n]
                pos += n
                if dst == src:
                    continue
                for i in range(0, len(part), self.chunk_rows):
                    chunks.append((src, dst, part[i:i + self.chunk_rows]))
        # records of looks before the previous one can no longer be referenced
        for src, recs in self.records.items():
            self.records[src] = [r for r in recs if r[0] >= look - 1]
        self.job = _Job(look, coordinator, chunks)

    def _run_chunk(self) -> int:
        job = self.job
        assert job is not None
        if job.chunks:
            src, dst, slots = job.chunks.popleft()
            shard = self.server.by_id[src]
            rec = move_rows(shard.ring, shard.index, self.rings[dst], slots,
                            chunk_rows=self.chunk_rows,
                            hide=functools.partial(_hide, shard))
            if rec.count:
                self.records.setdefault(src, []).append((job.look, dst, rec))
            job.moved += rec.count
            job.skipped += rec.skipped
        if job.chunks:
            return 1
        self.job = None
        self.counters["moved_rows"] += job.moved
        self.counters["skipped_rows"] += job.skipped
        self.counters["moves"] += 1
        reply = {"look": job.look, "rank": self.me, "moved": job.moved,
                 "skipped": job.skipped, "seconds": time.perf_counter() - job.t0}
        if job.coordinator == self.me:
            assert self.on_local_done is not None
            self.on_local_done(reply)
        else:
            self.channel.isend(job.coordinator, Tag.REPLACE_MOVED, _json(reply))
        return 1

    # -- forwarding late priority updates ------------------------------------------
    def _on_priority(self, msg: Message) -> None:
        self._priority(msg)  # the normal path: applied where the row still is
        if not self.records:
            return
        up = PriorityUpdate.unpack(msg.payload)
        if not self.records.get(up.shard_id):
            return
        ix = self.server.by_id[up.shard_id].index
        miss = np.flatnonzero(ix.gens[up.slots] != up.gens)
        if miss.size:
            self._forward(up.shard_id, up.slots[miss], up.gens[miss], up.priorities[miss],
                          None)

    def _forward(self, sid: int, slots: np.ndarray, gens: np.ndarray, prios: np.ndarray,
                 parent: tuple[int, int] | None) -> np.ndarray:
        """Send on the updates for rows that moved out of ``sid``; returns which."""
        done = np.zeros(len(slots), bool)
        for _, dst, rec in self.records.get(sid, ()):
            todo = np.flatnonzero(~done)
            if todo.size == 0:
                break
            hit, dslots, dgens = rec.forward(slots[todo], gens[todo])
            if not hit.any():
                continue
            idx = todo[hit]
            done[idx] = True
            self.counters["forwarded"] += len(idx)
            self._send(dst, dslots, dgens, prios[idx], parent)
        return done

    def _send(self, dst: int, slots: np.ndarray, gens: np.ndarray, prios: np.ndarray,
              parent: tuple[int, int] | None) -> None:
        owner = self.owner_of[dst]
        if owner == self.me:
            self._apply(dst, slots, gens, prios, parent)
            return
        self._fid += 1
        self.child_parent[self._fid] = parent
        if parent is not None:
            self.open[parent] += 1
        self.outstanding += 1
        up = PriorityUpdate(dst, slots, gens, prios)
        self.channel.isend(owner, Tag.REPLACE_FWD, _cat(_i64(self._fid), up.pack()))

    def _apply(self, sid: int, slots: np.ndarray, gens: np.ndarray, prios: np.ndarray,
               parent: tuple[int, int] | None, since: float | None = None) -> None:
        """Apply forwarded updates to ``sid`` where the row is; pass on those that moved
        again; keep those written here but not yet committed."""
        shard = self.server.by_id[sid]
        ix = shard.index
        live = (ix.gens[slots] == gens) & (gens > 0)
        if live.any():
            with shard.writing():
                ix.update(slots[live], gens[live], prios[live])
            self.counters["forward_applied"] += int(live.sum())
        rest = np.flatnonzero(~live)
        if rest.size:
            rest = rest[~self._forward(sid, slots[rest], gens[rest], prios[rest], parent)]
        if rest.size:
            v = shard.ring.views
            assert v is not None
            shard.ring.transport.sync()
            commit = int(v.header[H_COMMIT])
            wait = (v.stamps[slots[rest]] == gens[rest]) & (gens[rest] - 1 >= commit)
            if wait.any():
                w = rest[wait]
                self.pending.append(_Pending(sid, slots[w], gens[w], prios[w], parent,
                                             time.monotonic() if since is None else since))
                if parent is not None:
                    self.open[parent] += 1
            self.counters["forward_dropped"] += int(np.count_nonzero(~wait))

    def _retry_pending(self) -> int:
        items, self.pending = self.pending, []
        now = time.monotonic()
        for p in items:
            if now - p.since > self.timeout_s:
                raise DataPlaneTimeout(
                    f"rank {self.me}: rows moved into shard {p.shard_id} stayed uncommitted "
                    f"for {self.timeout_s:.1f} s (a writer of that shard did not finish)")
            self._apply(p.shard_id, p.slots, p.gens, p.priorities, p.parent, p.since)
            self._close(p.parent)
        return len(items)

    def _on_forward(self, msg: Message) -> None:
        fid = int(msg.payload[:8].view(np.int64)[0])
        up = PriorityUpdate.unpack(msg.payload[8:])
        key = (msg.source, fid)
        self.open[key] = 1  # held open while it is being applied
        self._apply(up.shard_id, np.array(up.slots), np.array(up.gens),
                    np.array(up.priorities), key)
        self._close(key)

    def _close(self, key: tuple[int, int] | None) -> None:
        """One item of a received forward is done; acknowledge it when none is left."""
        if key is None:
            return
        self.open[key] -= 1
        if self.open[key] == 0:
            del self.open[key]
            self.channel.isend(key[0], Tag.REPLACE_FWD_ACK, _i64(key[1]))

    def _on_ack(self, msg: Message) -> None:
        fid = int(msg.payload[:8].view(np.int64)[0])
        parent = self.child_parent.pop(fid)
        self.outstanding -= 1
        self._close(parent)

    # -- stopping together -----------------------------------------------------------
    def idle(self) -> bool:
        """Nothing of this rank in flight: no move, forward or pending update."""
        return (self.job is None and self.outstanding == 0 and not self.pending
                and not self.open and not self.busy())

    def _on_quiet(self, msg: Message) -> None:
        self.quiet_from.add(msg.source)

    def keep_open(self) -> bool:
        """Keep serving until every buffer rank said it is quiet (and this one is)."""
        return not (self.quiet_from >= self.buffers and self.idle())

    def _quiet_step(self) -> int:
        if self.declared_at is not None:
            if (not self.quiet_from >= self.buffers
                    and time.monotonic() - self.declared_at > self.timeout_s):
                raise DataPlaneTimeout(
                    f"buffer rank {self.me} waited {self.timeout_s:.1f} s for buffer ranks "
                    f"{sorted(self.buffers - self.quiet_from)} to finish re-placement work")
            return 0
        if self.server.waiting_for or not self.idle():
            return 0
        # every peer is done (no new update can come) and nothing of ours is in flight;
        # forwards acknowledge only once their whole chain is applied, so once every
        # buffer rank has said so, nothing is in flight anywhere
        self.declared_at = time.monotonic()
        self.quiet_from.add(self.me)
        for b in sorted(self.buffers - {self.me}):
            self.channel.isend(b, Tag.REPLACE_QUIET, np.zeros(0, np.uint8))
        return 1

    def step(self) -> int:
        """One pass (the buffer loop's hook): a chunk of the move, pending forwards,
        the quiet protocol. Local; blocks only inside ``move_rows`` (bounded)."""
        work = 0
        if self.job is not None:
            work += self._run_chunk()
        if self.pending:
            work += self._retry_pending()
        return work + self._quiet_step()


def _hide(shard: OwnedShard, slots: np.ndarray) -> None:
    with shard.writing():
        shard.index.invalidate(slots)


# ---------------------------------------------------------------------------------
# the coordinator (first buffer rank)


class Coordinator:
    """Runs the adaptive policy on the job's telemetry and carries out its moves.

    Lives in the first buffer rank's progress loop: a look starts when the lead
    learner's report arrives (every ``interval_supersteps``), asks every buffer rank for
    its held rows, decides, and on a move publishes the actors' new weights, then has
    the owners move their rows one after another. Every wait has a deadline.

    Args:
        edp (ExperienceDataPlane): the first buffer rank's data plane.
        mover (ShardMover): this rank's owner part.
        board (PlacementBoard): the actors' routing.
        policy (AdaptivePolicy): the policy (its placement: the job's shards).
        job (Placement): the job's placement (:func:`job_placement`).
        order (str): ``hottest`` (prioritized) or ``oldest``.
    """

    def __init__(self, edp: ExperienceDataPlane, mover: ShardMover, board: PlacementBoard,
                 policy: AdaptivePolicy, job: Placement, order: str) -> None:
        server = edp.server
        assert server is not None
        self.server, self.channel, self.control = server, edp.channel, edp.control
        self.me = edp.world_rank
        self.buffers = tuple(edp.roles.buffer_ranks)
        self.n_actors = len(edp.roles.actor_ranks)
        self.timeout_s = edp.config.run.timeout_s
        self.mover, self.board, self.policy, self.job, self.order = (mover, board, policy,
                                                                       job, order)
        self.state = "idle"  # idle | stats | moving
        self.look = 0
        self.counts = np.zeros(len(job.shards), np.int64)
        self._timing = np.zeros(3)  # weighted sums of compute, iteration, exposed
        self._steps = 0
        self.superstep = 0
        self.replies: dict[int, list[HeldSample]] = {}
        self.deadline = 0.0
        self.waiting = ""
        self.queue: list[tuple[int, dict[int, list[tuple[int, int]]]]] = []
        self.current: int | None = None
        self.record: dict[str, Any] = {}
        self.history: list[dict[str, Any]] = []
        self._inserts = (self.control.read(C_INSERTS), time.monotonic())
        h = server.handlers
        h[Tag.REPLACE_TELEMETRY] = self._on_telemetry
        h[Tag.REPLACE_STATS] = self._on_stats
        h[Tag.REPLACE_MOVED] = self._on_moved
        mover.busy = lambda: self.state != "idle"
        mover.on_local_done = lambda reply: self._moved(reply, self.me)
        server.hooks.append(self.step)

    # -- looks -----------------------------------------------------------------------
    def _on_telemetry(self, msg: Message) -> None:
        superstep, counts, steps, mean = _unpack_telemetry(msg.payload)
        self.counts += counts[:len(self.counts)]
        self._timing += mean * steps
        self._steps += steps
        self.superstep = superstep
        # looks only while peers run: once all are done no report can follow
        if self.state == "idle" and self.server.waiting_for:
            self._start_look()

    def _start_look(self) -> None:
        self.look += 1
        self.state, self.waiting = "stats", "the buffer ranks' held-row reports"
        self.deadline = time.monotonic() + self.timeout_s
        self.replies = {self.me: self.mover.samples()}
        for b in self.buffers:
            if b != self.me:
                self.channel.isend(b, Tag.REPLACE_STATS_REQ, _i64(self.look))
        if len(self.replies) == len(self.buffers):
            self._decide()

    def _on_stats(self, msg: Message) -> None:
        look, samples = unpack_samples(msg.payload)
        if self.state != "stats" or look != self.look:
            return
        self.replies[msg.source] = samples
        if len(self.replies) == len(self.buffers):
            self._decide()

    def _telemetry(self, samples: list[HeldSample]) -> Telemetry | None:
        total = int(self.counts.sum())
        if total <= 0 or self._steps <= 0:
            return None
        shares = {i: float(c) / total for i, c in enumerate(self.counts)}
        compute, iteration, _ = self._timing / self._steps
        now, inserts = time.monotonic(), self.control.read(C_INSERTS)
        rate = (inserts - self._inserts[0]) / max(now - self._inserts[1], 1e-9)
        self._inserts = (inserts, now)
        if iteration > 0:  # the workload's superstep is the measured one
            self.policy.workload = replace(self.policy.workload,
                                           update_rate_hz=1.0 / iteration)
        heat = heat_of(samples) if self.order == "hottest" else None
        return Telemetry(self.superstep, shard_sample_share=shares,
                         actor_rows_per_s=rate / max(self.n_actors, 1),
                         compute_s=float(compute), heat=heat or None)

    def _decide(self) -> None:
        samples = [s for b in self.buffers for s in self.replies[b]]
        t = self._telemetry(samples)
        held = {s.shard_id: s.held for s in samples}
        self.record = {"look": self.look, "superstep": self.superstep, "held": held,
                       "sample_share": {i: int(c) for i, c in enumerate(self.counts)}}
        self.counts[:] = 0
        self._timing[:] = 0.0
        self._steps = 0
        if t is None:
            self._finish("hold", "no samples since the last look")
            return
        d = self.policy.observe(t)
        self.record.update(current_s=d.current_s, proposed_s=d.proposed_s,
                           predicted_move_s=d.move_s, compute_s=t.compute_s,
                           actor_rows_per_s=t.actor_rows_per_s)
        if d.action == "hold" or d.placement is None:
            self._finish("hold", d.reason)
            return
        new = on_job_shards(d.placement, self.job)
        self.policy.placement = self.job = new
        moves = plan_in_place(new, samples, order=self.order)  # type: ignore[arg-type]
        version = self.board.publish(new.actor_weights or {})
        per_owner: dict[int, dict[int, list[tuple[int, int]]]] = {}
        for src, runs in moves_by_source(moves).items():
            if any(dst != src for dst, _ in runs):
                per_owner.setdefault(new.shards[src].owner_rank, {})[src] = runs
        self.queue = sorted(per_owner.items())
        self.record.update(action="move", reason=d.reason, routing_version=version,
                           moves=[[m.src_shard, m.dst_shard, m.rows] for m in moves],
                           planned_rows=rows_moving(moves), moved_rows=0, skipped_rows=0,
                           share_planned={s.shard_id: s.share for s in new.shards},
                           inserts_at_start=self.control.read(C_INSERTS),
                           samples_at_start=self.control.read(C_SAMPLES),
                           t0=time.perf_counter())
        self.state = "moving"
        self._advance()

    # -- moves -----------------------------------------------------------------------
    def _advance(self) -> None:
        if self.current is not None:
            return
        if not self.queue:
            r = self.record
            r["moves_done"] = self.board.mark_moved()
            r["seconds"] = time.perf_counter() - r.pop("t0")
            r["inserts_at_end"] = self.control.read(C_INSERTS)
            r["samples_at_end"] = self.control.read(C_SAMPLES)
            self._finish("move", r["reason"])
            return
        owner, moves = self.queue.pop(0)
        self.current = owner
        self.waiting = f"rank {owner} to move its rows"
        self.deadline = time.monotonic() + self.timeout_s
        if owner == self.me:
            self.mover.start_job(self.look, self.me, moves, self.order)
        else:
            self.channel.isend(owner, Tag.REPLACE_MOVE, _json(
                {"look": self.look, "order": self.order,
                 "moves": {str(k): v for k, v in moves.items()}}))

    def _on_moved(self, msg: Message) -> None:
        self._moved(_unjson(msg.payload), msg.source)

    def _moved(self, reply: dict[str, Any], source: int) -> None:
        if self.state != "moving" or source != self.current or reply["look"] != self.look:
            raise RuntimeError(f"unexpected move report {reply} from rank {source}")
        self.record["moved_rows"] += int(reply["moved"])
        self.record["skipped_rows"] += int(reply["skipped"])
        self.current = None
        self._advance()

    def _finish(self, action: str, reason: str) -> None:
        self.record.setdefault("action", action)
        self.record.setdefault("reason", reason)
        self.history.append(self.record)
        self.record = {}
        self.state, self.waiting = "idle", ""

    def step(self) -> int:
        """The buffer loop's hook: deadlines. Local; never blocks."""
        if self.state != "idle" and time.monotonic() > self.deadline:
            raise DataPlaneTimeout(f"adaptive placement (look {self.look}) waited "
                                   f"{self.timeout_s:.1f} s for {self.waiting}")
        return 0


# ---------------------------------------------------------------------------------
# the whole thing, per rank


def job_workload(edp: ExperienceDataPlane, job: Placement) -> Workload:
    """The workload the policy plans for: the job's rows, batch and sampling; rates and
    compute come from telemetry at each look."""
    cfg = edp.config
    sch = cfg.scheduler
    prioritized = sch.sampler == "prioritized" and cfg.storage.priority_exponent > 0
    return Workload(capacity_rows=job.capacity_rows, row_bytes=edp.spec.row_bytes,
                    batch_rows=sch.batch_rows, update_rate_hz=100.0, actor_rows_per_s=0.0,
                    sampling="prioritized" if prioritized else "uniform", scope="global",
                    tiers=("buffer_host",))


class Replacement:
    """Adaptive re-placement on one rank of a running job (see the module docstring).

    **Collective** on the job's ranks (construction: the placement board's window, and
    the start-up probe when ``[placement] cluster`` is empty; :meth:`close`). Built by
    :class:`~conduit_hpc.edp.ExperienceDataPlane` when ``[placement] adaptive = true``.

    Args:
        edp (ExperienceDataPlane): this rank's data plane (roles, shards, server or
            learner endpoint already built).
        cluster (ClusterModel | None): the cluster model; default: ``[placement]
            cluster`` (a TOML file), or the start-up probe when that is empty.

    Raises:
        ConfigError: the cluster model does not describe the job's nodes, or a buffer
            rank holds other than one shard (on every rank).
    """

    def __init__(self, edp: ExperienceDataPlane, cluster: ClusterModel | None = None) -> None:
        cfg, roles = edp.config, edp.roles
        pc = cfg.placement
        if cluster is None:
            if pc.cluster:
                cluster = ClusterModel.from_toml(pc.cluster)
            else:
                from .probe import probe_cluster

                cluster, _, _ = probe_cluster(roles)
        roster = Roster.from_ranks(cluster, roles.node_of, roles.learner_ranks,
                                   roles.buffer_ranks, roles.actor_ranks)
        self.job = job_placement(edp.placement, cluster, roster)
        workload = job_workload(edp, self.job)
        self.cluster = job_cluster(cluster, roster, self.job, workload)
        self.roster = roster
        me = roles.world_rank
        self.coordinator_rank = roles.buffer_ranks[0]
        n_shards = len(self.job.shards)
        nb = PlacementBoard.nbytes(len(roles.actor_ranks), n_shards)
        self._window = RmaWindow(roles.world, nb if me == self.coordinator_rank else 0,
                                 node_comm=roles.node,
                                 shared=cfg.transport.shared_memory == "auto")
        self.board = PlacementBoard(self._window, self.coordinator_rank, roles.actor_ranks,
                                    n_shards, cfg.run.timeout_s)
        self.mover: ShardMover | None = None
        self.coordinator: Coordinator | None = None
        self.router: ActorRouter | None = None
        self.tap: TelemetryTap | None = None
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
        elif me == roles.learner_ranks[0]:
            self.tap = TelemetryTap(edp.learner, edp.channel, self.coordinator_rank, n_shards,
                                    pc.interval_supersteps)
            edp.learner.on_superstep.append(self.tap)

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
        """This rank's part: the coordinator's decisions (``history``), an owner's
        counters, an actor's routing version. Local."""
        out: dict[str, Any] = {}
        if self.coordinator is not None:
            out["history"] = self.coordinator.history
            out["moves"] = sum(h.get("action") == "move" for h in self.coordinator.history)
        if self.mover is not None:
            out["counters"] = dict(self.mover.counters)
        if self.router is not None:
            out["routing_version"] = self.router.version
        if self.tap is not None:
            out["reports"] = self.tap.reports
        return out

    def close(self) -> None:
        """Free the board. **Collective** on the job's ranks; idempotent."""
        self._window.close()
