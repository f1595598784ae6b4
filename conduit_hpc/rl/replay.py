"""A plain in-process prioritized replay buffer (the single-process baseline's).

Columns in preallocated numpy arrays, a ring of slots, and the library's
:class:`~conduit_hpc.storage.priority.PriorityIndex` (sum-tree and min-tree with
per-slot generations) for proportional prioritized sampling (Schaul et al., 2016):
``P(i) = p_i^alpha / sum_j p_j^alpha`` and importance weights
``w_i = (N P(i))^-beta / max_j w_j``. Pure numpy; no MPI.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from conduit_hpc.storage.priority import PriorityIndex, check_masses, check_priorities

__all__ = ["PrioritizedReplay", "ReplaySample"]


class ReplaySample(NamedTuple):
    """One sampled batch.

    Attributes:
        batch (dict[str, np.ndarray]): the sampled rows, column by column (copies).
        slots (np.ndarray): int64 slot of each row.
        gens (np.ndarray): int64 generation of each row (pass back with priorities).
        weights (np.ndarray): float32 importance weights, max 1.
    """

    batch: dict[str, np.ndarray]
    slots: np.ndarray
    gens: np.ndarray
    weights: np.ndarray


class PrioritizedReplay:
    """Proportional prioritized replay in one process.

    Not thread-safe; not collective; nothing blocks.

    Args:
        columns (Mapping[str, tuple[tuple[int, ...], str]]): column name ->
            (per-row shape, numpy dtype name).
        capacity (int): rows held; the oldest row is overwritten first.
        alpha (float): priority exponent (0 = uniform).
    """

    def __init__(self, columns: Mapping[str, tuple[tuple[int, ...], str]], capacity: int,
                 alpha: float = 0.6) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity!r}")
        self.capacity = int(capacity)
        self._data = {name: np.zeros((capacity, *shape), dtype=dtype)
                      for name, (shape, dtype) in columns.items()}
        self._index = PriorityIndex(capacity, alpha=alpha)
        self._cursor = 0  # rows ever inserted; slot = seq % capacity, gen = seq + 1

    def __len__(self) -> int:
        return min(self._cursor, self.capacity)

    @property
    def inserted(self) -> int:
        """Rows ever inserted."""
        return self._cursor

    def add(self, batch: Mapping[str, np.ndarray], priorities: np.ndarray | None = None) -> None:
        """Append rows (overwriting the oldest); ``priorities`` None or NaN entries give
        the running maximum priority.

        Raises:
            KeyError: a column is missing. ValueError: rows differ in length, a priority
                is negative or not finite, or one is positive but its mass
                ``priority ** alpha`` underflows to 0 (it could never be drawn). Nothing
                is stored then: the priorities are checked before any row is written
                (a refused batch overwrote the oldest rows, which the index still
                held with their old priorities).
        """
        rows = len(next(iter(batch.values())))
        for name in self._data:
            if name not in batch:
                raise KeyError(f"batch lacks column {name!r}; it has {sorted(batch)}")
            if len(batch[name]) != rows:
                raise ValueError(f"column {name!r} has {len(batch[name])} rows, expected {rows}")
        if rows == 0:
            return
        p = (np.full(rows, np.nan) if priorities is None
             else np.asarray(priorities, dtype=np.float64).reshape(-1))
        if len(p) != rows:
            raise ValueError(f"priorities has {len(p)} entries for {rows} rows")
        given = check_priorities(p[~np.isnan(p)])  # NaN: the running maximum
        check_masses(given, self._index.alpha)
        # every column converted before any is written: one that cannot be (its row
        # shape) is refused with nothing stored
        new = {}
        for name, col in self._data.items():
            try:
                new[name] = np.broadcast_to(np.asarray(batch[name], dtype=col.dtype),
                                            (rows, *col.shape[1:]))
            except (ValueError, TypeError) as err:
                raise ValueError(f"column {name!r} does not fit rows of shape "
                                 f"{col.shape[1:]} and dtype {col.dtype}: {err}") from err
        if rows > self.capacity:  # only the newest rows survive
            new = {k: v[-self.capacity:] for k, v in new.items()}
            p = p[-self.capacity:]
            self._cursor += rows - self.capacity
            rows = self.capacity
        seq = np.arange(self._cursor, self._cursor + rows, dtype=np.int64)
        slots = seq % self.capacity
        for name, col in self._data.items():
            col[slots] = new[name]
        self._index.insert(slots, seq + 1, p)
        self._cursor += rows

    def sample(self, batch_size: int, beta: float, rng: np.random.Generator) -> ReplaySample:
        """Stratified proportional sample of ``batch_size`` rows (with replacement).

        Raises:
            ValueError: the buffer is empty, or ``batch_size < 1``.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        total = self._index.total
        if len(self) == 0 or total <= 0:
            raise ValueError("cannot sample from an empty replay buffer")
        targets = (np.arange(batch_size) + rng.random(batch_size)) / batch_size * total
        slots = self._index.sum.prefix_search(targets)
        # (N P(i))^-beta / (N P_min)^-beta = (p / p_min)^-beta, in logs: no underflow to
        # 0 ** -beta for a tiny priority
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            weights = np.exp(-beta * (np.log(self._index.sum[slots])
                                      - np.log(self._index.min.min)))
        return ReplaySample({k: v[slots].copy() for k, v in self._data.items()}, slots,
                            self._index.gens[slots].copy(), weights.astype(np.float32))

    def update_priorities(self, slots: np.ndarray, gens: np.ndarray,
                          priorities: np.ndarray) -> int:
        """Set priorities of sampled rows; rows overwritten since are skipped.

        Returns:
            int: updates dropped because their row was overwritten.

        Raises:
            ValueError: a priority negative, not finite, or positive with a mass that
                underflows to 0 (nothing applied).
        """
        p = check_priorities(priorities)
        check_masses(p, self._index.alpha)
        return self._index.update(slots, gens, p, checked=True)
