"""A buffer rank's part of re-placement: report held rows, move rows in the progress
loop, forward late priority updates (acknowledged chains), and stop serving together.
Composition layer."""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from conduit_hpc.errors import DataPlaneTimeout
from conduit_hpc.features.replace.board import _cat, _i64, _json, _unjson, pack_samples
from conduit_hpc.placement.inplace import HeldSample
from conduit_hpc.plane.extensions import BufferExtension
from conduit_hpc.protocol import PriorityUpdate, Tag
from conduit_hpc.storage.migrate import MoveRecord, held_slots, move_rows, select_rows
from conduit_hpc.storage.ring import H_COMMIT

if TYPE_CHECKING:
    from conduit_hpc.plane.buffer import BufferServer, OwnedShard
    from conduit_hpc.plane.extensions import FeatureHost
    from conduit_hpc.transport.channel import Message

Handler = Callable[["Message"], None]

__all__ = ["ShardMover"]

#: most rows and bytes per ``move_rows`` call (one call per progress-loop pass, so that
#: the owner keeps committing and answering samples while it moves)
CHUNK_ROWS = 1024
CHUNK_BYTES = 4 << 20
#: points per shard in a held-rows report (larger shards are summarised)
SAMPLE_POINTS = 4096


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
    """Forwarded updates for rows written into this rank's shard but not committed yet."""

    shard_id: int
    slots: np.ndarray
    gens: np.ndarray
    priorities: np.ndarray
    parent: tuple[int, int] | None
    since: float


class ShardMover(BufferExtension):
    """A buffer rank's part: report held rows, move rows, forward late updates, and
    keep serving until no buffer rank has anything in flight. Runs inside the rank's
    progress loop (a hook and message handlers); never blocks but for ``move_rows``'s
    bounded writes.

    Args:
        edp (FeatureHost): this buffer rank's data plane.
        chunk_rows (int | None): rows per ``move_rows`` call (default: ``CHUNK_ROWS``, at
            most ``CHUNK_BYTES`` of rows).
    """

    def __init__(self, edp: FeatureHost, *, chunk_rows: int | None = None) -> None:
        server = edp.server
        assert server is not None
        self.server: BufferServer = server
        self.channel = edp.channel
        self.rings = edp.rings
        self.me = edp.world_rank
        self.buffers = frozenset(edp.roles.buffer_ranks)
        self.owner_of = {s.shard_id: s.owner_rank for s in edp.placement.shards}
        self.timeout_s = edp.config.run.timeout_s
        self.chunk_rows = chunk_rows or max(1, min(CHUNK_ROWS,
                                                  CHUNK_BYTES // max(edp.spec.row_bytes, 1)))
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
        #: per shard, the generation each slot last got a learner's own update for: a
        #: forwarded update (sent for an older batch) never overwrites one of those
        self.direct = {s.shard_id: np.zeros(s.ring.capacity, np.int64) for s in server.shards}
        self.quiet_from: set[int] = set()
        self.declared_at: float | None = None
        self.counters = dict.fromkeys(("moved_rows", "skipped_rows", "moves", "forwarded",
                                       "forward_applied", "forward_superseded",
                                       "forward_dropped"), 0)
        self._handlers: dict[int, Handler] = {Tag.REPLACE_STATS_REQ: self._on_stats_request,
                          Tag.REPLACE_MOVE: self._on_move, Tag.REPLACE_FWD: self._on_forward,
                          Tag.REPLACE_FWD_ACK: self._on_ack, Tag.REPLACE_QUIET: self._on_quiet}
        server.add_extension(self)

    # -- the buffer loop's events (see BufferExtension) --------------------------------
    tags = frozenset({Tag.REPLACE_STATS_REQ, Tag.REPLACE_MOVE, Tag.REPLACE_FWD,
                      Tag.REPLACE_FWD_ACK, Tag.REPLACE_QUIET})

    def on_message(self, msg: Message) -> None:
        self._handlers[msg.tag](msg)

    def on_pass(self) -> int:
        return self.step()

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
        if not self.server.waiting_for:
            # every peer is done: nobody samples or ingests any more, so the rest of the
            # move buys nothing; each chunk moved is complete, the others stay put
            job.chunks.clear()
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
    def on_priority_update(self, up: PriorityUpdate) -> None:
        # applied where the row still is; forward what names rows that moved away
        ix = self.server.by_id[up.shard_id].index
        hit = ix.gens[up.slots] == up.gens
        self.direct[up.shard_id][up.slots[hit]] = up.gens[hit]
        if not self.records.get(up.shard_id):
            return
        miss = np.flatnonzero(~hit)
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
        # a learner updates in superstep order: one it sent to the row's new place is
        # for a later batch than any that reached the old place, so it stands
        newer = live & (self.direct[sid][slots] == gens)
        if newer.any():
            self.counters["forward_superseded"] += int(newer.sum())
            live &= ~newer
        if live.any():
            with shard.writing():
                ix.update(slots[live], gens[live], prios[live])
            self.counters["forward_applied"] += int(live.sum())
        rest = np.flatnonzero(~live & ~newer)
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


