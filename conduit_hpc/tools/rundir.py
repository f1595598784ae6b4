"""The run directory of ``conduit-hpc run``: checked, locked and made before any rank
starts. Local; no MPI."""

from __future__ import annotations

import contextlib
import datetime as _dt
import sys
from pathlib import Path
from typing import IO

from conduit_hpc import jsontext
from conduit_hpc.config import Config
from conduit_hpc.errors import ConfigError
from conduit_hpc.lockfile import hold, hold_checkpoint_root
from conduit_hpc.plane.csv_resume import set_aside as move_aside

__all__ = ["EXIT_FILE", "RunLock", "check_checkpoint_root", "ended", "lock_run_dir",
           "resume_problem", "set_aside", "unwritable"]

#: what the launcher records of how the job ended, in the run directory (read by
#: ``conduit-hpc report``): ``{"exit_status": int, "ok": bool, "why": str, "ended": str}``
EXIT_FILE = "exit.json"


def ended(run_dir: Path, rc: int, why: str = "") -> tuple[int, Path]:
    """The job ended with status ``rc``: print ``why`` (a failure's reason) to stderr and
    record both in ``RUN_DIR/exit.json`` (best effort: a full disk loses this record,
    not the job's). Returns ``(rc, run_dir)``, what :func:`launch` returns."""
    if why:
        print(why, file=sys.stderr)
    doc = {"exit_status": int(rc), "ok": rc == 0, "why": why,
           "ended": _dt.datetime.now().astimezone().isoformat(timespec="seconds")}
    with contextlib.suppress(OSError):
        (run_dir / EXIT_FILE).write_text(jsontext.dumps(doc, indent=1) + "\n")
    return rc, run_dir


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
    why = resume_problem(resume) if resume and resume != "latest" else ""
    if why:
        # the ranks (started in this directory) refuse it on every rank, after launch
        raise ConfigError(f"--resume {resume!r} must be a checkpoint directory "
                          f"(ckpt-NNNNNN) or a directory holding them; it {why}"
                          f" (--resume alone resumes from the latest)", key="--resume")


def resume_problem(resume: str) -> str:
    """Why the ranks' restore would refuse ``--resume PATH`` whatever it holds, by their
    own rule (:func:`~conduit_hpc.features.checkpointing.resume.restore_data_plane`): a
    checkpoint (or its manifest) or a directory holding checkpoints; "" when it is one.
    Before, a directory holding neither (an empty one, a run directory's parent) passed,
    and every rank started and then refused it together."""
    from conduit_hpc.checkpoint import files as ck

    p = Path(resume)
    if p.name == ck.MANIFEST:
        p = p.parent
    if not p.exists():
        return "does not exist"
    if not p.is_dir():
        return "is not a directory"
    if (p / ck.DONE).exists() or (p / ck.MANIFEST).exists() or ck.list_checkpoints(p):
        return ""
    return (f"is a directory that holds neither a checkpoint ({ck.MANIFEST}, {ck.DONE}) "
            f"nor checkpoint directories")


def set_aside(run_dir: Path, *, fresh: bool) -> None:
    """Before an attempt starts in ``run_dir``: the earlier attempt's ``logs/`` move to
    ``logs.K`` (the first free ``K``), with its ``config.toml``, ``command.txt`` and
    ``plan.json`` (this attempt writes its own: a resume with another rank count or
    ``--set`` overwrote them, and nothing said what the earlier attempt ran). For a
    ``fresh`` run (no ``--resume``) the earlier run's ``metrics/`` (and
    ``tensorboard/``) move to ``metrics.K`` too (its episodes were appended to the
    earlier run's). A resumed attempt keeps them: its metrics files go on where the
    earlier attempts' ended (the episode files and the per-superstep CSVs append, with
    their clocks and counts going on), so ``conduit-hpc report RUN_DIR`` covers the
    whole run; only the earlier ``metrics/summary.json`` moves into ``logs.K`` (an
    attempt writes its own at its end, and one killed before it left the earlier
    attempt's figures standing for the run). Local.

    Raises:
        OSError: a directory cannot be moved.
    """
    if (run_dir / "logs").exists():
        logs = move_aside(run_dir / "logs")
        mine = ("config.toml", "command.txt", "plan.json", "metrics/summary.json")
        for f in mine if not fresh else mine[:3]:
            if (run_dir / f).is_file():
                (run_dir / f).rename(logs / Path(f).name)
    for name in ("metrics", "tensorboard") if fresh else ():
        if (run_dir / name).exists():
            move_aside(run_dir / name)


