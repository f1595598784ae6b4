"""What the learner waited for (issue 23, item 4): exposed time split into path work,
the rate limiter and the rest (a core, scheduling, other ranks), in summary.json, the
report and the progress line."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_hpc.plane.metrics import (
    LEARNER_COLUMNS,
    PATH_WORK,
    exposed_split,
    exposed_story,
    latency_summary,
)
from conduit_hpc.tools.report.run import write_report
from conduit_hpc.tools.report.run_data import load_run, run_stats

secs = st.floats(0.0, 1.0, allow_nan=False)


@settings(deadline=None)
@given(st.lists(st.tuples(secs, secs, secs), max_size=20))
def test_the_parts_add_up_to_the_exposed_time(rows: list[tuple[float, float, float]]) -> None:
    e, lim, p = (np.array([r[i] for r in rows]) for i in range(3))
    s = exposed_split(e, lim, p)
    assert s["exposed_total_s"] == pytest.approx(e.sum())
    assert (s["exposed_path_s"] + s["exposed_limiter_s"] + s["exposed_other_s"]
            == pytest.approx(e.sum()))
    assert min(s["exposed_path_s"], s["exposed_limiter_s"], s["exposed_other_s"]) >= 0
    assert s["exposed_path_s"] <= p.sum() + 1e-12
    if p.sum() > 0:
        assert 0 <= s["path_work_hidden"] <= 1


def oversubscribed_rows(n: int = 100) -> list[dict[str, float]]:
    """``make run``'s picture: 6 ranks on 2 cores, edp mode. The batch's path work
    (0.4 ms) ran on the thread during compute; the learner then waits 3 ms for a core."""
    return [{"superstep": s, "time_s": 0.01 * s, "mode": "edp", "iteration_s": 0.013,
             "exposed_s": 0.003, "compute_s": 0.01, "ack_wait_s": 0.0, "sample_s": 0.0002,
             "gather_s": 0.0001, "transform_s": 0.00005, "copy_s": 0.00005,
             "limiter_wait_s": 0.001 if s % 10 == 0 else 0.0, "rows": 64, "staleness": 1}
            for s in range(n)]


def test_waiting_for_a_core_is_neither_path_work_nor_hidden_work_lost() -> None:
    s = latency_summary(oversubscribed_rows())
    assert s["exposed_total_s"] == pytest.approx(100 * 0.003)
    assert s["exposed_path_s"] == pytest.approx(100 * 0.0004)
    assert s["exposed_limiter_s"] == pytest.approx(10 * 0.001)
    assert s["exposed_other_s"] == pytest.approx(100 * 0.003 - 100 * 0.0004 - 10 * 0.001)
    story = exposed_story(s, 100 * 0.013)
    assert story.startswith("exposed 0.231 of wall time: path work 13%, rate limiter 3%, "
                            "other (a core, scheduling, other ranks) 83%"), story


def test_the_report_says_what_was_hidden_and_why(tmp_path: Path) -> None:
    """The report said 'hidden behind compute: 0' for make run (exposed 3 ms > path work
    0.4 ms: 1 - exposed/work clamped to 0). Now the path work that lay in no wait is
    hidden, and the wait is split."""
    metrics = tmp_path / "run" / "metrics"
    metrics.mkdir(parents=True)
    rows = oversubscribed_rows()
    with open(metrics / "learner-0.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[*LEARNER_COLUMNS, *[c for c in PATH_WORK
                                                               if c not in LEARNER_COLUMNS]],
                           extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    stats = run_stats(load_run(tmp_path / "run"))
    assert stats["path_work_hidden"] == pytest.approx(0.0)  # all 0.4 ms lie in a 3 ms wait
    # after the warm-up (5 of the 100 rows, as summary.json): 95 x (3 - 0.4) ms less the
    # limiter's 9 x 1 ms
    assert stats["exposed_other_s"] == pytest.approx(95 * 0.003 - 95 * 0.0004 - 9 * 0.001)
    assert "other (a core, scheduling, other ranks) 84%" in stats["exposed_story"]  # 0.238/0.285
    text = write_report([tmp_path / "run"], tmp_path / "out").read_text()
    assert "neither: a core, scheduling, other ranks" in text
    assert "waiting for a core" in text


def test_path_work_done_during_compute_counts_as_hidden() -> None:
    s = exposed_split([0.0001] * 10, [0.0] * 10, [0.002] * 10)
    assert s["path_work_hidden"] == pytest.approx(1 - 0.0001 / 0.002)
    assert math.isnan(exposed_split([0.1], [0.0], [0.0])["path_work_hidden"])


def test_the_progress_line_says_what_the_learner_waited_for() -> None:
    from types import SimpleNamespace

    from conduit_hpc.plane.learner import LearnerEndpoint

    fake = SimpleNamespace(_superstep=99,
                           mode=SimpleNamespace(name="edp",
                                                counters=lambda: {"resampled_rows": 0.0}),
                           record=SimpleNamespace(recent=oversubscribed_rows()[-50:]))
    text = LearnerEndpoint._status_text(fake)  # type: ignore[arg-type]
    assert "exposed 0.231 of wall time: path work 13%, rate limiter" in text, text
    # over the last rows, not the run (the run's is summary.json's and the report's): a
    # run's last line said 'exposed 0.00442 of wall time' beside the report's 0.0241
    assert "last 50: exposed 0.231 of wall time" in text, text
    assert "other (a core, scheduling, other ranks)" in text
