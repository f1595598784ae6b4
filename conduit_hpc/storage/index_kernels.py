"""Compiled calls over a whole priority index (update, set, hide) and a ring's marks.

The Python side of kernels that :mod:`conduit_hpc.storage.tree_kernels` builds (with
its tree kernels, which they call): argument checks and conversions, then one compiled
call each. Each returns ``None`` (or False) where numba is not there, and the caller
takes its numpy path, the reference they are tested against bit for bit
(``tests/unit/test_sumtree.py``).
"""

from __future__ import annotations

import numpy as np

from conduit_hpc.storage.tree_kernels import kernel

__all__ = ["index_hide", "index_set", "index_update", "mark"]


def _check_slots(what: str, slots: np.ndarray, n: int) -> None:
    """Refuse a slot outside ``[0, n)`` (a compiled store would write past a leaf),
    naming it."""
    if len(slots) and (slots.min() < 0 or slots.max() >= n):
        bad = int(slots[(slots < 0) | (slots >= n)][0])
        raise IndexError(f"{what}: slot {bad} outside [0, {n})")


def index_update(sum_tree: np.ndarray, min_tree: np.ndarray, gens: np.ndarray,
                 hidden: np.ndarray, raw: np.ndarray, slots: np.ndarray, ugens: np.ndarray,
                 prios: np.ndarray, scaled: np.ndarray, max_priority: float
                 ) -> tuple[int, float] | None:
    """:meth:`~conduit_hpc.storage.priority.PriorityIndex.update` after its checks, in
    one call over the index's arrays (priorities finite and >= 0, ``scaled`` their
    masses): returns (updates dropped, the new running maximum), or (-1, the maximum
    given) with nothing changed where a slot lies outside ``gens``; ``None`` where the
    kernels are not available (nothing changed)."""
    k = kernel("index_update")
    if k is None:
        return None
    c = np.ascontiguousarray
    d, m = k(sum_tree, min_tree, gens, hidden, raw, np.array(slots, dtype=np.int64),
             c(ugens, dtype=np.int64), c(prios, dtype=np.float64),
             c(scaled, dtype=np.float64), float(max_priority))
    return int(d), float(m)


def index_set(sum_tree: np.ndarray, min_tree: np.ndarray, gens: np.ndarray,
              raw: np.ndarray, slots: np.ndarray, sgens: np.ndarray, prios: np.ndarray,
              scaled: np.ndarray, *, keep_raw: bool) -> int | None:
    """:meth:`~conduit_hpc.storage.priority.PriorityIndex._set` in one call over the
    index's arrays (slots in range): generations, raw priorities (kept with
    ``keep_raw``) and both trees' leaves and parents. Returns the change in the number
    of slots that hold a generation; ``None`` (nothing changed) where the kernels are
    not available."""
    k = kernel("index_set")
    if k is None:
        return None
    if not len(slots) == len(sgens) == len(prios) == len(scaled):
        raise ValueError(f"index_set: slots, generations, priorities and masses differ "
                         f"in length: {len(slots)}, {len(sgens)}, {len(prios)}, "
                         f"{len(scaled)}")
    c = np.ascontiguousarray
    slots = c(slots, dtype=np.int64)
    _check_slots("index_set", slots, len(gens))  # never past a leaf
    return int(k(sum_tree, min_tree, gens, raw, slots, c(sgens, dtype=np.int64),
                 c(prios, dtype=np.float64), c(scaled, dtype=np.float64), bool(keep_raw)))


def index_hide(sum_tree: np.ndarray, min_tree: np.ndarray, gens: np.ndarray,
               hidden: np.ndarray, slots: np.ndarray, want: np.ndarray | None = None
               ) -> int | None:
    """:meth:`~conduit_hpc.storage.priority.PriorityIndex.hide` in one call over the
    index's arrays: the held rows of ``slots`` (where ``want`` is given, only those that
    still hold generation ``want``) become hidden. Returns the rows hidden (a repeated
    slot once); ``None`` (nothing changed) where the kernels are not available.

    Raises:
        IndexError: a slot outside the index (nothing changed).
    """
    k = kernel("index_hide")
    if k is None:
        return None
    slots = np.ascontiguousarray(slots, dtype=np.int64)
    _check_slots("index_hide", slots, len(gens))
    check = want is not None
    w = np.ascontiguousarray(want if check else slots, dtype=np.int64)
    if len(w) != len(slots):
        raise ValueError(f"index_hide: {len(slots)} slots but {len(w)} generations")
    return int(k(sum_tree, min_tree, gens, hidden, slots, w, check))


def mark(marks: np.ndarray, slots: np.ndarray, gens: np.ndarray) -> bool:
    """:meth:`~conduit_hpc.storage.ring.ShardRing.mark_sampled`'s stores in one call
    (-1: no slot; a slot outside ``marks`` is skipped): each slot keeps the largest
    generation drawn from it. False (nothing stored) where the kernels are not
    available."""
    k = kernel("mark")
    if k is None:
        return False
    if len(slots) != len(gens):
        raise ValueError(f"mark: {len(slots)} slots but {len(gens)} generations")
    k(marks, np.ascontiguousarray(slots, dtype=np.int64),
                     np.ascontiguousarray(gens, dtype=np.int64))
    return True
