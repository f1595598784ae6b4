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
])
def test_a_bad_job_section_value_is_refused_naming_it(job: str, override: str,
                                                      match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load(job, *override.split())


@pytest.mark.parametrize("job", ["torchrl_dqn_cartpole"])
def test_the_jobs_as_written_load(job: str) -> None:
    load(job)
