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

import functools
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from conduit_hpc.config.checks import MAX_PRIORITY
from conduit_hpc.errors import SpecError
from conduit_hpc.spec import as_array
from conduit_hpc.storage import index_kernels, tree_kernels
from conduit_hpc.storage.layout import H_IDX_DROPPED, H_IDX_MAXP, ShardViews
from conduit_hpc.storage.sumtree import MinTree, SumTree

__all__ = ["IndexBuffers", "PriorityIndex", "check_masses", "index_buffers", "least_drawable"]


_F64 = np.dtype(np.float64)


def as_priorities(priorities: ArrayLike, name: str = "priorities") -> np.ndarray:
    """Priorities as a float64 ``[n]`` array of their own (a copy: the caller may reuse
    its array at once), their values not yet checked (the first half of
    :func:`check_priorities`).

    Raises:
        SpecError: (a ``ValueError``) naming ``name``: not numbers, complex, or not one
            value per row.
    """
    if type(priorities) is np.ndarray and priorities.dtype is _F64 and priorities.ndim == 1:
        return priorities.copy()  # what the steps below make of it, in one call
    arr = as_array(priorities, name)
    if arr.dtype.kind == "c":
        raise SpecError(f"{name} must be real numbers, got dtype {arr.dtype}")
    if sum(d != 1 for d in arr.shape) > 1:  # [n], [n, 1], [1, n]: one per row
        raise SpecError(f"{name} must be one priority per row, of shape [n] or [n, 1], "
                        f"got shape {tuple(arr.shape)}")
    # a copy, never the caller's memory: the values checked must be the values applied,
    # and an edp learner's data-plane thread applies them after the call returned (a
    # NaN written into the caller's array then reached the sum-tree unchecked)
    return np.array(arr, dtype=np.float64).reshape(-1)


def check_priorities(priorities: ArrayLike, name: str = "priorities") -> np.ndarray:
    """Return priorities as float64, refusing negative, NaN or infinite values.

    Takes what :func:`~conduit_hpc.spec.as_array` takes (numpy, torch tensors, nested
    sequences) of booleans, integers or reals; complex values are refused (never silently
    dropped to their real part).

    Raises:
        SpecError: (a ``ValueError``) naming ``name``: not numbers, complex, or the first
            negative, NaN or infinite value, or one above ``MAX_PRIORITY`` (1e30, the bound
            of ``storage.initial_priority``; the sum-tree's totals would overflow), and its
            position.
    """
    p = as_priorities(priorities, name)
    # two reductions decide the common case (a NaN fails ``min >= 0``); the exact
    # search for the first bad value runs only when one is there
    if p.size and not (p.min() >= 0 and p.max() <= MAX_PRIORITY):
        bad = ~np.isfinite(p) | (p < 0) | (p > MAX_PRIORITY)
        i = int(np.flatnonzero(bad)[0])
        raise SpecError(f"{name}[{i}] must be finite, >= 0 and <= {MAX_PRIORITY:g} (sums "
                        f"of priorities must stay finite), got {p[i]!r}")
    return p


def check_masses(p: np.ndarray, alpha: float, name: str = "priorities") -> None:
    """Refuse a positive priority whose mass ``p ** alpha`` underflows float64 to 0 (only
    an exponent above 1 can: ``p ** alpha >= p`` for ``p <= 1`` otherwise). Such a row
    could never be drawn, as if given priority 0, and learners waited out their timeout
    on "every row held has priority 0" where every priority given was positive.

    Args:
        p (np.ndarray): float64 priorities, already checked (:func:`check_priorities`).
        alpha (float): ``storage.priority_exponent``.

    Raises:
        SpecError: (a ``ValueError``) naming ``name``, the first such value, its position
            and the smallest positive priority that keeps a mass.
    """
    if alpha <= 1 or not p.size:
        return
    lo = float(np.min(p, where=p > 0, initial=np.inf))
    if lo == np.inf or np.power(lo, alpha) > 0:  # pow is monotone: the least decides
        return
    with np.errstate(under="ignore"):
        i = int(np.flatnonzero((p > 0) & (np.power(p, alpha) == 0))[0])
    raise SpecError(f"{name}[{i}] = {p[i]!r} raised to storage.priority_exponent "
                    f"({alpha:g}) underflows float64 to 0, so its row could never be drawn; "
                    f"expected 0 (never drawn) or a priority >= {least_drawable(alpha)!r}")


