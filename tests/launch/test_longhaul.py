"""End to end: the long-haul job and its refusals (both placements side by side, through
the benchmark's smoke size, are in tests/bench). Every subprocess has a timeout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conduit_hpc.testing import REPO


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_a_layout_that_does_not_fit_is_one_clear_message(tmp_path: Path) -> None:
    out = cli("run", "jobs/longhaul_dqn.toml", "--runs", str(tmp_path), "-n", "4",
              "--set", "layout.buffers=1", "--set", "layout.actors=2",
              "--set", "job.workload=regression", timeout=120)
    assert out.returncode != 0
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("conduit-hpc: error")]
    assert len(errors) == 1, out.stderr
    assert "layout.buffers must be 2 with longhaul.mode = 'edge_replay'" in errors[0]


@pytest.mark.slow  # ~16 s: `make launch-slow` (.ci/run), not `make test`
def test_dqn_workload_runs_in_edge_replay(tmp_path: Path) -> None:
    out = cli("run", "jobs/longhaul_dqn.toml", "--runs", str(tmp_path),
              "--set", "job.supersteps=40", "--set", "scheduler.min_fill_rows=256",
              timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = next(tmp_path.iterdir()) / "metrics"
    summary = json.loads((metrics / "summary.json").read_text())
    assert summary["workload"] == "dqn" and summary["updates"] == 40
    assert summary["env_steps"] > 0 and summary["link_rows_crossed"] >= 40 * 64
    assert (metrics / "episodes.csv").exists()
