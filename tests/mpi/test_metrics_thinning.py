"""``run.metrics_full_rows`` reaches the learner's metrics file: a row for each of the
first N supersteps, then one per block of 2, 4, ... supersteps with its ``weight``; the
weights sum to the supersteps run, which the summary counts in memory from every one.

Layout: world rank 0 the learner, 1 the buffer, 2 an actor (3 ranks only)."""

from __future__ import annotations

import csv

import pytest
from conftest import SMALL_SPEC, play
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane
from conduit_hpc.testing import make_config

COMM = MPI.COMM_WORLD
SUPERSTEPS = 100


@pytest.mark.mpi(min_size=3)
@pytest.mark.skipif(COMM.size != 3, reason="runs at 3 ranks (one learner, buffer, actor)")
def test_the_learner_file_keeps_n_rows_then_weighted_samples(shared_dir) -> None:
    cfg = make_config(spec=SMALL_SPEC, layout={"learners": 1, "buffers": 1},
                      storage={"capacity_rows": 4096}, checkpoint={"on_stop": False},
                      run={"timeout_s": 30.0, "metrics_full_rows": 10},
                      scheduler={"mode": "edp", "batch_rows": 8, "min_fill_rows": 16})
    run_dir = shared_dir / "run"
    with ExperienceDataPlane(cfg, run_dir=run_dir) as edp:
        play(edp, lambda e: [e.next_batch() for _ in range(SUPERSTEPS)])
        learners = edp.summary()["learners"]
    (rank, summary), = learners.items()
    assert summary["supersteps"] == SUPERSTEPS  # in memory, every superstep
    if COMM.rank == 0:
        with open(run_dir / "metrics" / f"learner-{rank}.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        weights = [int(r["weight"]) for r in rows]
        # 10 of 1, 10 of 2, 10 of 4 (70 supersteps), then blocks of 8, the last one cut
        assert weights == [1] * 10 + [2] * 10 + [4] * 10 + [8] * 3 + [6], weights
        assert [int(r["superstep"]) for r in rows[:10]] == list(range(10))
