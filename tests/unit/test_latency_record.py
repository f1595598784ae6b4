"""A learner's summary rows in bounded memory (:class:`LatencyRecord`). The learner kept
every metrics row of its run (~0.8 kB each): at 5,000 supersteps a second that is ~15 GB
an hour. The record holds every row up to ``keep`` (its summary is then exactly
:func:`latency_summary`'s), and past that a uniform sample, with exact counts, means
and exposed split."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conduit_hpc.plane.metrics import SKIP, LatencyRecord, latency_summary


def _rows(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for s in range(n):
        exposed = float(rng.uniform(0.0, 1.0))
        out.append({"superstep": s, "mode": "sync", "exposed_s": exposed,
                    "sample_s": exposed * float(rng.uniform(0, 0.6)),
                    "gather_s": exposed * 0.1, "copy_s": 0.01, "transform_s": 0.0,
                    "ack_wait_s": 0.0, "limiter_wait_s": float(rng.uniform(0, 0.2)),
                    "iteration_s": exposed + 1.0, "compute_s": 1.0, "rows": 32})
    return out


#: the exposed split's totals: sums over every row
SUMS = ("exposed_total_s", "exposed_limiter_s", "exposed_path_s", "exposed_other_s",
        "path_work_s", "path_work_hidden")


@pytest.mark.parametrize("n", [0, 1, 9, 10, 49, 50, 51, 400])
def test_up_to_keep_rows_the_summary_is_latency_summary_of_every_row(n: int) -> None:
    rows = _rows(n)
    rec = LatencyRecord(keep=400)
    for r in rows:
        rec.add(r)
    assert rec.summary() == latency_summary(rows, skip=min(SKIP, n // 10))
    assert rec.rows == rows and list(rec.recent) == rows[-50:]


def test_past_keep_rows_memory_stays_bounded_and_the_sums_stay_exact() -> None:
    rows = _rows(30_000, seed=1)
    rec = LatencyRecord(keep=2_000)
    for r in rows:
        rec.add(r)
    assert len(rec.rows) == 2_000 - SKIP  # the sample, not every row
    assert list(rec.recent) == rows[-50:]
    got, want = rec.summary(), latency_summary(rows, skip=SKIP)
    assert set(got) == set(want)
    assert got["supersteps"] == 30_000 and got["measured"] == 30_000 - SKIP
    for key, value in want.items():
        if key.endswith("_mean_s") or key in SUMS:
            assert math.isclose(got[key], value, rel_tol=1e-9), key  # sums of every row
        elif key.endswith(("_median_s", "_p99_s")):
            assert abs(got[key] - value) < 0.06 * max(1.0, abs(value)), key  # a sample's
    # the sample is of rows after the warm-up, spread over the whole run
    seen = {r["superstep"] for r in rec.rows}
    assert min(seen) >= SKIP and max(seen) > 25_000 and min(seen) < 5_000
