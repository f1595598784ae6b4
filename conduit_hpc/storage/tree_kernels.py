"""Compiled tree updates (numba) for :mod:`conduit_hpc.storage.sumtree`.

Setting ``B`` leaves of a tree of ``2P`` nodes and fixing their parents is ``B log P``
scalar steps; done with numpy it is ~6 calls per level of numpy overhead (~0.2 ms per
tree for 256 leaves in a 100k-row shard, measured: ``bench/README.md``, "Delivery
capacity"), which is most of a priority update. Here it is one compiled loop. Each
parent is recomputed from its two children exactly as the numpy path does, so the trees
are bit for bit the same (``tests/unit/test_sumtree.py`` compares them against the
numpy path, which stays the reference and the fallback).

numba is imported on first use only (``import conduit_hpc`` stays light); where it is
missing or fails to compile, :func:`update` returns False and the caller takes the
numpy path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["allocate", "available", "check_rows", "draw", "is_weights", "kernel",
           "rows_intact", "search", "span", "update", "warm"]

_KERNELS: dict[str, Callable[..., Any]] | None = None
_FAILED = False


def _build() -> dict[str, Callable[..., Any]] | None:
    global _FAILED
    try:
        from conduit_hpc.storage import _tree_numba as k  # imports numba
    except ImportError:
        _FAILED = True
        return None
    return {"sum": k.sum_update, "min": k.min_update, "search": k.search, "draw": k.draw,
            "index_update": k.index_update, "index_set": k.index_set,
            "index_hide": k.index_hide, "mark": k.mark, "allocate": k.allocate,
            "check_rows": k.check_rows, "is_weights": k.is_weights, "span": k.span,
            "rows_intact": k.rows_intact,
            "fingerprint": k.fingerprint, "frames_differ": k.frames_differ}


def available() -> bool:
    """Whether the compiled kernels can be used (imports numba the first time). The
    wrappers below, which run every batch, read ``_KERNELS`` first and call this only
    while it is unset."""
    global _KERNELS
    if _KERNELS is None and not _FAILED:
        _KERNELS = _build()
    return _KERNELS is not None


def kernel(name: str) -> Callable[..., Any] | None:
    """The compiled kernel ``name`` (imports numba the first time); ``None`` where the
    kernels are not available. For :mod:`conduit_hpc.storage.index_kernels`."""
    if _KERNELS is None and not available():
        return None
    assert _KERNELS is not None
    return _KERNELS[name]


_WARM = False


def warm() -> None:
    """Import numba and load (or compile) every kernel now, on a scratch tree, so that
    the first real update or search does not pay for it (a data plane's owners and
    writers call this while they are built). Idempotent; local."""
    global _WARM
    if _WARM or not available():
        return
    assert _KERNELS is not None
    tree = np.zeros(8, dtype=np.float64)
    idx, vals = np.arange(2, dtype=np.int64), np.ones(2, dtype=np.float64)
    _KERNELS["sum"](tree, 4, idx, vals)
    _KERNELS["min"](tree.copy(), 4, idx, vals)
    _KERNELS["search"](tree, np.zeros(1), 2, np.empty(1, dtype=np.int64))
    one = np.ones(1, dtype=np.int64)
    draw(tree, one, 4, np.zeros(1), 2)
    # the index kernels (storage/index_kernels.py), with the argument types its calls use
    k, zero, f1 = _KERNELS, np.zeros(1, np.int64), np.ones(1)
    k["index_update"](tree, tree.copy(), one.copy(), one.copy(), np.zeros(4), zero.copy(),
                      one.copy(), f1.copy(), f1.copy(), 1.0)
    k["index_set"](tree, tree.copy(), one.copy(), np.zeros(4), zero.copy(), one.copy(),
                   f1.copy(), f1.copy(), False)
    k["index_hide"](tree, tree.copy(), one.copy(), one.copy(), zero.copy(), one.copy(), True)
    k["mark"](np.zeros(4, np.int64), zero.copy(), one.copy())
    allocate(np.ones(2), 2.0, np.zeros(2))
    check_rows(np.zeros((1, 3), np.int64), np.ones(1), 1.0, np.ones(1, np.int64))
    is_weights(np.ones(1), 1.0, 0.5, 1e-38)
    span(np.zeros(1, np.int64))
    span(np.zeros((1, 3), np.int64)[:, 0])  # a column of a batch's indices
    for a in (np.zeros(1, np.int64), np.zeros((1, 3), np.int64)[:, 0]):
        a.flags.writeable = False  # a caller's read-only array is another specialization
        span(a)
    rows_intact(np.zeros((1, 3), np.int64)[:, 2], np.zeros(1, np.int64), 1)
    # frames once (storage/frames.py), with 8-byte words: an Atari frame's 7,056 bytes
    words = np.zeros((1, 1), np.uint64)
    k["fingerprint"](words, np.ones(1, np.uint64), np.empty(1, np.uint64))
    k["frames_differ"](words, words[:0], words.copy(), zero.copy(), zero.copy(),
                       np.empty(1, np.bool_))
    _WARM = True


def update(kind: str, tree: np.ndarray, p: int, idx: np.ndarray, vals: np.ndarray) -> bool:
    """Set leaves ``idx`` (int64) of ``tree`` (float64, leaves from ``p``) to ``vals``
    (float64) and fix their parents; ``kind`` is ``"sum"`` or ``"min"``. Returns False
    (nothing changed) where the kernels are not available."""
    if not available():
        return False
    assert _KERNELS is not None
    _KERNELS[kind](tree, p, idx, vals)
    return True


def search(tree: np.ndarray, targets: np.ndarray, level: int) -> np.ndarray | None:
    """:func:`~conduit_hpc.storage.sumtree.prefix_search` compiled (``level``: the width
    of the level searched through running sums); ``None`` where the kernels are not
    available."""
    if _KERNELS is None and not available():
        return None
    assert _KERNELS is not None
    out = np.empty(len(targets), dtype=np.int64)
    _KERNELS["search"](tree, np.array(targets, dtype=np.float64), level, out)
    return out


def draw(tree: np.ndarray, gens: np.ndarray, capacity: int, targets: np.ndarray,
         level: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """:func:`search` and, for each found leaf, its generation (``gens``) and mass, in
    one call: (slots, generations, masses); a leaf at or past ``capacity`` (a torn read
    of a tree another process rewrites), or a target at or past the tree's total (drawn
    over a total it has lost mass since), gives slot -1, generation 0, mass 0 (drawn
    again by the caller). ``None`` where the kernels are not available."""
    if _KERNELS is None and not available():
        return None
    assert _KERNELS is not None
    n = len(targets)
    slots, got, mass = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n)
    _KERNELS["draw"](tree, gens, int(capacity), np.array(targets, dtype=np.float64), level,
                     slots, got, mass)
    return slots, got, mass


def allocate(totals: np.ndarray, grand: float, rand: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`~conduit_hpc.sampling.stratified.allocate_targets` after its checks
    (``grand``: ``totals.sum()``, > 0; ``rand``: the batch's uniform draws): (shard,
    local target) per item. ``None`` where the kernels are not available."""
    if _KERNELS is None and not available():
        return None
    assert _KERNELS is not None
    n = len(rand)
    shard, local = np.empty(n, np.int64), np.empty(n)
    _KERNELS["allocate"](np.ascontiguousarray(totals, dtype=np.float64), float(grand),
                         np.ascontiguousarray(rand, dtype=np.float64), shard, local)
    return shard, local


