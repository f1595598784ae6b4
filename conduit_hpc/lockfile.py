"""Exclusive ``flock`` locks on a directory's ``.lock`` file, naming their holder.

``conduit-hpc run`` holds ``RUN_DIR/.lock`` and, for a checkpoint root outside the run
directory, ``ROOT/.lock`` (:func:`conduit_hpc.tools.rundir.lock_run_dir`); a job's ranks
hold their checkpoint root's ``ROOT/.lock`` themselves when their launcher does not
(:func:`conduit_hpc.job.job_main`: a script started by hand, or a root inside the run
directory). Two runs writing one root would take each other's checkpoint numbers,
delete each other's checkpoints being written and prune each other's complete ones.
Local; no MPI.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import IO

from conduit_hpc.config import Config
from conduit_hpc.errors import ConduitError, ConfigError

__all__ = ["hold", "hold_checkpoint_root"]


def hold_checkpoint_root(cfg: Config, root: Path) -> IO[str]:
    """Take the checkpoint root ``root``'s ``.lock`` (made with the root if needed)
    without waiting. Keep the returned file open for as long as the run may write there;
    closing it (or the holder's exit) frees the root.

    Raises:
        ConduitError: another run holds it (naming the root and the holder's pid and host).
        ConfigError: ``root`` cannot be made or written (naming ``checkpoint.directory``).
    """
    return hold(root, lambda err: ConfigError(
        f"checkpoint.directory = {cfg.checkpoint.directory!r}: checkpoint root {root} "
        f"cannot be made or written: {err.strerror or err}; expected a writable "
        f"directory", key="checkpoint.directory"),
        f"checkpoint root {str(root)!r} (checkpoint.directory)",
        "another checkpoint.directory (each run's retention would delete the other's "
        "checkpoints)")


def hold(where: Path, unwritable_error: Callable[[OSError], Exception], what: str,
         instead: str) -> IO[str]:
    """Take ``where/.lock`` (made if needed) without waiting and write the holder in it
    (``pid P on HOST``). A file system without ``flock`` (an error other than "held":
    some NFS mounts) gives the file back unlocked: the run goes on unprotected.

    Raises:
        ConduitError: another process holds it (``what`` is in use, naming the holder;
            choose ``instead``).
        Exception: ``unwritable_error(err)`` when the directory or file cannot be made or
            written.
    """
    try:
        where.mkdir(parents=True, exist_ok=True)
        lock = open(where / ".lock", "a+")  # noqa: SIM115 - held past this function
    except OSError as err:
        raise unwritable_error(err) from err
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as err:  # held; any other error: a file system without
        lock.seek(0)  # locks (some NFS mounts), where the run goes on unlocked
        holder = lock.read().strip() or "?"
        lock.close()
        raise ConduitError(f"{what} is in use by another conduit-hpc run ({holder}); wait "
                           f"for it to end, or choose {instead}") from err
    except OSError:
        return lock
    try:  # a full file system (a quota, a small scratch) fails here, not at open
        lock.truncate(0)
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        lock.flush()
    except OSError as err:
        with contextlib.suppress(OSError):  # its close flushes the same bytes again
            lock.close()
        raise unwritable_error(err) from err
    return lock
