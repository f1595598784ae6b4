"""Per-superstep metrics: CSV sinks and summaries (the live progress lines are in
:mod:`conduit_hpc.plane.progress`).

Plain Python and numpy. Column sets are fixed per file (see :data:`LEARNER_COLUMNS`,
:data:`ACTOR_COLUMNS`); extra job columns (``loss``, ...) are appended the first time
they appear and stay for the run.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from conduit_hpc import jsontext

__all__ = [
    "ACTOR_COLUMNS",
    "LEARNER_COLUMNS",
    "CsvSink",
    "latency_summary",
    "write_summary",
]

LEARNER_COLUMNS = ("superstep", "time_s", "mode", "iteration_s", "exposed_s", "compute_s",
                   "sample_s", "gather_s", "transform_s", "copy_s", "rows", "staleness",
                   "limiter_wait_s")
ACTOR_COLUMNS = ("time_s", "rows", "rows_per_s", "limiter_wait_s", "policy_version")


class CsvSink:
    """Rows to a CSV file (or only to memory when ``path`` is None).

    Args:
        path (Path | None): file to write; parents are created.
        columns (Iterable[str]): leading columns, in order.
        keep (bool): also keep every row in :attr:`rows`.
    """

    def __init__(self, path: Path | None, columns: Iterable[str], *, keep: bool = True) -> None:
        self.columns = list(columns)
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
        for k in row:
            if k not in self.columns:
                if self._writer is not None:
                    continue  # the header is written: late extra columns are dropped
                self.columns.append(k)
        if self.keep:
            self.rows.append(row)
        self._pending.append(row)

    def flush(self) -> None:
        if self._path is None or not self._pending:
            self._pending.clear()
            return
        if self._file is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self._path, "w", newline="")  # noqa: SIM115 - lives with the sink
            self._writer = csv.DictWriter(self._file, self.columns, extrasaction="ignore")
            self._writer.writeheader()
        assert self._writer is not None
        self._writer.writerows(self._pending)
        self._pending.clear()
        self._file.flush()

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None


def latency_summary(rows: Sequence[Mapping[str, Any]], *, skip: int = 0) -> dict[str, float]:
    """Median and p99 of exposed and iteration latency (after ``skip`` warm-up rows);
    ``supersteps`` counts every row, ``measured`` the ones the statistics cover."""
    use = rows[skip:] if len(rows) > skip else rows
    out: dict[str, float] = {"supersteps": float(len(rows)), "measured": float(len(use))}
    for key in ("exposed_s", "iteration_s", "compute_s", "sample_s", "gather_s",
                "transform_s", "copy_s", "limiter_wait_s"):
        vals = np.array([float(r[key]) for r in use if key in r], dtype=float)
        if vals.size:
            out[f"{key[:-2]}_median_s"] = float(np.median(vals))
            out[f"{key[:-2]}_p99_s"] = float(np.percentile(vals, 99))
            out[f"{key[:-2]}_mean_s"] = float(vals.mean())
    return out


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
