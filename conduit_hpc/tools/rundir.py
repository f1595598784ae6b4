"""The run directory of ``conduit-hpc run``: checked, locked and made before any rank
starts. Local; no MPI."""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path
from typing import IO

from conduit_hpc.config import Config
from conduit_hpc.errors import ConduitError, ConfigError

__all__ = ["check_checkpoint_root", "lock_run_dir", "unwritable"]


def check_checkpoint_root(cfg: Config, run_dir: Path, resume: str) -> None:
    """Before launch: the checkpoint root must be a directory (or not yet exist), a
    fresh run (no ``resume``) must not start in one that holds checkpoints - its
    retention (``checkpoint.keep``) would delete another run's - and a ``resume`` path
    must be a directory. Local; reads only.

    Raises:
        ConfigError: naming ``checkpoint.directory`` or ``--resume``, the path and the
            problem.
    """
    from conduit_hpc.checkpoint.files import checkpoint_root, root_problem

    if root_problem(run_dir, fresh=False):
        return  # the run directory itself cannot be made: said when it is made
    problem = root_problem(checkpoint_root(cfg, run_dir), fresh=not resume)
    if problem:
        raise ConfigError(f"checkpoint.directory = {cfg.checkpoint.directory!r}: "
                          f"{problem}", key="checkpoint.directory")
    if resume and resume != "latest" and not Path(resume).is_dir():
        # the ranks (started in this directory) refuse it on every rank, after launch
        raise ConfigError(f"--resume {resume!r} must be a checkpoint directory "
                          f"(ckpt-NNNNNN) or a directory holding them; it "
                          f"{'is not a directory' if Path(resume).exists() else 'does not exist'}"
                          f" (--resume alone resumes from the latest)", key="--resume")


def unwritable(run_dir: Path, runs_root: str | Path, err: OSError) -> ConfigError:
    return ConfigError(f"run directory {str(run_dir)!r} (--run-dir, or under --runs "
                       f"{str(runs_root)!r}) cannot be made or written: "
                       f"{err.strerror or err} ({err.filename}); expected a writable "
                       f"directory", key="--runs")


def lock_run_dir(run_dir: Path, runs_root: str | Path) -> IO[str]:
    """Hold ``RUN_DIR/.lock`` (an exclusive ``flock``) while the job runs: a second
    ``conduit-hpc run`` into the same directory - a fresh run or a ``--resume`` - would
    write the same checkpoints and logs, and each one's retention delete the other's.
    Released when the launcher returns or dies (a requeued SLURM attempt takes it)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = open(run_dir / ".lock", "a+")  # noqa: SIM115 - held past this function
    except OSError as err:
        raise unwritable(run_dir, runs_root, err) from err
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as err:  # held; any other error: a file system without
        lock.seek(0)  # locks (some NFS mounts), where the run goes on unlocked
        holder = lock.read().strip() or "?"
        lock.close()
        raise ConduitError(f"run directory {str(run_dir)!r} is in use by another "
                           f"conduit-hpc run ({holder}); wait for it to end, or choose "
                           f"another --run-dir") from err
    except OSError:
        return lock
    lock.truncate(0)
    lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    lock.flush()
    return lock
