"""The job contract on every rank: ``job_main`` and stop requests.

A job script is a Python file beside its TOML file (``jobs/NAME.py`` for
``jobs/NAME.toml``) that declares its config class (``JOB_CONFIG = MyConfig``, see
:mod:`conduit_hpc.config.jobs`) and ends with::

    if __name__ == "__main__":
        job_main(MyConfig, run)

On every rank ``job_main`` parses ``--config``/``--set``/``--run-dir``/``--resume``,
loads the config, sends the rank's output to ``RUN_DIR/logs/rank.N/``, and calls
``run(config, run_dir, resume)`` - always those three arguments: ``run_dir``
(``Path | None``, ``None`` without ``--run-dir``) and ``resume`` (``str``: ``""``,
``"latest"`` or a checkpoint path). A :class:`~conduit_hpc.errors.ConduitError`
becomes one ``conduit-hpc: error`` line and exit status 3 (which, under
``python -m mpi4py``, aborts every rank: no hang). It also turns ``SIGUSR1`` into a *stop
request* (:func:`stop_requested`) that a job polls at a safe point (a superstep
boundary) to checkpoint and end early - this is how a SLURM preemption warning reaches
the ranks (see ``slurm/README.md``). A job that writes checkpoints holds its
checkpoint root's ``.lock`` while ``run`` runs (world rank 0 takes it; ``conduit-hpc
run`` holds a root outside the run directory itself and says so with
``--launcher-holds-root``): a root that another run holds fails every rank together
(see ``docs/sharp-bits.md``, "One run per checkpoint root"). See
``docs/writing-a-job.md``.

Imports nothing that starts MPI (``job_main`` imports mpi4py for that lock's verdict,
under a launcher only).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from conduit_hpc.config import Config
from conduit_hpc.errors import ConduitError, ConfigError

__all__ = ["ERROR_PREFIX", "ignore_stop_requests", "install_stop_handler", "job_arguments",
           "job_main", "resume_argument", "stop_requested", "stop_signal"]

ERROR_PREFIX = "conduit-hpc: error"
C = TypeVar("C", bound=Config)




def job_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="conduit_hpc job (run under mpirun)")
    p.add_argument("--config", required=True, help="job TOML file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (TOML literal)")
    p.add_argument("--run-dir", default="", help="directory for this run's outputs")
    p.add_argument("--resume", nargs="?", const="latest", default=None,
                   help="resume from the latest (or the given) checkpoint")
    p.add_argument("--launcher-holds-root", default="", metavar="ROOT",
                   help="the checkpoint root whose .lock the launcher holds for this job "
                        "(set by conduit-hpc run; the ranks then do not take it)")
    return p.parse_args(argv)


def resume_argument(value: str | None) -> str:
    """``--resume``'s value as ``run`` gets it: ``""`` without the flag, ``"latest"``
    for the flag alone, else the path given.

    Raises:
        ConfigError: an empty or blank value (``--resume ""``), which would start fresh
            silently.
    """
    if value is None:
        return ""
    if not value.strip():
        raise ConfigError(f"--resume must be given alone (the latest checkpoint) or with a "
                          f"checkpoint path, got the empty value {value!r}", key="--resume")
    return value


def job_main(config_cls: type[C], run: Callable[[C, Path | None, str], Any],
             argv: Sequence[str] | None = None) -> None:
    """Entry point of a job script on every rank: ``run(config, run_dir, resume)``.

    Args:
        config_cls (type[Config]): the job's config class (loads ``--config``).
        run (Callable): called once as ``run(config, run_dir, resume)`` with
            ``run_dir: Path | None`` and ``resume: str`` (see the module docstring).
        argv (Sequence[str] | None): the arguments (default: ``sys.argv[1:]``).
    """
    args = job_arguments(argv)
    rank = _world_rank()
    # the handler first: the launcher forwards a stop request only once every rank's
    # logs/rank.N exists (before that, SIGUSR1's default action would kill the rank)
    install_stop_handler()
    if args.run_dir:
        _log_to_files(Path(args.run_dir) / "logs", rank)
    try:
        resume = resume_argument(args.resume)
        cfg = config_cls.from_toml(args.config, args.set)
        run_dir = Path(args.run_dir) if args.run_dir else None
        _check_fresh_root(cfg, run_dir, resume)
        with contextlib.ExitStack() as held:
            lock = _hold_root(cfg, run_dir, resume, args.launcher_holds_root)
            if lock is not None:
                held.callback(lock.close)  # the root is free again once run returns
            run(cfg, run_dir, resume)
    except ConduitError as err:
        print(f"{ERROR_PREFIX} on world rank {rank}: {type(err).__name__}: {err}",
              file=sys.stderr, flush=True)
        _reported_together(err)
        sys.exit(3)
    finally:
        # the run is over: a stop request now (a preemption warning while the ranks
        # finalize) has nothing left to stop, and Python's finalization would give
        # SIGUSR1 its default action back - killing a rank that finished its work
        ignore_stop_requests()


def _check_fresh_root(cfg: Config, run_dir: Path | None, resume: str) -> None:
    """A fresh run (no ``--resume``) that writes checkpoints must not start in a
    checkpoint root holding another run's: its retention (``checkpoint.keep``) would
    delete them. ``conduit-hpc run`` checks this before launch; a job script started by
    hand with ``mpirun`` is checked here, on every rank alike (nothing is written before
    every rank has built the data plane). Local; reads the directory only."""
    ck = cfg.checkpoint
    if not (resume or ck.writes):
        return
    from conduit_hpc.checkpoint.files import checkpoint_root, root_problem

    # a resumed run's root must be a usable directory too (not a file, a broken link)
    problem = root_problem(checkpoint_root(cfg, run_dir), fresh=not resume)
    if problem:
        raise ConfigError(f"checkpoint.directory = {ck.directory!r}: {problem}",
                          key="checkpoint.directory")


def _hold_root(cfg: Config, run_dir: Path | None, resume: str,
               launcher_holds: str) -> IO[str] | None:
    """World rank 0 takes the checkpoint root's ``.lock`` for a run that writes
    checkpoints, unless the launcher holds it (``--launcher-holds-root``: ``conduit-hpc
    run`` with a root outside the run directory). Without it, two job scripts started by
    hand into one root (or a job started by hand and a ``conduit-hpc run`` whose root lies
    in its run directory) both passed :func:`_check_fresh_root`, then took each other's
    checkpoint numbers and their retention deleted each other's checkpoints. Under the
    lock, rank 0 checks again that a fresh run's root holds no checkpoints (another run
    may have written some and ended since). Its verdict reaches every rank in one bounded
    broadcast (``run.timeout_s``: ranks that reach ``job_main`` at different times wait
    for each other that long at most), and every rank raises the same error. A file
    system without ``flock`` goes on unlocked (:func:`conduit_hpc.lockfile.hold`).
    Returns rank 0's lock (``None`` on the other ranks).

    Raises:
        ConduitError: another run holds the root (naming it and the holder's pid and host).
        ConfigError: the root cannot be made or written, or holds checkpoints now.
        CollectiveFailed: a rank did not reach this point within ``run.timeout_s``.
    """
    from conduit_hpc.checkpoint.files import checkpoint_root

    if not cfg.checkpoint.writes:
        return None
    root = checkpoint_root(cfg, run_dir).resolve()
    if launcher_holds and Path(launcher_holds).resolve() == root:
        return None
    if not any(v in os.environ for v in _RANK_VARS):  # a single process, no launcher
        return _take_root(cfg, run_dir, resume, root)
    from mpi4py import MPI

    from conduit_hpc.transport.objects import bounded_bcast_json

    world = MPI.COMM_WORLD
    lock, verdict = None, None
    if world.Get_rank() == 0:
        try:
            lock = _take_root(cfg, run_dir, resume, root)
        except ConduitError as err:
            verdict = {"type": type(err).__name__, "message": str(err),
                       "key": getattr(err, "key", "")}
    try:
        verdict = bounded_bcast_json(world, verdict, 0, cfg.run.timeout_s,
                                     "the checkpoint root's lock (job_main)")
    except BaseException:
        if lock is not None:
            lock.close()
        raise
    if verdict:
        agreed = (ConfigError(verdict["message"], key=verdict["key"])
                  if verdict["type"] == "ConfigError" else ConduitError(verdict["message"]))
        agreed.reported_together = (world, cfg.run.timeout_s)  # type: ignore[attr-defined]
        raise agreed
    return lock


def _reported_together(err: ConduitError) -> None:
    """After every rank printed an error that they agreed on (:func:`_hold_root`): wait,
    bounded, until every rank has, before this one exits - the first rank's exit aborts
    the job (``python -m mpi4py``), and rank 0, whose broadcast ends first, killed the
    others before they had said why."""
    together = getattr(err, "reported_together", None)
    if together is None:
        return
    from conduit_hpc.transport.objects import bounded_barrier

    with contextlib.suppress(ConduitError):  # (said already; a rank gone: exit anyway)
        bounded_barrier(together[0], together[1], "every rank's report of the error")


def _take_root(cfg: Config, run_dir: Path | None, resume: str, root: Path) -> IO[str]:
    """This process takes ``root``'s lock; a fresh run's root must still hold no
    checkpoints once it is held (else the lock is let go and that is raised)."""
    from conduit_hpc.lockfile import hold_checkpoint_root

    lock = hold_checkpoint_root(cfg, root)
    try:
        _check_fresh_root(cfg, run_dir, resume)
    except BaseException:
        lock.close()
        raise
    return lock


def _log_to_files(logs: Path, rank: int) -> None:
    """Send this rank's stdout and stderr to ``logs/rank.N/stdout`` and ``stderr`` (the
    launcher follows rank 0's). Done by the rank itself, under ``mpirun`` and ``srun``
    alike: ``mpirun --output dir=`` loses output to a directory-creation race in some
    PMIx versions."""
    where = logs / f"rank.{rank}"
    where.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    for stream, name in ((sys.stdout, "stdout"), (sys.stderr, "stderr")):
        fd = os.open(where / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, stream.fileno())
        os.close(fd)
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)


_STOP = {"signal": 0}


def _on_stop_signal(signum: int, frame: object) -> None:
    _STOP["signal"] = signum


def install_stop_handler() -> None:
    """Make ``SIGUSR1`` set the stop request (main thread only; idempotent)."""
    signal.signal(signal.SIGUSR1, _on_stop_signal)


def ignore_stop_requests() -> None:
    """Ignore ``SIGUSR1`` from now on (main thread; a no-op elsewhere): for a rank whose
    run has ended. An ignored signal stays ignored through interpreter finalization."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def stop_requested() -> bool:
    """Whether this process got a stop request (``SIGUSR1``: a preemption warning
    forwarded by ``conduit-hpc run`` or by ``srun``/``mpirun``).

    Not collective and rank-dependent (a signal may reach ranks at different times):
    a job decides to stop from an agreement over all ranks (e.g. an ``allreduce`` of
    this flag with ``MPI.LOR`` at a superstep boundary), then checkpoints and returns.
    Does not block.
    """
    return _STOP["signal"] != 0


def stop_signal() -> int:
    """The signal of this process's stop request (0: none yet). Local."""
    return _STOP["signal"]


#: set on every rank by the launchers (Open MPI, PMIx, MPICH's PMI, srun)
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")


def _world_rank() -> int:
    for var in _RANK_VARS:
        if var in os.environ:
            return int(os.environ[var])
    return 0


