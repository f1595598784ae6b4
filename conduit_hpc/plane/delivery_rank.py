"""A delivery rank per learner (``scheduler.delivery = "process"``).

In ``edp`` mode with ``delivery = "thread"`` the experience path (admit, sample, gather,
transform, priority sends) runs on a data-plane thread inside the learner's process and
competes with the learner's compute for its interpreter. With ``"process"`` it runs on a
rank of its own on the learner's node:

* :class:`DeliveryServer` - the delivery rank's loop (``plane.serve()`` there): it owns
  the :class:`~conduit_hpc.plane.delivery.Deliverer`, the fetch strategy and the prefetch
  clock, writes ready batches into the :class:`~conduit_hpc.plane.staging_ring.StagingRing`
  and forwards the learner's priority updates to the owners;
* :class:`ProcessMode` - the learner's side (a
  :class:`~conduit_hpc.plane.modes.DeliveryMode`): ``next_batch`` says "I asked for
  batch ``s``" in a shared word and pops the ready slot (numpy views of shared memory,
  then the device staging); ``update_priorities`` is one write into the shared update
  queue; the learner's other MPI calls (weights, control words) run inline.

Priority updates keep their meaning: the learner queues its updates of superstep
``s - 1`` before it asks for batch ``s``; the delivery rank forwards every queued update
before it counts the request, and a batch prepared after that sees them (as
:meth:`~conduit_hpc.plane.delivery.Deliverer.mark` does for the thread).

Failures: every wait on either side is bounded by ``run.timeout_s``. A delivery rank that
fails writes its error into the ring, and its learner raises
:class:`~conduit_hpc.errors.RemoteFailure` with that message at its next call. If the
failure came while preparing batches (e.g. the transform raised), the delivery rank then
waits for its learner's decision, as the learner's own thread would in thread delivery: a
learner that takes the error and ends (``done``) ends the job cleanly (``serve``
returns); one that fails (or does not answer within the timeout) makes the delivery rank
raise its error. Either end that leaves the data plane's ``with`` block on an exception
(also one raised outside ``serve``) says so likewise (``fail``); a rank that dies without a
word leaves the other to its timeout.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from conduit_hpc import jsontext
from conduit_hpc.errors import ConfigError, DataPlaneClosed, DataPlaneTimeout, RemoteFailure
from conduit_hpc.plane.delivery import Deliverer
from conduit_hpc.plane.fetch import Fetch
from conduit_hpc.plane.learner import LearnerEndpoint
from conduit_hpc.plane.modes import MODES, DeliveryMode, inline_mode
from conduit_hpc.plane.prefetch import Prefetcher
from conduit_hpc.plane.roles import RoleComms
from conduit_hpc.plane.staging import Batch, BatchSink, Stager
from conduit_hpc.plane.staging_ring import (
    W_CLOSED,
    W_FAILED,
    W_FINAL,
    W_LEARNER_FAILED,
    W_REQUESTED,
    W_STARTED,
    W_STOP,
    W_STOPPED,
    SlotWriter,
    StagingLayout,
    StagingRing,
)
from conduit_hpc.sampling import make_sampler
from conduit_hpc.scheduler import PrefetchClock
from conduit_hpc.transport.objects import allgather_json, bounded_barrier
from conduit_hpc.transport.rma import RmaWindow
from conduit_hpc.wait import Backoff, Deadline

if TYPE_CHECKING:
    from conduit_hpc.config import Config
    from conduit_hpc.sampling import Sampler
    from conduit_hpc.spec import Spec

#: the delivery rank's counters, in the order of the staging ring's counter slots (left
#: there when it stops, for the learner's summary)
COUNTERS = ("resampled_rows", "limiter_wait_s", "overwritten_unsampled", "pinned_rounds",
            "priority_rows_direct", "priority_rows_messaged")

__all__ = ["COUNTERS", "DeliveryServer", "ProcessMode", "SlotWriter", "learner_delivery",
           "make_deliverer", "make_delivery_server", "open_staging"]


def make_deliverer(edp: Any, rank: int, shards: tuple[int, ...], stager: BatchSink,
                   transform: Any, seed_rank: int | None = None) -> Deliverer:
    """The experience path of ``rank`` over ``shards`` on the data plane ``edp`` (a
    learner's, or its delivery rank's: then ``seed_rank`` is the learner, whose sampler
    seed it takes). Local."""
    cfg, roles = edp.config, edp.roles
    owners = {s: edp.placement.shards[s].owner_rank for s in shards}
    acks = {o: a for o in set(owners.values())
            if (a := edp.memory.acks_of(o, roles.world_size)) is not None}
    seed = cfg.run.seed + (rank if seed_rank is None else seed_rank)
    sampler = make_sampler(cfg, seed)
    writers = {}
    # across nodes too: the hang of a41331b (the lock's wait outside MPI while the
    # holder's atomic needed this rank's progress) is fixed in lock_index (docs/hosts.md)
    if sampler.direct_search and not any(f.priority_messages for f in edp.features):
        from conduit_hpc.storage.shared_index import SharedIndexWriter

        # node-local shards: this rank writes its updates into their index itself
        writers = {s: SharedIndexWriter(edp.rings[s], rank, alpha=sampler.alpha)
                   for s in shards if edp.rings[s].views is not None and owners[s] in acks}
    d = Deliverer(spec=edp.spec, rings={s: edp.rings[s] for s in shards}, owners=owners,
                  acks=acks, sync=edp.window.sync, rank=rank,
                  pins=edp.memory.block, channel=edp.channel,
                  control=edp.control, limiter=edp.limiter, config=cfg.scheduler,
                  sampler=sampler, n_actors=len(roles.writer_ranks),
                  stager=stager, transform=transform, timeout_s=cfg.run.timeout_s,
                  poll_interval_s=cfg.transport.poll_interval_s, writers=writers,
                  progress=edp.window.progress)
    d.hosts = d.prio.hosts = roles.hosts
    gpu = [s for s in shards if edp.placement.shards[s].tier == "learner_gpu"]
    if gpu:  # mirrored on this learner's device (planning.executable checked the rest)
        from conduit_hpc.plane.device_tier import DeviceShard

        assert stager.device is not None  # a learner's own (config refuses the others)
        for s in gpu:
            d.place(s, DeviceShard(s, edp.rings[s], alpha=d.sampler.alpha,
                                   device=stager.device, seed=seed + s))
    pc = cfg.placement
    if pc.device_rows > 0:  # promotion to the device (plane/device_policy.py)
        from conduit_hpc.plane.device_policy import DevicePolicy

        mine = [s for s in shards if s not in gpu and edp.rings[s].views is not None
                and owners[s] in acks and [r for r, got in edp.placement.learner_shards.items()
                                           if s in got] == [rank]]
        d.device_policy = DevicePolicy(mine, budget=pc.device_rows, seed=seed,
                                       interval=pc.interval_supersteps, patience=pc.patience)
    return d


def make_delivery_server(edp: Any, ring: StagingRing, transform: Any) -> DeliveryServer:
    """The delivery rank's loop on the data plane ``edp`` (this rank). Local."""
    cfg, roles = edp.config, edp.roles
    me = roles.world_rank
    learner = roles.learner_of(me)
    writer = SlotWriter(ring)
    d = make_deliverer(edp, me, tuple(edp.placement.learner_shards.get(learner, ())),
                       writer, transform, seed_rank=learner)
    fetch = MODES[cfg.scheduler.mode].fetch_for(cfg.scheduler)
    return DeliveryServer(d, fetch, ring, learner=learner, depth=cfg.scheduler.prefetch_depth,
                          timeout_s=cfg.run.timeout_s,
                          poll_interval_s=cfg.transport.poll_interval_s)


