"""Metric definitions of the long-haul deployment (plain numpy; no MPI, no torch).

One definition serves both placements (``forward`` and ``edge_replay``):

* **Bytes crossing the link**, per direction (``e2c``: edge -> data centre, ``c2e``: the
  other way): message bytes as the link model counts them, counted when they reach the
  far end.
* **Link utilisation** of a direction over an interval: bytes that reached the far end
  in it / (bandwidth * interval length).
* **Transferred experiences** and their **priority**: a row *crosses* when the edge
  buffer hands it to the link - forwarded (``forward``) or sampled and sent in a batch
  (``edge_replay``). Its priority is the raw priority the edge replay holds for that row
  at that moment (``|TD| + eps`` as the actor or the learner last set it, before the
  exponent ``alpha``; a row inserted without one holds the running maximum). The
  average priority of transferred experiences over an interval is the sum of those
  priorities over the rows that crossed in it / their number (a row sampled twice
  counts twice).
* **Dropped rows** (``forward``): rows the edge buffer discarded because the link could
  not carry them before ``longhaul.queue_rows`` newer rows queued behind them (or the
  ring overwrote them first); **unsent rows**: rows still queued when the job ended.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "LINK_COLUMNS",
    "LinkSnapshot",
    "merge_link_stats",
    "settled_mean",
    "superstep_columns",
    "windowed_mean_priority",
]

#: columns the long-haul deployment adds to ``learner-<rank>.csv``
LINK_COLUMNS = ("link_e2c_bytes", "link_c2e_bytes", "link_e2c_util", "link_c2e_util",
                "xfer_rows", "xfer_priority_sum", "xfer_priority_mean", "dropped_rows",
                "backlog_rows")


@dataclass(frozen=True, slots=True)
class LinkSnapshot:
    """Cumulative link counters of the whole job at one moment.

    Attributes:
        time_s (float): when (any clock, seconds).
        e2c_bytes, c2e_bytes (int): bytes that reached the far end, per direction.
        rows (int): rows that crossed edge -> data centre.
        priority_sum (float): sum of their priorities when they crossed.
        dropped (int): rows dropped at the edge (``forward``).
        backlog (int): rows queued at the edge for the link now (``forward``).
    """

    time_s: float
    e2c_bytes: int = 0
    c2e_bytes: int = 0
    rows: int = 0
    priority_sum: float = 0.0
    dropped: int = 0
    backlog: int = 0


def superstep_columns(prev: LinkSnapshot, cur: LinkSnapshot,
                      bytes_per_s: float) -> dict[str, float]:
    """The learner's link columns for the interval ``prev`` -> ``cur`` (one superstep).

    Returns:
        dict[str, float]: :data:`LINK_COLUMNS`; ``xfer_priority_mean`` is NaN when no row
        crossed, utilisations are NaN for an empty interval.
    """
    dt = cur.time_s - prev.time_s
    e2c = cur.e2c_bytes - prev.e2c_bytes
    c2e = cur.c2e_bytes - prev.c2e_bytes
    rows = cur.rows - prev.rows
    psum = cur.priority_sum - prev.priority_sum
    cap = bytes_per_s * dt
    return {"link_e2c_bytes": float(e2c), "link_c2e_bytes": float(c2e),
            "link_e2c_util": e2c / cap if cap > 0 else math.nan,
            "link_c2e_util": c2e / cap if cap > 0 else math.nan,
            "xfer_rows": float(rows), "xfer_priority_sum": psum,
            "xfer_priority_mean": psum / rows if rows > 0 else math.nan,
            "dropped_rows": float(cur.dropped), "backlog_rows": float(cur.backlog)}


def windowed_mean_priority(rows: ArrayLike, priority_sums: ArrayLike,
                           window: int) -> np.ndarray:
    """Average priority of transferred rows over the trailing ``window`` supersteps at
    each superstep: the window's priority sum / the window's rows (NaN where no row
    crossed in it)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window!r}")
    r = np.concatenate([[0.0], np.cumsum(np.nan_to_num(np.asarray(rows, dtype=float)))])
    p = np.concatenate([[0.0], np.cumsum(np.nan_to_num(np.asarray(priority_sums,
                                                                  dtype=float)))])
    hi = np.arange(1, len(r))
    lo = np.maximum(hi - window, 0)
    rs, ps = r[hi] - r[lo], p[hi] - p[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(rs > 0, ps / np.where(rs > 0, rs, 1.0), np.nan)


def settled_mean(values: ArrayLike, *, skip_fraction: float = 0.5,
                 weight: ArrayLike | None = None) -> float:
    """Mean of the finite values after the first ``skip_fraction`` of them (the part of
    a loss curve after it has settled). NaN if nothing is left. With ``weight`` (the
    supersteps each value stands for: a learner file's ``weight`` column), the fraction
    counts supersteps and the mean weighs each value by its weight.

    Raises:
        ValueError: ``skip_fraction`` outside [0, 1).
    """
    if not 0 <= skip_fraction < 1:
        raise ValueError(f"skip_fraction must be in [0, 1), got {skip_fraction!r}")
    v = np.asarray(values, dtype=float)
    w = np.ones(len(v)) if weight is None else np.asarray(weight, dtype=float)
    before = np.concatenate([[0.0], np.cumsum(w)[:-1]])  # supersteps before each value
    start = int(np.searchsorted(before, int(w.sum() * skip_fraction), side="left"))
    tail, tw = v[start:], w[start:]
    ok = np.isfinite(tail)
    return float((tail[ok] * tw[ok]).sum() / tw[ok].sum()) if ok.any() else math.nan


def merge_link_stats(per_rank: Iterable[Mapping[str, Any] | None], *, mode: str,
                     bytes_per_s: float, latency_s: float) -> dict[str, Any]:
    """Job totals from every rank's :meth:`.feature.LongHaul.local_stats`
    (``None`` for ranks without any).

    Returns:
        dict: ``mode``, ``bandwidth_bytes_s``, ``latency_s``; per direction
        ``{e2c,c2e}_bytes`` (sent, reached the far end), ``{e2c,c2e}_messages`` and
        ``{e2c,c2e}_received_bytes`` (counted by the receivers); ``rows_crossed``,
        ``priority_sum_crossed``, ``priority_mean_crossed``, ``rows_forwarded``,
        ``rows_dropped``, ``rows_unsent``, ``rows_received`` (into the data-centre
        replay), ``edge_rows_committed``, ``late_s_max``; ``forwarded_nominal_bytes``
        (the forward messages' bytes uncompressed: with ``compression = "zlib"``,
        over the bytes they took on the link, the compression ratio).
    """
    out: dict[str, Any] = {"mode": mode, "bandwidth_bytes_s": bytes_per_s,
                           "latency_s": latency_s}
    keys = ("rows_crossed", "priority_sum_crossed", "rows_forwarded", "rows_dropped",
            "rows_unsent", "rows_received", "edge_rows_committed", "forwarded_nominal_bytes")
    for k in ("e2c_bytes", "c2e_bytes", "e2c_messages", "c2e_messages",
              "e2c_received_bytes", "c2e_received_bytes", *keys):
        out[k] = 0
    out["priority_sum_crossed"] = 0.0
    late = 0.0
    for s in per_rank:
        if not s:
            continue
        d = "e2c" if s["side"] == "edge" else "c2e"
        back = "c2e" if d == "e2c" else "e2c"
        out[f"{d}_bytes"] += s["bytes_out"]
        out[f"{d}_messages"] += s["messages_out"]
        out[f"{back}_received_bytes"] += s["bytes_in"]
        for k in keys:
            out[k] += s.get(k, 0)
        late = max(late, s.get("late_s_max", 0.0))
    n = out["rows_crossed"]
    out["priority_mean_crossed"] = out["priority_sum_crossed"] / n if n else math.nan
    out["late_s_max"] = late
    return out
