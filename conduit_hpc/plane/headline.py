"""A run's headline figures, computed once from its metrics files: what ``summary.json``
says and what ``conduit-hpc report`` prints are the same numbers from the same function.

* ``rows_ingested``: the actors' final running totals (``actor-<rank>.csv``, column
  ``rows``), summed.
* ``ingest_span_s``: the longest actor's time from its start to its last row
  (``time_s``); ``actor_seconds``: those times summed over actors.
* ``ingest_rows_per_s``: ``rows_ingested / ingest_span_s`` (all actors together, over
  the time they ingested; not over set-up and teardown).
* ``actor_limiter_wait_s``: the actors' final rate-limiter waits, summed; with
  ``actor_seconds`` it says what fraction of the actors' time went to waiting.
* ``env_steps_to_target``: in ``episodes.csv`` (time order, ``env_steps`` the job's
  total), the env steps at the first episode after which the mean return of the last
  ``window`` scored episodes (``scored`` column, when there is one) reaches
  ``target_return``; ``None`` when it never does.

Plain Python; no MPI. Missing files leave their keys out.
"""

from __future__ import annotations

import csv
import io
import math
import os
import stat
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conduit_hpc.config.loader import read_bounded
from conduit_hpc.errors import ConduitError

__all__ = ["actor_totals", "headline_figures", "read_metrics_text", "steps_to_target",
           "waited_fraction"]


def _float(text: str | None) -> float:
    """A cell's number; NaN (left out) when missing, not a number or not finite."""
    if not text:
        return math.nan
    try:
        x = float(text)
    except ValueError:
        return math.nan
    return x if math.isfinite(x) else math.nan


def actor_totals(metrics: Path) -> list[dict[str, float]]:
    """Per ``actor-<rank>.csv`` (running totals): the last row's ``rows``, ``time_s`` and
    ``limiter_wait_s`` (NaN where missing). Local; reads files."""
    out = []
    for path in sorted(metrics.glob("actor-*.csv")):
        if not path.stem.split("-", 1)[1].isdigit():
            continue
        last: dict[str, str] = {}
        try:
            for row in csv.DictReader(_lines(path)):
                if not math.isnan(_float(row.get("time_s"))):
                    last = row
        except (OSError, UnicodeDecodeError, csv.Error, ConduitError):
            continue
        if last:
            out.append({k: _float(last.get(k)) for k in ("rows", "time_s",
                                                          "limiter_wait_s")})
    return out


def steps_to_target(env_steps: Sequence[float], returns: Sequence[float],
                    scored: Sequence[bool] | None, *, window: int,
                    target_return: float) -> int | None:
    """Env steps at the first episode after which the mean of the last ``window`` scored
    returns is at least ``target_return`` (episodes in the order given); None if never.

    Raises:
        ValueError: ``window`` < 1, or sequences of different lengths.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if len(env_steps) != len(returns) or (scored is not None and len(scored) != len(returns)):
        raise ValueError("env_steps, returns and scored must have one entry per episode")
    recent: deque[float] = deque(maxlen=window)
    for i, ret in enumerate(returns):
        if scored is not None and not scored[i]:
            continue
        recent.append(float(ret))
        # each term divided first: the mean of returns near 1e308 must not overflow
        if len(recent) == window and math.fsum(x / window for x in recent) >= target_return:
            return int(env_steps[i])
    return None


def _episodes(path: Path) -> tuple[list[float], list[float], list[bool] | None]:
    steps: list[float] = []
    rets: list[float] = []
    scored: list[bool] = []
    reader = csv.DictReader(_lines(path))
    has_scored = "scored" in (reader.fieldnames or ())
    for row in reader:
        s, r = _float(row.get("env_steps")), _float(row.get("episode_return"))
        if math.isnan(s) or math.isnan(r):
            continue
        steps.append(s)
        rets.append(r)
        scored.append(row.get("scored", "1") in ("1", "1.0", "True", "true"))
    return steps, rets, scored if has_scored else None


#: a run's metrics file larger than this is refused (a day at one row a second is ~10 MB)
MAX_METRICS_BYTES = 1 << 30


def read_metrics_text(path: Path) -> str:
    """A run's metrics, summary or plan file as text, read bounded (a device, FIFO or
    socket in a run directory is refused at once, a file that grows past the limit
    while read too: :func:`conduit_hpc.config.loader.read_bounded`).

    Raises:
        ConduitError: not a regular file, or too large; UnicodeDecodeError; OSError.
    """
    if not stat.S_ISREG(os.stat(path).st_mode):  # a run writes none: no writer to wait for
        raise ConduitError(f"metrics file {str(path)!r} is not a regular file (a FIFO, "
                           f"device or socket), not one a run writes")
    return read_bounded(path, "metrics file", MAX_METRICS_BYTES).decode("utf-8")


def _lines(path: Path) -> io.StringIO:
    return io.StringIO(read_metrics_text(path), newline="")


def headline_figures(metrics: str | Path, *, target_return: float | None = None,
                     window: int = 20) -> dict[str, Any]:
    """The headline figures of the run whose metrics directory is ``metrics`` (see the
    module docstring). ``env_steps_to_target`` only with ``target_return``. Local; reads
    files; never raises for a missing or unreadable file (its keys are left out)."""
    m = Path(metrics)
    out: dict[str, Any] = {}
    totals = actor_totals(m) if m.is_dir() else []
    if totals:
        rows = sum(t["rows"] for t in totals if not math.isnan(t["rows"]))
        spans = [t["time_s"] for t in totals if not math.isnan(t["time_s"])]
        out["rows_ingested"] = int(rows) if math.isfinite(rows) else None
        out["ingest_span_s"] = max(spans, default=0.0)
        out["actor_seconds"] = sum(spans)  # not fsum: 1e308 + 1e308 is inf, not an error
        out["ingest_rows_per_s"] = rows / out["ingest_span_s"] if out["ingest_span_s"] else 0.0
        waits = [t["limiter_wait_s"] for t in totals if not math.isnan(t["limiter_wait_s"])]
        if waits:
            out["actor_limiter_wait_s"] = sum(waits)
        # cells near 1e308 (a damaged file; finite each) can sum past the largest float:
        # such a figure is left out like one of a missing file
        out = {k: v for k, v in out.items() if v is not None and math.isfinite(v)}
    ep = m / "episodes.csv"
    if target_return is not None and ep.is_file():
        try:
            steps, rets, scored = _episodes(ep)
        except (OSError, UnicodeDecodeError, csv.Error, ConduitError):
            return out
        out["env_steps_to_target"] = steps_to_target(steps, rets, scored, window=window,
                                                     target_return=target_return)
        out["target_return"] = float(target_return)
        out["target_window"] = int(window)
    return out


def waited_fraction(figures: dict[str, Any]) -> str:
    """``"actors waited 543 of 656 actor-s (83%)"``, or "" without the figures."""
    wait, total = figures.get("actor_limiter_wait_s"), figures.get("actor_seconds")
    if wait is None or not total:
        return ""
    return f"actors waited {wait:,.0f} of {total:,.0f} actor-s ({100 * wait / total:.0f}%)"
