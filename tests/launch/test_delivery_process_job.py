"""End-to-end: an existing job (jobs/synthetic.py, unchanged) runs through
``conduit-hpc run`` with a delivery rank per learner (``scheduler.delivery =
"process"``); the launcher counts that rank."""

from __future__ import annotations

import csv
import re
import subprocess
import sys

from conduit_hpc.testing import REPO


def test_synthetic_job_runs_with_a_delivery_rank(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", "run",
                          "jobs/synthetic.toml", "--runs", str(tmp_path),
                          "--set", 'scheduler.delivery="process"',
                          "--set", "checkpoint.every_seconds=0",
                          "--set", "checkpoint.on_stop=false",
                          "--set", "layout.actors=1", "--set", "run.duration_s=1.0",
                          "--timeout", "120"],
                         cwd=REPO, capture_output=True, text=True, timeout=180, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    m = re.search(r"learner 0 \(edp\): (\d+) supersteps", out.stdout)
    assert m is not None and int(m.group(1)) > 0, out.stdout[-2000:]
    (run_dir,) = tmp_path.iterdir()
    # 4 ranks: learner, its delivery rank, the buffer, one actor
    assert sorted(p.name for p in (run_dir / "logs").glob("rank.*")) == [
        "rank.0", "rank.1", "rank.2", "rank.3"]
    with open(run_dir / "metrics" / "learner-0.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == int(m.group(1))
    assert all(int(r["rows"]) == 256 for r in rows)
