"""End to end: the Ape-X DQN Atari job (jobs/apex_atari.toml) at a smoke size through
`conduit-hpc run` - a tiny replay, a few supersteps, a time budget. It must step real ALE
frames, ingest rows, run its supersteps with a finite loss and write its summary with
the throughput figures. Needs the [atari] extra (skips without it; a failure under CI).
The subprocess has a timeout."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from extras import need_extra

from conduit_hpc.testing import REPO

JOB = REPO / "jobs" / "apex_atari.toml"
SUPERSTEPS = 40
#: a smoke size for a 2-core machine: 4 ranks, 2 actors x 2 envs, 1,000 rows of replay
SMOKE = ["layout.actors=2", "dqn.num_envs=4", "storage.capacity_rows=1000",
         "scheduler.min_fill_rows=200", "scheduler.samples_per_insert=0",
         "scheduler.error_buffer=0", f"job.max_supersteps={SUPERSTEPS}",
         "run.duration_s=120", "job.progress_every_s=0", "dqn.target_period=20"]


@pytest.mark.timeout(280)
def test_smoke_run_steps_frames_ingests_and_trains(tmp_path: Path) -> None:
    need_extra("atari", "ale_py", "cv2")
    cmd = [sys.executable, "-m", "conduit_hpc.tools.cli", "run", str(JOB), "--runs",
           str(tmp_path)]
    for s in SMOKE:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=260,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    summary = json.loads((run_dir / "metrics" / "summary.json").read_text())
    print(f"apex_atari smoke: {summary['frames']:,} frames ({summary['frames_per_s']:.0f}/s), "
          f"{summary['rows_ingested']:,} rows ({summary['ingest_rows_per_s']:.0f}/s), "
          f"{summary['updates']} supersteps in {summary['wall_s']:.1f} s")
    assert summary["env_id"] == "ALE/Pong-v5" and summary["row_bytes"] == 2 * 4 * 84 * 84 + 24
    # each frame stored once: one frame, 8 references and a lag a slot (under 1/6)
    assert summary["stored_row_bytes"] == 84 * 84 + 8 * 8 + 8 + 24
    assert summary["frame_stacks"] == {"obs": {"stream": "env", "axis": 0, "depth": 4,
                                               "next_field": "next_obs"}}
    # the superstep budget ended it (the time budget is only a guard)
    assert summary["stopped_by"] == "superstep budget", summary["stopped_by"]
    assert summary["updates"] == summary["supersteps"] == SUPERSTEPS
    assert summary["loss_finite"] is True
    # real frames: every agent step is frame_skip = 4 emulator frames, and at least the
    # minimum fill of n-step rows went in before the first batch
    assert summary["frames"] == 4 * summary["env_steps"] and summary["env_steps"] >= 200
    assert summary["rows_ingested"] >= 200
    assert summary["frames_per_s"] > 0 and summary["ingest_rows_per_s"] > 0
    assert len(summary["frames_per_s_per_actor"]) == 2
    assert all(v > 0 for v in summary["frames_per_s_per_actor"])
    assert summary["rows_delivered"] == SUPERSTEPS * 32 and summary["delivered_rows_per_s"] > 0
    assert summary["exposed_mean_s"] >= 0
    with open(run_dir / "metrics" / "learner-0.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= SUPERSTEPS - 1 and {"loss", "td_abs_mean", "mean_return"} <= set(rows[0])
    assert "frames/s" in proc.stdout and "rows/s" in proc.stdout
