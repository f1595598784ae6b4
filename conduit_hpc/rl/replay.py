"""A plain in-process prioritized replay buffer (the single-process baseline's).

Columns in preallocated numpy arrays, a ring of slots, and the library's
:class:`~conduit_hpc.storage.priority.PriorityIndex` (sum-tree and min-tree with
per-slot generations) for proportional prioritized sampling (Schaul et al., 2016):
``P(i) = p_i^alpha / sum_j p_j^alpha`` and importance weights
``w_i = (N P(i))^-beta / max_j w_j``. Pure numpy; no MPI.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from conduit_hpc.config.checks import MAX_PRIORITY
from conduit_hpc.errors import SpecError
from conduit_hpc.spec import Field, Spec, as_array
from conduit_hpc.storage.priority import (
    PriorityIndex,
    as_priorities,
    check_masses,
    check_priorities,
)

__all__ = ["PrioritizedReplay", "ReplaySample"]


class ReplaySample(NamedTuple):
    """One sampled batch.

    Attributes:
        batch (dict[str, np.ndarray]): the sampled rows, column by column (copies).
        slots (np.ndarray): int64 slot of each row.
        gens (np.ndarray): int64 generation of each row (pass back with priorities).
        weights (np.ndarray): float32 importance weights in (0, 1], max 1.
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
        if (not isinstance(capacity, int | np.integer) or isinstance(capacity, bool)
                or capacity < 1):
            raise ValueError(f"capacity must be an integer >= 1, got {capacity!r}")
        _check_alpha(alpha, int(capacity))
        if not isinstance(columns, Mapping):
            raise SpecError(f"columns must be a mapping of name to (shape, dtype), got "
                            f"{type(columns).__name__}")
        fields = []
        for name, entry in columns.items():
            if not isinstance(entry, tuple | list) or len(entry) != 2:
                raise SpecError(f"column {name!r}: expected a (shape, dtype) pair, got "
                                f"{entry!r}")
            # the data plane's rules for names, dtypes and shapes; a batch's columns
            # are cast within their kind (float64 -> float32, never float -> int)
            dtype: Any = entry[1]  # Field checks and normalises dtype and shape
            fields.append(Field(name, dtype, entry[0], cast="same_kind"))
        self.spec = Spec(fields)
        self.capacity = int(capacity)
        self._data = self.spec.empty(self.capacity)
        self._index = PriorityIndex(self.capacity, alpha=float(alpha))
        self._cursor = 0  # rows ever inserted; slot = seq % capacity, gen = seq + 1

    def __len__(self) -> int:
        return min(self._cursor, self.capacity)

    @property
    def inserted(self) -> int:
        """Rows ever inserted."""
        return self._cursor

    def add(self, batch: Mapping[str, np.ndarray], priorities: np.ndarray | None = None) -> None:
        """Append rows (overwriting the oldest); ``priorities`` None or NaN entries give
        the running maximum priority. Columns ``batch`` holds beyond those declared are
        not stored.

        Raises:
            ValueError: (:class:`~conduit_hpc.errors.SpecError`) naming the column: one
                is missing, its per-row shape differs, its dtype does
                not cast within its kind (or a value would wrap or overflow), or columns
                differ in length; or a priority is negative or not finite, or one is
                positive but its mass
                ``priority ** alpha`` underflows to 0 (it could never be drawn). Nothing
                is stored then: the priorities are checked before any row is written
                (a refused batch overwrote the oldest rows, which the index still
                held with their old priorities).
        """
        # every column checked and converted before anything is written: a missing
        # column, another per-row shape (never broadcast: a row of shape (1,) filled a
        # (4,) row with copies), a lossy cast (float actions truncated, NaN made an
        # integer) or columns of different lengths are refused, nothing stored; columns
        # not declared are left out (an n-step accumulator's ``env``)
        if not isinstance(batch, Mapping):
            raise SpecError(f"batch must be a mapping of column name to array, got "
                            f"{type(batch).__name__}")
        new = self.spec.validate({n: batch[n] for n in self.spec.names if n in batch})
        rows = self.spec.rows_of(new)
        p = (np.full(rows, np.nan) if priorities is None
             else as_priorities(priorities))
        if len(p) != rows:
            raise ValueError(f"priorities has {len(p)} entries for {rows} rows")
        if rows == 0:
            return
        given = check_priorities(p[~np.isnan(p)])  # NaN: the running maximum
        check_masses(given, self._index.alpha)
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
            ValueError: the buffer is empty or every row held has priority 0,
                ``batch_size`` is not an integer >= 1, or ``beta`` is not a number in
                [0, 1000] (a NaN or infinite beta made every weight NaN or 0).
            TypeError: ``rng`` is not a ``numpy.random.Generator``.
        """
        if (not isinstance(batch_size, int | np.integer) or isinstance(batch_size, bool)
                or batch_size < 1):
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        real = isinstance(beta, int | float | np.integer | np.floating)
        if not (real and not isinstance(beta, bool) and 0 <= beta <= 1e3):  # NaN fails
            raise ValueError(f"beta must be a number in [0, 1000] (the importance-weight "
                             f"exponent, as scheduler.beta), got {beta!r}")
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator "
                            f"(np.random.default_rng(seed)), got {type(rng).__name__}")
        total = self._index.total
        if len(self) == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        if total <= 0:
            raise ValueError(f"cannot sample: every one of the {len(self)} rows held has "
                             f"priority 0 (no row can be drawn); give some row a "
                             f"priority > 0 with update_priorities")
        targets = (np.arange(batch_size) + rng.random(batch_size)) / batch_size * total
        slots = self._index.sum.prefix_search(targets)
        # (N P(i))^-beta / (N P_min)^-beta = (p / p_min)^-beta, in logs: no underflow to
        # 0 ** -beta for a tiny priority
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            weights = np.exp(-beta * (np.log(self._index.sum[slots])
                                      - np.log(self._index.min.min)))
        # a ratio past float32's range (priorities 1e30 and 1e-20 may both be held) made
        # a weight 0, outside (0, 1] (a loss dividing by it, or taking its log, got inf):
        # the smallest normal float32 instead, as the data plane's sampler gives
        w32 = np.maximum(weights.astype(np.float32), np.finfo(np.float32).tiny)
        return ReplaySample({k: v[slots].copy() for k, v in self._data.items()}, slots,
                            self._index.gens[slots].copy(), w32)

    def update_priorities(self, slots: np.ndarray, gens: np.ndarray,
                          priorities: np.ndarray) -> int:
        """Set priorities of sampled rows; rows overwritten since are skipped. A slot
        named twice gets the last of its priorities.

        Returns:
            int: updates dropped because their row was overwritten.

        Raises:
            ValueError: (nothing applied) ``slots`` or ``gens`` not integers (a bool
                mask or floats, which were taken as slots 0 and 1 or truncated), a slot
                outside ``[0, capacity)`` (named), lengths that differ, or a priority
                negative, not finite, or positive with a mass that underflows to 0.
        """
        s = _as_integers(slots, "slots")
        g = _as_integers(gens, "gens")
        p = check_priorities(priorities)
        if not len(s) == len(g) == len(p):
            raise ValueError(f"slots, gens and priorities must have one entry per row, got "
                             f"{len(s)}, {len(g)} and {len(p)} entries")
        bad = np.flatnonzero((s < 0) | (s >= self.capacity))
        if bad.size:
            raise ValueError(f"slots[{bad[0]}] must be in [0, {self.capacity}) (a slot "
                             f"sample returned), got {s[bad[0]]}")
        check_masses(p, self._index.alpha)
        return self._index.update(s, g, p, checked=True)


def _as_integers(values: object, name: str) -> np.ndarray:
    """``values`` as a flat int64 array, refusing any other dtype than integers (an
    empty sequence is fine)."""
    arr = as_array(values, name)
    if arr.size and arr.dtype.kind not in "iu":
        raise SpecError(f"{name} must be integers (as sample returned them), got dtype "
                        f"{arr.dtype.name}")
    if sum(d != 1 for d in arr.shape) > 1:
        raise SpecError(f"{name} must be one entry per row, of shape [n], got shape "
                        f"{tuple(arr.shape)}")
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise SpecError(f"{name} must be below 2**63, got {arr.max()}")
    return arr.astype(np.int64).reshape(-1)


def _check_alpha(alpha: object, capacity: int) -> None:
    """Refuse a priority exponent that is not a number in ``[0, 10]`` (NaN gave NaN
    masses and a sum-tree that drew slot 0 only; a negative one favoured the rows of
    least priority) or whose masses of priorities up to ``MAX_PRIORITY``, summed over
    ``capacity`` rows, overflow float64 (the bound of ``storage.priority_exponent``)."""
    ok = isinstance(alpha, int | float | np.integer | np.floating) and not isinstance(alpha,
                                                                                     bool)
    if not (ok and 0 <= float(alpha) <= 10):  # type: ignore[arg-type]
        raise ValueError(f"alpha must be a number in [0, 10] (the priority exponent, as "
                         f"storage.priority_exponent), got {alpha!r}")
    top = math.floor((math.log(sys.float_info.max) - math.log(capacity))
                     / math.log(MAX_PRIORITY) * 1000) / 1000
    if float(alpha) > top:  # type: ignore[arg-type]
        raise ValueError(f"alpha must be <= {top:g} with capacity {capacity} (priorities "
                         f"up to {MAX_PRIORITY:g} raised to it, summed over the rows, "
                         f"must stay finite in float64), got {alpha!r}")