@functools.lru_cache(maxsize=16)
def least_drawable(alpha: float) -> float:
    """The smallest float64 ``p`` whose ``p ** alpha`` is not 0 (``alpha`` > 0): a
    bisection over the bit patterns of positive floats (their order is the values')."""
    lo, hi = 0, int(np.float64(1.0).view(np.int64))  # pow(0) is 0, pow(1) is 1
    with np.errstate(under="ignore"):
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if np.power(np.int64(mid).view(np.float64), alpha) > 0:
                hi = mid
            else:
                lo = mid
    return float(np.int64(hi).view(np.float64))


@dataclass(frozen=True, slots=True)
class IndexBuffers:
    """Where a :class:`PriorityIndex` keeps its state, when not in its own memory: the
    shard's index blocks in shared memory (see the layout in
    :mod:`conduit_hpc.storage.ring`), so that every node-local process that holds the
    index lock can write it.

    Attributes:
        sum_tree, min_tree (np.ndarray): float64 trees of :func:`tree_nodes` nodes.
        gens, hidden (np.ndarray): int64 per slot: generation of the drawable row, of
            the hidden row.
        raw (np.ndarray): float64 per slot: raw priority.
        state (np.ndarray): int64[3]: running maximum priority (float64 bits), updates
            applied, updates dropped.
    """

    sum_tree: np.ndarray
    min_tree: np.ndarray
    gens: np.ndarray
    hidden: np.ndarray
    raw: np.ndarray
    state: np.ndarray


def index_buffers(views: ShardViews) -> IndexBuffers:
    """The index blocks of a shard mapped in this process (see the ring's layout)."""
    return IndexBuffers(sum_tree=views.tree, min_tree=views.min_tree, gens=views.gens,
                        hidden=views.hidden, raw=views.raw,
                        state=views.header[H_IDX_MAXP:H_IDX_DROPPED + 1])