def unwritable(run_dir: Path, runs_root: str | Path, err: OSError) -> ConfigError:
    return ConfigError(f"run directory {str(run_dir)!r} (--run-dir, or under --runs "
                       f"{str(runs_root)!r}) cannot be made or written: "
                       f"{err.strerror or err} ({err.filename}); expected a writable "
                       f"directory", key="--runs")


class RunLock:
    """The ``.lock`` files a launcher holds while its job runs; :meth:`close` frees them.
    ``root``: the checkpoint root (resolved) whose ``.lock`` is among them (a root
    outside the run directory, or the run directory itself), or ``None`` (no checkpoints
    written, or a root inside the run directory, which the ranks lock themselves): the
    launcher tells its ranks (``job_main --launcher-holds-root``) so that they do not try
    to take it - a fresh open by a child conflicts with its own launcher."""

    def __init__(self, files: list[IO[str]], root: Path | None = None) -> None:
        self.files = files
        self.root = root

    def close(self) -> None:
        for f in self.files:
            f.close()


def lock_run_dir(run_dir: Path, runs_root: str | Path, cfg: Config | None = None, *,
                 fresh: bool | None = None) -> RunLock:
    """Hold ``RUN_DIR/.lock`` (an exclusive ``flock``) while the job runs: a second
    ``conduit-hpc run`` into the same directory - a fresh run or a ``--resume`` - would
    write the same checkpoints and logs, and each one's retention delete the other's.
    With ``cfg``, a checkpoint root outside the run directory (an absolute
    ``checkpoint.directory`` that several runs may name) is held the same way
    (``ROOT/.lock``, :func:`~conduit_hpc.lockfile.hold_checkpoint_root`): two runs writing
    one root would take each other's checkpoint numbers, delete each other's checkpoints
    being written, and prune each other's complete ones. (A root inside the run directory
    is locked by the job's world rank 0, in ``job_main``: the one lock that a job script
    started by hand into the same root takes too.) Released when the launcher returns or
    dies (a requeued SLURM attempt takes them). An earlier run's ``exit.json`` is removed
    (this run records its own); with ``fresh`` given, its logs (and metrics) are set
    aside (:func:`set_aside`).

    Raises:
        ConduitError: a lock is held by another run (naming the directory and holder).
        ConfigError: the run directory cannot be made or written.
    """
    lock = hold(run_dir, lambda err: unwritable(run_dir, runs_root, err),
                f"run directory {str(run_dir)!r}", "another --run-dir")
    with contextlib.suppress(OSError):  # how an earlier run in this directory ended
        (run_dir / EXIT_FILE).unlink(missing_ok=True)
    try:
        if fresh is not None:
            set_aside(run_dir, fresh=fresh)
    except OSError as err:
        lock.close()
        raise unwritable(run_dir, runs_root, err) from err
    if cfg is None or not cfg.checkpoint.writes:
        return RunLock([lock])  # (a resume without checkpoints of its own only reads)
    from conduit_hpc.checkpoint.files import checkpoint_root

    root = checkpoint_root(cfg, run_dir).resolve()
    if root == run_dir.resolve():  # ROOT/.lock is RUN_DIR/.lock, held just above: the
        return RunLock([lock], root)  # ranks must not take it again (job_main)
    if root.is_relative_to(run_dir.resolve()):
        return RunLock([lock])  # world rank 0 locks it (job_main); RUN_DIR/.lock keeps
        # a second conduit-hpc run out before launch
    try:
        held = hold_checkpoint_root(cfg, root)
    except BaseException:
        lock.close()
        raise
    return RunLock([lock, held], root)
