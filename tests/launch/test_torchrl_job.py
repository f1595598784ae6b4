"""End to end: TorchRL's DQN (jobs/torchrl_dqn_cartpole) on the data plane through
`conduit-hpc run` in edp mode learns within a small budget (the benchmark's smoke run is
in tests/bench). Needs the [torchrl] extra
(a failure under CI without it, see tests/extras.py). Every subprocess has a
timeout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conduit_hpc.testing import REPO

JOB = REPO / "jobs" / "torchrl_dqn_cartpole.toml"
RANDOM_MEAN_RETURN = 22.0  # a uniformly random policy on CartPole-v1


@pytest.fixture(autouse=True)
def _extra() -> None:
    from extras import need_torchrl

    need_torchrl()


# ~30 s on an idle 2-core machine; the timeouts only guard against a hang (a machine
# shared with other jobs can take several times as long to start four torch ranks)
@pytest.mark.slow  # ~24 s: `make launch-slow` (.ci/run), not `make test`
@pytest.mark.timeout(600)
def test_short_torchrl_dqn_run_on_the_data_plane_learns(tmp_path: Path) -> None:
    budget = 4000
    proc = subprocess.run(
        [sys.executable, "-m", "conduit_hpc.tools.cli", "run", str(JOB), "--mode", "edp",
         "--runs", str(tmp_path), "--set", f"torchrl.max_env_steps={budget}",
         "--set", "torchrl.annealing_frames=1000", "--set", "torchrl.progress_every_s=0"],
        cwd=REPO, capture_output=True, text=True, timeout=570, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    summary = json.loads((run_dir / "metrics" / "summary.json").read_text())
    assert summary["mode"] == "edp"
    assert summary["stopped_by"] in ("env-step budget", "target"), summary
    assert summary["env_steps"] >= budget or summary["reached"]
    # every row the collectors made went through the data plane
    assert summary["rows_ingested"] >= summary["env_steps"]
    assert summary["updates"] > 100 and summary["plane_exposed_mean_s"] is not None
    print(f"edp: final mean return {summary['final_mean_return']:.1f} after "
          f"{summary['updates']} updates, {summary['env_steps']} env steps")
    # an untrained greedy Q network scores ~10, a random policy ~22: learning is needed
    assert summary["final_mean_return"] > 2 * RANDOM_MEAN_RETURN, summary
