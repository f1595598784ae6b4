"""End to end: the Ape-X DQN job through `conduit-hpc run` in each delivery mode, with a
small superstep budget. The learned policy must beat a random one, and the job must
write its episodes and summary. Every subprocess has a timeout."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conduit_hpc.testing import REPO

JOB = REPO / "jobs" / "dqn_cartpole.toml"
RANDOM_MEAN_RETURN = 22.0  # a uniformly random policy on CartPole-v1
SUMMARY_KEYS = {"reached", "env_steps_to_target", "wall_s", "env_steps", "updates",
                "final_mean_return", "mode", "supersteps", "exposed_mean_s",
                "ingest_rows_per_s"}


# edp (the default) in `make test`; sync and service (~20 s each) in `make launch-slow`
# (.ci/run): each mode's job end to end also in test_cli.py's synthetic jobs
@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["edp", pytest.param("sync", marks=pytest.mark.slow),
                                  pytest.param("service", marks=pytest.mark.slow)])
def test_short_dqn_run_learns_in_every_mode(mode: str, tmp_path: Path) -> None:
    supersteps = 2000
    proc = subprocess.run(
        [sys.executable, "-m", "conduit_hpc.tools.cli", "run", str(JOB), "--mode", mode,
         "--runs", str(tmp_path), "--set", f"job.max_supersteps={supersteps}",
         "--set", "job.progress_every_s=0"],
        cwd=REPO, capture_output=True, text=True, timeout=220, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    summary = json.loads((run_dir / "metrics" / "summary.json").read_text())
    assert set(summary) >= SUMMARY_KEYS, sorted(SUMMARY_KEYS - set(summary))
    assert summary["mode"] == mode
    assert re.search(r"return curve \(mean scored return per [\d,]+ env steps\): \d", proc.stdout)
    # the job stopped on its budget (or, by luck, on the target), every rank together
    assert summary["stopped_by"] in ("superstep budget", "target"), summary["stopped_by"]
    if not summary["reached"]:
        assert summary["updates"] == supersteps and summary["env_steps_to_target"] is None
    # an untrained greedy Q network scores ~10, a random policy ~22: learning is needed
    print(f"{mode}: final mean return {summary['final_mean_return']:.1f} after "
          f"{summary['updates']} updates, {summary['env_steps']} env steps")
    assert summary["final_mean_return"] > 2.5 * RANDOM_MEAN_RETURN, summary
    with open(run_dir / "metrics" / "episodes.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and {"time_s", "env_steps", "actor", "episode_return"} <= set(rows[0])
    assert len({r["actor"] for r in rows}) == 4  # every actor rank played
    steps = [int(r["env_steps"]) for r in rows]
    assert steps == sorted(steps) and steps[-1] <= summary["env_steps"]
    with open(run_dir / "metrics" / "learner-0.csv", newline="") as f:
        learner = list(csv.DictReader(f))
    assert len(learner) >= summary["updates"] - 1
    assert {"loss", "td_abs_mean", "exposed_s"} <= set(learner[0])
    assert {r["mode"] for r in learner} == {mode}


@pytest.mark.slow  # ~25 s: `make launch-slow` (.ci/run), not `make test`
@pytest.mark.timeout(240)
def test_resume_continues_training_from_the_checkpointed_model(tmp_path: Path) -> None:
    common = [sys.executable, "-m", "conduit_hpc.tools.cli", "run", str(JOB), "--runs",
              str(tmp_path), "--set", "job.progress_every_s=0", "--set",
              "checkpoint.every_supersteps=100"]
    first = subprocess.run([*common, "--set", "job.max_supersteps=250"], cwd=REPO,
                           capture_output=True, text=True, timeout=110, check=False)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    first_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    assert sorted(p.name for p in (first_dir / "checkpoints").iterdir()) == [
        ".lock", "ckpt-000001", "ckpt-000002"]  # at supersteps 100 and 200; the root's
    # lock, which rank 0 held while the job ran (docs/sharp-bits.md)
    before = json.loads((first_dir / "metrics" / "summary.json").read_text())
    second = subprocess.run([*common, "--resume", "--set", "job.max_supersteps=300"],
                            cwd=REPO, capture_output=True, text=True, timeout=110,
                            check=False)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    assert "model, target network and optimizer from checkpoint 2 (after 200 updates)" \
        in second.stdout, second.stdout[-2000:]
    second_dir = max((p for p in tmp_path.iterdir() if p.is_dir()), key=lambda p: p.name)
    after = json.loads((second_dir / "metrics" / "summary.json").read_text())
    # the replay came back (at least the fill the learner needed to start) ...
    rows = re.search(r"resumed from \S+ \(checkpoint 2\): ([\d,]+) rows", second.stdout)
    assert rows and int(rows.group(1).replace(",", "")) >= 1000, second.stdout[-2000:]
    # ... and 100 more updates on top of the checkpoint's 200; env steps go on counting
    assert after["updates"] == 300
    assert after["env_steps"] > before["env_steps"] / 2 > 0


@pytest.mark.slow  # ~22 s: `make launch-slow` (.ci/run), not `make test`
@pytest.mark.timeout(300)
def test_two_learners_train_data_parallel_with_identical_parameters(tmp_path: Path) -> None:
    """``layout.learners = 2``: gradients all-reduced (gloo) every superstep. Both learners
    run the same supersteps, end with the same parameters (checksums in summary.json),
    write their own metrics, and the policy learns within a short budget."""
    supersteps = 1200
    proc = subprocess.run(
        [sys.executable, "-m", "conduit_hpc.tools.cli", "run", str(JOB), "--runs",
         str(tmp_path), "--set", "layout.learners=2", "--set", "layout.actors=2",
         "--set", f"job.max_supersteps={supersteps}", "--set", "job.progress_every_s=0"],
        cwd=REPO, capture_output=True, text=True, timeout=280, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "2 learner(s) (gloo all-reduce)" in proc.stdout
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    summary = json.loads((run_dir / "metrics" / "summary.json").read_text())
    assert summary["learners"] == 2
    assert summary["stopped_by"] in ("superstep budget", "target"), summary["stopped_by"]
    updates = summary["learner_updates"]
    assert len(updates) == 2 and len(set(updates.values())) == 1, updates
    checksums = summary["param_checksums"]
    assert len(checksums) == 2 and len(set(checksums.values())) == 1, checksums
    assert summary["params_identical"] is True
    # the gradient all-reduce and the agreement, timed on each learner, every superstep
    ar = summary["allreduce_mean_s_per_learner"]
    assert sorted(ar) == sorted(checksums) and all(0 < t < 10 for t in ar.values()), ar
    assert summary["allreduce_mean_s"] == ar[min(ar, key=int)]
    assert 0 < summary["agree_mean_s"] < 10, summary
    for rank in (int(r) for r in checksums):  # every learner wrote its metrics
        with open(run_dir / "metrics" / f"learner-{rank}.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert len(rows) >= summary["updates"] - 1 and "loss" in rows[0]
    print(f"2 learners: final mean return {summary['final_mean_return']:.1f} after "
          f"{summary['updates']} updates, {summary['env_steps']} env steps")
    assert summary["final_mean_return"] > 2.5 * RANDOM_MEAN_RETURN, summary


@pytest.mark.slow  # ~37 s: `make launch-slow` (.ci/run), not `make test`
@pytest.mark.timeout(300)
def test_the_learner_gpu_tier_trains_checkpoints_and_resumes(tmp_path: Path) -> None:
    """``planner = "static"`` on ``jobs/cluster-local-gpu.toml``: part of the replay in a
    ``learner_gpu`` shard mirrored on the learner's device (the CPU here). The job learns,
    draws about the planned share of its rows from the device, checkpoints (the owner's
    index mirrors the device's priorities) and resumes with the device tier refilled."""
    common = [sys.executable, "-m", "conduit_hpc.tools.cli", "run", str(JOB), "--runs",
              str(tmp_path), "--set", "job.progress_every_s=0", "--set",
              "placement.planner=static", "--set",
              "placement.cluster=jobs/cluster-local-gpu.toml", "--set",
              "checkpoint.every_supersteps=1000"]
    first = subprocess.run([*common, "--set", "job.max_supersteps=2000"], cwd=REPO,
                           capture_output=True, text=True, timeout=140, check=False)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    first_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    plan = json.loads((first_dir / "plan.json").read_text())
    gpu = [s for s in plan["placement"]["shards"] if s["tier"] == "learner_gpu"]
    assert len(gpu) == 1 and plan["tiers"]["learner_gpu"]["rows"] == gpu[0]["capacity_rows"]
    summary = json.loads((first_dir / "metrics" / "summary.json").read_text())
    assert summary["final_mean_return"] > 2.5 * RANDOM_MEAN_RETURN, summary
    drawn = summary["device_rows_drawn"]
    assert drawn > 0, summary
    print(f"learner_gpu: {drawn:.0f} of {summary['updates'] * 64} rows drawn on the device, "
          f"final mean return {summary['final_mean_return']:.1f}")
    second = subprocess.run([*common, "--resume", "--set", "job.max_supersteps=2100"],
                            cwd=REPO, capture_output=True, text=True, timeout=140,
                            check=False)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    rows = re.search(r"resumed from \S+ \(checkpoint 1\): ([\d,]+) rows", second.stdout)
    assert rows and int(rows.group(1).replace(",", "")) >= 1000, second.stdout[-2000:]
    second_dir = max((p for p in tmp_path.iterdir() if p.is_dir()), key=lambda p: p.name)
    after = json.loads((second_dir / "metrics" / "summary.json").read_text())
    assert after["updates"] == 2100 and after["device_rows_drawn"] > 0, after
