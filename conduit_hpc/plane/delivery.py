"""The deliver control point on learner ranks: sample, gather, transform, copy.

:class:`Deliverer` runs the experience path for one batch - read the shards' published
statistics, wait for the rate limiter, draw stratified targets (the
:class:`~conduit_hpc.sampling.Sampler`), have each shard's share drawn and its rows put
into the batch by the shard's :class:`~conduit_hpc.plane.sources.ShardSource` (its tier:
a buffer's ring, with the :class:`~conduit_hpc.plane.fetch.Fetch` strategy searching and
copying here or the owner sampling and sending; or a device mirror), check they are
intact, transform them, weigh them and hand them to the
:class:`~conduit_hpc.plane.staging.BatchSink`. It also carries priority updates back
(:class:`~conduit_hpc.plane.priority_write.PriorityWrite`).

This is the composition layer: it uses the transport (windows, channel) and the
semantics (sampling, scheduler) together. Not thread-safe: one thread uses it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from conduit_hpc.config import SchedulerConfig
from conduit_hpc.errors import DataPlaneClosed
from conduit_hpc.plane.control import C_ACTORS_DONE, C_INSERTS, C_SAMPLES, ControlBlock
from conduit_hpc.plane.priority_write import PriorityWrite
from conduit_hpc.plane.sources import Fill, HostSource, ShardSource, unanswered
from conduit_hpc.plane.staging import Batch, BatchSink
from conduit_hpc.plane.transform import checked_transform, private_columns
from conduit_hpc.protocol import SampleReply, SampleRequest, Tag
from conduit_hpc.sampling import Sampler, ShardStats
from conduit_hpc.scheduler import LimiterState, RateLimiter
from conduit_hpc.spec import Spec
from conduit_hpc.storage.layout import H_COMMIT, H_UNSAMPLED
from conduit_hpc.storage.ring import ShardRing
from conduit_hpc.transport.channel import Channel
from conduit_hpc.wait import NO_HOSTS, Backoff, Deadline, Hosts

if TYPE_CHECKING:
    from conduit_hpc.plane.device_policy import DevicePolicy
    from conduit_hpc.plane.device_tier import DeviceShard
    from conduit_hpc.plane.owner_block import OwnerBlock
    from conduit_hpc.storage.shared_index import SharedIndexWriter

__all__ = ["Asked", "Deliverer", "Fill", "Part", "ShardEmptied", "Transform",
           "checked_transform"]

Transform = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
#: one shard's share of a batch: (first position, end, reply, rows that came with it,
#: the source that drew it and fills it)
Part = tuple[int, int, SampleReply, np.ndarray, ShardSource]
#: requests sent to owners: request id -> (first position, end, the shard's source)
Asked = dict[int, tuple[int, int, ShardSource]]
_NO_ROWS = np.zeros(0, np.uint8)  # a part drawn here: no bytes came with a reply


class ShardEmptied(Exception):
    """A shard drawn from lost all its mass before its rows were intact (every row's
    priority set to 0 meanwhile): no redraw in it can succeed, the batch starts over
    from the rate limiter (:meth:`Deliverer.admit`), which waits for mass or says why
    none will come. Internal: ``Fetch.prepare`` catches it."""


class Deliverer:
    """The experience path of one learner rank (not thread-safe: one thread uses it).

    Args:
        spec (Spec): the row schema.
        rings (Mapping[int, ShardRing]): ring clients of the shards this learner reads.
        owners (Mapping[int, int]): shard id -> owner rank.
        acks (Mapping[int, np.ndarray]): for owners whose memory this process maps, the
            int64 per-rank count of priority-update messages they have applied.
        sync (Callable[[], None]): memory barrier for ``acks``.
        rank (int): this learner's rank (its entry in ``acks``).
        channel (Channel): the data plane's channel.
        control (ControlBlock): job-wide counters.
        limiter (RateLimiter): the samples-per-insert limiter.
        config (SchedulerConfig): batch size, window.
        sampler (Sampler): draws targets and weighs rows.
        n_actors (int): actors in the job (to know when all are done).
        stager (BatchSink): takes finished batches (the learner's device, or a delivery
            rank's staging slot).
        transform (Transform | None): applied to each numpy batch before the copy.
        timeout_s (float): bound on every wait.
        poll_interval_s (float): longest pause of a wait.
        pins (OwnerBlock | None): where the read pins are in each owner's memory
            (``None``: no pins; see :func:`~conduit_hpc.plane.direct_draw.gather_checked`).
        writers (Mapping[int, SharedIndexWriter] | None): shards whose index this rank
            writes its priority updates into itself (the priority write stage,
            :class:`~conduit_hpc.plane.priority_write.PriorityWrite`).
    """
    hosts: Hosts = NO_HOSTS  #: each world rank's host, for errors (make_deliverer sets it)
    awaiting: tuple[Mapping[int, int], Container[int]] = ({}, ())  #: see collect()

    def __init__(self, *, spec: Spec, rings: Mapping[int, ShardRing], owners: Mapping[int, int],
                 acks: Mapping[int, np.ndarray], sync: Callable[[], None], rank: int,
                 channel: Channel, control: ControlBlock, limiter: RateLimiter,
                 config: SchedulerConfig, sampler: Sampler, n_actors: int,
                 stager: BatchSink, transform: Transform | None, timeout_s: float,
                 poll_interval_s: float, pins: OwnerBlock | None = None,
                 writers: Mapping[int, SharedIndexWriter] | None = None,
                 progress: Callable[[], None] | None = None) -> None:
        self.spec, self.rings, self.owners = spec, dict(rings), dict(owners)
        self.shard_ids = np.array(sorted(self.rings), dtype=np.int64)
        self._sids = [int(s) for s in self.shard_ids]  # the same, as ints (every batch)
        self.channel, self.control, self.limiter = channel, control, limiter
        self.cfg, self.n_actors = config, n_actors
        self.sampler, self.stager = sampler, stager
        self.transform = transform
        self.timeout_s, self.poll_s = timeout_s, poll_interval_s
        self.window = sampler.window
        self._request_id = 0
        self.acks, self._sync, self.rank = dict(acks), sync, rank
        #: the priority write stage: updates to where each row's index lives
        self.prio = PriorityWrite(owners=owners, acks=acks, sync=sync, rank=rank,
                                  channel=channel, writers=writers or {},
                                  timeout_s=timeout_s, poll_interval_s=poll_interval_s,
                                  progress=progress)
        #: enters MPI's progress engine (the window's; a no-op on one node): a learner's
        #: data-plane thread calls it every idle turn, as its node's atomics may wait
        #: for it (docs/sharp-bits.md, "Passive-target progress")
        self.mpi_progress: Callable[[], None] = progress or (lambda: None)
        self.resampled = 0
        self.limiter_wait_s = 0.0
        self.pins = pins
        self.pinned_rounds = 0  # redraw rounds made under a read pin
        #: rows committed into this learner's shards, up to each shard's capacity (what
        #: the minimum fill counts: rows hidden while being overwritten were written)
        self.written = 0
        #: rows of this learner's shards overwritten before any learner drew them, as
        #: the owners last published (see :class:`~conduit_hpc.plane.buffer.OwnedShard`)
        self.overwritten_unsampled = 0
        # replies that arrived while another batch's were awaited (pipelined owner fetch)
        self.stash: dict[int, tuple[SampleReply, np.ndarray]] = {}
        #: shard id -> where its rows are drawn and gathered (:meth:`place`)
        self.sources: dict[int, ShardSource] = {}
        #: the sources that are device mirrors (``learner_gpu`` shards, promoted ones)
        self.device_shards: dict[int, DeviceShard] = {}
        self._searched: set[int] = set()  # owners whose index this rank searches
        self.placed = 0  #: times :meth:`place` changed a source
        for sid in self.rings:
            self.place(sid, None)
        self.sync_s = 0.0  # seconds the last admit() spent reading statistics (syncs)
        #: promotes and demotes shards at superstep boundaries (``placement.device_rows``)
        self.device_policy: DevicePolicy | None = None
        self.check_failed = control.watch(rank)  # RemoteFailure, if a rank failed

    def place(self, sid: int, source: DeviceShard | None) -> None:
        """Draw and gather shard ``sid`` from ``source`` (a device mirror) from now on,
        or (``None``) from its ring - searched here where this process maps the owner's
        index and the sampler searches directly, else drawn by its owner."""
        from conduit_hpc.plane.device_tier import DeviceShard

        if isinstance(source, DeviceShard):
            self.sources[sid] = source
            self.device_shards[sid] = source
        else:
            owner = self.owners[sid]
            self.sources[sid] = HostSource(
                sid, self.rings[sid], owner,
                searchable=self.sampler.direct_search and owner in self.acks,
                await_applied=self.prio.await_applied)
            self.device_shards.pop(sid, None)
        self._searched = {o for s in self.sources.values()
                          if (o := s.searched_owner) is not None}
        self.placed += 1  # sources changed (fetch strategies key caches by it)

    @property
    def capacities(self) -> dict[int, int]:
        """Shard id -> capacity of every shard this learner reads."""
        return {sid: r.capacity for sid, r in self.rings.items()}

    # -- statistics and the rate limiter -------------------------------------------
    def shard_stats(self) -> list[ShardStats]:
        """Each shard's statistics for samplers, from its source (what the owner last
        published: one header read; a device mirror syncs); also updates
        :attr:`written` and :attr:`overwritten_unsampled`."""
        out = []
        written = unsampled = 0
        t0 = time.perf_counter()
        for sid in self._sids:
            ring = self.rings[sid]
            head = ring.read_header()
            out.append(self.sources[sid].stats(head))
            written += min(int(head[H_COMMIT]), ring.capacity)
            unsampled += int(head[H_UNSAMPLED])
        self.sync_s += time.perf_counter() - t0
        self.written, self.overwritten_unsampled = written, unsampled
        return out

    def admit(self, rows: int) -> tuple[list[ShardStats], float]:
        """Wait until the limiter lets us sample ``rows``, then count them. Returns the
        shard statistics to sample with and the seconds waited (less :attr:`sync_s`,
        the time the statistics took to read - device shards sync there - which is
        part of sampling)."""
        t0 = time.perf_counter()
        self.check_failed()  # a learner that never waits must still stop
        self.sync_s = 0.0
        deadline: Deadline | None = None  # made on the first wait (most batches have none)
        backoff: Backoff | None = None  # ... as is this
        lim = self.limiter
        fenced = False
        while True:
            stats = self.shard_stats()
            held = self.written  # written rows: those hidden for overwriting count too
            mass = sum(s.total for s in stats)
            if mass > 0 and not lim.enabled and held >= lim.min_size_to_sample:
                break  # no ratio to keep: the insert and sample counters need no read
            state = LimiterState(self.control.read(C_INSERTS), self.control.read(C_SAMPLES),
                                 held)
            if mass > 0 and lim.can_sample(state, rows):
                break
            if self.control.read(C_ACTORS_DONE) >= self.n_actors:
                # actors stopped by a rank's failure are counted finished too: that
                # failure, not the rows they never wrote, is why (read now, not at the
                # watch's pace: it was missed by 0.5 s at 7 ranks)
                self.control.raise_if_failed(self.channel.rank)
                # no insert will ever come: the ratio no longer binds, the fill must
                if held >= lim.min_size_to_sample and mass > 0:
                    break
                if not fenced:
                    # the stats may lag: rows the actors wrote before they finished that
                    # an owner has not committed yet, or this learner's own priority
                    # updates in flight (every row zeroed, one raised again) - look once
                    # more after every owner has committed and applied them
                    self.fence()
                    fenced = True
                    continue
                why = (f": no window of {self.window} rows within one stream's episode "
                       f"has priority > 0" if self.window > 1 and held else "")
                raise DataPlaneClosed(
                    f"every actor finished with {held} rows held (total priority mass "
                    f"{mass:g}{why}); sampling needs scheduler.min_fill_rows = "
                    f"{lim.min_size_to_sample} rows with mass > 0")
            if deadline is None or backoff is None:
                deadline = Deadline(self.timeout_s, f"the rate limiter to let this learner "
                                                    f"sample {rows} rows")
                backoff = Backoff(self.poll_s)
            deadline.check(partial(lim.explain_sampling, state, mass, held, self.window))
            self.control.raise_if_failed(self.channel.rank)  # a writer left on an error
            self.channel.progress()  # e.g. messages held for a long link still go out
            backoff.pause()
        self.control.add(C_SAMPLES, rows)
        waited = time.perf_counter() - t0 - self.sync_s
        self.limiter_wait_s += waited
        return stats, waited

    def unadmit(self, rows: int) -> None:
        """Take back :meth:`admit`'s count of ``rows`` (a batch that starts over)."""
        self.control.add(C_SAMPLES, -rows)

    def fence(self) -> None:
        """Wait (bounded) until the owners of this learner's shards have committed the
        rows written so far and applied this learner's priority updates: one 1-target
        sample request per shard - an owner handles a learner's messages in order and
        commits a shard before it answers a sample request of it, and the rows were in
        its memory before the request was sent."""
        ids = {self.ask(Tag.SAMPLE, int(sid), np.zeros(1)): int(sid) for sid in self.shard_ids}
        if ids:
            self.collect(Tag.SAMPLE_REPLY, ids, "the owners' replies to a fence")

    # -- sampling --------------------------------------------------------------------
    def ask(self, tag: Tag, sid: int, targets: np.ndarray) -> int:
        """Send shard ``sid``'s owner a sample request. Returns its id."""
        self._request_id += 1
        req = SampleRequest(self._request_id, sid, targets)
        self.channel.isend(self.owners[sid], tag, req.pack())
        return self._request_id

    def collect(self, tag: Tag, ids: Mapping[int, int], what: str
                ) -> dict[int, tuple[SampleReply, np.ndarray]]:
        got = {i: self.stash.pop(i) for i in ids if i in self.stash}
        self.awaiting = ids, got  # (request id -> shard id, replies): timeouts' messages
        while len(got) < len(ids):
            msg = self.channel.recv(tag=tag, timeout_s=self.timeout_s, what=what,
                                    between=self.check_failed, detail=partial(
                                        unanswered, self.hosts, self.owners, ids, got))
            rep, rest = SampleReply.unpack(msg.payload)
            if rep.request_id in ids:
                got[rep.request_id] = (rep, rest)
            else:  # for another batch in flight (see begin())
                self.stash[rep.request_id] = (rep, rest)
        return got

    def start_draw(self, tag: Tag, stats: list[ShardStats], rows: int
                   ) -> tuple[list[Part], Asked]:
        """Targets over all shards; each shard's share is drawn by its source here
        (:meth:`ShardSource.draw <conduit_hpc.plane.sources.ShardSource.draw>`), or its
        owner is asked (one message per shard, with ``tag``; ``Tag.SERVICE``: owners
        send the rows). Returns the parts drawn and the requests sent (not awaited)."""
        shard_pos, local = self.sampler.targets(stats, rows)
        # each shard's run of targets (they come in shard order); one shard: all of them
        bounds = ((0, len(shard_pos)) if len(stats) == 1
                  else np.searchsorted(shard_pos, np.arange(len(stats) + 1)))
        owner_sends = tag is Tag.SERVICE
        asked: Asked = {}
        parts: list[Part] = []
        for k in range(len(stats)):
            a, b = int(bounds[k]), int(bounds[k + 1])
            if b == a:
                continue
            sid = int(self.shard_ids[k])
            src = self.sources[sid]
            found = src.draw(local[a:b], owner_sends)
            if found is not None:
                parts.append((a, b, found, _NO_ROWS, src))
            else:
                asked[self.ask(tag, sid, local[a:b])] = (a, b, src)
        return parts, asked

    def finish_draw(self, tag: Tag, parts: list[Part], asked: Asked, what: str) -> list[Part]:
        """Wait (bounded) for the replies to ``asked`` (``tag``: the requests'); returns
        every part in batch order."""
        if asked:
            reply = Tag.SERVICE_REPLY if tag is Tag.SERVICE else Tag.SAMPLE_REPLY
            replies = self.collect(reply, {i: v[2].shard_id for i, v in asked.items()}, what)
            parts = parts + [(a, b, replies[i][0], replies[i][1], src)
                             for i, (a, b, src) in asked.items()]
        parts.sort(key=lambda x: x[0])
        return parts

    def draw(self, tag: Tag, stats: list[ShardStats], rows: int) -> list[Part]:
        """:meth:`start_draw` then :meth:`finish_draw`: every part of one batch."""
        parts, asked = self.start_draw(tag, stats, rows)
        return self.finish_draw(tag, parts, asked, "sample replies")

    def mark(self) -> None:
        """A superstep ended: batches prepared from now on must see every priority
        update sent so far. Messages to an owner arrive in order, so asking the owner
        keeps this by itself; a direct search of its tree first waits for the owner's
        acknowledgement count to catch up (:meth:`_search`); updates written into a
        node-local index directly are there already. Then the device policy looks."""
        self.prio.mark()
        if self.device_policy is not None:
            self.device_policy.step(self)

    def await_acks(self) -> None:
        """Before a batch's statistics are read: wait (bounded) until every owner whose
        tree this process searches directly has applied the priority updates this batch
        must see (:meth:`mark`), so that the statistics the targets are drawn over and
        the trees they are searched in agree. Returns at once when nothing was sent
        since the last acknowledged count. Spins, then yields the processor (the owner
        may need this core); never a fixed sleep on the way."""
        for owner in self._searched:  # the sources that search an owner's index here
            self.prio.await_applied(owner)

    # -- one batch ---------------------------------------------------------------------
    def assemble(self, superstep: int, staleness: int, stats: list[ShardStats],
                 parts: list[Part], timings: dict[str, float], fill: Fill) -> Batch:
        """Fill (``fill(a, b, rows, indices, mass, flat)``: the fetch strategy's), transform,
        weigh and copy one batch."""
        B, w = self.cfg.batch_rows, self.window
        lead = (B, w) if w > 1 else (B,)
        out = self.stager.alloc(superstep, self.spec, lead)  # where the sink wants it
        flat = out if w == 1 else {k: v.reshape(B * w, *v.shape[len(lead):])
                                   for k, v in out.items()}
        indices = np.empty((B, 3), dtype=np.int64)
        mass = np.empty(B, dtype=np.float64)
        t1 = time.perf_counter()
        on_device: list[tuple[np.ndarray, dict[str, Any]]] = []  # rows left on the device
        host = self.transform is not None  # the transform works on numpy: all rows here
        for a, b, rep, rows, src in parts:
            indices[a:b, 0], indices[a:b, 1], indices[a:b, 2] = rep.shard_id, rep.slots, rep.gens
            mass[a:b] = rep.mass
            placed = src.fill(fill, a, b, rep, rows, indices, mass, flat, host)
            if placed is not None:
                on_device.append(placed)
        timings["gather_s"] = time.perf_counter() - t1
        return self.finish(superstep, staleness, stats, out, indices, mass, timings, on_device)

    def finish(self, superstep: int, staleness: int, stats: list[ShardStats],
               out: dict[str, np.ndarray], indices: np.ndarray, mass: np.ndarray,
               timings: dict[str, float],
               on_device: list[tuple[np.ndarray, dict[str, Any]]] | None = None) -> Batch:
        """Transform, weigh and hand over a batch whose rows are in ``out`` (and, for
        rows left on the device, ``on_device``)."""
        t2 = time.perf_counter()
        data = out
        if self.transform is not None:
            data = checked_transform(self.transform(out), self.cfg.batch_rows)
            if self.stager.holds_host_arrays:  # the batch is its arrays: none shared
                data = private_columns(data, out)
        t3 = time.perf_counter()
        timings["transform_s"] = t3 - t2
        weights = self.sampler.weights(mass, stats, superstep)
        extra: dict[str, Any] = {"device_rows": on_device} if on_device else {}
        batch = self.stager.to_device(data, indices, weights,
                                      superstep + self.sampler.superstep_offset, staleness,
                                      **extra)
        timings["copy_s"] = time.perf_counter() - t3
        batch.timings = timings
        return batch

    # -- priorities ----------------------------------------------------------------------
    def send_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> int:
        """Carry checked priority updates to where the rows' index lives (the priority
        write stage, :meth:`PriorityWrite.send`). Returns rows sent."""
        return self.prio.send(indices, priorities, self.device_shards)
