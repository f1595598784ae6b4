"""End-to-end: the example job of docs/writing-a-job.md runs as written."""

from __future__ import annotations

import csv
import subprocess
import sys

from conduit_hpc.testing import REPO


def test_example_gym_job_runs_and_writes_learner_metrics(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", "run",
                          "jobs/example_gym.toml", "--runs", str(tmp_path),
                          "--set", "example.batches=40", "--timeout", "240"],
                         cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "learner 0: 40 batches" in out.stdout
    (run_dir,) = tmp_path.iterdir()
    with open(run_dir / "metrics" / "learner-0.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 40
    assert all(float(r["mean_reward"]) == 1.0 for r in rows[:40])  # CartPole: 1 per step
    assert (run_dir / "logs" / "rank.0" / "stdout").exists()
