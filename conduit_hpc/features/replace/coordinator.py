"""The coordinator of re-placement (the first buffer rank): looks, the policy, moves in
turn. Composition layer."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from conduit_hpc.errors import DataPlaneTimeout
from conduit_hpc.features.replace.board import (
    PlacementBoard,
    _i64,
    _json,
    _unjson,
    _unpack_telemetry,
    unpack_samples,
)
from conduit_hpc.features.replace.owner import ShardMover
from conduit_hpc.placement.adaptive import AdaptivePolicy, Telemetry
from conduit_hpc.placement.inplace import (
    HeldSample,
    heat_of,
    moves_by_source,
    on_job_shards,
    plan_in_place,
    rows_moving,
)
from conduit_hpc.placement.placement import Placement
from conduit_hpc.plane.control import C_INSERTS, C_SAMPLES
from conduit_hpc.plane.extensions import BufferExtension
from conduit_hpc.protocol import Tag

if TYPE_CHECKING:
    from conduit_hpc.plane.host import FeatureHost
    from conduit_hpc.transport.channel import Message

Handler = Callable[["Message"], None]

#: the looks whose records a coordinator keeps (the latest; :attr:`Coordinator.history`)
HISTORY_KEEP = 1000

__all__ = ["HISTORY_KEEP", "Coordinator"]

# ---------------------------------------------------------------------------------
# the coordinator (first buffer rank)


class Coordinator(BufferExtension):
    """Runs the adaptive policy on the job's telemetry and carries out its moves.

    Lives in the first buffer rank's progress loop: a look starts when the lead
    learner's report arrives (every ``interval_supersteps``), asks every buffer rank for
    its held rows, decides, and on a move publishes the actors' new weights, then has
    the owners move their rows one after another. Every wait has a deadline.

    Args:
        edp (FeatureHost): the first buffer rank's data plane.
        mover (ShardMover): this rank's owner part.
        board (PlacementBoard): the actors' routing.
        policy (AdaptivePolicy): the policy (its placement: the job's shards).
        job (Placement): the job's placement (:func:`job_placement`).
        order (str): ``hottest`` (prioritized) or ``oldest``.
    """

    def __init__(self, edp: FeatureHost, mover: ShardMover, board: PlacementBoard,
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
        # the latest looks' records (every look was kept: one record per
        # interval_supersteps for the whole run, and all of it in the job's summary);
        # every look and move is counted
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_KEEP)
        self.looks_done = 0
        self.moves = 0
        self.skipped_looks = 0  # while cooling down after a move
        self._inserts = (self.control.read(C_INSERTS), time.monotonic())
        self._handlers: dict[int, Handler] = {Tag.REPLACE_TELEMETRY: self._on_telemetry,
                          Tag.REPLACE_STATS: self._on_stats, Tag.REPLACE_MOVED: self._on_moved}
        mover.busy = lambda: self.state != "idle"
        mover.on_local_done = lambda reply: self._moved(reply, self.me)
        server.add_extension(self)

    # -- the buffer loop's events (see BufferExtension) --------------------------------
    tags = frozenset({Tag.REPLACE_TELEMETRY, Tag.REPLACE_STATS, Tag.REPLACE_MOVED})

    def on_message(self, msg: Message) -> None:
        self._handlers[msg.tag](msg)

    def on_pass(self) -> int:
        return self.step()

    # -- looks -----------------------------------------------------------------------
    def _on_telemetry(self, msg: Message) -> None:
        superstep, counts, steps, mean = _unpack_telemetry(msg.payload)
        self.counts += counts[:len(self.counts)]
        self._timing += mean * steps
        self._steps += steps
        self.superstep = superstep
        if self._cooling():
            # the policy would only say "cooling down": skip the look, its round trip of
            # held-row reports and its LP, which all run inside buffer progress loops
            self.skipped_looks += 1
            self._reset_window()
            return
        # looks only while peers run: once all are done no report can follow
        if self.state == "idle" and self.server.waiting_for:
            self._start_look()

    def _cooling(self) -> bool:
        last = self.policy.last_move_superstep
        return (self.state == "idle" and last is not None
                and self.superstep - last < self.policy.knobs.cooldown_supersteps)

    def _reset_window(self) -> None:
        self.counts[:] = 0
        self._timing[:] = 0.0
        self._steps = 0

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
        self._reset_window()
        if t is None:
            self._finish("hold", "no samples since the last look")
            return
        t0 = time.perf_counter()
        d = self.policy.observe(t)
        self.record.update(policy_s=time.perf_counter() - t0,
                           current_s=d.current_s, proposed_s=d.proposed_s,
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
        if not self.server.waiting_for:
            self.queue.clear()  # every peer is done: the rest of the move buys nothing
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
        self.looks_done += 1
        self.moves += self.record["action"] == "move"
        self.record = {}
        self.state, self.waiting = "idle", ""

    def step(self) -> int:
        """The buffer loop's hook: deadlines. Local; never blocks."""
        if self.state != "idle" and time.monotonic() > self.deadline:
            raise DataPlaneTimeout(f"adaptive placement (look {self.look}) waited "
                                   f"{self.timeout_s:.1f} s for {self.waiting}")
        return 0