class PriorityIndex:
    """Priorities of one shard.

    Args:
        capacity (int): slots of the shard.
        alpha (float): exponent applied to priorities (0: uniform).
        initial_priority (float): priority of rows inserted without one before any
            larger priority was seen.
        sum_buffer, gens_buffer (np.ndarray | None): storage for the sum-tree and the
            generations only (shared memory, so that node-local learners search).
        buffers (IndexBuffers | None): storage for the whole index (overrides the two
            above): node-local learners then also write it, under the shard's lock.
        attach (bool): with ``buffers``, use the index another object built there
            (a learner's writer) instead of clearing it.
    """

    def __init__(self, capacity: int, *, alpha: float, initial_priority: float = 1.0,
                 sum_buffer: np.ndarray | None = None,
                 gens_buffer: np.ndarray | None = None,
                 buffers: IndexBuffers | None = None, attach: bool = False) -> None:
        self.capacity = int(capacity)
        self.alpha = float(alpha)
        self._count: int | None = None  # see count
        #: no other object changes the generations (not so for a learner's writer,
        #: attached to the owner's index: its count is a scan every time)
        self._own_gens = not attach
        tree_kernels.warm()  # numba's import and kernels now, not in the first update
        if buffers is not None:
            self.sum = SumTree(capacity, buffers.sum_tree, attach=attach)
            self.min = MinTree(capacity, buffers.min_tree, attach=attach)
            self.gens, self.priority = buffers.gens, buffers.raw
            #: generation of each hidden row (0: the slot is not hidden)
            self.hidden_gens = buffers.hidden
            self._state = buffers.state
            self._maxp = self._state[0:1].view(np.float64)  # the running maximum's bits
            if not attach:
                for a in (self.gens, self.priority, self.hidden_gens, self._state):
                    a[:] = 0
                self.max_priority = float(initial_priority)
            return
        self.sum = SumTree(capacity, sum_buffer)
        self.min = MinTree(capacity)
        # generation each leaf is for (0: nothing to draw there)
        if gens_buffer is None:
            self.gens = np.zeros(capacity, dtype=np.int64)
        else:
            self.gens = gens_buffer
            self.gens[:] = 0
        self.priority = np.zeros(capacity, dtype=np.float64)  # raw priority (before alpha)
        self.hidden_gens = np.zeros(capacity, dtype=np.int64)
        self._state = np.zeros(3, dtype=np.int64)
        self._maxp = self._state[0:1].view(np.float64)  # the running maximum's bits
        self.max_priority = float(initial_priority)

    # the running maximum and the update counters live in ``_state`` (shared or not)
    @property
    def max_priority(self) -> float:
        """Largest priority seen: rows inserted without one get it."""
        return float(self._maxp[0])

    @max_priority.setter
    def max_priority(self, value: float) -> None:
        self._maxp[0] = float(value)

    @property
    def applied_updates(self) -> int:
        """Priority updates applied (to drawable or hidden rows)."""
        return int(self._state[1])

    @applied_updates.setter
    def applied_updates(self, value: int) -> None:
        self._state[1] = int(value)

    @property
    def dropped_updates(self) -> int:
        """Priority updates dropped: their row had been overwritten."""
        return int(self._state[2])

    @dropped_updates.setter
    def dropped_updates(self, value: int) -> None:
        self._state[2] = int(value)

    def _scaled(self, p: np.ndarray) -> np.ndarray:
        # p ** 0 would give 1 for p = 0; keep zero priority at zero mass (for alpha > 0,
        # 0 ** alpha is 0 already)
        if self.alpha == 1:
            return p
        if self.alpha > 0:
            return np.power(p, self.alpha)
        return np.where(p > 0, np.power(p, self.alpha), 0.0)

    @property
    def count(self) -> int:
        """Slots that hold a sampleable row. Counted once, then kept by :meth:`_set`
        (the owner's passes ask for it after every change: a scan of every slot each
        time was ~10% of a pass) where only this object changes the generations."""
        if self._count is None:
            count = int(np.count_nonzero(self.gens))
            if self._own_gens:
                self._count = count
            return count
        return self._count

    @property
    def total(self) -> float:
        """Sum of ``priority ** alpha`` over held rows."""
        return self.sum.total

    def insert(self, slots: np.ndarray, gens: np.ndarray, priorities: np.ndarray) -> None:
        """Make rows visible: NaN priorities become the running maximum."""
        slots = np.asarray(slots, dtype=np.int64)
        p = np.array(priorities, dtype=np.float64, copy=True)
        given = ~np.isnan(p)
        scaled = None
        if given.any():
            p[~given] = self.max_priority  # the maximum seen before this batch
            check_priorities(p[given])
            self.max_priority = max(self.max_priority, float(p[given].max()))
        else:  # the common case: every row gets the maximum, of one mass (numpy's pow
            # gives one value for equal inputs, in an array of any length)
            p[:] = self.max_priority
            scaled = np.full(len(p), self._scaled(p[:1])[0])
        self.hidden_gens[slots] = 0
        self._set(slots, np.asarray(gens, dtype=np.int64), p, scaled)

    def _set(self, slots: np.ndarray, gens: np.ndarray, p: np.ndarray,
             scaled: np.ndarray | None = None, *, keep_raw: bool = False) -> None:
        """Set the rows of ``slots`` (in range) to generation ``gens`` and priority ``p``
        (the raw priority kept as it is with ``keep_raw``; ``scaled``: ``p``'s masses,
        when the caller has them): one compiled pass over both trees where numba is
        there, else :meth:`_set_numpy`."""
        if scaled is None:
            # a zero priority is zero mass for every alpha (_scaled): no pow to compute
            scaled = self._scaled(p) if p.any() else p
        if self.sum.compiled and self.min.compiled:
            more = index_kernels.index_set(self.sum.nodes, self.min.nodes, self.gens,
                                          self.priority, slots, gens, p, scaled,
                                          keep_raw=keep_raw)
            if more is not None:
                if self._count is not None:
                    self._count += more
                return
        self._count = None  # counted again when asked
        self._set_numpy(slots, gens, p, scaled, keep_raw=keep_raw)

    def _set_numpy(self, slots: np.ndarray, gens: np.ndarray, p: np.ndarray,
                   scaled: np.ndarray, *, keep_raw: bool = False) -> None:
        """The reference path of :meth:`_set` (and its fallback without numba)."""
        self.gens[slots] = gens
        if not keep_raw:
            self.priority[slots] = p
        self.sum.update(slots, scaled)
        # the min-tree covers rows that can be drawn (mass > 0): it sets the largest
        # importance weight
        self.min.update(slots, np.where((gens > 0) & (scaled > 0), scaled, np.inf))

    def load(self, gens: np.ndarray, priority: np.ndarray, scaled: np.ndarray) -> None:
        """Replace every slot's row at once (a restore): generations, raw priorities and
        masses (``priority ** alpha``), one per slot; nothing is hidden after it."""
        self.gens[:] = gens
        self.priority[:] = priority
        self.hidden_gens[:] = 0
        self._count = None  # counted again when asked
        self.sum.load(scaled)
        self.min.load(np.where((gens > 0) & (scaled > 0), scaled, np.inf))

    def invalidate(self, slots: np.ndarray) -> None:
        """Remove the rows of ``slots`` (taken out, or their slot handed to a writer):
        nothing of them is kept."""
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size:
            self.hidden_gens[slots] = 0
            self._set(slots, np.zeros(len(slots), np.int64), np.zeros(len(slots)))

    def hide(self, slots: np.ndarray, gens: np.ndarray | None = None) -> int:
        """Make the held rows of ``slots`` undrawable but keep them (generation, raw
        priority; see the module docstring); with ``gens``, only the rows whose slot
        still holds that generation. One compiled call where numba is there. Returns
        rows hidden (a repeated slot once)."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        if self.sum.compiled and self.min.compiled:
            k = index_kernels.index_hide(self.sum.nodes, self.min.nodes, self.gens,
                                        self.hidden_gens, slots, gens)
            if k is not None:
                if self._count is not None:
                    self._count -= k
                return k
        held = self.gens[slots]
        keep = held > 0
        if gens is not None:
            keep &= held == np.asarray(gens, dtype=np.int64).reshape(-1)
        slots = np.unique(slots[keep])
        if slots.size:
            self.hidden_gens[slots] = self.gens[slots]
            self._set(slots, np.zeros(len(slots), np.int64), np.zeros(len(slots)),
                      keep_raw=True)
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

    def update(self, slots: np.ndarray, gens: np.ndarray, priorities: np.ndarray, *,
               checked: bool = False) -> int:
        """Set new priorities where the slot still holds generation ``gens``.

        Args:
            checked (bool): ``priorities`` are float64 already checked finite and >= 0
                (:func:`check_priorities`; the learner checks every update before it is
                sent), so they are not checked again.

        Returns:
            int: updates dropped because their row was overwritten.

        Raises:
            ValueError: a negative, NaN or infinite priority, or one whose
                ``priority ** alpha`` overflows (nothing applied).
        """
        p = (np.asarray(priorities, dtype=np.float64).reshape(-1) if checked
             else check_priorities(priorities))
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        gens = np.asarray(gens, dtype=np.int64).reshape(-1)
        if not (len(slots) == len(gens) == len(p)):
            raise ValueError(f"slots, gens and priorities differ in length: "
                             f"{len(slots)}, {len(gens)}, {len(p)}")
        if not slots.size:
            return 0
        compiled = self.sum.compiled and self.min.compiled and len(self.gens) == self.capacity
        if not compiled:  # the compiled update checks the slots itself, in its one pass
            self._check_slots(slots)
        if self.alpha > 1:  # p ** alpha may overflow only then
            top = float(p.max())
            with np.errstate(over="ignore"):  # an overflow is refused below, not warned of
                scaled_top = np.power(top, self.alpha)
            if not np.isfinite(scaled_top):
                raise SpecError(f"priority {top!r} ** priority_exponent {self.alpha} "
                                f"overflows float64; priorities must stay below "
                                f"{np.finfo(np.float64).max ** (1 / self.alpha):.3g}")
        if compiled:
            done = index_kernels.index_update(self.sum.nodes, self.min.nodes, self.gens,
                                             self.hidden_gens, self.priority, slots, gens, p,
                                             self._scaled(p), float(self._maxp[0]))
            if done is not None:
                dropped, top = done
                if dropped < 0:  # a slot outside the index: nothing was changed
                    raise ValueError(f"slot outside [0, {self.capacity})")
                state = self._state  # the maximum, then applied and dropped updates
                self._maxp[0] = top
                state[1] += len(slots) - dropped
                state[2] += dropped
                return dropped
            self._check_slots(slots)
        return self._update_numpy(slots, gens, p)

    def _check_slots(self, slots: np.ndarray) -> None:
        """Refuse a slot outside ``[0, capacity)`` (ValueError)."""
        if slots.min() < 0 or slots.max() >= self.capacity:
            raise ValueError(f"slot outside [0, {self.capacity})")

    def _update_numpy(self, slots: np.ndarray, gens: np.ndarray, p: np.ndarray) -> int:
        """The reference path of :meth:`update` (and its fallback without numba)."""
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
