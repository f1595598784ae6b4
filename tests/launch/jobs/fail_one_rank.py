"""Test job: world rank ``fail.rank`` fails while the others go on.

``fail.phase = "barrier"`` (default): it raises a plain exception (not a ConduitError)
while every other rank blocks in a barrier; under ``python -m mpi4py`` the job must abort.

Any other phase runs a real data plane (actors ingest, buffers serve, learners take
``fail.supersteps`` batches, checkpoints as ``[checkpoint]`` says) and rank ``fail.rank``
does ``fail.how`` - ``"raise"``, ``"kill"`` (SIGKILL, as the OOM killer), ``"exit0"`` /
``"exit1"`` (``os._exit``: no clean-up, no error), ``"stop"`` (SIGSTOP: a hung process) -
at ``fail.phase``: ``"start"`` (right after the constructor, before any batch or
ingest), ``"midrun"`` (``fail.after_s`` seconds after the constructor, from a timer
thread), ``"checkpoint"`` (when it writes its part of the ``fail.cut``-th periodic
checkpoint: a buffer rank), or ``"done"`` (inside its ``done()``). The job must end
(never the launcher's budget), non-zero, with one error line.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from mpi4py import MPI

from conduit_hpc import Config, ExperienceDataPlane, Role
from conduit_hpc.errors import DataPlaneTimeout
from conduit_hpc.features.checkpointing import CheckpointAgent, checkpoint_root
from conduit_hpc.job import job_main


@dataclass(frozen=True, slots=True, kw_only=True)
class FailSection:
    rank: int = 2
    conduit_error: bool = False  # raise a ConduitError (one-line report) instead
    kill: bool = False  # die of SIGKILL instead (as the OOM killer would)
    how: str = "raise"  # data-plane phases: "raise", "kill", "exit0", "exit1", "stop"
    phase: str = "barrier"  # or "start", "midrun", "checkpoint", "done"
    after_s: float = 2.0  # "midrun": seconds after the constructor
    cut: int = 2  # "checkpoint": the periodic checkpoint whose writing fails
    supersteps: int = 400  # what a learner runs (unless stopped)


@dataclass(frozen=True, slots=True, kw_only=True)
class FailConfig(Config):
    fail: FailSection = field(default_factory=FailSection)


def act(how: str, where: str) -> None:
    """Fail as ``how`` says (``where`` names the phase in the error raised)."""
    me = MPI.COMM_WORLD.Get_rank()
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif how in ("exit0", "exit1"):
        os._exit(int(how[-1]))
    else:
        raise RuntimeError(f"deliberate failure on world rank {me} {where}")


def run_data_plane(cfg: FailConfig, run_dir: Path | None) -> None:
    f, me = cfg.fail, MPI.COMM_WORLD.Get_rank()
    mine = me == f.rank
    if mine and f.phase == "checkpoint":  # a buffer rank writing its part
        from conduit_hpc.features.checkpointing import agent

        real, calls = agent.write_buffer_part, [0]

        def failing(*args: object, **kwargs: object) -> object:
            calls[0] += 1
            if calls[0] == f.cut:
                act(f.how, f"writing checkpoint part {calls[0]}")
            return real(*args, **kwargs)  # type: ignore[operator]

        agent.write_buffer_part = failing  # type: ignore[assignment]
    with ExperienceDataPlane(cfg, run_dir=run_dir) as edp:
        if mine and f.phase == "start":
            act(f.how, "before its first batch")
        if mine and f.phase == "midrun":
            threading.Timer(f.after_s, act, (f.how, "mid-run")).start()
        if mine and f.phase == "done":
            real_done = edp.done

            def failing_done() -> None:
                act(f.how, "inside done()")
                real_done()

            edp.done = failing_done  # type: ignore[method-assign]
        ccfg = cfg.checkpoint  # periodic checkpoints, as jobs/synthetic.py cuts them
        agent = CheckpointAgent(edp, checkpoint_root(cfg, run_dir),
                                every_seconds=ccfg.every_seconds, keep=ccfg.keep)
        agent.every_supersteps(ccfg.every_supersteps, lambda: {})
        rng = np.random.default_rng(me)
        if edp.role is Role.ACTOR:
            while not edp.should_stop:
                edp.ingest({"x": rng.random(8, dtype=np.float32)})
        elif edp.serves:
            edp.serve()
        else:
            for _ in range(f.supersteps):
                edp.next_batch()
        edp.done()
        agent.finish()


def run(cfg: FailConfig, run_dir: Path | None, resume: str) -> None:
    if cfg.fail.phase != "barrier":
        run_data_plane(cfg, run_dir)
        return
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
