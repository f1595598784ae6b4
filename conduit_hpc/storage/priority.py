"""Per-shard priority index: sum-tree and min-tree over slots, with generations.

Held by the shard's owner (single writer). A leaf holds ``priority ** alpha`` of the row
committed in that slot, or 0 when the slot is empty, being overwritten, or hidden. Each
leaf remembers the generation (stamp ``seq + 1``) it was set for, so that an update for a
row that has since been overwritten is dropped, never applied to the new row.

A row can be **hidden** (:meth:`PriorityIndex.hide`: the owner's guard band, ahead of
writers that may soon overwrite it) without being removed: it is not drawable (mass 0,
generation 0 in :attr:`gens`), but its generation (:attr:`hidden_gens`) and raw priority
are kept, updates that name it still set its priority, and :meth:`unhide` makes it
drawable again with the priority last given to it.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from conduit_hpc.errors import SpecError
from conduit_hpc.spec import as_array
from conduit_hpc.storage.sumtree import MinTree, SumTree

__all__ = ["PriorityIndex"]


def check_priorities(priorities: ArrayLike, name: str = "priorities") -> np.ndarray:
    """Return priorities as float64, refusing negative, NaN or infinite values.

    Takes what :func:`~conduit_hpc.spec.as_array` takes (numpy, torch tensors, nested
    sequences) of booleans, integers or reals; complex values are refused (never silently
    dropped to their real part).

    Raises:
        SpecError: (a ``ValueError``) naming ``name``: not numbers, complex, or the first
            negative, NaN or infinite value and its position.
    """
    arr = as_array(priorities, name)
    if arr.dtype.kind == "c":
        raise SpecError(f"{name} must be real numbers, got dtype {arr.dtype}")
    p = arr.astype(np.float64, copy=False).reshape(-1)
    bad = ~np.isfinite(p) | (p < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SpecError(f"{name}[{i}] must be finite and >= 0, got {p[i]!r}")
    return p


class PriorityIndex:
    """Priorities of one shard.

    Args:
        capacity (int): slots of the shard.
        alpha (float): exponent applied to priorities (0: uniform).
        initial_priority (float): priority of rows inserted without one before any
            larger priority was seen.
        sum_buffer, gens_buffer (np.ndarray | None): storage for the sum-tree and the
            generations (shared memory, so that node-local learners search directly).
    """

    def __init__(self, capacity: int, *, alpha: float, initial_priority: float = 1.0,
                 sum_buffer: np.ndarray | None = None,
                 gens_buffer: np.ndarray | None = None) -> None:
        self.capacity = int(capacity)
        self.alpha = float(alpha)
        self.sum = SumTree(capacity, sum_buffer)
        self.min = MinTree(capacity)
        # generation each leaf is for (0: nothing to draw there)
        if gens_buffer is None:
            self.gens = np.zeros(capacity, dtype=np.int64)
        else:
            self.gens = gens_buffer
            self.gens[:] = 0
        self.priority = np.zeros(capacity, dtype=np.float64)  # raw priority (before alpha)
        #: generation of each hidden row (0: the slot is not hidden)
        self.hidden_gens = np.zeros(capacity, dtype=np.int64)
        self.max_priority = float(initial_priority)
        self.dropped_updates = 0
        self.applied_updates = 0

    def _scaled(self, p: np.ndarray) -> np.ndarray:
        # p ** 0 would give 1 for p = 0; keep zero priority at zero mass
        return np.where(p > 0, np.power(p, self.alpha), 0.0) if self.alpha != 1 else p

    @property
    def count(self) -> int:
        """Slots that hold a sampleable row."""
        return int(np.count_nonzero(self.gens))

    @property
    def total(self) -> float:
        """Sum of ``priority ** alpha`` over held rows."""
        return self.sum.total

    def insert(self, slots: np.ndarray, gens: np.ndarray, priorities: np.ndarray) -> None:
        """Make rows visible: NaN priorities become the running maximum."""
        slots = np.asarray(slots, dtype=np.int64)
        p = np.array(priorities, dtype=np.float64, copy=True)
        given = ~np.isnan(p)
        p[~given] = self.max_priority  # the maximum seen before this batch
        if given.any():
            check_priorities(p[given])
            self.max_priority = max(self.max_priority, float(p[given].max()))
        self.hidden_gens[slots] = 0
        self._set(slots, np.asarray(gens, dtype=np.int64), p)

    def _set(self, slots: np.ndarray, gens: np.ndarray, p: np.ndarray) -> None:
        self.gens[slots] = gens
        self.priority[slots] = p
        scaled = self._scaled(p)
        self.sum.update(slots, scaled)
        # the min-tree covers rows that can be drawn (mass > 0): it sets the largest
        # importance weight
        self.min.update(slots, np.where((gens > 0) & (scaled > 0), scaled, np.inf))

    def invalidate(self, slots: np.ndarray) -> None:
        """Remove the rows of ``slots`` (taken out, or their slot handed to a writer):
        nothing of them is kept."""
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size:
            self.hidden_gens[slots] = 0
            self._set(slots, np.zeros(len(slots), np.int64), np.zeros(len(slots)))

    def hide(self, slots: np.ndarray) -> int:
        """Make the held rows of ``slots`` undrawable but keep them (generation, raw
        priority; see the module docstring). Returns rows hidden."""
        slots = np.asarray(slots, dtype=np.int64)
        slots = slots[self.gens[slots] > 0]
        if slots.size:
            keep = self.priority[slots].copy()
            self.hidden_gens[slots] = self.gens[slots]
            self._set(slots, np.zeros(len(slots), np.int64), np.zeros(len(slots)))
            self.priority[slots] = keep
        return int(slots.size)

    def unhide(self, slots: np.ndarray, gens: np.ndarray) -> int:
        """Make hidden rows drawable again where the slot still holds generation
        ``gens``, with the priority last given to them. Returns rows made drawable."""
        slots = np.asarray(slots, dtype=np.int64)
        gens = np.asarray(gens, dtype=np.int64)
        ok = (self.hidden_gens[slots] == gens) & (gens > 0)
        slots, gens = slots[ok], gens[ok]
        if slots.size:
            self.hidden_gens[slots] = 0
            self._set(slots, gens, self.priority[slots].copy())
        return int(slots.size)

    def update(self, slots: np.ndarray, gens: np.ndarray, priorities: np.ndarray) -> int:
        """Set new priorities where the slot still holds generation ``gens``.

        Returns:
            int: updates dropped because their row was overwritten.

        Raises:
            ValueError: a negative, NaN or infinite priority (nothing applied).
        """
        p = check_priorities(priorities)
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        gens = np.asarray(gens, dtype=np.int64).reshape(-1)
        if not (len(slots) == len(gens) == len(p)):
            raise ValueError(f"slots, gens and priorities differ in length: "
                             f"{len(slots)}, {len(gens)}, {len(p)}")
        if slots.size and (slots.min() < 0 or slots.max() >= self.capacity):
            raise ValueError(f"slot outside [0, {self.capacity})")
        live = (self.gens[slots] == gens) & (gens > 0)
        hidden = ~live & (self.hidden_gens[slots] == gens) & (gens > 0)
        dropped = int(len(slots) - np.count_nonzero(live) - np.count_nonzero(hidden))
        if live.any():
            self._set(slots[live], gens[live], p[live])
            self.max_priority = max(self.max_priority, float(p[live].max()))
        if hidden.any():  # kept for when the row is drawable again (unhide)
            self.priority[slots[hidden]] = p[hidden]
            self.max_priority = max(self.max_priority, float(p[hidden].max()))
        self.dropped_updates += dropped
        self.applied_updates += len(slots) - dropped
        return dropped
