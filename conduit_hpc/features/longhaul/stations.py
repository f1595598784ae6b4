"""The long-haul buffer-loop extensions (:class:`~conduit_hpc.plane.extensions.BufferExtension`):
:class:`EdgeForwarder` and :class:`EdgeReplayStation` on the edge buffer,
:class:`CloudReceiver` on the cloud buffer. Each runs on its buffer rank's loop thread
and never blocks (sends are ``isend`` on the linked channel).
"""

from __future__ import annotations

import numpy as np

from conduit_hpc.features.longhaul.board import BoardPublisher, LinkCounters
from conduit_hpc.plane.buffer import BufferServer, OwnedShard
from conduit_hpc.plane.extensions import BufferExtension
from conduit_hpc.protocol import Tag
from conduit_hpc.protocol.forward import F_END, forward_message_bytes, pack_forward, unpack_forward
from conduit_hpc.transport.channel import Message
from conduit_hpc.transport.link import LinkedChannel

__all__ = ["CloudReceiver", "EdgeForwarder", "EdgeReplayStation"]




class EdgeForwarder(BufferExtension):
    """``forward``: moves committed rows of the edge ring across the link, oldest first.

    Each pass: if more than ``queue_rows`` committed rows wait, the oldest beyond that
    are dropped (counted); then messages of up to ``forward_rows`` rows are handed to the
    link while it would finish sending them within two message times (so the link never
    idles for want of a message, at most about one waits in it, and nothing queues out of
    sight). A row found overwritten before
    it could be sent is dropped too. When the loop ends, what still waits is counted as
    unsent and an end marker follows the last message. Rows restored from a checkpoint
    are not sent (nor counted): they were the earlier run's.

    Args:
        shard (OwnedShard): the edge ring (this rank owns it).
        channel (LinkedChannel): this rank's channel.
        dest (int): the cloud buffer.
        queue_rows (int), forward_rows (int): see ``[longhaul]``.
        counters (LinkCounters): updated in place.
        publisher (BoardPublisher): publishes them.
        timeout_s (float): bound on releasing the last messages when the loop ends.
        compress (bool): zlib-compress the rows of each message
            (:func:`~conduit_hpc.protocol.forward.pack_forward`); the link is charged
            with the bytes sent, and a message's size is predicted for the pacing from
            the last message's compression ratio.
    """

    def __init__(self, shard: OwnedShard, channel: LinkedChannel, dest: int, *,
                 queue_rows: int, forward_rows: int, counters: LinkCounters,
                 publisher: BoardPublisher, timeout_s: float, compress: bool = False) -> None:
        self.shard, self.link, self.dest = shard, channel, dest
        self.timeout_s = timeout_s
        self.queue_rows, self.forward_rows = queue_rows, forward_rows
        self.c, self.publisher = counters, publisher
        self.spec = shard.ring.layout.spec
        self.next_seq = 0  # oldest committed row neither forwarded nor dropped
        self.finished = False
        self.compress = compress
        self.sent_ratio = 1.0  # sent / nominal bytes of the last message

    def on_pass(self) -> int:
        shard, ch, c = self.shard, self.link, self.c
        # rows a checkpoint restored are an earlier run's: forwarded (the cloud replay
        # restored them too), dropped or unsent there; never sent or counted twice
        self.next_seq = max(self.next_seq, shard.restored_commit)
        commit = shard.committed
        backlog = commit - self.next_seq
        if backlog > self.queue_rows:
            c.rows_dropped += backlog - self.queue_rows
            self.next_seq = commit - self.queue_rows
        cap = shard.ring.capacity
        work = 0
        while self.next_seq < commit:
            k = min(commit - self.next_seq, self.forward_rows)
            nominal = forward_message_bytes(self.spec, k)
            nbytes = max(1, int(nominal * self.sent_ratio))
            if ch.ready_at(nbytes) > ch.clock() + 2 * nbytes / ch.link.params.bytes_per_s:
                break  # the link is busy: the rows wait here, where the bound applies
            seqs = np.arange(self.next_seq, self.next_seq + k, dtype=np.int64)
            slots = seqs % cap
            cols, reserved = shard.ring.gather(slots)
            # torn rows are a prefix (with frame stacks: up to the last torn row)
            bad = np.flatnonzero(~shard.ring.intact(seqs + 1, reserved))
            torn = int(bad[-1]) + 1 if bad.size else 0
            if torn:
                c.rows_dropped += torn
                self.next_seq += torn
                continue
            prio = shard.index.priority[slots].copy()
            msg = pack_forward(self.spec, self.next_seq, prio, cols, compress=self.compress)
            self.sent_ratio = msg.size / nominal
            ch.isend(self.dest, Tag.FORWARD, msg)
            c.forwarded_nominal_bytes += nominal
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
