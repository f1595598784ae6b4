"""Vectorised sum-tree and min-tree over a fixed number of leaves.

Both trees are flat numpy arrays of ``2 * P`` nodes (``P`` the next power of two of the
capacity; node 1 is the root, leaves start at ``P``). Updates recompute each touched
parent from its two children, so repeated updates never drift: in one compiled loop
where numba is installed (:mod:`conduit_hpc.storage.tree_kernels`), else level by level
with numpy (the reference the compiled path is tested against); no per-row Python loop.
"""

from __future__ import annotations

import numpy as np

from conduit_hpc.storage import tree_kernels

__all__ = ["MinTree", "SumTree", "prefix_search", "search_level", "tree_nodes"]


#: levels of at most this many nodes are recomputed whole by :meth:`_Tree.update`
_DENSE_LEVEL = 4096
#: :func:`prefix_search` finds the node at the level of this many nodes with one binary
#: search over the level's running sums, then descends the levels below it
_SEARCH_LEVEL = 4096


def tree_nodes(capacity: int) -> int:
    """Number of float64 nodes a tree over ``capacity`` leaves takes (``2 * P``)."""
    p = 1
    while p < capacity:
        p *= 2
    return 2 * p


class _Tree:
    _fill: float
    #: use the compiled update (storage/tree_kernels.py) where numba is there
    compiled: bool = True

    def __init__(self, capacity: int, buffer: np.ndarray | None = None, *,
                 attach: bool = False) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be > 0, got {capacity!r}")
        self.capacity = int(capacity)
        nodes = tree_nodes(capacity)
        self._p = nodes // 2
        self._depth = self._p.bit_length() - 1
        if buffer is None:
            self._tree = np.full(nodes, self._fill, dtype=np.float64)
        else:
            if buffer.dtype != np.float64 or buffer.shape != (nodes,):
                raise ValueError(f"buffer must be float64 of shape ({nodes},), got "
                                 f"{buffer.dtype} {buffer.shape}")
            self._tree = buffer
            if not attach:  # attach: another process's tree, already built
                self._tree[:] = self._fill

    _kind: str  # the compiled kernel's name (storage/tree_kernels.py)

    @property
    def nodes(self) -> np.ndarray:
        """The flat node array (root at 1, leaves from ``len // 2``); writable: for the
        compiled kernels that change a whole index in one call."""
        return self._tree

    def _combine(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _check_index(self, idx: np.ndarray) -> None:
        if idx.size and (idx.min() < 0 or idx.max() >= self.capacity):
            bad = idx[(idx < 0) | (idx >= self.capacity)][0]
            raise IndexError(f"leaf index {int(bad)} outside [0, {self.capacity})")

    def update(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Set leaves ``indices`` to ``values`` (later duplicates win) and fix parents."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size == 0:
            return
        self._check_index(idx)
        vals = np.broadcast_to(np.asarray(values, dtype=np.float64), idx.shape)
        # fresh, writable, contiguous arrays: one compiled signature for every caller
        if self.compiled and tree_kernels.update(self._kind, self._tree, self._p,
                                                 np.array(idx, dtype=np.int64),
                                                 np.array(vals, dtype=np.float64)):
            return
        self._update_numpy(idx, vals)

    def _update_numpy(self, idx: np.ndarray, vals: np.ndarray) -> None:
        """The reference path of :meth:`update` (and its fallback without numba)."""
        tree = self._tree
        nodes = idx + self._p
        tree[nodes] = vals
        # parents level by level; ``level`` is the first node of the parents' level (its
        # width too). One sort; a sorted array stays sorted when halved, so duplicates
        # are dropped by comparing neighbours. Once the touched nodes are a sixteenth of
        # their level (or the level is small), every level above is recomputed whole
        # with strided slices - a few contiguous adds instead of gathers and scatters.
        nodes = np.sort(nodes >> 1)
        nodes = nodes[np.concatenate(([True], nodes[1:] != nodes[:-1]))]
        level = self._p >> 1
        while level >= 1:
            if level <= _DENSE_LEVEL or 16 * len(nodes) >= level:
                while level >= 1:
                    tree[level:2 * level] = self._combine(tree[2 * level:4 * level:2],
                                                          tree[2 * level + 1:4 * level:2])
                    level >>= 1
                return
            tree[nodes] = self._combine(tree[2 * nodes], tree[2 * nodes + 1])
            nodes >>= 1
            nodes = nodes[np.concatenate(([True], nodes[1:] != nodes[:-1]))]
            level >>= 1

    def set_range(self, start: int, values: np.ndarray) -> None:
        """Set the contiguous leaves ``start .. start+len(values)-1`` (no wrap)."""
        self.update(np.arange(start, start + len(values), dtype=np.int64), values)

    def __getitem__(self, indices: np.ndarray | int) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64)
        self._check_index(idx.reshape(-1))
        return self._tree[idx + self._p]

    @property
    def leaves(self) -> np.ndarray:
        """Read-only view of the ``capacity`` leaf values."""
        v = self._tree[self._p:self._p + self.capacity]
        v.flags.writeable = False
        return v

    def state(self) -> np.ndarray:
        """Leaf values as a copy (for checkpoints)."""
        return self._tree[self._p:self._p + self.capacity].copy()

    def load(self, leaves: np.ndarray) -> None:
        """Replace every leaf and rebuild the tree."""
        leaves = np.asarray(leaves, dtype=np.float64)
        if leaves.shape != (self.capacity,):
            raise ValueError(f"leaves must have shape ({self.capacity},), got {leaves.shape}")
        self._tree[:] = self._fill
        self._tree[self._p:self._p + self.capacity] = leaves
        for level in range(self._depth - 1, -1, -1):
            lo, hi = 1 << level, 1 << (level + 1)
            nodes = np.arange(lo, hi)
            self._tree[lo:hi] = self._combine(self._tree[2 * nodes], self._tree[2 * nodes + 1])


class SumTree(_Tree):
    """Sums of non-negative leaf values with vectorised prefix search.

    Args:
        capacity (int): number of leaves.
        buffer (np.ndarray | None): float64 storage of :func:`tree_nodes` nodes to use
            (e.g. shared memory that other processes search); default: its own.
        attach (bool): use ``buffer`` as it is (a tree another object built there).
    """

    _fill = 0.0
    _kind = "sum"

    def _combine(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a + b

    def update(self, indices: np.ndarray, values: np.ndarray) -> None:
        vals = np.asarray(values, dtype=np.float64)
        if vals.size and not (np.isfinite(vals).all() and (vals >= 0).all()):
            bad = vals.reshape(-1)[~(np.isfinite(vals.reshape(-1)) & (vals.reshape(-1) >= 0))][0]
            raise ValueError(f"sum-tree values must be finite and >= 0, got {bad!r}")
        super().update(indices, vals)

    @property
    def total(self) -> float:
        """Sum of all leaves."""
        return float(self._tree[1])

    def prefix_search(self, targets: np.ndarray) -> np.ndarray:
        """For each target mass ``t`` in ``[0, total)``, the leaf ``i`` with
        ``sum(leaves[:i]) <= t < sum(leaves[:i+1])``; never a zero-valued leaf.

        Raises:
            ValueError: the tree is empty (total 0).
        """
        if self.total <= 0:
            raise ValueError("cannot search a sum-tree whose total is 0")
        return prefix_search(self._tree, targets)


def search_level(nodes: int, *, compiled: bool = True) -> int:
    """Width of the level :func:`prefix_search` searches through running sums, for a
    tree of ``nodes`` nodes: 1 (none: descend from the root) for the compiled search,
    where one loop per target is cheap and the running sums of a 4096-wide level are
    not (measured 6 against 34 us for 256 targets in a 100k-leaf tree); up to
    ``_SEARCH_LEVEL`` for numpy, where each level costs a few calls."""
    return 1 if compiled else min(_SEARCH_LEVEL, nodes // 2)


def prefix_search(tree: np.ndarray, targets: np.ndarray, *, compiled: bool = True,
                  level: int | None = None) -> np.ndarray:
    """Prefix search over a sum-tree stored flat in ``tree`` (``2 * P`` nodes, root at
    1, leaves from ``P``) - usable on another process's tree in shared memory. Targets
    are clipped into ``[0, total)``; the tree's total must be > 0. Compiled where numba
    is there (:mod:`conduit_hpc.storage.tree_kernels`), else numpy; for a given
    ``level`` (the width of the level reached through running sums; default
    :func:`search_level`) both take the same float steps."""
    p = len(tree) // 2
    if compiled and p > 1:
        found = tree_kernels.search(tree, np.asarray(targets).reshape(-1),
                                    min(level or search_level(len(tree)), p))
        if found is not None:
            return found
    level = min(level or _SEARCH_LEVEL, p)
    total = float(tree[1])
    t = np.array(targets, dtype=np.float64, copy=True).reshape(-1)
    np.clip(t, 0.0, np.nextafter(total, 0.0), out=t)
    if level > 1:
        # the top levels in one step: the node of the ``level``-wide level whose running
        # sum first exceeds the target (never one without mass: its running sum does
        # not grow); rounding past the end goes to the last node with mass
        # one copy: another process may be writing a tree in shared memory (its seqlock
        # then makes the caller retry), and every figure below must come from one read
        masses = tree[level:2 * level].copy()
        cum = np.cumsum(masses)
        k = np.searchsorted(cum, t, side="right")
        nonzero = np.flatnonzero(masses > 0)
        last = int(nonzero[-1]) if nonzero.size else 0
        k = np.minimum(k, last)
        t -= cum[k] - masses[k]
        np.maximum(t, 0.0, out=t)
        node = k + level
    else:
        node = np.ones(t.shape, dtype=np.int64)
    for _ in range(p.bit_length() - level.bit_length()):
        left = 2 * node
        lv = tree[left]
        go_right = (t >= lv) & (tree[left + 1] > 0)
        # a target that rounding pushed past a subtree with no mass stays left
        go_right |= lv <= 0
        t = np.where(go_right, t - lv, t)
        node = left + go_right
    return node - p


class MinTree(_Tree):
    """Minimum over leaves; empty leaves hold ``+inf``.

    Args:
        capacity (int): number of leaves.
        buffer (np.ndarray | None), attach (bool): as for :class:`SumTree`.
    """

    _fill = float("inf")
    _kind = "min"

    def _combine(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.minimum(a, b)

    @property
    def min(self) -> float:
        """Smallest leaf (``inf`` when every leaf is empty)."""
        return float(self._tree[1])
