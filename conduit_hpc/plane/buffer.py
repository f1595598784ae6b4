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
aborts the whole job on an uncaught exception.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from conduit_hpc.protocol import PriorityUpdate, SampleReply, SampleRequest, Tag, pack_rows
from conduit_hpc.sampling import valid_sequence_starts
from conduit_hpc.storage.priority import PriorityIndex
from conduit_hpc.storage.ring import ShardRing
from conduit_hpc.transport.channel import Channel, Message

__all__ = ["BufferServer", "OwnedShard", "SequenceWindow", "ServerExtension", "Tag"]


@dataclass(frozen=True, slots=True)
class SequenceWindow:
    """How the sequence sampler cuts windows (``length`` rows; ``episode_field`` and
    ``stream_field`` name spec fields, or are empty)."""

    length: int
    episode_field: str = ""
    stream_field: str = ""
    cross_episode: bool = False
    refresh_s: float = 0.02


@dataclass(eq=False)
class OwnedShard:
    """A shard this rank owns: its ring client and priority index.

    Attributes:
        shard_id (int): global shard number.
        ring (ShardRing): direct access to the memory.
        index (PriorityIndex): priorities of visible rows.
        sequence (SequenceWindow | None): set when the sampler draws windows.
        hidden_upto (int): seqs below this that lap older rows have had those rows hidden.
    """

    shard_id: int
    ring: ShardRing
    index: PriorityIndex
    sequence: SequenceWindow | None = None
    hidden_upto: int = 0
    _starts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _starts_at: float = -1.0
    _dirty: bool = True

    @property
    def committed(self) -> int:
        """Rows committed into this shard since it was created (or restored)."""
        assert self.ring.views is not None
        return int(self.ring.views.header[1])

    def poll(self) -> int:
        """Advance commits, update the index, publish stats. Returns rows made visible."""
        ring, cap = self.ring, self.ring.capacity
        old, new = ring.advance_commits()
        # rows a writer has been handed for overwriting (seq q overwrites q - cap)
        reserved = ring.reserve_cursor()
        lo = max(self.hidden_upto, new, cap)
        stale = np.zeros(0, np.int64)
        if reserved > lo:
            seqs = np.arange(lo, reserved, dtype=np.int64)
            slots = seqs % cap
            stale = slots[self.index.gens[slots] == seqs - cap + 1]
        self.hidden_upto = max(self.hidden_upto, reserved)
        if new > old or stale.size or self._dirty:
            with self.writing():
                if new > old:
                    lo = max(old, new - cap)
                    seqs = np.arange(lo, new, dtype=np.int64)
                    slots = seqs % cap
                    assert ring.views is not None
                    self.index.insert(slots, seqs + 1, ring.views.priority[slots])
                if stale.size:
                    self.index.invalidate(stale)
        return new - old

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Change the index inside the shard's seqlock, then publish its stats, so that
        node-local readers searching the tree see a consistent state or retry."""
        self.ring.index_write_begin()
        try:
            yield
        finally:
            self.ring.index_write_end(*self._stats())
            self._dirty = False

    def _stats(self) -> tuple[int, float, float, float]:
        ix = self.index
        if self.sequence is not None:
            starts = self._window_starts()  # the cache sample() draws from
            return len(starts), float(len(starts)), 1.0, ix.max_priority
        return ix.count, ix.total, ix.min.min if ix.count else np.inf, ix.max_priority

    # -- sampling ------------------------------------------------------------------
    def _window_starts(self, force: bool = False) -> np.ndarray:
        """Seqs that start a valid window (sequence sampler), cached briefly."""
        seq = self.sequence
        assert seq is not None and self.ring.views is not None
        now = time.monotonic()
        if not force and now - self._starts_at < seq.refresh_s:
            return self._starts
        cap = self.ring.capacity
        commit = self.committed
        lo = max(0, commit - cap)
        seqs = np.arange(lo, commit, dtype=np.int64)
        slots = seqs % cap
        held = self.index.gens[slots] == seqs + 1
        cols = self.ring.views.columns
        ends = cols[seq.episode_field][slots].astype(bool) if seq.episode_field else None
        stream = cols[seq.stream_field][slots] if seq.stream_field else None
        starts = valid_sequence_starts(held, seq.length, episode_end=ends, stream=stream,
                                       cross_episode=seq.cross_episode)
        self._starts, self._starts_at = seqs[starts] if len(seqs) else starts, now
        return self._starts

    def sample(self, targets: np.ndarray) -> SampleReply:
        """Rows for mass offsets ``targets`` (window indices for sequences): slot,
        generation and mass of each; slot -1 where the shard has nothing to draw right
        now (every row hidden while being overwritten) - the learner draws again. Local.
        """
        ix = self.index
        n = len(targets)
        empty = SampleReply(0, self.shard_id, np.full(n, -1, np.int64), np.zeros(n, np.int64),
                            np.zeros(n), 0, 0.0, np.inf)
        if self.sequence is not None:
            starts = self._window_starts()
            if len(starts) == 0:
                return empty
            pick = starts[np.clip(targets.astype(np.int64), 0, len(starts) - 1)]
            slots = pick % self.ring.capacity
            return SampleReply(0, self.shard_id, slots, pick + 1, np.ones(len(pick)),
                               len(starts), float(len(starts)), 1.0)
        if ix.total <= 0:
            return empty
        slots = ix.sum.prefix_search(targets)
        return SampleReply(0, self.shard_id, slots, ix.gens[slots].copy(),
                           ix.sum[slots].copy(), ix.count, ix.total,
                           ix.min.min if ix.count else np.inf)


class ServerExtension(Protocol):
    """Extra work of a buffer rank's loop (e.g. the long-haul forwarder):
    :meth:`step` runs every pass after the messages (returns work done, never blocks);
    :meth:`finish` once when the loop ends. An extension may add handlers and peers to
    wait for."""

    def step(self) -> int: ...

    def finish(self) -> None: ...


class BufferServer:
    """Progress loop of a buffer rank.

    Args:
        shards (list[OwnedShard]): the shards this rank owns.
        channel (Channel): the data plane's message channel.
        peers (tuple[int, ...]): channel ranks that will each send :attr:`Tag.DONE`.
        on_done (Callable[[int], None] | None): called with the rank of each peer that
            says it is done (the data plane counts them in its control block).
        poll_interval_s (float): longest sleep between passes when idle.
        seed (int): seed of the resampling of rows found torn in service mode.
        acks (np.ndarray | None): int64 per rank in shared memory: priority-update
            messages applied from that rank (learners that search trees directly wait
            for their updates to be counted here).
        sync (Callable[[], None] | None): memory barrier for ``acks``.
    """

    def __init__(self, shards: list[OwnedShard], channel: Channel, peers: tuple[int, ...],
                 *, on_done: Callable[[int], None] | None = None,
                 poll_interval_s: float = 0.0002, seed: int = 0,
                 acks: np.ndarray | None = None,
                 sync: Callable[[], None] | None = None) -> None:
        self.shards = shards
        self.by_id = {s.shard_id: s for s in shards}
        self.channel = channel
        self.waiting_for = set(peers)
        self.poll_interval_s = poll_interval_s
        self.on_done = on_done
        self.acks, self.sync = acks, sync
        self.rng = np.random.default_rng(seed)
        self.handlers: dict[int, Callable[[Message], None]] = {
            Tag.DONE: self._on_done, Tag.SAMPLE: self._on_sample,
            Tag.SERVICE: self._on_service, Tag.PRIORITY: self._on_priority}
        self.deferred: list[Message] = []
        #: called once per pass after the commits (e.g. the checkpoint agent); each
        #: returns work done and must not block
        self.hooks: list[Callable[[], int]] = []
        #: each returns True while this rank must keep serving after every peer is done
        #: (adaptive placement finishing a move or forwarding updates); must not block
        self.keep_open: list[Callable[[], bool]] = []
        #: sources whose messages wait (in order) until :meth:`release` - between a
        #: learner's checkpoint marker and this rank's cut, so that the cut holds exactly
        #: what that learner sent before the marker
        self.holding: dict[int, float] = {}
        self.held: list[Message] = []
        #: tags that are never held (the checkpoint protocol itself)
        self.pass_through: set[int] = {Tag.CKPT_CUT, Tag.CKPT_PART, Tag.CKPT_REQUEST,
                                       Tag.CKPT_MARK, Tag.STOP}
        self.extensions: list[ServerExtension] = []
        self.passes = 0
        self.samples_served = 0
        self.rows_served = 0

    # -- handlers ------------------------------------------------------------------
    def _on_done(self, msg: Message) -> None:
        if msg.source in self.waiting_for:
            self.waiting_for.discard(msg.source)
            if self.on_done is not None:
                self.on_done(msg.source)

    def _on_sample(self, msg: Message) -> None:
        req = SampleRequest.unpack(msg.payload)
        shard = self.by_id[req.shard_id]
        # commit first: rows written before the request was sent are visible in memory
        # by now, and the reply's stats must count them (a learner's fence relies on it)
        shard.poll()
        rep = shard.sample(req.targets)
        rep = SampleReply(req.request_id, rep.shard_id, rep.slots, rep.gens, rep.mass,
                          rep.held, rep.total, rep.min_mass)
        self.samples_served += len(req.targets)
        self.channel.isend(msg.source, Tag.SAMPLE_REPLY, rep.pack())

    def _on_service(self, msg: Message) -> None:
        if not self._try_service(msg):
            self.deferred.append(msg)  # answered on a later pass, once rows are there

    def _try_service(self, msg: Message) -> bool:
        """Sample, gather the rows from local memory and send everything back. Returns
        False (nothing sent) when the shard has nothing intact to draw right now."""
        req = SampleRequest.unpack(msg.payload)
        shard = self.by_id[req.shard_id]
        rep = shard.sample(req.targets)
        window = shard.sequence.length if shard.sequence is not None else 1
        cap = shard.ring.capacity
        slots, gens, mass = rep.slots.copy(), rep.gens.copy(), rep.mass.copy()
        for _ in range(8):
            drawn = slots >= 0
            flat = (np.where(drawn, slots, 0)[:, None]
                    + np.arange(window)[None, :]).reshape(-1) % cap
            cols, reserved = shard.ring.gather(flat)
            # nothing drawn, or the oldest row of the item handed to a writer meanwhile
            bad = ~drawn | ((gens - 1) + cap < reserved)
            if not bad.any():
                break
            # draw replacements in the same shard
            fresh = shard.sample(self.rng.random(int(bad.sum())) * max(shard.index.total, 0.0)
                                 if shard.sequence is None else
                                 self.rng.random(int(bad.sum())) * len(shard._window_starts()))
            slots[bad], gens[bad], mass[bad] = fresh.slots, fresh.gens, fresh.mass
        else:
            return False
        out = SampleReply(req.request_id, rep.shard_id, slots, gens, mass, rep.held,
                          rep.total, rep.min_mass)
        self.samples_served += len(slots)
        self.rows_served += len(flat)
        self.channel.isend(msg.source, Tag.SERVICE_REPLY,
                           out.pack(pack_rows(shard.ring.layout.spec, cols)))
        return True

    def _on_priority(self, msg: Message) -> None:
        up = PriorityUpdate.unpack(msg.payload)
        shard = self.by_id[up.shard_id]
        with shard.writing():
            shard.index.update(up.slots, up.gens, up.priorities)
        if self.acks is not None:
            self.acks[msg.source] += 1
            if self.sync is not None:
                self.sync()

    @property
    def finished(self) -> bool:
        """True once every peer said it is done (and nothing keeps this rank open)."""
        return not self.waiting_for and not any(k() for k in self.keep_open)

    def step(self) -> int:
        """One pass: commits, index, stats, then every pending message. Returns work
        done. Local; never blocks."""
        work = sum(s.poll() for s in self.shards)
        if self.deferred:
            waiting, self.deferred = self.deferred, []
            for old in waiting:
                if self._try_service(old):
                    work += 1
                else:
                    self.deferred.append(old)
        while (msg := self.channel.poll()) is not None:
            if msg.source in self.holding and msg.tag not in self.pass_through:
                self.held.append(msg)
            else:
                self._dispatch(msg)
            work += 1
        for hook in self.hooks:
            work += hook()
        for ext in self.extensions:
            work += ext.step()
        self.passes += 1
        return work

    def _dispatch(self, msg: Message) -> None:
        handler = self.handlers.get(msg.tag)
        if handler is None:
            raise RuntimeError(f"buffer got a message with unknown tag {msg.tag} "
                               f"from rank {msg.source}")
        handler(msg)

    def hold(self, source: int) -> None:
        """Keep messages from ``source`` (in order) until :meth:`release`. Local."""
        self.holding.setdefault(source, time.monotonic())

    def release(self) -> int:
        """Handle every held message, in arrival order, and stop holding. Local."""
        held, self.held = self.held, []
        self.holding.clear()
        for msg in held:
            self._dispatch(msg)
        return len(held)

    def held_since(self) -> float | None:
        """When the oldest hold began (``time.monotonic``), or None."""
        return min(self.holding.values(), default=None)

    def serve(self) -> None:
        """Run passes until every peer is done, then one last commit pass. Blocks; see
        the module docstring for why it cannot block forever."""
        idle = 0
        while not self.finished:
            if self.step():
                idle = 0
            else:
                idle += 1
                if idle > 20:
                    time.sleep(min(self.poll_interval_s * (idle - 20), 0.0005))
        for s in self.shards:
            s.poll()
        for ext in self.extensions:
            ext.finish()