def learner_delivery(edp: Any, shards: tuple[int, ...], stager: Stager, transform: Any
                     ) -> tuple[Callable[[LearnerEndpoint], DeliveryMode], Sampler]:
    """A learner's delivery mode over ``shards`` and its sampler, on the data plane
    ``edp`` (this rank): the experience path in this process (``scheduler.mode``'s
    :func:`~conduit_hpc.plane.learner.inline_mode`), or, with ``delivery =
    "process"``, the staging ring its delivery rank fills (:class:`ProcessMode`; the
    sampler only checks this learner's priority updates). Local."""
    cfg, me = edp.config, edp.roles.world_rank
    if edp.staging is None:
        d = make_deliverer(edp, me, shards, stager, transform)
        return inline_mode(d, cfg.scheduler), d.sampler
    ring, peer, poll_s = edp.staging, edp.roles.delivery_of[me], cfg.transport.poll_interval_s
    return (lambda ep: ProcessMode(ep, ring, stager, peer, poll_s, edp.control.name_first),
            make_sampler(cfg, cfg.run.seed + me))


def open_staging(roles: RoleComms, config: Config, spec: Spec) -> StagingRing | None:
    """The staging ring of this rank's {learner, delivery rank} pair (``None`` on other
    roles). **Collective** on the world.

    Raises:
        ConfigError: a learner and its delivery rank are not on one node (on every rank,
            before any window exists).
    """
    world, me = roles.world, roles.world_rank
    # bounded: a rank that hangs or died in the constructor before this point ends the
    # others after run.timeout_s, not in Split for ever
    bounded_barrier(world, config.run.timeout_s, "the data plane's constructor (staging)")
    pairs = sorted(roles.delivery_of.items())
    color = next((k for k, (lo, d) in enumerate(pairs) if me in (lo, d)), MPI.UNDEFINED)
    pair: MPI.Intracomm = world.Split(color, 0 if me in roles.delivery_ranks else 1)  # type: ignore[assignment]
    local = True
    if pair != MPI.COMM_NULL:
        shm = pair.Split_type(MPI.COMM_TYPE_SHARED, key=pair.Get_rank())
        local = shm.Get_size() == 2
        shm.Free()
    ok = allgather_json(world, bool(local))
    far = [[lo, d] for lo, d in pairs if not (ok[lo] and ok[d])]
    if far:
        if pair != MPI.COMM_NULL:
            pair.Free()
        raise ConfigError(f"scheduler.delivery = 'process' needs each learner's delivery "
                          f"rank on the learner's node (they share memory), but the pairs "
                          f"(learner, delivery) {far} are on different nodes; place "
                          f"the delivery ranks with their learners (layout.per_node = true) "
                          f"or use delivery = 'thread'", key="scheduler.delivery")
    if pair == MPI.COMM_NULL:
        return None
    sch = config.scheduler
    layout = StagingLayout(spec, sch.batch_rows, sch.window, sch.prefetch_depth + 1,
                           queue_rows=max(256, sch.batch_rows))
    owner = 0  # the delivery rank is rank 0 of the pair (key above)
    window = RmaWindow(pair, layout.nbytes if me in roles.delivery_ranks else 0,
                       node_comm=pair, shared=True, timeout_s=config.run.timeout_s,
                       what="the data plane's constructor (the staging window)")
    return StagingRing(window, owner, layout)


