"""The buffer role: the progress loop that owns shards.

A buffer rank holds shard memory in RMA windows and runs :class:`BufferServer`'s loop:
it advances each shard's commit cursor, makes newly committed rows sampleable in the
shard's :class:`~conduit_hpc.storage.PriorityIndex` (and hides rows that a writer has
been handed for overwriting), and answers messages from other ranks. With the MPI
wheels used here, one-sided traffic to a rank only progresses while it is inside MPI;
the loop keeps entering MPI (see ``docs/sharp-bits.md``).

The loop ends when every non-buffer rank has said it is done. It cannot block forever
on a dead peer: a rank that fails raises, and jobs run under ``python -m mpi4py``, which
aborts the whole job on an uncaught exception.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .storage.priority import PriorityIndex
from .storage.ring import ShardRing
from .transport.channel import Channel, Message

__all__ = ["BufferServer", "OwnedShard", "Tag"]


class Tag(enum.IntEnum):
    """Message tags on the data plane's channel."""

    DONE = 1  # a non-buffer rank will send nothing more
    # checkpoints and stopping (conduit_hpc.checkpointing); payloads are JSON bytes
    STOP = 40  # a rank was asked to stop (SIGTERM/SIGUSR1): every rank stops
    CKPT_REQUEST = 41  # any rank -> first buffer rank: please checkpoint
    CKPT_CUT = 42  # first buffer rank -> buffer ranks: cut your shards now
    CKPT_PART = 43  # buffer rank -> first buffer rank: my file is written
    CKPT_MARK = 44  # learner -> every buffer rank: my messages of superstep s are sent


@dataclass(eq=False)
class OwnedShard:
    """A shard this rank owns: its ring client and priority index.

    Attributes:
        shard_id (int): global shard number.
        ring (ShardRing): direct access to the memory.
        index (PriorityIndex): priorities of visible rows.
        hidden_upto (int): seqs below this that lap older rows have had those rows hidden.
    """

    shard_id: int
    ring: ShardRing
    index: PriorityIndex
    hidden_upto: int = 0

    @property
    def committed(self) -> int:
        """Rows committed into this shard since it was created (or restored)."""
        assert self.ring.views is not None
        return int(self.ring.views.header[1])

    def poll(self) -> int:
        """Advance commits and update the index. Returns rows made visible."""
        ring, cap = self.ring, self.ring.capacity
        old, new = ring.advance_commits()
        if new > old:
            lo = max(old, new - cap)
            seqs = np.arange(lo, new, dtype=np.int64)
            slots = seqs % cap
            assert ring.views is not None
            self.index.insert(slots, seqs + 1, ring.views.priority[slots])
        # hide rows a writer has been handed for overwriting (seq q overwrites q - cap)
        reserved = ring.reserve_cursor()
        lo = max(self.hidden_upto, new, cap)
        if reserved > lo:
            seqs = np.arange(lo, reserved, dtype=np.int64)
            slots = seqs % cap
            stale = self.index.gens[slots] == seqs - cap + 1
            self.index.invalidate(slots[stale])
        self.hidden_upto = max(self.hidden_upto, reserved)
        return new - old


class BufferServer:
    """Progress loop of a buffer rank.

    Args:
        shards (list[OwnedShard]): the shards this rank owns.
        channel (Channel): the data plane's message channel.
        peers (tuple[int, ...]): channel ranks that will each send :attr:`Tag.DONE`.
        poll_interval_s (float): longest sleep between passes when idle.
    """

    def __init__(self, shards: list[OwnedShard], channel: Channel, peers: tuple[int, ...],
                 *, poll_interval_s: float = 0.0002) -> None:
        self.shards = shards
        self.channel = channel
        self.waiting_for = set(peers)
        self.poll_interval_s = poll_interval_s
        self.handlers: dict[int, Callable[[Message], None]] = {Tag.DONE: self._on_done}
        #: called once per pass after the commits (e.g. the checkpoint agent); each
        #: returns work done and must not block
        self.hooks: list[Callable[[], int]] = []
        self.passes = 0

    def _on_done(self, msg: Message) -> None:
        self.waiting_for.discard(msg.source)

    @property
    def finished(self) -> bool:
        """True once every peer said it is done."""
        return not self.waiting_for

    def step(self) -> int:
        """One pass: commits, index, then every pending message. Returns work done.
        Local; never blocks."""
        work = sum(s.poll() for s in self.shards)
        while (msg := self.channel.poll()) is not None:
            handler = self.handlers.get(msg.tag)
            if handler is None:
                raise RuntimeError(f"buffer got a message with unknown tag {msg.tag} "
                                   f"from rank {msg.source}")
            handler(msg)
            work += 1
        for hook in self.hooks:
            work += hook()
        self.passes += 1
        return work

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
                    time.sleep(min(self.poll_interval_s * (idle - 20), 0.002))
        for s in self.shards:
            s.poll()
