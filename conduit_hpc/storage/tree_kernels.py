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

__all__ = ["available", "search", "update", "warm"]

_KERNELS: dict[str, Callable[..., Any]] | None = None
_FAILED = False


def _build() -> dict[str, Callable[..., Any]] | None:
    global _FAILED
    try:
        import numba
    except ImportError:
        _FAILED = True
        return None

    @numba.njit(cache=True, nogil=True)
    def sum_update(tree: np.ndarray, p: int, idx: np.ndarray, vals: np.ndarray) -> None:
        for i in range(idx.shape[0]):  # later duplicates win, as in numpy's scatter
            tree[idx[i] + p] = vals[i]
        for i in range(idx.shape[0]):
            node = (idx[i] + p) >> 1
            while node >= 1:
                tree[node] = tree[2 * node] + tree[2 * node + 1]
                node >>= 1

    @numba.njit(cache=True, nogil=True)
    def min_update(tree: np.ndarray, p: int, idx: np.ndarray, vals: np.ndarray) -> None:
        for i in range(idx.shape[0]):
            tree[idx[i] + p] = vals[i]
        for i in range(idx.shape[0]):
            node = (idx[i] + p) >> 1
            while node >= 1:
                a, b = tree[2 * node], tree[2 * node + 1]
                tree[node] = a if a <= b else b
                node >>= 1

    @numba.njit(cache=True, nogil=True)
    def search(tree: np.ndarray, targets: np.ndarray, level: int, out: np.ndarray) -> None:
        # the numpy path of sumtree.prefix_search, step for step (the same float
        # operations in the same order): the top levels through the running sums of the
        # ``level``-wide level, then one level at a time
        p = tree.shape[0] // 2
        total = tree[1]
        hi = np.nextafter(total, 0.0)
        depth = 0
        while (level << depth) < p:
            depth += 1
        n = targets.shape[0]
        if level > 1:
            masses = tree[level:2 * level].copy()
            cum = np.cumsum(masses)
            last = 0
            for j in range(level - 1, -1, -1):
                if masses[j] > 0:
                    last = j
                    break
        for i in range(n):
            t = targets[i]
            t = 0.0 if t < 0.0 else (hi if t > hi else t)
            if level > 1:
                lo, up = 0, level  # searchsorted(cum, t, side="right")
                while lo < up:
                    mid = (lo + up) >> 1
                    if cum[mid] <= t:
                        lo = mid + 1
                    else:
                        up = mid
                k = lo if lo < last else last
                t -= cum[k] - masses[k]
                if t < 0.0:
                    t = 0.0
                node = k + level
            else:
                node = 1
            for _ in range(depth):
                left = 2 * node
                lv = tree[left]
                right = (t >= lv and tree[left + 1] > 0) or lv <= 0
                if right:
                    t = t - lv
                    node = left + 1
                else:
                    node = left
            out[i] = node - p

    return {"sum": sum_update, "min": min_update, "search": search}


def available() -> bool:
    """Whether the compiled kernels can be used (imports numba the first time)."""
    global _KERNELS
    if _KERNELS is None and not _FAILED:
        _KERNELS = _build()
    return _KERNELS is not None


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
    if not available():
        return None
    assert _KERNELS is not None
    out = np.empty(len(targets), dtype=np.int64)
    _KERNELS["search"](tree, np.array(targets, dtype=np.float64), level, out)
    return out