class DeliveryServer:
    """The delivery rank's loop (see the module docstring).

    Args:
        d (Deliverer): the experience path, with the :class:`SlotWriter` as its stager.
        fetch (Fetch): how rows are found and fetched.
        ring (StagingRing): the ring shared with the learner.
        learner (int): the learner's world rank (for messages).
        depth (int): ``scheduler.prefetch_depth``.
        timeout_s (float): bound on every wait (also: on the learner's silence).
        poll_interval_s (float): longest pause while idle.
    """

    def __init__(self, d: Deliverer, fetch: Fetch, ring: StagingRing, *, learner: int,
                 depth: int, timeout_s: float, poll_interval_s: float) -> None:
        self.d, self.ring = d, ring
        self.learner, self.timeout_s = learner, timeout_s
        self.clock = PrefetchClock(depth)
        self.poll_s = min(poll_interval_s, 0.0005)
        self.prefetch = Prefetcher(d, fetch, self.clock, self._publish, self._closed)
        self.finished = False
        self.started = False  # the learner's sampler state was taken (batches may start)
        self.silent = False  # its learner stopped asking (its own timeout, not a failure)
        self.learner_failed = False  # it raised its learner's failure
        self.updates = 0  # update messages forwarded

    def serve(self) -> None:
        """Run until the learner stops (bounded: see the module docstring)."""
        if self.finished:
            return
        try:
            self._loop()
        except BaseException as err:
            if isinstance(err, RemoteFailure) and not self.learner_failed:  # e.g. the
                self._raise_if_learner_failed(err)  # control block's: its learner's error
            self.ring.set_message(W_FAILED, f"{type(err).__name__}: {err}")
            # a wait while preparing (the rate limiter's, with every priority 0) is a
            # failure like the transform's: the learner may take it and end
            if isinstance(err, Exception) and not isinstance(err, RemoteFailure) \
                    and not self.silent and self._learner_ends():
                return  # the learner took the error and ended: so does this rank
            raise
        finally:
            self.finished = True

    def fail(self, why: str) -> None:
        """This rank left its data plane on an exception outside :meth:`serve` (e.g. the
        job's code before it): tell the learner, which raises it at its next call (it
        waited out ``run.timeout_s`` for a batch and raised DataPlaneTimeout). Not
        after the learner stopped, nor over an error already written."""
        if not self.ring.word(W_FAILED) and not self.ring.word(W_STOPPED):
            self.ring.set_message(W_FAILED, why)

    def _learner_ends(self) -> bool:
        """After a failure while preparing batches (e.g. the transform raised), reported
        to the learner: wait (bounded by ``run.timeout_s``) for its decision. True when
        it ends cleanly (``done``: it handled the error, as it may in the other modes),
        False when it fails too or does not answer in time (this rank then raises)."""
        ring = self.ring
        deadline = time.monotonic() + self.timeout_s
        backoff = Backoff(self.poll_s)
        while time.monotonic() < deadline:
            self.d.channel.progress()
            self.d.mpi_progress()
            if ring.word(W_LEARNER_FAILED):
                return False
            if ring.word(W_STOP):
                if ring.word(W_LEARNER_FAILED):  # read after the stop: a learner that
                    return False  # failed says so before it stops
                try:
                    self.prefetch.finish()  # no owner's reply left unreceived
                    self._forward()
                except Exception:  # the first error is the one raised
                    return False
                return True
            backoff.pause()
        return False

    def _forward(self) -> None:
        for idx, p in self.ring.pop_all():
            self.d.send_priorities(idx, p)
            self.updates += 1

    def _loop(self) -> None:
        ring, clock, d = self.ring, self.clock, self.d
        backoff = Backoff(self.poll_s)
        quiet = time.monotonic()
        while True:
            d.channel.progress()
            d.mpi_progress()  # across nodes its node's atomics may wait for this rank
            self._raise_if_learner_failed()
            if not self.started and (state := ring.state(W_STARTED)) is not None:
                # the sampler continues where the learner's was put (a restore)
                d.sampler.load_state_dict(json.loads(state))
                self.started = True
            requested = ring.word(W_REQUESTED)
            self._forward()  # every update queued before that request
            while clock.requested < requested:
                self.prefetch.request()
                quiet = time.monotonic()
            if ring.word(W_STOP):
                # a learner that failed says so before it stops, but both words may have
                # come since the check above (the delivery rank then ended cleanly, exit
                # code 0, for a failed learner: 4 runs in 15 at 4 ranks, load 11)
                self._raise_if_learner_failed()
                self._stop()
                return
            did = self.started and self.prefetch.step()
            if did:
                backoff.reset()
                quiet = time.monotonic()
                continue
            if time.monotonic() - quiet > self.timeout_s:
                self.silent = True
                raise DataPlaneTimeout(
                    f"the delivery rank waited {self.timeout_s:.1f} s for its learner (world "
                    f"rank {self.learner}) to ask for batch {clock.requested} (a learner's "
                    f"time between next_batch calls must stay under run.timeout_s)")
            backoff.pause()

    def _raise_if_learner_failed(self, cause: BaseException | None = None) -> None:
        if self.ring.word(W_LEARNER_FAILED):
            self.learner_failed = True
            raise RemoteFailure(f"the learner (world rank {self.learner}) failed: "
                                f"{self.ring.message(W_LEARNER_FAILED)}") from cause

    def _publish(self, batch: Batch, t: int) -> None:
        self.ring.publish(t, batch.superstep, batch.staleness, batch.timings)

    def _closed(self, err: DataPlaneClosed) -> None:  # the learner raises it
        self.ring.set_message(W_CLOSED, str(err))

    def _stop(self) -> None:
        """The learner stops: no owner's reply is left unreceived, every queued update
        is forwarded, the counters are left for the learner's summary."""
        self.prefetch.finish()
        self._forward()
        d, ring = self.d, self.ring
        got = {"resampled_rows": d.resampled, "limiter_wait_s": d.limiter_wait_s,
               "overwritten_unsampled": d.overwritten_unsampled,
               "pinned_rounds": d.pinned_rounds, "priority_rows_direct": d.prio.direct_rows,
               "priority_rows_messaged": d.prio.message_rows}
        for k, name in enumerate(COUNTERS):
            ring.counters[k] = float(got[name])
        if self.started:  # its random state goes back (what a final checkpoint saves)
            ring.set_state(W_FINAL, jsontext.dumps({"rng": d.sampler.state_dict(0)["rng"]}))
        ring.set_word(W_STOPPED, 1)


