"""The example jobs' own sections refuse nonsense when the config loads (what
``conduit-hpc run`` does before mpirun), naming the key and the value. No MPI."""

from __future__ import annotations

import pytest

from conduit_hpc import ConfigError
from conduit_hpc.config import declared_config
from conduit_hpc.testing import REPO


def load(job: str, *sets: str) -> object:
    path = REPO / "jobs" / f"{job}.toml"
    cls, _ = declared_config(path)
    assert cls is not None
    return cls.from_toml(path, list(sets))


@pytest.mark.parametrize(("job", "override", "match"), [
    # eps_init = nan was reported as "torchrl.eps_end must be ..., got 0.04"
    ("torchrl_dqn_cartpole", "torchrl.eps_init=nan", r"torchrl\.eps_init must be .*, got nan"),
    ("torchrl_dqn_cartpole", "torchrl.eps_init=2", r"torchrl\.eps_init must be .*, got 2"),
    ("torchrl_dqn_cartpole", "torchrl.eps_init=0.3 torchrl.eps_end=0.5",
     r"torchrl\.eps_end must be in \[0, eps_init = 0\.3\], got 0\.5"),
    # a NaN target is never reached: the run went on to its budgets
    ("torchrl_dqn_cartpole", "torchrl.target_return=nan",
     r"torchrl\.target_return must be a number .*, got nan"),
    # the learner slept 1e9 s per superstep: the job hung, every rank waiting for it
    ("longhaul_dqn", "job.learner_step_s=1e9",
     r"job\.learner_step_s must be .*3600.*, got 1000000000\.0"),
    # the learner never looked at episode reports or stop requests: dqn.max_env_steps =
    # 1500 ran on to 10,368 steps, 'stopped by time budget', mean return nan
    ("dqn_cartpole", "job.poll_every_s=1e300",
     r"job\.poll_every_s must be <= run\.timeout_s \(120 s\), got 1e\+300"),
    ("dqn_cartpole", "job.report_every_s=121",
     r"job\.report_every_s must be <= run\.timeout_s \(120 s\), got 121\.0"),
    ("apex_atari", "job.poll_every_s=1e9 run.timeout_s=60",
     r"job\.poll_every_s must be <= run\.timeout_s \(60 s\), got 1000000000\.0"),
])
def test_a_bad_job_section_value_is_refused_naming_it(job: str, override: str,
                                                      match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load(job, *override.split())


@pytest.mark.parametrize("job", ["torchrl_dqn_cartpole"])
def test_the_jobs_as_written_load(job: str) -> None:
    load(job)


@pytest.mark.parametrize(("job", "actors"), [("dqn_cartpole", 4), ("apex_atari", 2)])
def test_an_n_step_whose_ingests_the_rate_limiter_refuses_is_refused_at_start(
        job: str, actors: int) -> None:
    """An Ape-X actor ingests up to envs_per_actor * n_step rows at once (every env
    ending an episode in one step); over scheduler.max_insert_batch the rate limiter
    refused that ingest mid-run ('batch of 95 rows exceeds scheduler.max_insert_batch =
    64' on an actor with dqn.n_step = 1000000). The job's start-up check refuses it, naming
    dqn.n_step; a larger max_insert_batch (with its error_buffer) makes it fit."""
    import sys

    cfg = load(job, "dqn.n_step=1000")
    check = sys.modules[type(cfg).__module__].check_config
    with pytest.raises(ConfigError, match=r"dqn\.n_step = 1000 with .* env\(s\) per actor "
                                          r"makes ingests of up to \d+ rows"):
        check(cfg, actors, 1)
    k = cfg.dqn.num_envs // actors
    ok = load(job, "dqn.n_step=1000", f"scheduler.max_insert_batch={1000 * k}",
              f"scheduler.error_buffer={cfg.scheduler.samples_per_insert * 1000 * k + 64}")
    assert check(ok, actors, 1) == k


@pytest.mark.parametrize("batches", [0, -1])
def test_the_example_job_refuses_a_batch_count_below_one(batches: int) -> None:
    """example.batches = -1 ran, took no batch and printed 'learner 0: -1 batches'."""
    with pytest.raises(ConfigError, match=rf"example\.batches must be >= 1, got {batches}"):
        load("example_gym", f"example.batches={batches}")
