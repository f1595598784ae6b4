"""Per-superstep metrics: CSV sinks and summaries (the live progress lines are in
:mod:`conduit_hpc.plane.progress`).

Plain Python and numpy. Column sets are fixed per file (see :data:`LEARNER_COLUMNS`,
:data:`ACTOR_COLUMNS`); extra job columns (``loss``, ...) are appended the first time
they appear and stay for the run.

A learner's file (``learner-<rank>.csv``) holds a row for each of its first
``run.metrics_full_rows`` supersteps, then a weighted sample: see
:mod:`conduit_hpc.plane.sampled_rows` (the writer's :class:`RowThinning`, and what its
readers weigh the rows with). ``summary.json`` is computed in memory from every
superstep (:class:`LatencyRecord`).
"""

from __future__ import annotations

import csv
import io
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from conduit_hpc import jsontext
from conduit_hpc.plane.csv_resume import cut_torn_row, last_row, latest_time, number, set_aside
from conduit_hpc.plane.sampled_rows import RowThinning

__all__ = [
    "ACTOR_CARRY",
    "ACTOR_COLUMNS",
    "LEARNER_COLUMNS",
    "PATH_WORK",
    "CsvSink",
    "LatencyRecord",
    "exposed_split",
    "exposed_story",
    "latency_summary",
    "rows_split",
    "set_aside",
    "write_summary",
]

#: the batch timings that are experience-path work (its preparation, inline or on the
#: data-plane thread): waiting for acknowledged updates, sampling, gathering, the
#: transform and the copy to the learner's device
PATH_WORK = ("ack_wait_s", "sample_s", "gather_s", "transform_s", "copy_s")

LEARNER_COLUMNS = ("superstep", "time_s", "mode", "iteration_s", "exposed_s", "compute_s",
                   "sample_s", "gather_s", "transform_s", "copy_s", "rows", "staleness",
                   "limiter_wait_s", "weight")
ACTOR_COLUMNS = ("time_s", "rows", "rows_per_s", "limiter_wait_s", "policy_version")
#: the actor's columns that go on over a resumed run's attempts (its clock, running totals)
ACTOR_CARRY = ("time_s", "rows", "limiter_wait_s", "ring_wait_s")


