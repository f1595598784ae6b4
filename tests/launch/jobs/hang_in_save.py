"""Test job: world rank ``hang.rank`` stops (SIGSTOP: a hung process, as on a stuck
filesystem) while it writes its part of a checkpoint in ``save_checkpoint``
(``hang.phase = "save"``), or while it reads one in ``restore_data_plane``
(``"restore"``), or in the data plane's constructor (``"construct"``): when it picks its
device (``hang.step = "device"``: ``hang.rank`` must be a learner), or just before one of
the constructor's other collective steps (``hang.step``, a key of :data:`STEPS`: the rank
stops before it calls that step's function). Every other rank must end within
``run.timeout_s`` with an error naming the step it waited in, not wait for the hung rank
for ever."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from mpi4py import MPI

from conduit_hpc import Config, ExperienceDataPlane, Role
from conduit_hpc import checkpoint as ck
from conduit_hpc.features.checkpointing import restore_data_plane, save_checkpoint
from conduit_hpc.job import job_main
from conduit_hpc.testing import checked_batch


@dataclass(frozen=True, slots=True, kw_only=True)
class HangSection:
    rank: int = 2
    phase: str = "save"  # or "restore", "construct"
    step: str = "device"  # constructing: "device", or a key of STEPS


@dataclass(frozen=True, slots=True, kw_only=True)
class HangConfig(Config):
    hang: HangSection = field(default_factory=HangSection)


class StopsWhenWritten(Mapping[str, np.ndarray]):
    """Extra state whose writing stops this process (between the checkpoint's first
    barrier and the gather of every rank's part)."""

    def __getitem__(self, key: str) -> np.ndarray:
        return np.zeros(4)

    def __iter__(self) -> Iterator[str]:
        os.kill(os.getpid(), signal.SIGSTOP)
        yield "state"

    def __len__(self) -> int:
        return 1


#: constructor steps: the module and function the hung rank stops before it calls
STEPS = {
    "roles": ("conduit_hpc.plane.front", "split_roles"),  # before the Dup
    "communicators": ("conduit_hpc.plane.roles", "assign_roles"),  # before the role splits
    "placement": ("conduit_hpc.plane.front", "decide_placement"),  # the plan's gather
    "memory": ("conduit_hpc.plane.front", "ShardMemory"),
    "memory_check": ("conduit_hpc.plane.memory", "free_memory_bytes"),  # inside the check
    "window": ("conduit_hpc.plane.memory", "RmaWindow"),  # before the windows' allocation
    "room": ("conduit_hpc.transport.rma", "shared_memory_dir"),  # inside a window's check
    "channel": ("conduit_hpc.plane.front", "Channel"),  # before its Dup
}


def stop_before(module: str, name: str) -> None:
    """Make this process stop (SIGSTOP) when ``module.name`` is next called."""
    import importlib

    mod = importlib.import_module(module)
    real = getattr(mod, name)

    def stopping(*args: object, **kwargs: object) -> object:
        os.kill(os.getpid(), signal.SIGSTOP)
        return real(*args, **kwargs)

    setattr(mod, name, stopping)


def run(cfg: HangConfig, run_dir: Path | None, resume: str) -> None:
    assert run_dir is not None
    if cfg.hang.phase == "construct" and MPI.COMM_WORLD.Get_rank() == cfg.hang.rank:
        if cfg.hang.step == "device":
            stop_before("conduit_hpc.plane.staging", "select_device")
        else:
            stop_before(*STEPS[cfg.hang.step])
    with ExperienceDataPlane(cfg, run_dir=run_dir) as edp:
        if edp.role is Role.ACTOR:
            for i in range(4):
                edp.ingest(checked_batch(edp.world_rank, 8 * i, 8))
            edp.done()
        else:
            edp.serve()
        hang = edp.world_rank == cfg.hang.rank
        saving = cfg.hang.phase == "save"
        save_checkpoint(edp, run_dir / "checkpoints",
                        extra_state=StopsWhenWritten() if hang and saving else None)
    if saving:
        return
    if hang:  # this rank stops when it opens the checkpoint to read its part
        def stop(*args: object, **kwargs: object) -> None:
            os.kill(os.getpid(), signal.SIGSTOP)

        ck.open_checkpoint = stop  # type: ignore[assignment]
    with ExperienceDataPlane(cfg, run_dir=run_dir) as edp:
        restore_data_plane(edp, "latest", roots=[run_dir / "checkpoints"])


JOB_CONFIG = HangConfig

if __name__ == "__main__":
    job_main(HangConfig, run)
