"""The buffer role: the progress loop that owns shards.

A buffer rank holds shard memory in RMA windows and runs :class:`BufferServer`'s loop:
it advances each shard's commit cursor, makes newly committed rows sampleable in the
shard's :class:`~conduit_hpc.storage.PriorityIndex` (and hides rows that a writer has
been handed for overwriting), publishes the shard's statistics for samplers, and
answers messages: prefix searches for learners (``edp``/``sync``), whole batches
(``service``), priority updates, and "done". With the MPI wheels used here, one-sided
traffic to a rank only progresses while it is inside MPI; the loop keeps entering MPI
(see ``docs/sharp-bits.md``).

The loop ends when every non-buffer rank has said it is done. It cannot block forever
on a dead peer: a rank that fails raises, and jobs run under ``python -m mpi4py``, which
aborts the whole job on an uncaught exception; a rank whose exception is caught outside
its ``with`` block marks itself failed in the control block, and an idle loop raises
:class:`~conduit_hpc.errors.RemoteFailure` (``ControlBlock.raise_if_failed``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from conduit_hpc.errors import TransportError
from conduit_hpc.plane.control import C_ACTORS_DONE
from conduit_hpc.plane.extensions import BufferExtension
from conduit_hpc.plane.shard import OwnedShard
from conduit_hpc.protocol import PriorityUpdate, SampleReply, SampleRequest, Tag, pack_rows
from conduit_hpc.sampling import make_sampler
from conduit_hpc.transport.channel import Channel, Message
from conduit_hpc.wait import Backoff

__all__ = ["BufferServer", "OwnedShard", "make_server"]


def make_server(edp: Any, on_done: Callable[[int], None] | None) -> BufferServer:
    """The buffer loop of this rank of the data plane ``edp``, over the shards it owns;
    the ranks that draw samples (learners, or their delivery ranks) are the ones whose
    end releases writers held on undrawn rows. Local."""
    cfg, roles, me = edp.config, edp.roles, edp.roles.world_rank
    sampler = make_sampler(cfg, cfg.run.seed + me)
    owned = edp.memory.owned_shards(cfg, roles, edp.placement, sampler)
    peers = tuple(r for r in range(roles.world_size) if r not in roles.buffer_ranks)
    acks = edp.memory.block.acks(edp.window.own_segment())
    writers = len(roles.writer_ranks)
    return BufferServer(owned, edp.channel, peers, on_done=on_done,
                        poll_interval_s=cfg.transport.poll_interval_s,
                        seed=cfg.run.seed + me, window=sampler.window, acks=acks,
                        sync=edp.window.sync, learners=roles.sampler_ranks,
                        failed=lambda: edp.control.raise_if_failed(me),
                        writers_done=lambda: edp.control.read(C_ACTORS_DONE) >= writers)


class BufferServer:
    """Progress loop of a buffer rank.

    Features add work through :class:`~conduit_hpc.plane.extensions.BufferExtension`
    objects (:meth:`add_extension`); see that module for the events and the rule that
    none of them blocks.

    Args:
        shards (list[OwnedShard]): the shards this rank owns.
        channel (Channel): the data plane's message channel.
        peers (tuple[int, ...]): channel ranks that will each send :attr:`Tag.DONE`.
        on_done (Callable[[int], None] | None): called with the rank of each peer that
            says it is done (the data plane counts them in its control block).
        poll_interval_s (float): longest sleep between passes when idle.
        seed (int): seed of the resampling of rows found torn in service mode.
        window (int): rows per sampled item (sequence windows: > 1).
        acks (np.ndarray | None): int64 per rank in shared memory: priority-update
            messages applied from that rank (learners that search trees directly wait
            for their updates to be counted here).
        sync (Callable[[], None] | None): memory barrier for ``acks``.
        learners (tuple[int, ...]): channel ranks of the learners; once each has said it
            is done, no shard holds writers back (``block`` ingest policy).
        failed (Callable[[], None] | None): raises when a peer left on an exception
            (called when a pass found nothing to do).
        writers_done (Callable[[], bool] | None): whether every writer of the job has
            said it is done (asked only when a sample request finds nothing drawable
            while a guard band hides rows: the band is then given back at once).

    Fairness: each pass commits at most ``OwnedShard.max_commit_rows`` rows per shard,
    then answers every message that has arrived (deferred service requests first), so a
    request waits at most about one bounded pass before it is answered - or, when its
    shard has nothing drawable, until the next pass that has something.
    """

    def __init__(self, shards: list[OwnedShard], channel: Channel, peers: tuple[int, ...],
                 *, on_done: Callable[[int], None] | None = None,
                 poll_interval_s: float = 0.0002, seed: int = 0, window: int = 1,
                 acks: np.ndarray | None = None,
                 sync: Callable[[], None] | None = None,
                 learners: tuple[int, ...] = (),
                 failed: Callable[[], None] | None = None,
                 writers_done: Callable[[], bool] | None = None) -> None:
        self.shards = shards
        self.by_id = {s.shard_id: s for s in shards}
        self.channel = channel
        self.waiting_for = set(peers)
        self.poll_interval_s = poll_interval_s
        self.on_done = on_done
        self.window = window
        self.acks, self.sync, self.failed = acks, sync, failed
        self.writers_done = writers_done
        self.learners_left = set(learners)
        self.rng = np.random.default_rng(seed)
        self._handlers: dict[int, Callable[[Message], None]] = {
            Tag.DONE: self._on_done, Tag.SAMPLE: self._on_sample,
            Tag.SERVICE: self._on_service, Tag.PRIORITY: self._on_priority}
        self.deferred: list[Message] = []
        self.extensions: list[BufferExtension] = []
        self.passes = 0
        self._learner_msg = False  # a learner's update or request came this pass
        self.samples_served = 0
        self.rows_served = 0

    def add_extension(self, ext: BufferExtension, *, first: bool = False) -> None:
        """Add a feature's work to the loop (after the others, or before them with
        ``first``); its :attr:`~BufferExtension.tags` must not be taken already. Local."""
        for tag in ext.tags:
            if tag in self._handlers:
                raise TransportError(f"message tag {tag} of {type(ext).__name__} is "
                                     f"handled already")
            self._handlers[tag] = ext.on_message
        if first:
            self.extensions.insert(0, ext)
        else:
            self.extensions.append(ext)

    def wait_for(self, rank: int) -> None:
        """Do not end the loop before ``rank`` says it is done. Local."""
        self.waiting_for.add(rank)

    def peer_done(self, rank: int) -> None:
        """``rank`` will send nothing more (its DONE, or a feature's end marker)."""
        if rank in self.learners_left:
            self.learners_left.discard(rank)
            if not self.learners_left:  # nobody will draw again: nothing holds writers
                for s in self.shards:
                    s.block = False
        if rank in self.waiting_for:
            self.waiting_for.discard(rank)
            if self.on_done is not None:
                self.on_done(rank)
            for ext in self.extensions:
                ext.on_peer_done(rank)

    # -- handlers ------------------------------------------------------------------
    def _on_done(self, msg: Message) -> None:
        self.peer_done(msg.source)

    def _on_sample(self, msg: Message) -> None:
        self._learner_msg = True
        req = SampleRequest.unpack(msg.payload)
        shard = self.by_id[req.shard_id]
        # commit first: rows written before the request was sent are visible in memory
        # by now, and the reply's stats must count them (a learner's fence relies on it)
        shard.poll()
        rep = shard.sample(req.targets)
        if not rep.total > 0 and self._writers_gone(shard):
            # nothing drawable, writers gone: the band's rows come back now, not after
            # idle_s (a learner's fence after the last writer decides that nothing will
            # ever be drawable: it must not count them out)
            shard.poll()
            rep = shard.sample(req.targets)
        shard.mark(rep.slots, rep.gens, self.window)
        rep = SampleReply(req.request_id, rep.shard_id, rep.slots, rep.gens, rep.mass,
                          rep.held, rep.total, rep.min_mass)
        self.samples_served += len(req.targets)
        self.channel.isend(msg.source, Tag.SAMPLE_REPLY, rep.pack())

    def _writers_gone(self, shard: OwnedShard) -> bool:
        """Whether every writer is done, so that ``shard`` (a guard band hiding rows
        beyond its reserve cursor) may give its band back at once; marks every shard."""
        if shard.writers_gone or self.writers_done is None or not shard.band_held():
            return False
        if self.writers_done():
            for s in self.shards:
                s.writers_gone = True
        return shard.writers_gone

    def _on_service(self, msg: Message) -> None:
        self._learner_msg = True
        if not self._try_service(msg):
            self.deferred.append(msg)  # answered on a later pass, once rows are there

    #: redraw rounds of one service request before it is deferred to a later pass
    SERVICE_ROUNDS = 16

    def _try_service(self, msg: Message) -> bool:
        """Sample, gather the rows from local memory and send everything back. Rows found
        overwritten after the gather are replaced by fresh draws of only those rows (at
        most :attr:`SERVICE_ROUNDS` rounds). Returns False (nothing sent) when the shard
        has nothing intact to draw right now."""
        req = SampleRequest.unpack(msg.payload)
        shard = self.by_id[req.shard_id]
        rep = shard.sample(req.targets)
        window = self.window
        cap = shard.ring.capacity
        n = len(rep.slots)
        slots, gens, mass = rep.slots.copy(), rep.gens.copy(), rep.mass.copy()
        offs = np.arange(window)[None, :]
        cols = shard.ring.layout.spec.empty(n * window)
        todo = np.arange(n)
        for _ in range(self.SERVICE_ROUNDS):
            drawn = slots[todo] >= 0
            flat = (np.where(drawn, slots[todo], 0)[:, None] + offs).reshape(-1) % cap
            got, reserved = shard.ring.gather(flat)
            sel = (todo[:, None] * window + offs).reshape(-1)
            for k, col in got.items():
                cols[k][sel] = col
            # nothing drawn, or the oldest row of the item handed to a writer meanwhile
            bad = ~drawn | ~shard.ring.intact(gens[todo], reserved)
            if not bad.any():
                break
            todo = todo[bad]
            if shard.span() <= 0:  # nothing drawable: say so (the learner starts over
                slots[:] = -1  # from its rate limiter, which knows whether mass can come;
                n = 0  # deferred, the request waited for rows no actor would write)
                break
            fresh = shard.sample(self.rng.random(len(todo)) * max(shard.span(), 0.0))
            slots[todo], gens[todo], mass[todo] = fresh.slots, fresh.gens, fresh.mass
        else:
            return False
        shard.mark(slots, gens, window)
        out = SampleReply(req.request_id, rep.shard_id, slots, gens, mass, rep.held,
                          rep.total, rep.min_mass)
        self.samples_served += n
        self.rows_served += n * window
        self.channel.isend(msg.source, Tag.SERVICE_REPLY,
                           out.pack(pack_rows(shard.ring.layout.spec, cols) if n else None))
        return True

    def _on_priority(self, msg: Message) -> None:
        self._learner_msg = True
        up = PriorityUpdate.unpack(msg.payload)
        shard = self.by_id[up.shard_id]
        with shard.writing():
            shard.index.update(up.slots, up.gens, up.priorities)
        for ext in self.extensions:
            ext.on_priority_update(up)
        if self.acks is not None:
            self.acks[msg.source] += 1
            if self.sync is not None:
                self.sync()

    @property
    def finished(self) -> bool:
        """True once every peer said it is done (and no extension keeps this rank open)."""
        return not self.waiting_for and not any(e.keep_open() for e in self.extensions)

    def step(self) -> int:
        """One pass: commits, index and stats (bounded work per shard), then every
        pending message, then the extensions. Returns work done. Local; never blocks."""
        work = sum(s.poll(bounded=True) for s in self.shards)
        if self.deferred:
            waiting, self.deferred = self.deferred, []
            for old in waiting:
                if self._try_service(old):
                    work += 1
                else:
                    self.deferred.append(old)
        while (msg := self.channel.poll()) is not None:
            if not any(e.intercept(msg) for e in self.extensions):
                self.dispatch(msg)
            work += 1
        for ext in self.extensions:
            work += ext.on_pass()
        self.passes += 1
        return work

    def dispatch(self, msg: Message) -> None:
        """Handle ``msg`` by its tag (an extension hands back what it intercepted)."""
        handler = self._handlers.get(msg.tag)
        if handler is None:
            raise TransportError(f"buffer got a message with unknown tag {msg.tag} "
                                 f"from rank {msg.source}")
        handler(msg)

    #: after a learner's message, idle passes yield instead of sleeping for this long:
    #: a learner that samples steadily sends its next update or request within it, and
    #: its next batch waits for that message to be applied (a sleeping loop adds its
    #: pause to every batch)
    HOT_S = 0.005

    def serve(self) -> None:
        """Run passes until every peer is done, then one last commit pass. Blocks; see
        the module docstring for why it cannot block forever."""
        backoff = Backoff(max(self.poll_interval_s, 0.0005))
        hot_until = 0.0
        while not self.finished:
            if self.step():
                backoff.reset()
                if self._learner_msg:
                    self._learner_msg = False
                    hot_until = time.monotonic() + self.HOT_S
            elif time.monotonic() < hot_until:
                time.sleep(0)
            else:
                if self.failed is not None:  # idle: a peer that left on an error
                    self.failed()  # will never say it is done (raises RemoteFailure)
                backoff.pause()
        for s in self.shards:
            s.poll()
        for ext in self.extensions:
            ext.on_finish()