class CsvSink:
    """Rows to a CSV file (or only to memory when ``path`` is None).

    A file that an earlier attempt of the run wrote (a requeued or resumed job in its
    run directory) is kept: with the same header the rows are appended (a row a kill
    left torn is cut first), and each ``carry`` column goes on after the earlier rows
    (a clock, a running total: each value is written plus the file's last one); a file
    of other columns (another version, other job columns) is moved to ``NAME.K`` (the
    first free ``K``) and a new one begun. The earlier attempt's rows were overwritten.
    A carried ``time_s`` goes on after the latest ``time_s`` of this file and of the
    files beside it named like it (``actor-*.csv``), read when the sink is made, also
    when this file is new (a rank new to a resumed run), as the episode files' clocks
    do (:mod:`conduit_hpc.plane.csv_resume`).

    Args:
        path (Path | None): file to write; parents are created.
        columns (Iterable[str]): leading columns, in order.
        keep (bool): also keep every row in :attr:`rows`.
        carry (Iterable[str]): columns that go on over the attempts (numbers).
        thinning (RowThinning | None): which rows go to the file (None: all); the
            listeners and :attr:`rows` see every row.
    """

    def __init__(self, path: Path | None, columns: Iterable[str], *, keep: bool = True,
                 carry: Iterable[str] = (), thinning: RowThinning | None = None) -> None:
        self.carry = tuple(carry)
        #: added to the ``carry`` columns as rows are written (the earlier attempts')
        self.offsets: dict[str, float] = {}
        # where a carried clock goes on, read now: before this attempt's ranks write
        # the files beside this one (read at the first write, another rank's first row
        # moved it on)
        self._clock_s = (latest_time(path) if path is not None and "time_s" in self.carry
                         else 0.0)
        self.thinning = thinning
        self.columns = list(columns)
        self._known = set(self.columns)  # the same, for lookups (every row, every key)
        self.rows: list[dict[str, Any]] = []
        self.keep = keep
        self._pending: list[dict[str, Any]] = []
        self._file: TextIO | None = None
        self._path = path
        self._writer: csv.DictWriter[str] | None = None
        #: called with every row as it is added (e.g. a TensorBoard writer); keep cheap
        self.listeners: list[Callable[[Mapping[str, Any]], None]] = []

    def add(self, row: Mapping[str, Any]) -> None:
        row = dict(row)
        for listener in self.listeners:
            listener(row)
        if self._writer is None and not self._known.issuperset(row):
            for k in row:  # (once the header is written, late extra columns are dropped)
                if k not in self._known:
                    self.columns.append(k)
                    self._known.add(k)
        if self.keep:
            self.rows.append(row)
        if self.thinning is not None:
            out = self.thinning.offer(row)
            if out is None:
                return
            row = out
        self._pending.append(row)

    def rows_on_disk(self) -> int:
        """Rows the file holds before this sink writes (an earlier attempt's; 0 for
        none). Reads the file (an actor's: a row a second)."""
        if self._path is None or self._file is not None or not self._path.is_file():
            return 0
        try:
            with open(self._path, "rb") as fh:
                return max(sum(1 for line in fh if line.endswith(b"\n")) - 1, 0)
        except OSError:
            return 0

    @property
    def pending(self) -> int:
        """Rows added since the last :meth:`flush` (held in memory until then)."""
        return len(self._pending)

    def flush(self) -> None:
        if self._path is None or not self._pending:
            self._pending.clear()
            return
        if self._file is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            earlier = _earlier_rows(self._path, self.columns)
            if earlier is not None:
                self.offsets = {c: number(earlier, c) for c in self.carry}
            if "time_s" in self.carry:  # (also in a file new to the run: a new rank's)
                self.offsets["time_s"] = self._clock_s
            self._file = open(self._path, "a" if earlier is not None else "w",  # noqa: SIM115
                              newline="")  # (lives with the sink)
            self._writer = csv.DictWriter(self._file, self.columns, extrasaction="ignore")
            if earlier is None:
                self._writer.writeheader()
        assert self._writer is not None
        rows = self._pending
        if any(self.offsets.values()):  # (copies: the rows kept are this attempt's)
            rows = [{**r, **{c: r[c] + v for c, v in self.offsets.items()
                             if v and isinstance(r.get(c), int | float)}} for r in rows]
        self._writer.writerows(rows)
        self._pending.clear()
        self._file.flush()

    def close(self) -> None:
        last = self.thinning.rest() if self.thinning is not None else None
        if last is not None:
            self._pending.append(last)
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None


def _earlier_rows(path: Path, columns: list[str]) -> dict[str, str] | None:
    """The last whole row (``{}`` for none) of an earlier attempt's ``path`` with the
    header ``columns``, its torn last row cut; None when there is no such file to
    append to (none, empty, or other columns, or no regular file, such as a FIFO: then
    moved aside to ``path.K``)."""
    if not path.exists():
        return None
    if not path.is_file():
        set_aside(path)
        return None
    if cut_torn_row(path) <= 0:  # (unreadable: the open for writing says why, as before)
        return None
    got = last_row(path)
    if got is None:
        return None
    header, last = got
    if header == columns:
        return dict(zip(columns, last, strict=False)) if last else {}
    set_aside(path)
    return None


#: the latency columns :func:`latency_summary` reports (median, p99 and mean of each)
SUMMARY_KEYS = ("exposed_s", "iteration_s", "compute_s", "sample_s", "gather_s",
                "transform_s", "copy_s", "limiter_wait_s")
#: warm-up rows a summary skips at most (``min(SKIP, rows // 10)``)
SKIP = 5


