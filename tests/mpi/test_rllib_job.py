"""jobs/rllib_dqn_cartpole.py under more ranks than its layout uses (the ``[rllib]``
extra; the check comes before Ray starts)."""

from __future__ import annotations

import sys

import pytest
from extras import need_extra
from mpi4py import MPI

from conduit_hpc import ConfigError
from conduit_hpc.config import declared_config
from conduit_hpc.testing import REPO

need_extra("rllib", "ray.rllib", module_level=True)


@pytest.mark.mpi(min_size=3)
@pytest.mark.skipif(MPI.COMM_WORLD.size != 3,
                    reason="one rank count (make test's time): a rule of the config")
def test_ranks_beyond_learner_and_buffer_are_refused_on_every_rank() -> None:
    """layout.actors = 0 means "the rest of -n", so -n 3 gave the job an actor rank that
    did nothing while the learner trained (the layout check reads the config, where
    actors = 0). Now every rank raises the same ConfigError naming the -n to use."""
    path = REPO / "jobs" / "rllib_dqn_cartpole.toml"
    cls, _ = declared_config(path)
    assert cls is not None
    cfg = cls.from_toml(path, ["rllib.max_env_steps=1", "run.duration_s=1",
                               "run.timeout_s=30"])
    with pytest.raises(ConfigError, match=r"-n leaves \d+ actor rank\(s\) with nothing to "
                                          r"do; use -n 2"):
        sys.modules[cls.__module__].run(cfg, None, "")