class ProcessMode(DeliveryMode):
    """The learner's side of ``delivery = "process"`` (see the module docstring)."""

    name = "edp"

    def __init__(self, endpoint: LearnerEndpoint, ring: StagingRing, stager: Stager,
                 delivery_rank: int, poll_interval_s: float,
                 name_failed: Callable[[int], None]) -> None:
        super().__init__(endpoint)
        self.depth = endpoint.cfg.prefetch_depth
        self.ring, self.stager, self.peer = ring, stager, delivery_rank
        #: ControlBlock.name_first: its failure is named before this rank leaves on it
        self.name_failed = name_failed
        self.poll_s = min(poll_interval_s, 0.0005)
        self._stopped = False
        self._failed = False  # this learner failed, or already raised the peer's failure
        self._raised = False  # a next_batch raised (the learner may take it and end)
        self._counters: dict[str, float] = {}  # the delivery rank's, left at its stop

    def start(self) -> None:
        """Before the first request: hand the delivery rank this learner's sampler
        state, which it draws and weighs with (what a restore put there: the superstep
        the beta schedule and ``Batch.superstep`` count from, the random state)."""
        self.ring.set_state(W_STARTED, jsontext.dumps(self.ep.sampler.state_dict(0)))

    def _check_peer(self) -> None:
        if self.ring.word(W_FAILED):
            self._failed = True
            why = self.ring.message(W_FAILED)
            if not why.startswith("RemoteFailure"):  # its own error: it marks itself next
                self.name_failed(self.peer)  # (peers name it, not this rank)
            raise RemoteFailure(f"the delivery rank (world rank {self.peer}) of this learner "
                                f"failed: {why}")

    def _wait(self, ready: Any, what: str, peer_failed_too: bool = False) -> None:
        """Until ``ready()`` (bounded); ``peer_failed_too``: a failed delivery rank is
        one of the ends waited for, not an error."""
        deadline = Deadline(self.ep.timeout_s, what)
        # a short spin, then yields: the delivery rank it waits for needs a core (200
        # spins held one for the ~0.2 ms a CartPole batch takes; 20 gave 4,096-5,006
        # idle batches/s against 3,295-4,381 in bench capacity, interleaved runs)
        backoff = Backoff(self.poll_s, spins=20, yields=50)
        while not ready():
            if not peer_failed_too:
                self._check_peer()
            deadline.check(f"the delivery rank is world rank {self.peer}")
            backoff.pause()

    def next_batch(self, s: int) -> Batch:
        ring = self.ring
        ring.set_word(W_REQUESTED, s + 1)  # after every update queued before; frees s - 1

        def ready() -> bool:
            if ring.ready(s):
                return True
            if ring.word(W_CLOSED):
                if ring.ready(s):
                    return True
                raise DataPlaneClosed(ring.message(W_CLOSED))
            return False

        try:
            self._wait(ready, f"batch {s} from the delivery rank")
        except Exception:
            self._raised = True
            raise
        data, indices, weights, superstep, staleness, timings = ring.batch(s)
        batch = self.stager.to_device(data, indices, weights, superstep, staleness)
        batch.timings = timings
        return batch

    def send_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        ring, rows = self.ring, self.ring.layout.queue_rows
        for a in range(0, len(indices), rows):
            if ring.queue_free() <= 0:
                self._wait(lambda: ring.queue_free() > 0,
                           "room in the priority-update queue")
            ring.push(indices[a:a + rows], priorities[a:a + rows])

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        ring = self.ring
        ring.set_word(W_STOP, 1)
        if self._failed:  # its failure (or this learner's) was reported already
            return
        if self._raised:  # e.g. its own timeout while the delivery rank's wait ran on:
            # that rank fails with its reason, then ends as this learner does (cleanly)
            self._wait(lambda: ring.word(W_STOPPED) == 1 or ring.word(W_FAILED) != 0,
                       "the delivery rank to stop", peer_failed_too=True)
            if ring.word(W_STOPPED) != 1:
                return
        self._wait(lambda: ring.word(W_STOPPED) == 1, "the delivery rank to stop")
        self._counters = dict(zip(COUNTERS, (float(v) for v in ring.counters), strict=False))
        if (final := ring.state(W_FINAL)) is not None:  # the random state it drew with
            self.ep.sampler.load_state_dict(json.loads(final))

    def counters(self) -> dict[str, float]:
        return dict(self._counters)

    def fail(self, why: str) -> None:
        """The learner failed: tell the delivery rank (it raises at once). The first
        failure is the one told (a later one is its consequence)."""
        self._failed = True
        if not self.ring.word(W_LEARNER_FAILED):
            self.ring.set_message(W_LEARNER_FAILED, why)
