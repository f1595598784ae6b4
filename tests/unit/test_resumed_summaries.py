"""What a resumed job's ``summary.json`` says: counters from the run's start, rates over
this attempt's own work and time."""

from __future__ import annotations

import math

from test_apex import load_job

from conduit_hpc.testing import REPO


def _flat(updates: int, at_start: int, wall_s: float) -> dict:
    job = load_job()
    cfg = job.DQNCartPoleConfig.from_toml(REPO / "jobs" / "dqn_cartpole.toml")
    learner = {"updates": updates, "updates_at_start": at_start, "wall_s": wall_s,
               "env_steps_offset": 4176, "why": "superstep budget", "mean": math.nan}
    stats = [("learner", 0, learner), ("actor", 2, {"env_steps": 100, "episodes": 3})]
    summary = {"learners": {0: {"supersteps": updates - at_start}}, "rows_ingested": 0,
               "actors": {2: {"limiter_wait_s": 0.0}}}
    return job.flat_summary(cfg, summary, stats, wall_s, False)


def test_a_resumed_run_s_update_rate_is_this_attempt_s() -> None:
    """updates_per_s divided the run's updates (the checkpoint's included) by this
    attempt's time: a resume at 758 updates that ran 4,242 more in 16.6 s said 301/s
    (255/s), and one whose superstep budget was already spent said 194,799,749/s."""
    flat = _flat(5000, 758, 16.6)
    assert flat["updates"] == 5000 and flat["updates_at_start"] == 758
    assert abs(flat["updates_per_s"] - 4242 / 16.6) < 1e-9
    assert flat["env_steps"] == 4176 + 100 and flat["env_steps_offset"] == 4176
    assert _flat(929, 929, 4.8e-6)["updates_per_s"] == 0.0
    assert _flat(300, 0, 2.0)["updates_per_s"] == 150.0  # a fresh run: as before
