"""How a learner's rows are found and fetched: the :class:`Fetch` strategies.

* :class:`DirectFetch` (``scheduler.fetch = "direct"``): this rank searches the trees of
  shards in its node's shared memory itself (other shards' owners are asked for slots,
  one message per shard) and copies the rows - numpy from shared memory, one indexed
  RMA get per field otherwise - redrawing any row overwritten meanwhile.
* :class:`OwnerFetch` (``"owner"``, and always in ``service`` mode): each shard's owner
  samples and sends the rows in its reply. Several batches may be in flight at once
  (:meth:`OwnerFetch.begin` / :meth:`~OwnerFetch.arrived` / :meth:`~OwnerFetch.complete`),
  so that a long link's latency overlaps in ``edp`` mode.

Config picks one by name (:data:`FETCHES`); no code path branches on the name.
"""

from __future__ import annotations

import abc
import functools
import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from conduit_hpc.plane.delivery import Asked, Deliverer, Part, ShardEmptied
from conduit_hpc.plane.direct_draw import direct_batch, direct_rings, gather_checked
from conduit_hpc.plane.staging import Batch
from conduit_hpc.protocol import SampleReply, Tag, unpack_rows
from conduit_hpc.sampling import ShardStats
from conduit_hpc.scheduler.limiter import no_window_why
from conduit_hpc.storage.ring import ShardRing
from conduit_hpc.wait import Deadline

__all__ = ["FETCHES", "DirectFetch", "Fetch", "OwnerFetch", "PendingBatch"]


class Fetch(abc.ABC):
    """Finds and fetches the rows of one batch for a :class:`Deliverer`."""

    name: ClassVar[str]
    #: several batches may be in flight at once (begin / arrived / complete)
    pipelined: ClassVar[bool] = False
    #: the request tag whose replies carry slots (and, for owners, rows)
    request_tag: ClassVar[Tag]

    def prepare(self, d: Deliverer, superstep: int, staleness: int) -> Batch:
        """One batch, inline. Blocks (bounded). A shard that lost all its mass while
        the batch was drawn (:class:`~conduit_hpc.plane.delivery.ShardEmptied`) makes
        the batch start over, from the rate limiter: it waits for mass, or raises
        :class:`~conduit_hpc.errors.DataPlaneClosed` once no insert can come."""
        B = d.cfg.batch_rows
        deadline: Deadline | None = None
        while True:
            t_ack = time.perf_counter()
            self.before_admit(d)
            timings = {"ack_wait_s": time.perf_counter() - t_ack, "sample_s": 0.0,
                       "gather_s": 0.0, "transform_s": 0.0, "copy_s": 0.0}
            stats, waited = d.admit(B)
            timings["limiter_wait_s"] = waited
            t0 = time.perf_counter() - d.sync_s  # a device shard's sync is sampling work
            try:
                return self.batch(d, superstep, staleness, stats, timings, t0)
            except ShardEmptied as err:
                deadline = _again(d, B, deadline, err)

    def batch(self, d: Deliverer, superstep: int, staleness: int, stats: list[ShardStats],
              timings: dict[str, float], t0: float) -> Batch:
        """Draw, fill and finish one admitted batch (``t0``: when sampling began)."""
        parts = d.draw(self.request_tag, stats, d.cfg.batch_rows)
        timings["sample_s"] = time.perf_counter() - t0
        return d.assemble(superstep, staleness, stats, parts, timings,
                          functools.partial(self.fill, d))

    def before_admit(self, d: Deliverer) -> None:  # noqa: B027 - optional, default no-op
        """What must happen before the batch's statistics are read (default: nothing)."""

    @abc.abstractmethod
    def fill(self, d: Deliverer, a: int, b: int, rows: np.ndarray, indices: np.ndarray,
             mass: np.ndarray, flat: dict[str, np.ndarray]) -> None:
        """Put rows ``a .. b`` of the batch into ``flat`` (``rows``: bytes that came
        with the reply)."""


class DirectFetch(Fetch):
    """Search and copy this rank itself (see the module docstring)."""

    name = "direct"
    request_tag = Tag.SAMPLE
    _for: Deliverer | None = None  # the Deliverer ...
    _placed = -1  # ... and its placement that _rings is for
    _rings: list[tuple[int, ShardRing]] | None = None

    def batch(self, d: Deliverer, superstep: int, staleness: int, stats: list[ShardStats],
              timings: dict[str, float], t0: float) -> Batch:
        # every shard in this node's memory, searched here: the direct draw
        # (plane/direct_draw.py), without the per-shard stages
        if self._for is not d or self._placed != d.placed:  # whether the direct draw
            self._for, self._placed, self._rings = d, d.placed, direct_rings(d)  # can, now
        rings = self._rings
        if rings is None:
            return super().batch(d, superstep, staleness, stats, timings, t0)
        return direct_batch(d, rings, superstep, staleness, stats, timings, t0)

    def before_admit(self, d: Deliverer) -> None:
        # the owners apply this learner's earlier updates before the statistics are
        # read: the targets are then drawn over the same totals the trees hold
        d.await_acks()

    def fill(self, d: Deliverer, a: int, b: int, rows: np.ndarray, indices: np.ndarray,
             mass: np.ndarray, flat: dict[str, np.ndarray]) -> None:
        gather_checked(d, int(indices[a, 0]), a, b, indices, mass, flat)