class LatencyRecord:
    """A learner's metrics rows for its summary, in bounded memory. The learner kept
    every row of its run (~0.8 kB each: at 5,000 supersteps a second it grew by ~15 GB
    an hour).

    While at most ``keep`` rows came, it holds them all, and :meth:`summary` is
    :func:`latency_summary` of them. Past that (the summary then skips :data:`SKIP`
    warm-up rows), it holds a uniform sample of ``keep - SKIP`` of the rows after the
    warm-up (Algorithm R, seeded): the medians and p99s are the sample's, while the
    counts, the means and the exposed split are sums over every row. :attr:`recent`
    holds the last 50 rows. Not thread-safe.
    """

    def __init__(self, keep: int = 65_536, seed: int = 0) -> None:
        if keep < 10 * SKIP:
            raise ValueError(f"keep must be >= {10 * SKIP}, got {keep}")
        self.keep, self.n = keep, 0
        self.rows: list[dict[str, Any]] = []  # every row, then the sample (see above)
        self.recent: deque[dict[str, Any]] = deque(maxlen=50)
        self._rng = np.random.default_rng(seed)
        self._draws: list[float] = []
        # past ``keep`` rows: sums over the rows after the warm-up, (count, sum) per key
        # and the exposed split's totals, folded in 4,096 rows at a time
        self._sums = {k: [0, 0.0] for k in SUMMARY_KEYS}
        self._split: dict[str, float] = {}
        self._pending: list[dict[str, Any]] = []

    def add(self, row: dict[str, Any]) -> None:
        self.n += 1
        self.recent.append(row)
        if self.n <= self.keep:
            self.rows.append(row)
            return
        if self.n == self.keep + 1:  # from now on the summary skips SKIP rows
            del self.rows[:SKIP]
            self._fold(self.rows)
        self._pending.append(row)
        if len(self._pending) >= 4096:
            self._fold(self._pending)
            self._pending = []
        # Algorithm R over the rows after the warm-up (the sample holds keep - SKIP):
        # the k-th replaces a uniform one of the sample with probability (keep - SKIP) / k
        if not self._draws:
            self._draws = self._rng.random(4096).tolist()
        j = int(self._draws.pop() * (self.n - SKIP))
        if j < len(self.rows):
            self.rows[j] = row

    def _fold(self, rows: Sequence[Mapping[str, Any]]) -> None:
        for key, acc in self._sums.items():
            vals = [float(r[key]) for r in rows if key in r]
            acc[0] += len(vals)
            acc[1] += math.fsum(vals)
        timed = [r for r in rows if "exposed_s" in r]
        if timed:
            for k, v in rows_split(timed).items():
                if k != "path_work_hidden":
                    self._split[k] = self._split.get(k, 0.0) + v

    def summary(self) -> dict[str, float]:
        """:func:`latency_summary` of every row added, skipping ``min(SKIP, rows // 10)``
        warm-up rows (past ``keep`` rows, see the class docstring)."""
        if self.n <= self.keep:
            return latency_summary(self.rows, skip=min(SKIP, self.n // 10))
        self._fold(self._pending)
        self._pending = []
        out = latency_summary(self.rows)  # the sample's medians and p99s ...
        out["supersteps"], out["measured"] = float(self.n), float(self.n - SKIP)
        for key, (count, total) in self._sums.items():  # ... the means of every row
            if count:
                out[f"{key[:-2]}_mean_s"] = total / count
        if self._split:
            out.update(self._split)
            work, path = self._split["path_work_s"], self._split["exposed_path_s"]
            out["path_work_hidden"] = 1.0 - path / work if work > 0 else math.nan
        return out


def latency_summary(rows: Sequence[Mapping[str, Any]], *, skip: int = 0) -> dict[str, float]:
    """Median and p99 of exposed and iteration latency (after ``skip`` warm-up rows);
    ``supersteps`` counts every row, ``measured`` the ones the statistics cover."""
    use = rows[skip:] if len(rows) > skip else rows
    out: dict[str, float] = {"supersteps": float(len(rows)), "measured": float(len(use))}
    for key in SUMMARY_KEYS:
        vals = np.array([float(r[key]) for r in use if key in r], dtype=float)
        if vals.size:
            out[f"{key[:-2]}_median_s"] = float(np.median(vals))
            out[f"{key[:-2]}_p99_s"] = float(np.percentile(vals, 99))
            out[f"{key[:-2]}_mean_s"] = float(vals.mean())
    if use and "exposed_s" in use[0]:
        out.update(rows_split(use))  # what the exposed time was spent waiting for
    return out


def _zeros_for_nan(values: Any, n: int) -> np.ndarray:
    arr = np.zeros(n) if values is None else np.asarray(values, dtype=float).reshape(-1)
    return np.nan_to_num(arr, nan=0.0, posinf=0.0, neginf=0.0)


def exposed_split(exposed: Any, limiter: Any = None, path: Any = None,
                  weight: Any = None) -> dict[str, float]:
    """What the learner waited for in ``next_batch`` (its exposed time), per superstep.

    Each superstep's exposed time is split, in this order, into the batch's path work
    (``PATH_WORK`` summed, at most the exposed time), the rate limiter's wait (at most
    what is left) and the rest: waiting that neither explains - for a core, for the
    scheduler, for other ranks. With ``scheduler.mode = "sync"`` the path work runs
    inside the wait; with ``edp`` it ran on the data-plane thread, partly during
    compute, so its share of the wait is an upper bound (path work is counted first so
    that what is called hidden is never overstated) and the rest is waiting for a batch
    that was not being worked on.

    Args:
        exposed (array-like): exposed seconds per superstep.
        limiter (array-like | None): the learner's rate-limiter wait per superstep.
        path (array-like | None): path-work seconds per superstep.
        weight (array-like | None): supersteps each entry stands for (a learner file's
            :data:`WEIGHT`; None: 1 each): the totals weigh each entry by it.

    Returns:
        dict[str, float]: totals ``exposed_total_s``, ``exposed_path_s``,
        ``exposed_limiter_s``, ``exposed_other_s`` (summing to the first), ``path_work_s``
        and ``path_work_hidden`` (the share of path work that did not lie in the wait:
        hidden behind compute; NaN without path work). NaN entries count as 0.
    """
    e = np.maximum(_zeros_for_nan(exposed, 0), 0.0)
    work = np.maximum(_zeros_for_nan(path, len(e)), 0.0)
    p = np.minimum(work, e)
    rest = e - p
    lim = np.minimum(np.maximum(_zeros_for_nan(limiter, len(e)), 0.0), rest)
    w = np.ones(len(e)) if weight is None else np.asarray(weight, dtype=float).reshape(-1)
    total_work = float((w * work).sum())
    used = float((w * p).sum())
    return {"exposed_total_s": float((w * e).sum()), "exposed_limiter_s": float((w * lim).sum()),
            "exposed_path_s": used, "exposed_other_s": float((w * (rest - lim)).sum()),
            "path_work_s": total_work,
            "path_work_hidden": 1.0 - used / total_work if total_work > 0 else math.nan}


def exposed_story(split: Mapping[str, float], wall_s: float | None = None) -> str:
    """The split in words: ``"exposed 0.231 of wall time: path work 4%, rate limiter 0%,
    other (a core, scheduling, other ranks) 96%; path work hidden behind compute 91%"``
    ("" when nothing was exposed)."""
    total = split.get("exposed_total_s", 0.0)
    if not total:
        return ""
    head = (f"exposed {total / wall_s:.3g} of wall time" if wall_s else
            f"exposed {total:.3g} s")
    parts = ", ".join(f"{name} {100 * split.get(key, 0.0) / total:.0f}%" for name, key in (
        ("path work", "exposed_path_s"), ("rate limiter", "exposed_limiter_s"),
        ("other (a core, scheduling, other ranks)", "exposed_other_s")))
    hidden = split.get("path_work_hidden", math.nan)
    tail = (f"; path work hidden behind compute {100 * hidden:.0f}%"
            if math.isfinite(hidden) else "")
    return f"{head}: {parts}{tail}"


def rows_split(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """:func:`exposed_split` of metrics rows (dicts with ``exposed_s`` and timings)."""
    return exposed_split([float(r.get("exposed_s", math.nan)) for r in rows],
                         [float(r.get("limiter_wait_s", math.nan)) for r in rows],
                         [math.fsum(float(r.get(k, 0.0)) for k in PATH_WORK) for r in rows])


def write_summary(path: Path, summary: Mapping[str, Any]) -> None:
    """A JSON dict of headline numbers (non-finite floats become null, at any depth)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(jsontext.dumps(dict(summary), indent=1, sort_keys=True) + "\n")


def format_table(rows: list[list[str]], header: list[str]) -> str:
    """A plain aligned text table."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    buf = io.StringIO()
    for r in [header, ["-" * w for w in widths], *rows]:
        buf.write("  ".join(str(x).rjust(w) for x, w in zip(r, widths, strict=False)) + "\n")
    return buf.getvalue()
