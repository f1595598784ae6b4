"""End to end: the Ape-X DQN Atari job (jobs/apex_atari.toml) at a smoke size through
`conduit-hpc run` - a tiny replay, a few supersteps, a time budget. It must step real ALE
frames, ingest rows, run its supersteps with a finite loss, checkpoint its replay (each
frame once, compressed) and write its summary with the throughput figures and what its
replay holds against the full layout; then `--resume` must restore the saved rows and the
learner, go on training, and write a final checkpoint when SIGTERM stops it. Needs the
[atari] extra (skips without it; a failure under CI). Every subprocess has a timeout."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from extras import need_extra

from conduit_hpc import checkpoint as ck
from conduit_hpc.testing import REPO

JOB = REPO / "jobs" / "apex_atari.toml"
SUPERSTEPS = 30
#: a smoke size for a 2-core machine: 4 ranks, 2 actors x 2 envs, 1,000 rows of replay
SMOKE = ["layout.actors=2", "dqn.num_envs=4", "storage.capacity_rows=1000",
         "scheduler.min_fill_rows=200", "scheduler.samples_per_insert=0",
         "scheduler.error_buffer=0", f"job.max_supersteps={SUPERSTEPS}",
         "run.duration_s=120", "job.progress_every_s=0", "dqn.target_period=20"]


CKPT_EVERY = SUPERSTEPS // 2  # one periodic checkpoint, at superstep 15


def run_cmd(runs: Path, *sets: str) -> list[str]:
    cmd = [sys.executable, "-m", "conduit_hpc.tools.cli", "run", str(JOB), "--runs", str(runs)]
    for s in (*SMOKE, *sets):
        cmd += ["--set", s]
    return cmd


@pytest.mark.slow  # ~25 s: `make launch-slow` (.ci/run), not `make test`
@pytest.mark.timeout(420)  # inner timeouts: 200 + 120 + 80 s
def test_smoke_run_steps_frames_ingests_trains_checkpoints_and_resumes(tmp_path: Path) -> None:
    need_extra("atari", "ale_py", "cv2")
    cmd = run_cmd(tmp_path, f"checkpoint.every_supersteps={CKPT_EVERY}")
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=200,
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
    # ingest over the actors' span (it was the job's wall time, set-up included) and at
    # the bytes the shards took, each frame once (it was whole stacks: 56,472 B a row)
    per_row = summary["ingest_mb_per_s"] * 1e6 / summary["ingest_rows_per_s"]
    assert 7152 <= per_row < 2 * 7152, per_row
    csv_span = max(float(list(csv.DictReader(p.read_text().splitlines()))[-1]["time_s"])
                   for p in (run_dir / "metrics").glob("actor-*.csv"))
    assert 0 < summary["ingest_span_s"] <= csv_span
    assert summary["ingest_rows_per_s"] == pytest.approx(
        summary["rows_ingested"] / summary["ingest_span_s"])
    assert len(summary["frames_per_s_per_actor"]) == 2
    assert all(v > 0 for v in summary["frames_per_s_per_actor"])
    assert summary["rows_delivered"] == SUPERSTEPS * 32 and summary["delivered_rows_per_s"] > 0
    assert summary["exposed_mean_s"] >= 0
    with open(run_dir / "metrics" / "learner-0.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= SUPERSTEPS - 1 and {"loss", "td_abs_mean", "mean_return"} <= set(rows[0])
    assert "frames/s" in proc.stdout and "rows/s" in proc.stdout
    check_replay_summary(summary, proc.stdout)
    resume_then_stop(tmp_path, run_dir)


def check_replay_summary(summary: dict, stdout: str) -> None:
    """What the replay holds, stored against the full layout, as `plan` counts it (the
    row's payload plus a stamp and the priority index: 112 B at most)."""
    assert summary["replay_capacity_rows"] == 1000
    assert summary["replay_tier_rows"] == {"buffer_host": 1000}
    assert 0 < summary["replay_rows_held"] <= 1000
    assert summary["stored_over_full"] == pytest.approx(7152 / 56472)
    assert summary["memory_row_bytes"] == 7152 + 112
    assert summary["memory_row_bytes_full"] == 56472 + 112
    assert summary["replay_memory_bytes"] == 1000 * (7152 + 112)
    assert summary["full_layout_rows_in_budget"] == 1000 * (7152 + 112) // (56472 + 112) == 128
    assert summary["rows_per_budget_over_full"] >= 6  # the goal
    assert "7,152 B stored a row against 56,472 B in the full layout" in stdout
    assert "would hold 128 full rows (7.8x fewer)" in stdout


def resume_then_stop(runs: Path, first: Path) -> None:
    """The periodic checkpoint of the first run holds the replay each frame once (gzip
    on the frame and reference columns); `--resume` restores its rows and the learner,
    trains on, and SIGTERM ends it with a final checkpoint."""
    (saved,) = [p for p in ck.list_checkpoints(first / "checkpoints") if ck.is_complete(p)]
    c = ck.open_checkpoint(saved)
    c.verify()
    assert {"obs__frame", "obs__refs"} <= set(c.spec.names)
    assert not {"obs", "next_obs"} & set(c.spec.names)  # frames once, no whole stacks
    with h5py.File(saved / "buffer-0000.h5", "r") as f:
        cols = f["shards/0/columns"]
        assert cols["obs__frame"].compression == cols["obs__refs"].compression == "gzip"
        assert cols["action"].compression is None
    lead = next(r for r, v in c.counters.items() if v.get("role") == "learner")
    assert c.counters[lead]["updates"] == CKPT_EVERY and 0 < c.rows <= 1000
    out_path = runs / "resume.out"
    with open(out_path, "w") as out:
        job = subprocess.Popen([*run_cmd(runs, "job.max_supersteps=0", "run.duration_s=90",
                                         "job.progress_every_s=0.25"), "--resume"],
                               cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        end = time.monotonic() + 120
        while not any(int(m.replace(",", "")) > CKPT_EVERY for m in re.findall(
                r"^\[apex_atari\].* supersteps +([\d,]+)", out_path.read_text(), re.M)):
            assert job.poll() is None and time.monotonic() < end, out_path.read_text()[-3000:]
            time.sleep(0.1)
        job.send_signal(signal.SIGTERM)  # the launcher asks every rank to stop
        rc = job.wait(timeout=80)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)
    text = out_path.read_text()
    assert rc == 0, text[-3000:]
    # the saved rows came back, and the learner's model, optimizer and step
    # frames stored once: the checkpoint's rows are slots, some of them transitions
    from conduit_hpc.storage.frames import LAG_COLUMN, LAG_NONE

    transitions = sum(int((c.shard_dataset(s.shard_id, f"columns/{LAG_COLUMN}")
                           < LAG_NONE).sum()) for s in c.shards)
    assert 0 < transitions <= c.rows
    assert (f"resumed from {saved} (checkpoint 1): {c.rows:,} slots (frames stored once: "
            f"{transitions:,} of the checkpoint's slots are transitions, the others hold "
            f"frames only)\n") in text, text[-3000:]
    assert (f"model, target network and optimizer from checkpoint 1 (after {CKPT_EVERY} "
            f"updates)") in text
    second = max((p for p in runs.iterdir() if p.is_dir()), key=lambda p: p.name)
    assert second != first
    summary = json.loads((second / "metrics" / "summary.json").read_text())
    assert summary["stopped_by"] == "stop requested"
    assert summary["updates"] > CKPT_EVERY  # counted on from the checkpoint's
    assert summary["env_steps_total"] > summary["env_steps"]
    # SIGTERM: a final checkpoint, numbered on from the restored one, at the last update
    final = Path(re.findall(r"^final checkpoint written: (\S+)$", text, re.M)[-1])
    assert final.parent == second / "checkpoints" and ck.seq_of(final) == 2
    f = ck.open_checkpoint(final)
    f.verify()
    assert f.counters[lead]["updates"] == summary["updates"]
    # every row both checkpoints hold (the same seq) is stored alike: the frames the
    # rows reference, their references and their fields (the lag may be sealed anew)
    a, b = c.read_shard(0), f.read_shard(0)
    common, ia, ib = np.intersect1d(a.seqs, b.seqs, return_indices=True)
    for name, col in a.columns.items():
        if name != "frames__lag":
            assert np.array_equal(col[ia], b.columns[name][ib]), name
    print(f"apex_atari resume: {c.rows:,} rows restored, {len(common):,} still held at the "
          f"final checkpoint and equal; {summary['updates']} updates")
