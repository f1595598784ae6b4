"""RLlib's DQN on the data plane, end to end under ``conduit-hpc run`` (the ``[rllib]``
extra). Skipped only where the extra is missing and ``CI`` is unset; under ``CI`` a
missing extra fails (``.ci/run`` installs it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from extras import need_extra

from conduit_hpc.testing import REPO

need_extra("rllib", "ray.rllib", module_level=True)

# a small budget that a DQN learns within: random play scores ~22 on CartPole-v1
SHORT = ["--set", "rllib.max_env_steps=6000", "--set", "rllib.target_return=50.0",
         "--set", "rllib.learning_starts=500", "--set", "scheduler.min_fill_rows=250",
         "--set", "rllib.epsilon_steps=2000", "--set", "rllib.lr=0.001",
         "--set", "rllib.target_update_steps=250", "--set", "rllib.smoothing_episodes=10",
         "--set", "storage.capacity_rows=10000"]


def run_job(tmp_path: Path, *args: str, timeout_s: float = 240.0):
    return subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", "run",
                           "jobs/rllib_dqn_cartpole.toml", "--runs", str(tmp_path),
                           "--timeout", str(int(timeout_s) - 20), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
                          check=False)


@pytest.mark.slow  # ~28 s: `make launch-slow` (.ci/run), not `make test`
def test_rllib_dqn_learns_with_its_replay_on_the_data_plane_in_edp_mode(tmp_path) -> None:
    out = run_job(tmp_path, "--mode", "edp", *SHORT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    result = json.loads((run_dir / "rllib-result.json").read_text())
    assert result["replay"] == "data_plane" and result["mode"] == "edp"
    # RLlib's own loop sampled from the data plane and learnt: its smoothed mean return
    # rose from random play's ~22 to the target within the budget
    assert result["reached"], result["curve"]
    assert result["curve"][0][1] < 40 <= result["best_return"]
    assert result["train_steps"] > 100
    assert result["exposed_sample_ms"] > 0 and result["iteration_ms"] > 0


def test_a_bad_replay_buffer_key_is_refused_by_name_before_ray_starts(tmp_path) -> None:
    out = run_job(tmp_path, "--set", "rllib.buffer_keys={bogus_key = 1.0}", timeout_s=120)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "ConfigError" in text and "replay_buffer_config.bogus_key" in text, text[-3000:]
    assert "Started a local Ray instance" not in text  # refused before Ray started
    logs = "".join(p.read_text() for p in tmp_path.rglob("std*") if p.is_file())
    assert "Started a local Ray instance" not in logs
