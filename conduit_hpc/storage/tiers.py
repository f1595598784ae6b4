"""Memory tiers behind one interface, and exact prioritized sampling across them.

Plain numpy here; no MPI, no torch at import. A *tier store* holds rows of one spec in
one kind of memory, each row with a job-wide row id and a priority:

* ``buffer_host`` and ``learner_host``: :class:`~conduit_hpc.storage.windowstore.
  WindowStore` - a shard ring in a transport segment (an RMA window: on the buffer rank,
  or on a buffer rank of the learner's node; see :mod:`conduit_hpc.plane.planning`) with
  its owner's :class:`~conduit_hpc.storage.PriorityIndex`;
* ``learner_gpu``: :class:`~conduit_hpc.storage.device.DeviceStore` - torch tensors on
  the learner's device with a device-side priority index (cumulative masses searched
  with ``torch.searchsorted``), so its rows are drawn, gathered and re-prioritised on
  the device.

:class:`TierStore` is the interface; :class:`TieredReplay` composes stores into one
replay: a row id directory (where each row is), global prioritized sampling that is
exact across tiers (a row is drawn with probability ``mass / total mass of every tier``),
priority updates that follow a row that moved, and moves between tiers (promotion of the
hottest rows to the fastest tier, demotion of the coldest) that lose and duplicate
nothing: a move takes rows out of one store only once the other has room, and puts them
in with their current priority and id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from conduit_hpc.storage.priority import check_priorities

__all__ = ["TIER_ORDER", "TierStore", "TieredBatch", "TieredReplay", "move_between"]

#: fastest first: where a learner reads cheapest
TIER_ORDER = ("learner_gpu", "learner_host", "buffer_host")


@runtime_checkable
class TierStore(Protocol):
    """Rows of one tier. Slots are the store's own addresses (``0 .. capacity-1``);
    ``ids`` are the job's row ids (int64, >= 0), carried with the row when it moves.
    Arrays are numpy for host stores, torch tensors on the device for the device store
    (``search``/``gather``/``update`` take and give the store's kind); ``to_host``
    converts for callers that mix them."""

    tier: str
    capacity: int

    def held(self) -> int:
        """Rows held."""
        ...

    def free(self) -> int:
        """Rows an insert takes now without evicting one held."""
        ...

    def total(self) -> float:
        """Sum of ``priority ** alpha`` over held rows."""
        ...

    def insert(self, rows: Mapping[str, Any], ids: Any, priorities: Any) -> Any:
        """Store rows; returns their slots. Raises ``ValueError`` when ``len > free()``
        (nothing stored)."""
        ...

    def search(self, targets: Any) -> Any:
        """Slots for mass targets in ``[0, total())``: slot ``i`` for the targets that
        fall in its interval of the cumulative masses (exact prioritized draw)."""
        ...

    def gather(self, slots: Any) -> dict[str, Any]:
        ...

    def ids_at(self, slots: Any) -> Any:
        """Row ids at ``slots`` (-1 where nothing is held)."""
        ...

    def priorities(self, slots: Any) -> Any:
        ...

    def masses(self, slots: Any) -> Any:
        """``priority ** alpha`` at ``slots``: what the draw is proportional to."""
        ...

    def update(self, slots: Any, ids: Any, priorities: Any) -> Any:
        """New priorities where ``slots`` still hold ``ids``; returns the applied mask."""
        ...

    def take(self, slots: Any) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Remove held rows (for a move): their columns, ids and priorities, host arrays."""
        ...

    def held_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every held row: slots, ids and priorities (host arrays, any order)."""
        ...

    def to_host(self, x: Any) -> np.ndarray:
        ...


def move_between(src: TierStore, dst: TierStore, slots: np.ndarray) -> tuple[np.ndarray,
                                                                               np.ndarray]:
    """Move the rows held at ``slots`` of ``src`` into ``dst``: nothing is taken unless
    ``dst`` has room for all of them, and each row keeps its id and priority.

    Returns:
        tuple: (ids moved, their slots in ``dst``).

    Raises:
        ValueError: ``dst`` has fewer free slots than rows to move (nothing moved).
    """
    slots = np.unique(np.asarray(slots, np.int64))
    if len(slots) > dst.free():
        raise ValueError(f"cannot move {len(slots)} rows from {src.tier} to {dst.tier}: "
                         f"it has room for {dst.free()}")
    rows, ids, prio = src.take(slots)
    new = dst.to_host(dst.insert(rows, ids, prio))
    return ids, new


@dataclass(frozen=True, slots=True)
class TieredBatch:
    """Rows drawn across tiers.

    Attributes:
        data (dict[str, Any]): columns, torch tensors on the replay's device (numpy when
            the replay has no device).
        ids (np.ndarray): row id of each row.
        tiers (np.ndarray): index of the tier each row came from (``replay.stores``).
        slots (np.ndarray): its slot there.
        probabilities (np.ndarray): the probability each row had of being drawn in one
            draw: ``mass / total``.
    """

    data: dict[str, Any]
    ids: np.ndarray
    tiers: np.ndarray
    slots: np.ndarray
    probabilities: np.ndarray


class TieredReplay:
    """One replay over several tier stores, fastest first.

    Args:
        stores (Sequence[TierStore]): the stores, fastest first (see
            :data:`TIER_ORDER`); their tiers must differ.
        device (str | None): where :meth:`sample` assembles batches (a torch device:
            ``cuda:0``, ``cpu``); ``None`` leaves them numpy.
        seed (int): sampling seed.
    """

    def __init__(self, stores: Sequence[TierStore], *, device: str | None = None,
                 seed: int = 0) -> None:
        tiers = [s.tier for s in stores]
        if not stores or len(set(tiers)) != len(tiers):
            raise ValueError(f"stores must be one per tier, at least one, got {tiers}")
        self.stores = list(stores)
        self.device = device
        self.rng = np.random.default_rng(seed)
        self.where: dict[int, tuple[int, int]] = {}  # row id -> (store, slot)
        self.late_updates = 0  # updates that followed a moved row
        self.dropped_updates = 0  # updates for rows no longer held
        self.moved_rows = 0

    # -- rows in -----------------------------------------------------------------
    def insert(self, tier: int, rows: Mapping[str, np.ndarray], ids: np.ndarray,
               priorities: np.ndarray) -> None:
        """Rows into store ``tier`` (the plan's choice). Raises ``ValueError`` for a
        duplicate id or when the store has no room (nothing stored)."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        if len(np.unique(ids)) != len(ids) or any(int(i) in self.where for i in ids):
            raise ValueError("row ids must be new and distinct")
        if (ids < 0).any():
            raise ValueError("row ids must be >= 0")
        p = check_priorities(priorities)
        slots = self.stores[tier].to_host(self.stores[tier].insert(rows, ids, p))
        for i, s in zip(ids.tolist(), slots.tolist(), strict=True):
            self.where[i] = (tier, s)

    @property
    def held(self) -> int:
        return len(self.where)

    def totals(self) -> np.ndarray:
        """Each store's total mass (one scalar from the device per device store)."""
        return np.asarray([s.total() for s in self.stores], np.float64)

    # -- sampling ------------------------------------------------------------------
    def draw(self, k: int, *, stratified: bool = True) -> tuple[np.ndarray, np.ndarray,
                                                                 np.ndarray]:
        """``k`` draws, each row with probability ``mass / total`` over every tier:
        global targets in ``[0, total)`` (stratified: one per ``total / k`` stratum;
        else independent), each answered by the store whose range of the cumulative
        masses it falls in. Returns (store index, slot, probability) per draw.

        Raises:
            ValueError: nothing to draw (every store's mass is 0).
        """
        totals = self.totals()
        total = float(totals.sum())
        if k <= 0 or total <= 0:
            raise ValueError(f"cannot draw {k} rows from a replay of total mass {total}")
        u = self.rng.random(k)
        targets = (np.arange(k) + u) * (total / k) if stratified else u * total
        edges = np.concatenate([[0.0], np.cumsum(totals)])
        which = np.clip(np.searchsorted(edges, targets, side="right") - 1, 0,
                        len(self.stores) - 1)
        while (totals[which] <= 0).any():  # float edge: a target on an empty store
            bad = totals[which] <= 0
            which[bad] = np.flatnonzero(totals > 0)[-1]
        slots = np.empty(k, np.int64)
        prob = np.empty(k)
        for j, store in enumerate(self.stores):
            sel = np.flatnonzero(which == j)
            if not len(sel):
                continue
            t = np.clip(targets[sel] - edges[j], 0.0, np.nextafter(totals[j], 0.0))
            s = store.to_host(store.search(store_prio(store, t)))
            slots[sel] = s
            prob[sel] = store.to_host(store.masses(store_slots(store, s))) / total
        return which, slots, prob

    def sample(self, k: int, *, stratified: bool = True) -> TieredBatch:
        """Draw ``k`` rows (:meth:`draw`) and gather them, assembled on ``device``."""
        which, slots, prob = self.draw(k, stratified=stratified)
        ids = np.empty(k, np.int64)
        parts: list[tuple[np.ndarray, dict[str, Any]]] = []
        for j, store in enumerate(self.stores):
            sel = np.flatnonzero(which == j)
            if not len(sel):
                continue
            ids[sel] = store.to_host(store.ids_at(store_slots(store, slots[sel])))
            parts.append((sel, store.gather(store_slots(store, slots[sel]))))
        return TieredBatch(_assemble(parts, k, self.device), ids, which, slots, prob)

    # -- priorities ----------------------------------------------------------------
    def update(self, batch: TieredBatch, priorities: np.ndarray) -> None:
        """New priorities for a batch's rows: in place where the row is still where it
        was drawn, else where it moved to (late updates follow the row); updates for
        rows no longer held are dropped and counted."""
        p = check_priorities(priorities)
        if len(p) != len(batch.ids):
            raise ValueError(f"{len(p)} priorities for a batch of {len(batch.ids)}")
        followed: list[int] = []
        for j, store in enumerate(self.stores):
            sel = np.flatnonzero(batch.tiers == j)
            if not len(sel):
                continue
            ok = store.to_host(store.update(store_slots(store, batch.slots[sel]),
                                            store_ids(store, batch.ids[sel]),
                                            store_prio(store, p[sel])))
            followed += sel[~ok.astype(bool)].tolist()
        for i in followed:
            loc = self.where.get(int(batch.ids[i]))
            if loc is None:
                self.dropped_updates += 1
                continue
            store = self.stores[loc[0]]
            store.update(store_slots(store, np.asarray([loc[1]])),
                         store_ids(store, batch.ids[i:i + 1]), store_prio(store, p[i:i + 1]))
            self.late_updates += 1

    # -- moves ---------------------------------------------------------------------
    def move(self, src: int, dst: int, ids: np.ndarray) -> int:
        """Move rows (by id) from store ``src`` to store ``dst``. Returns rows moved.

        Raises:
            ValueError: an id not held in ``src``, or ``dst`` has no room (nothing moved).
        """
        ids = np.unique(np.asarray(ids, np.int64))
        locs = [self.where.get(int(i)) for i in ids]
        if any(loc is None or loc[0] != src for loc in locs):
            raise ValueError(f"rows {ids.tolist()} are not all held in store {src}")
        slots = np.asarray([loc[1] for loc in locs if loc is not None], np.int64)
        moved, new = move_between(self.stores[src], self.stores[dst], slots)
        for i, s in zip(moved.tolist(), new.tolist(), strict=True):
            self.where[i] = (dst, s)
        self.moved_rows += len(moved)
        return len(moved)

    def rebalance(self, max_rows: int) -> tuple[int, int]:
        """Hottest rows to the fastest store: for each pair of adjacent stores, swap up
        to ``max_rows`` of the slower store's hottest rows with the faster store's
        coldest ones where the slow row is hotter (demote first, into the room the
        slower store has, then promote). Returns (promoted, demoted)."""
        up = down = 0
        for fast in range(len(self.stores) - 1):
            slow = fast + 1
            fast_store, slow_store = self.stores[fast], self.stores[slow]
            _, f_ids, f_p = fast_store.held_rows()
            _, s_ids, s_p = slow_store.held_rows()
            o = np.lexsort((s_ids, -s_p))[:max_rows]  # hottest first
            hot, hot_p = s_ids[o], s_p[o]
            o = np.lexsort((f_ids, f_p))  # coldest first
            cold, cold_p = f_ids[o], f_p[o]
            n_in = min(len(hot), fast_store.free())  # straight into free room
            swaps = 0
            while (n_in + swaps < len(hot) and swaps < len(cold)
                   and hot_p[n_in + swaps] > cold_p[swaps]):
                swaps += 1
            swaps = min(swaps, slow_store.free())  # demoted rows need room below
            if swaps:
                down += self.move(fast, slow, cold[:swaps])
            if n_in + swaps:
                up += self.move(slow, fast, hot[:n_in + swaps])
        return up, down

    def audit(self) -> dict[int, tuple[int, float]]:
        """Every held row: id -> (store, priority), from the stores themselves (not the
        directory); raises ``AssertionError`` if a row is held twice or the directory
        disagrees."""
        out: dict[int, tuple[int, float]] = {}
        for j, store in enumerate(self.stores):
            slots, ids, prio = store.held_rows()
            for s, i, p in zip(slots.tolist(), ids.tolist(), prio.tolist(), strict=True):
                assert i not in out, f"row {i} held twice"
                assert self.where.get(i) == (j, s), f"row {i}: directory {self.where.get(i)}"
                out[i] = (j, p)
        assert len(out) == len(self.where), "the directory lists rows no store holds"
        return out


def store_slots(store: TierStore, slots: np.ndarray) -> Any:
    """Slots in the store's kind (a device tensor for a device store)."""
    conv = getattr(store, "from_host", None)
    return conv(np.asarray(slots, np.int64)) if conv else np.asarray(slots, np.int64)


def store_ids(store: TierStore, ids: np.ndarray) -> Any:
    return store_slots(store, ids)


def store_prio(store: TierStore, p: np.ndarray) -> Any:
    conv = getattr(store, "from_host", None)
    return conv(np.asarray(p, np.float64)) if conv else np.asarray(p, np.float64)


def _assemble(parts: list[tuple[np.ndarray, dict[str, Any]]], k: int,
              device: str | None) -> dict[str, Any]:
    """Columns of every part in draw order: torch on ``device`` (host parts copied
    there, device parts stay), or numpy without a device."""
    if device is None:
        out: dict[str, Any] = {}
        for sel, cols in parts:
            for name, c in cols.items():
                arr = np.asarray(c.cpu()) if hasattr(c, "cpu") else np.asarray(c)
                if name not in out:
                    out[name] = np.empty((k, *arr.shape[1:]), arr.dtype)
                out[name][sel] = arr
        return out
    import torch

    dev = torch.device(device)
    tout: dict[str, Any] = {}
    for sel, cols in parts:
        idx = torch.as_tensor(sel, device=dev)
        for name, c in cols.items():
            t = c.to(dev, non_blocking=True) if isinstance(c, torch.Tensor) else \
                torch.from_numpy(np.ascontiguousarray(c)).to(dev, non_blocking=True)
            if name not in tout:
                tout[name] = torch.empty((k, *t.shape[1:]), dtype=t.dtype, device=dev)
            tout[name].index_copy_(0, idx, t)
    return tout
