"""The rows of a learner's metrics file (``RUN_DIR/metrics/learner-<rank>.csv``): which
supersteps have one, and how a reader weighs them.

**Writer.** The file holds a row for each of the learner's first ``N =
run.metrics_full_rows`` supersteps (100,000 by default: every test, smoke benchmark and
short job keeps every row), then ``N`` rows for blocks of 2 supersteps, ``N`` for
blocks of 4, then 8, ... (:class:`RowThinning`, fed by
:class:`~conduit_hpc.plane.metrics.CsvSink`). Each of those rows is that of a superstep
drawn uniformly from its block, and its :data:`WEIGHT` column says how many supersteps
it stands for: stratified by superstep count, so unbiased over supersteps (sampling by
time would over-represent long supersteps; a fixed place in each block would see work
that recurs every 2**k supersteps always or never). After ``S`` supersteps the file
holds at most ``N (1 + log2(1 + S / N))`` rows, ``N`` more each time the run doubles
(~24 MB at ~240 bytes a row: a day at 2,400 supersteps a second is ~1.1 M rows,
~270 MB), where a row a superstep grew it by ~2 GB an hour. ``metrics_full_rows = 0``
keeps every row (weight 1). The weights sum to the supersteps the file covers; a job
killed mid-run loses the row of the block it was in (one row at most).

**Readers** weigh each row by its weight: counts of supersteps are sums of weights
(exact), sums and means weigh each row by it (exact over the first ``N`` supersteps,
unbiased estimates from the sample past them), percentiles are weighted
(:func:`weighted_percentile`, :func:`weighted_median`: numpy's of the values repeated
``weight`` times), a warm-up is skipped by superstep count (:func:`rows_after`). A file
written before the column has weight 1 for every row (:func:`row_weight`,
:func:`weights`). The job's ``summary.json`` and the figures it prints are not computed
from the file but in memory from every superstep
(:class:`~conduit_hpc.plane.metrics.LatencyRecord`).

Plain Python and numpy; no MPI.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from conduit_hpc.config.checks import METRICS_FULL_ROWS as FULL_ROWS

__all__ = ["FULL_ROWS", "WEIGHT", "RowThinning", "row_weight", "rows_after", "weighted_mean",
           "weighted_median", "weighted_percentile", "weights"]

#: the learner file's column that says how many supersteps a row stands for (see the
#: module docstring); a file without it has one row per superstep
WEIGHT = "weight"

class RowThinning:
    """Which of a learner's per-superstep rows go to its file (see the module docstring).

    The first ``full_rows`` rows offered pass with weight 1; then the supersteps are cut
    into ``full_rows`` blocks of 2, then ``full_rows`` blocks of 4, 8, ..., and each
    block passes one row - a uniform draw from the block (a reservoir of one, seeded),
    with :data:`WEIGHT` the block's size - when the block is complete; :meth:`rest`
    passes the last, incomplete block's (weight: the supersteps it holds). The weights
    passed sum to the rows offered. A uniform draw, not a fixed place in each block:
    work that recurs every 2**k supersteps (weights, checkpoints) would otherwise be
    always in the sample or never. Not thread-safe.

    Args:
        full_rows (int): rows passed at each block size; 0: every row, weight 1.
        seed (int): seed of the draws.
    """

    def __init__(self, full_rows: int = FULL_ROWS, seed: int = 0) -> None:
        if isinstance(full_rows, bool) or not isinstance(full_rows, int) or full_rows < 0:
            raise ValueError(f"full_rows must be an integer >= 0 (0: every row), "
                             f"got {full_rows!r}")
        self.full_rows = full_rows
        self.offered = 0
        self.block = 1  # supersteps per row now
        self._blocks_left = full_rows  # blocks of this size still to pass
        self._seen = 0  # rows offered of the current block
        self._held: Mapping[str, Any] | None = None
        self._rng = random.Random(seed)

    def offer(self, row: Mapping[str, Any]) -> dict[str, Any] | None:
        """The row to write now (a copy with :data:`WEIGHT`), or None."""
        self.offered += 1
        self._seen += 1
        if self._seen == 1 or self._rng.random() * self._seen < 1.0:
            self._held = row  # the j-th row of a block replaces the held one w.p. 1/j
        if self._seen < self.block:
            return None
        out = self.rest()
        if self.full_rows:
            self._blocks_left -= 1
            if not self._blocks_left:
                self.block, self._blocks_left = 2 * self.block, self.full_rows
        return out

    def rest(self) -> dict[str, Any] | None:
        """The current block's row, weighing the rows offered in it so far, or None
        when none was; the block is closed. :meth:`offer` calls it when a block is
        complete; the writer calls it at the end, for the incomplete one."""
        if self._held is None:
            return None
        out = {**self._held, WEIGHT: self._seen}
        self._held, self._seen = None, 0
        return out


# -- reading --------------------------------------------------------------------------


def row_weight(row: Mapping[str, Any]) -> float:
    """Supersteps a learner-file row (a ``csv.DictReader`` row) stands for: its
    :data:`WEIGHT` cell; 1 when the file has no such column (written before it) or the
    cell is empty, not a number or below 1 (a damaged cell)."""
    try:
        x = float(row.get(WEIGHT) or 1.0)
    except (TypeError, ValueError):
        return 1.0
    return x if math.isfinite(x) and x >= 1 else 1.0


def weights(column: Any, n: int) -> np.ndarray:
    """The :data:`WEIGHT` column of ``n`` rows as floats (None: a file without it); a
    cell that is not a finite number >= 1 counts as 1."""
    if column is None:
        return np.ones(n)
    try:
        c = np.asarray(column, dtype=float).reshape(-1)[:n]
    except (TypeError, ValueError):  # text cells: one at a time
        c = np.array([row_weight({WEIGHT: x}) for x in list(column)[:n]], dtype=float)
    out = np.ones(n)
    with np.errstate(invalid="ignore"):
        out[:len(c)] = np.where(np.isfinite(c) & (c >= 1), c, 1.0)
    return out


_Row = TypeVar("_Row", bound=Mapping[str, Any])


def rows_after(rows: Sequence[_Row], supersteps: float) -> list[_Row]:
    """The rows after those standing for the first ``supersteps`` supersteps of the
    file (a row is left out when the supersteps before it are fewer): a warm-up skipped
    by superstep count, the same as ``rows[supersteps:]`` for a file of weight-1 rows."""
    before = 0.0
    for i, r in enumerate(rows):
        if before >= supersteps:
            return list(rows[i:])
        before += row_weight(r)
    return []


def _neighbours(values: Any, weight: Any, q: float) -> tuple[float, float, float] | None:
    """The two values of ``np.repeat(values, weight)``, sorted, around its ``q``-th
    percentile, and where it lies between them (0 to 1); None without a finite value."""
    v = np.asarray(values, dtype=float).reshape(-1)
    w = np.asarray(weight, dtype=float).reshape(-1)
    ok = np.isfinite(v) & np.isfinite(w) & (w > 0)
    v, w = v[ok], w[ok]
    if not v.size:
        return None
    order = np.argsort(v, kind="stable")
    v, cum = v[order], np.cumsum(w[order])
    pos = q / 100.0 * (cum[-1] - 1.0)  # in the repeated array, 0-based
    lo = math.floor(pos)
    a = v[min(int(np.searchsorted(cum, lo, side="right")), len(v) - 1)]
    b = v[min(int(np.searchsorted(cum, lo + 1, side="right")), len(v) - 1)]
    return float(a), float(b), pos - lo


def weighted_percentile(values: Any, weight: Any, q: float) -> float:
    """The ``q``-th percentile of ``values``, each counted ``weight`` times:
    ``np.percentile(np.repeat(values, weight), q)`` (linear interpolation) without the
    repeat, for integer weights. Non-finite values are left out; NaN when none is left."""
    got = _neighbours(values, weight, q)
    if got is None:
        return math.nan
    a, b, t = got
    return a + (b - a) * t if t < 0.5 else b - (b - a) * (1.0 - t)  # numpy's lerp


def weighted_median(values: Any, weight: Any) -> float:
    """``np.median(np.repeat(values, weight))`` (and :func:`statistics.median`'s): the
    middle value, or the mean of the two middle ones. As :func:`weighted_percentile`."""
    got = _neighbours(values, weight, 50.0)
    if got is None:
        return math.nan
    a, b, t = got
    return (a + b) / 2 if t else a


def weighted_mean(values: Any, weight: Any) -> float:
    """Mean of the finite ``values``, each counted ``weight`` times; NaN when none."""
    v = np.asarray(values, dtype=float).reshape(-1)
    w = np.asarray(weight, dtype=float).reshape(-1)
    ok = np.isfinite(v) & np.isfinite(w)
    total = float(w[ok].sum())
    return float((v[ok] * w[ok]).sum()) / total if total > 0 else math.nan