@dataclass
class PendingBatch:
    """A batch whose rows the owners are sampling and sending (see
    :meth:`OwnerFetch.begin`): the parts drawn at once (device mirrors) and the
    requests sent (request id -> the batch positions it fills)."""

    superstep: int
    staleness: int
    stats: list[ShardStats]
    parts: list[Part]
    ids: Asked
    t0: float
    waited: float
    again: Deadline | None = None  # bound of its restarts (see OwnerFetch.complete)


class OwnerFetch(Fetch):
    """The owners sample and send the rows (see the module docstring)."""

    name = "owner"
    pipelined = True
    request_tag = Tag.SERVICE

    def fill(self, d: Deliverer, a: int, b: int, rows: np.ndarray, indices: np.ndarray,
             mass: np.ndarray, flat: dict[str, np.ndarray]) -> None:
        if indices[a, 1] < 0:  # the owner had nothing to draw (and sent no rows)
            raise ShardEmptied(int(indices[a, 0]))
        w = d.window
        for name, arr in unpack_rows(d.spec, rows, (b - a) * w).items():
            flat[name][a * w:b * w] = arr

    def begin(self, d: Deliverer, superstep: int, staleness: int) -> PendingBatch:
        """Start a batch: admit it, draw its targets and send one request per shard;
        returns at once. Blocks only while the rate limiter or the minimum fill holds
        sampling back."""
        B = d.cfg.batch_rows
        stats, waited = d.admit(B)
        t0 = time.perf_counter() - d.sync_s  # a device shard's sync is sampling work
        parts, ids = d.start_draw(Tag.SERVICE, stats, B)
        return PendingBatch(superstep, staleness, stats, parts, ids, t0, waited)

    def arrived(self, d: Deliverer, pending: PendingBatch) -> bool:
        """Whether every reply of ``pending`` is here (receives what has arrived). Local;
        never blocks."""
        while (msg := d.channel.poll(tag=Tag.SERVICE_REPLY)) is not None:
            rep, rest = SampleReply.unpack(msg.payload)
            d.stash[rep.request_id] = (rep, rest)
        return all(i in d.stash for i in pending.ids)

    def drain(self, d: Deliverer, pending: PendingBatch) -> None:
        """Receive ``pending``'s replies (bounded by the timeout) and drop them: a batch
        in flight at the end is not assembled (nor transformed)."""
        d.finish_draw(Tag.SERVICE, pending.parts, pending.ids, "service replies")

    def complete(self, d: Deliverer, pending: PendingBatch) -> Batch | PendingBatch:
        """Wait for ``pending``'s replies (bounded by the timeout) and assemble it; or,
        where an owner had nothing to draw, the batch started over (:meth:`begin`)."""
        parts = d.finish_draw(Tag.SERVICE, pending.parts, pending.ids, "service replies")
        timings = {"sample_s": time.perf_counter() - pending.t0, "gather_s": 0.0,
                   "transform_s": 0.0, "copy_s": 0.0, "limiter_wait_s": pending.waited}
        try:
            return d.assemble(pending.superstep, pending.staleness, pending.stats, parts,
                              timings, functools.partial(self.fill, d))
        except ShardEmptied as err:
            deadline = _again(d, d.cfg.batch_rows, pending.again, err)
            again = self.begin(d, pending.superstep, pending.staleness)
            again.again = deadline
            return again


def _again(d: Deliverer, rows: int, deadline: Deadline | None, err: ShardEmptied
           ) -> Deadline:
    """A batch starts over after ``err``: its sample count is taken back, and the
    restarts of one batch are bounded by the timeout. Returns their deadline."""
    d.unadmit(rows)  # not sampled after all
    deadline = deadline or Deadline(d.timeout_s, "a batch whose shards kept losing all "
                                                 "their mass")
    deadline.check(f"shard {err.args[0]} had nothing left to draw"
                   + (f" ({no_window_why(d.window)})" if d.window > 1 else ""))
    time.sleep(d.poll_s)  # the owners publish their statistics meanwhile
    return deadline


#: ``scheduler.fetch`` -> strategy
FETCHES: dict[str, type[Fetch]] = {"direct": DirectFetch, "owner": OwnerFetch}
