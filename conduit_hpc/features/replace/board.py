"""The placement board (coordinator -> actors), actors' routing, the lead learner's
telemetry, and the byte layouts of re-placement messages. Composition layer."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from conduit_hpc.placement.inplace import HeldSample
from conduit_hpc.placement.placement import ShardWeights
from conduit_hpc.plane.extensions import LearnerHook
from conduit_hpc.protocol import Tag
from conduit_hpc.transport.rma import RmaWindow
from conduit_hpc.wait import Deadline

if TYPE_CHECKING:
    from conduit_hpc.plane.delivery import Batch
    from conduit_hpc.plane.learner import LearnerEndpoint
    from conduit_hpc.transport.channel import Channel

__all__ = ["ActorRouter", "PlacementBoard", "TelemetryTap", "pack_samples", "unpack_samples"]

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
        deadline = Deadline(self.timeout_s, f"the placement board on rank {self.owner} "
                                            f"to settle (it stayed mid-update)")
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
            deadline.check()
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


class TelemetryTap(LearnerHook):
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

    def on_superstep(self, superstep: int, batch: Batch, exposed_s: float) -> None:
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


