"""The priority write: a learner's (or its delivery rank's) priority updates, carried to
where each row's index lives, and the wait that a staleness-0 batch makes for them.

:class:`PriorityWrite` is the one owner of this stage of delivery:

* shards in this node's shared memory (a
  :class:`~conduit_hpc.storage.shared_index.SharedIndexWriter` each): the update is
  written into the shard's index here and now, under the index lock - no message, no
  round trip, nothing to wait for before the next batch;
* other shards (another node, ``transport.shared_memory = "never"``, the sequence
  sampler, or a feature whose buffer extension must see every update): one message per
  shard to its owner, who applies it and counts it in shared memory (the
  acknowledgements a direct search waits for, :meth:`PriorityWrite.await_applied`).

Order is kept per owner: once a message to an owner is outstanding, the next updates
for its shards go as messages too until it has applied them (so a later direct write
never overtakes an earlier message); :meth:`PriorityWrite.through_owners` forces the
next ones through the owners (a checkpoint's marker: the owner holds what follows it
until its cut). Not thread-safe: one thread uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from conduit_hpc.protocol import PriorityUpdate, Tag
from conduit_hpc.storage import tree_kernels
from conduit_hpc.transport.channel import Channel
from conduit_hpc.wait import NO_HOSTS, Hosts, wait_until

if TYPE_CHECKING:
    from conduit_hpc.plane.device_tier import DeviceShard
    from conduit_hpc.storage.shared_index import SharedIndexWriter

__all__ = ["PriorityWrite"]


class PriorityWrite:
    """See the module docstring.

    Args:
        owners (Mapping[int, int]): shard id -> owner rank.
        acks (Mapping[int, np.ndarray]): for owners whose memory this process maps, the
            int64 per-rank count of update messages they applied.
        sync (Callable[[], None]): memory barrier for ``acks``.
        rank (int): this rank (its entry in ``acks``).
        channel (Channel): the data plane's channel.
        writers (Mapping[int, SharedIndexWriter]): shards written here directly.
        timeout_s (float), poll_interval_s (float): bounds of the waits.
        progress (Callable[[], None] | None): enters MPI's progress engine (the
            window's :meth:`~conduit_hpc.transport.rma.RmaWindow.progress`): the wait
            for acknowledgements calls it, as the owner's atomics on its own segment may
            need this rank inside MPI (across nodes, when this rank is its node's
            leader; docs/hosts.md).
    """

    hosts: Hosts = NO_HOSTS  #: each world rank's host, for errors (make_deliverer sets it)

    def __init__(self, *, owners: Mapping[int, int], acks: Mapping[int, np.ndarray],
                 sync: Callable[[], None], rank: int, channel: Channel,
                 writers: Mapping[int, SharedIndexWriter], timeout_s: float,
                 poll_interval_s: float, progress: Callable[[], None] | None = None) -> None:
        self.owners, self.acks, self._sync, self.rank = dict(owners), dict(acks), sync, rank
        self._progress = progress
        self.channel, self.writers = channel, dict(writers)
        self.timeout_s, self.poll_s = timeout_s, poll_interval_s
        self.sent: dict[int, int] = {}  # update messages sent, per owner
        self.required: dict[int, int] = {}  # ... that a batch prepared now must see
        self._acked: dict[int, int] = {}  # ... that the owner is known to have applied
        self._must_message: set[int] = set()
        self.direct_rows = 0  # rows written into node-local indexes
        self.message_rows = 0  # rows sent to owners

    def mark(self) -> None:
        """A superstep ended: batches prepared from now on must see every update so far
        (direct writes are in the index already; messages: see :meth:`await_applied`)."""
        self.required = dict(self.sent)

    def through_owners(self) -> None:
        """Send the next updates to every owner as messages, until each has applied one
        sent after this call. Local."""
        self._must_message = set(self.owners.values())

    def _via_owner(self, owner: int) -> bool:
        if owner in self._must_message:
            return True
        sent = self.sent.get(owner, 0)
        if sent == 0 or self._acked.get(owner, 0) >= sent:
            return False
        acks = self.acks.get(owner)
        if acks is None:
            return True
        self._sync()
        got = int(acks[self.rank])
        if got >= sent:
            self._acked[owner] = got
            return False
        return True

    def send(self, indices: np.ndarray, priorities: np.ndarray,
             device_shards: Mapping[int, DeviceShard]) -> int:
        """Carry checked updates (``[n, 3]`` shard, slot, generation) where they live (see
        the module docstring); rows of device-tier shards are also applied on the device
        at once. Blocks only for an index lock (bounded). Returns rows carried."""
        for sid, dev in device_shards.items():
            sel = indices[:, 0] == sid
            if sel.any():
                dev.update(indices[sel, 1], indices[sel, 2], priorities[sel])
        # one shard - the only one this learner reads (every row's shard was checked),
        # or the only one in these rows: no sort, no split
        if len(self.owners) == 1 or _one_shard(indices):
            parts = [(indices, priorities)]
        else:
            order = np.argsort(indices[:, 0], kind="stable")
            idx, pr = indices[order], priorities[order]
            cuts = np.flatnonzero(np.diff(idx[:, 0])) + 1
            parts = list(zip(np.split(idx, cuts), np.split(pr, cuts), strict=True))
        for part, p in parts:
            sid = int(part[0, 0])
            owner = self.owners[sid]
            writer = self.writers.get(sid)
            if writer is not None and not self._via_owner(owner):
                writer.apply(part[:, 1], part[:, 2], p)
                self.direct_rows += len(part)
                continue
            up = PriorityUpdate(sid, part[:, 1], part[:, 2], p)
            self.channel.isend(owner, Tag.PRIORITY, up.pack())
            self.sent[owner] = self.sent.get(owner, 0) + 1
            self.message_rows += len(part)
            self._must_message.discard(owner)
        return len(indices)

    def await_applied(self, owner: int) -> None:
        """Wait (bounded) until ``owner`` has applied the messages :attr:`required`
        (at once when none is outstanding). Spins, then yields the processor (the owner
        may need this core) and drives MPI progress (a large update moves only while its
        sender is inside MPI; across nodes the owner's atomics on its own segment may
        wait for this rank to enter MPI, see ``progress``); never a fixed sleep on the
        way."""
        need = self.required.get(owner, 0)
        if need <= self._acked.get(owner, 0):
            return
        acks = self.acks[owner]
        self._sync()
        if int(acks[self.rank]) < need:
            def applied() -> bool:
                self._sync()
                return int(acks[self.rank]) >= need

            def between() -> None:
                self.channel.progress()
                if self._progress is not None:
                    self._progress()

            wait_until(applied, timeout_s=self.timeout_s, max_sleep_s=self.poll_s,
                       yields=200, between=between,
                       what=f"the owner (rank {owner}{self.hosts.of(owner)}) to apply this "
                            f"learner's priority updates")
        self._acked[owner] = need

    def catch_up(self, owner: int) -> None:
        """Require every message sent so far to ``owner`` and wait until it applied
        them (e.g. before copying its index to a device)."""
        self.required[owner] = max(self.required.get(owner, 0), self.sent.get(owner, 0))
        self.await_applied(owner)


def _one_shard(indices: np.ndarray) -> bool:
    """Whether every row of ``indices`` (``[n, 3]``, n >= 1) names one shard."""
    lo, hi = tree_kernels.span(indices[:, 0])
    return lo == hi
