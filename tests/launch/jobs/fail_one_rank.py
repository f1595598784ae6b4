"""Test job: world rank ``fail.rank`` raises a plain exception (not a ConduitError) while
every other rank blocks in a barrier; under ``python -m mpi4py`` the job must abort."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from mpi4py import MPI

from conduit_hpc import Config
from conduit_hpc.errors import DataPlaneTimeout
from conduit_hpc.job import job_main


@dataclass(frozen=True, slots=True, kw_only=True)
class FailSection:
    rank: int = 2
    conduit_error: bool = False  # raise a ConduitError (one-line report) instead
    kill: bool = False  # die of SIGKILL instead (as the OOM killer would)


@dataclass(frozen=True, slots=True, kw_only=True)
class FailConfig(Config):
    fail: FailSection = field(default_factory=FailSection)


def run(cfg: FailConfig, run_dir: Path | None, resume: str) -> None:
    comm = MPI.COMM_WORLD
    comm.Barrier()
    if comm.Get_rank() == cfg.fail.rank:
        if cfg.fail.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        if cfg.fail.conduit_error:
            raise DataPlaneTimeout(f"deliberate timeout on world rank {cfg.fail.rank}")
        raise RuntimeError(f"deliberate failure on world rank {cfg.fail.rank}")
    comm.Barrier()  # never completes: the failing rank does not arrive


JOB_CONFIG = FailConfig

if __name__ == "__main__":
    job_main(FailConfig, run)
