"""Where a learner draws and gathers one shard's rows: the :class:`ShardSource` strategy
of the draw and gather stages of :class:`~conduit_hpc.plane.delivery.Deliverer`.

A tier is a strategy of these stages, not a special case of each: the Deliverer holds
one source per shard it reads and asks it, for every batch, for the shard's statistics,
to draw the shard's share of the targets, and to put the drawn rows into the batch.

* :class:`HostSource` - a ring in a buffer's memory: statistics from the ring's header;
  drawn here by searching the owner's index in this node's shared memory (when the
  sampler allows and this process maps it) or else by the owner (``draw`` returns
  ``None``: the Deliverer asks it); rows filled by the fetch strategy
  (:mod:`~conduit_hpc.plane.fetch`: copied and checked here, or sent by the owner).
* :class:`~conduit_hpc.plane.device_tier.DeviceShard` - a ``learner_gpu`` shard
  mirrored on the learner's device: statistics from a sync, drawn and gathered on the
  device, priority updates applied there at once.

Promotion and demotion (:mod:`~conduit_hpc.plane.device_policy`) swap a shard's source
(:meth:`Deliverer.place <conduit_hpc.plane.delivery.Deliverer.place>`); a part already
drawn keeps the source that drew it until it is filled.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Container, Mapping
from typing import Any

import numpy as np

from conduit_hpc.protocol import SampleReply
from conduit_hpc.sampling import ShardStats
from conduit_hpc.storage.layout import H_HELD, H_MIN, H_TOTAL
from conduit_hpc.storage.ring import ShardRing
from conduit_hpc.wait import Hosts

__all__ = ["Fill", "HostSource", "ShardSource", "unanswered"]

#: the fetch strategy's fill: puts rows a..b of a batch into its flat columns (from the
#: reply's bytes, or gathered) - ``fill(a, b, rows, indices, mass, flat)``
Fill = Callable[[int, int, np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]], None]


class ShardSource(abc.ABC):
    """One shard's draw and gather for a learner (see the module docstring). Used by
    the one thread that uses its Deliverer."""

    shard_id: int
    #: the owner whose index this rank searches in shared memory (its acknowledgements
    #: are waited for before statistics are read), or ``None``
    searched_owner: int | None = None
    #: priority updates are also applied here, at once (a device mirror)
    local_updates: bool = False

    @abc.abstractmethod
    def stats(self, head: np.ndarray) -> ShardStats:
        """The shard's statistics to sample with (``head``: its ring header, just read)."""

    @abc.abstractmethod
    def draw(self, targets: np.ndarray, owner_sends: bool) -> SampleReply | None:
        """The rows for ``targets`` (mass offsets in ``[0, stats.total)``), drawn here,
        or ``None``: the owner is asked (``owner_sends``: the fetch strategy has owners
        send the rows, so a host index is not searched here)."""

    @abc.abstractmethod
    def fill(self, fill: Fill, a: int, b: int, rep: SampleReply, rows: np.ndarray,
             indices: np.ndarray, mass: np.ndarray, flat: dict[str, np.ndarray],
             host: bool) -> tuple[np.ndarray, dict[str, Any]] | None:
        """Put batch rows ``a .. b`` (drawn as ``rep``; ``rows``: bytes that came with a
        reply) into ``flat`` with the fetch strategy's ``fill``, or return (positions,
        columns on the device) for rows that stay on the device (``host``: a transform
        needs every row in ``flat``)."""

    def update(self, slots: np.ndarray, gens: np.ndarray, priorities: np.ndarray) -> None:
        """Apply priority updates here (only where :attr:`local_updates`)."""
        raise NotImplementedError(f"shard {self.shard_id}: no local priority updates")


class HostSource(ShardSource):
    """A shard in a buffer's memory (see the module docstring).

    Args:
        shard_id (int): the shard.
        ring (ShardRing): its ring client.
        owner (int): the owner's rank.
        searchable (bool): this rank may search the owner's index (the sampler searches
            directly and this process maps the owner's memory and acknowledgements).
        await_applied (Callable[[int], None]): waits (bounded) until an owner applied
            this learner's updates that a search must see.
    """

    def __init__(self, shard_id: int, ring: ShardRing, owner: int, *, searchable: bool,
                 await_applied: Callable[[int], None]) -> None:
        self.shard_id, self.ring, self.owner = int(shard_id), ring, int(owner)
        self.searched_owner = self.owner if searchable else None
        self._await = await_applied

    def stats(self, head: np.ndarray) -> ShardStats:
        f = head.view(np.float64)
        return ShardStats(total=float(f[H_TOTAL]), count=int(head[H_HELD]),
                          min=float(f[H_MIN]))

    def draw(self, targets: np.ndarray, owner_sends: bool) -> SampleReply | None:
        if owner_sends or self.searched_owner is None:
            return None
        self._await(self.owner)
        ring = self.ring
        found = ring.search(targets)
        if found is None:
            return None
        slots, gens, mass, held, total, mn = found
        ring.mark_sampled(slots, gens)
        return SampleReply(0, self.shard_id, slots, gens, mass, held, total, mn)

    def fill(self, fill: Fill, a: int, b: int, rep: SampleReply, rows: np.ndarray,
             indices: np.ndarray, mass: np.ndarray, flat: dict[str, np.ndarray],
             host: bool) -> None:
        fill(a, b, rows, indices, mass, flat)
        return None


def unanswered(hosts: Hosts, owners: Mapping[int, int], asked: Mapping[int, int],
               got: Container[int]) -> str:
    """For a timeout's message (made only then, maybe on another thread than the one
    waiting): the owners of the shards asked for (request id -> shard id) whose request
    id is not in ``got``, each by world rank and (across hosts) host; ``""``: none."""
    by_owner: dict[int, list[int]] = {}
    for sid in sorted({s for i, s in tuple(asked.items()) if i not in got}):
        by_owner.setdefault(owners[sid], []).append(sid)
    return "" if not by_owner else "no reply yet from " + "; ".join(
        f"{hosts.rank(o)}, the owner of shard{'s' if len(s) > 1 else ''} "
        f"{', '.join(map(str, s))}" for o, s in by_owner.items())
