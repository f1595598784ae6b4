"""The ``learner_gpu`` tier in a running job: a shard mirrored, slot for slot, in its
learner's device memory.

A ``learner_gpu`` shard of the executed plan is a ring like any other: actors write it by
the plan's row weights, and a buffer rank on the learner's node owns it (commits, the
guard band, overwrite accounting, checkpoints; :func:`~conduit_hpc.plane.planning.
executable` picks that rank). The one learner that reads it keeps every live row of it
in a :class:`~conduit_hpc.storage.device.DeviceStore` on the learner's device (``cuda:i``;
the CPU here) **in the same slot**, so the ring's FIFO eviction is the device tier's too.
The learner's data-plane thread, the only user of a :class:`DeviceShard`:

* **syncs** before each batch's statistics are read (:meth:`DeviceShard.sync`): rows
  committed since the last sync are copied in from the node's shared memory, each with
  the mass the owner's index gives it (its initial priority, or the priority restored
  from a checkpoint); rows whose slot the ring has handed to a writer since (``seq +
  capacity`` below the reserve and free cursors: the ring's FIFO eviction) are dropped.
  A row enters the device once (an id, ``seq + 1``, is put at most once: the sync cursor
  only moves forward) and leaves once. (The owner hides a row from its own index a few
  rows earlier, by its guard band against torn reads; a device copy cannot be torn, so
  the device keeps the row until its slot is actually handed on);
* **draws** the shard's share of a batch on the device: the sampler's stratified targets
  that fall in this shard (its total mass is the device's) are searched in the device's
  cumulative masses (``torch.searchsorted``), so global prioritized sampling over host
  and device shards stays one exact draw; rows are gathered with ``index_select`` and
  written into the batch on the device (:meth:`~conduit_hpc.plane.staging.Stager.
  to_device`), with no host copy of the rows;
* **updates** priorities on the device at once (no round trip); the same update is also
  sent to the owner as for any shard (a write-back, never waited for by the draw), so the
  owner's index mirrors the device's - checkpoints, overwrite accounting and a restored
  job's first sync then need nothing special.

What a sync costs: one read of the commit cursor and free cursor, one seqlocked read of
the new rows' index leaves, one copy of the new rows (numpy -> device), and one masked
pass over the device ids when the free cursor moved.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from conduit_hpc.plane.sources import Fill, ShardSource
from conduit_hpc.protocol import SampleReply
from conduit_hpc.sampling import ShardStats
from conduit_hpc.storage.layout import H_FREE
from conduit_hpc.storage.ring import ShardRing

if TYPE_CHECKING:
    import torch

__all__ = ["DeviceShard"]


class DeviceShard(ShardSource):
    """One ``learner_gpu`` shard on its learner's device (see the module docstring): the
    device tier's :class:`~conduit_hpc.plane.sources.ShardSource`. Not thread-safe: the
    learner's data-plane thread uses it.

    Args:
        shard_id (int): the shard.
        ring (ShardRing): its ring client; this process must map the owner's memory.
        alpha (float): the sampler's priority exponent (the owner's index uses it too).
        device (str | torch.device): the learner's device.
        seed (int): seed of the device store's generator.

    Raises:
        RuntimeError: the ring's memory is not mapped here (the owner is on another node).
    """

    def __init__(self, shard_id: int, ring: ShardRing, *, alpha: float,
                 device: str | torch.device, seed: int = 0) -> None:
        from conduit_hpc.storage.device import DeviceStore

        if ring.views is None:
            raise RuntimeError(f"learner_gpu shard {shard_id}: its ring (rank {ring.owner}) "
                               f"must be in this node's shared memory")
        self.shard_id, self.ring, self.capacity = int(shard_id), ring, ring.capacity
        self.store = DeviceStore(ring.layout.spec, ring.capacity, alpha=alpha, device=device,
                                 seed=seed)
        self.synced = 0  # every seq below this was put on the device, or skipped
        self._gate = 0  # the free cursor the last eviction pass used
        self._stats = ShardStats(0.0, 0, math.inf)
        self.rows_in = 0  # rows put on the device
        self.evicted = 0  # ... dropped again because the ring handed their slot on
        self.missed = 0  # committed rows overwritten before a sync saw them
        self.drawn = 0  # rows drawn from the device

    # -- keeping up with the ring ----------------------------------------------------
    def _writer_gate(self) -> int:
        """The first seq a writer may have been handed and let write: the reserve cursor,
        or the free cursor when that is smaller (0: not managed yet) - the ring's
        intact rule (:meth:`~conduit_hpc.storage.ring.ShardRing.gather`)."""
        ring = self.ring
        assert ring.views is not None
        reserved = ring.reserve_cursor()
        ring.transport.sync()
        free = int(ring.views.header[H_FREE])
        return min(reserved, free) if free else reserved

    def sync(self) -> ShardStats:
        """Put rows committed since the last sync on the device and drop rows whose slot
        was handed to a writer; returns the shard's statistics for sampling. Local;
        never blocks (the index read retries only while the owner writes it)."""
        ring, cap = self.ring, self.capacity
        commit = ring.commit_cursor()  # first: rows below it are committed
        gate = self._evict()  # before any put: a slot's old row leaves before its new one
        lo = max(self.synced, commit - cap, gate - cap, 0)
        if commit > lo:
            seqs = np.arange(lo, commit, dtype=np.int64)
            slots = seqs % cap
            gens, mass = ring.leaves(slots)
            ok = gens == seqs + 1  # indexed (not yet: the owner is mid-pass; 0: hidden)
            if ok.any():
                last = int(np.flatnonzero(ok)[-1])
                self.missed += int(np.count_nonzero(~ok[:last]))  # hidden, overwritten
                take = np.flatnonzero(ok[:last + 1])
                rows, cursor = ring.gather(slots[take])
                intact = ring.intact(seqs[take] + 1, cursor)  # no writer touched them
                keep = take[intact]
                self.missed += int(np.count_nonzero(~intact))
                if len(keep) < len(take):
                    rows = {k: v[intact] for k, v in rows.items()}
                self.store.put(slots[keep], rows, seqs[keep] + 1, mass[keep])
                self.rows_in += len(keep)
                self.synced = lo + last + 1
        self._evict()  # rows handed to a writer while they were copied
        self._stats = self._read_stats()
        return self._stats

    def _evict(self) -> int:
        """Drop the rows whose slot the ring has handed to a writer; returns the gate."""
        gate, cap = self._writer_gate(), self.capacity
        if gate > self._gate:
            # a row of seq q is gone once q + capacity < gate: its id q + 1 <= gate - cap.
            # Rows below the last gate are gone already and none is put below a gate, so
            # only the seqs between the two gates' laps can hold such rows
            lo = max(self._gate - cap, gate - 2 * cap, 0)
            slots = np.arange(lo, max(gate - cap, lo), dtype=np.int64) % cap
            self.evicted += self.store.evict_ids_below(gate - cap + 1, slots)
            self._gate = gate
        return gate

    def _read_stats(self) -> ShardStats:
        import torch

        st = self.store
        vals = torch.stack([st.total_tensor(), st.min_tensor()]).cpu().numpy()
        return ShardStats(total=float(vals[0]), count=st.held(), min=float(vals[1]))

    @property
    def last_stats(self) -> ShardStats:
        """What the last :meth:`sync` (or update) left."""
        return self._stats

    # -- the ShardSource stages ----------------------------------------------------------
    local_updates = True

    def stats(self, head: np.ndarray) -> ShardStats:
        """Sync (the ring header is not needed: the device's statistics are exact)."""
        return self.sync()

    def fill(self, fill: Fill, a: int, b: int, rep: SampleReply, rows: np.ndarray,
             indices: np.ndarray, mass: np.ndarray, flat: dict[str, np.ndarray],
             host: bool) -> tuple[np.ndarray, dict[str, Any]] | None:
        """The rows stay on the device, written into the batch there; with ``host``
        (a transform works on numpy) they come to the host."""
        cols = self.gather(rep.slots)
        if not host:
            return np.arange(a, b), cols
        for k, v in cols.items():
            flat[k][a:b] = v.cpu().numpy().view(flat[k].dtype)
        return None

    # -- a batch's share -----------------------------------------------------------------
    def draw(self, targets: np.ndarray, owner_sends: bool = False) -> SampleReply:
        """Rows for ``targets`` (mass offsets in ``[0, stats.total)``, as the sampler
        drew them over the statistics of the last sync): their slots, generations and
        masses, found on the device; the rows are marked drawn in the ring (for the
        owner's overwrite accounting). Always drawn here, whatever the fetch strategy
        (``owner_sends``)."""
        import torch

        st = self.store
        total = st.total_tensor()
        t = torch.as_tensor(np.asarray(targets, np.float64), device=st.device)
        t = torch.minimum(t, torch.nextafter(total, total.new_zeros(())))
        slots = st.search(t)
        out = torch.stack([slots, st.ids.index_select(0, slots)]).cpu().numpy()
        mass = st.mass.index_select(0, slots).cpu().numpy()
        self.ring.mark_sampled(out[0], out[1])
        self.drawn += len(targets)
        s = self._stats
        return SampleReply(0, self.shard_id, out[0], out[1], mass, s.count, s.total, s.min)

    def gather(self, slots: np.ndarray) -> dict[str, Any]:
        """The rows at ``slots`` as device tensors (``index_select``)."""
        return self.store.gather(np.asarray(slots, np.int64))

    def update(self, slots: np.ndarray, gens: np.ndarray, priorities: np.ndarray) -> None:
        """New priorities where ``slots`` still hold generations ``gens``, on the device
        without a host synchronisation (rows since evicted are skipped)."""
        self.store.update(slots, gens, priorities)