def check_rows(idx: np.ndarray, prios: np.ndarray, top: float, caps: np.ndarray
               ) -> int | None:
    """The first row of an update (``idx``: int64 ``[n, 3]`` shard, slot, generation;
    ``prios``: float64 ``[n]``) whose shard has no capacity in ``caps`` (int64, indexed
    by shard id; <= 0: not read), whose slot is outside ``[0, capacity)`` or whose
    priority is outside ``[0, top]`` (NaN is), else -1: one pass for
    :func:`~conduit_hpc.sampling.check_update`, which names the fault itself. ``None``
    where the kernels are not available."""
    if _KERNELS is None and not available():
        return None
    assert _KERNELS is not None
    c = np.ascontiguousarray
    return int(_KERNELS["check_rows"](c(idx, dtype=np.int64), c(prios, dtype=np.float64),
                                      float(top), c(caps, dtype=np.int64)))


def is_weights(mass: np.ndarray, pmin: float, beta: float, least: float | np.floating
               ) -> np.ndarray | None:
    """:func:`~conduit_hpc.sampling.stratified.importance_weights` after its checks,
    one compiled loop with the same float steps (its numpy path is the reference):
    ``pmin`` (the shards' smallest mass) lowered to the smallest positive ``mass``,
    then float32 ``exp(-beta * (log(mass) - log(pmin)))`` per row, raised to ``least``.
    ``None`` where the kernels are not available."""
    if _KERNELS is None and not available():
        return None
    assert _KERNELS is not None
    out = np.empty(len(mass), np.float32)
    _KERNELS["is_weights"](np.ascontiguousarray(mass, dtype=np.float64), float(pmin),
                           float(beta), np.float32(least), out)
    return out


def span(a: np.ndarray) -> tuple[int, int]:
    """``(a.min(), a.max())`` of a non-empty 1-D integer array in one pass (compiled
    where the kernels are there: one call instead of two numpy reductions, each ~1 us on
    a batch's 256 slots; int64 arrays of any strides go in as they are)."""
    if a.dtype is _INT64 and (_KERNELS is not None or available()):
        assert _KERNELS is not None
        return _KERNELS["span"](a)  # (int, int): numba boxes int64 as int
    return int(a.min()), int(a.max())


_INT64 = np.dtype(np.int64)


def rows_intact(gens: np.ndarray, cursor: np.ndarray, capacity: int) -> bool | None:
    """Whether every row of ``gens`` (int64 generations, any strides) is intact against
    its own writers' cursor ``cursor`` (int64, one per row): one compiled pass for
    :meth:`~conduit_hpc.storage.ShardRing.all_intact` with frame stacks. ``None`` where
    the kernels are not there or the arrays are not int64 of one length (the caller
    takes the numpy rule)."""
    if (gens.dtype is not _INT64 or cursor.dtype is not _INT64 or gens.ndim != 1
            or cursor.shape != gens.shape or not available()):
        return None
    assert _KERNELS is not None
    return bool(_KERNELS["rows_intact"](gens, cursor, int(capacity)))
