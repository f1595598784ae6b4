"""Launching jobs: the rank-side entry helper and the ``mpirun`` wrapper.

Job scripts end with ``job_main(MyConfig, run)``: it parses ``--config``/``--set``/
``--run-dir``, loads the config, runs the job, and turns a
:class:`~conduit_hpc.errors.ConduitError` into one ``conduit-hpc: error`` line and a
non-zero exit (which, under ``python -m mpi4py``, aborts every rank: no hang).

:func:`launch` is what ``conduit-hpc run`` does: resolve the config, make the run
directory, and start the ranks with ``mpirun`` (or ``srun`` inside a SLURM allocation)
with the environment that the MPI wheel needs, under a timeout.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .config import Config
from .errors import ConduitError

__all__ = ["ERROR_PREFIX", "job_main", "launch", "mpi_env", "to_toml"]

ERROR_PREFIX = "conduit-hpc: error"
C = TypeVar("C", bound=Config)


# ---------------------------------------------------------------------------------
# rank side


def job_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="conduit_hpc job (run under mpirun)")
    p.add_argument("--config", required=True, help="job TOML file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (TOML literal)")
    p.add_argument("--run-dir", default="", help="directory for this run's outputs")
    p.add_argument("--resume", nargs="?", const="latest", default="",
                   help="resume from the latest (or the given) checkpoint")
    return p.parse_args(argv)


def job_main(config_cls: type[C], run: Callable[..., Any],
             argv: Sequence[str] | None = None) -> None:
    """Entry point of a job script on every rank.

    ``run`` is called as ``run(config)`` or, if it accepts them, with keyword arguments
    ``run_dir`` (Path | None) and ``resume`` (str).
    """
    args = job_arguments(argv)
    rank = _world_rank()
    if args.run_dir:
        _log_to_files(Path(args.run_dir) / "logs", rank)
    try:
        cfg = config_cls.from_toml(args.config, args.set)
        kwargs: dict[str, Any] = {}
        code = getattr(run, "__code__", None)
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount] if code else ()
        if "run_dir" in names:
            kwargs["run_dir"] = Path(args.run_dir) if args.run_dir else None
        if "resume" in names:
            kwargs["resume"] = args.resume
        run(cfg, **kwargs)
    except ConduitError as err:
        print(f"{ERROR_PREFIX} on world rank {rank}: {type(err).__name__}: {err}",
              file=sys.stderr, flush=True)
        sys.exit(3)


def _log_to_files(logs: Path, rank: int) -> None:
    """Send this rank's stdout and stderr to ``logs/rank-N.out`` and ``.err`` (the
    launcher follows rank 0's). Done by the rank itself: ``mpirun --output dir=``
    loses output to a directory-creation race in some PMIx versions."""
    logs.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    for stream, suffix in ((sys.stdout, "out"), (sys.stderr, "err")):
        fd = os.open(logs / f"rank-{rank}.{suffix}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                     0o644)
        os.dup2(fd, stream.fileno())
        os.close(fd)
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)


def _world_rank() -> int:
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


# ---------------------------------------------------------------------------------
# TOML output (the resolved config of a run)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as a TOML value")


def to_toml(data: Mapping[str, Any]) -> str:
    """Write a nested mapping of scalars and lists as TOML (tables for mappings)."""
    lines: list[str] = []

    def table(prefix: str, d: Mapping[str, Any]) -> None:
        scalars = {k: v for k, v in d.items() if not isinstance(v, Mapping)}
        subs = {k: v for k, v in d.items() if isinstance(v, Mapping)}
        if prefix and (scalars or not subs):
            lines.append(f"\n[{prefix}]")
        for k, v in scalars.items():
            lines.append(f"{k} = {_toml_value(v)}")
        for k, v in subs.items():
            table(f"{prefix}.{k}" if prefix else k, v)

    table("", data)
    return "\n".join(lines).lstrip("\n") + "\n"


# ---------------------------------------------------------------------------------
# launcher side


def mpi_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for ranks of the Open MPI pip wheel on a possibly oversubscribed
    machine (values already set win). See ``docs/sharp-bits.md``."""
    env = dict(os.environ if base is None else base)
    prefix = sys.prefix
    defaults = {
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OMPI_MCA_osc": "^ucx",
        "OMPI_MCA_btl": "^ofi",
        "OMPI_MCA_pml": "ob1",
        "OMPI_MCA_mpi_yield_when_idle": "1",
        "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
        "PRTE_MCA_hwloc_default_binding_policy": "none",
    }
    if Path(prefix, "lib", "libmpi.so.40").exists():
        defaults["OPAL_PREFIX"] = prefix
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        defaults["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        defaults["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    for k, v in defaults.items():
        env.setdefault(k, v)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def ranks_for(cfg: Config) -> int:
    """Ranks a config's layout uses on one node (counts mode; one actor when 'rest')."""
    lay = cfg.layout
    return lay.learners + lay.buffers + max(lay.actors, 1)


def entry_for(config_path: Path, cfg: Config) -> Path:
    """The job script: ``<config>.py`` beside the TOML file."""
    return config_path.with_suffix(".py")


def launch(config_path: str | Path, *, nranks: int | None = None,
           overrides: Sequence[str] = (), runs_root: str | Path = "runs",
           resume: str = "", timeout_s: float | None = None, quiet: bool = False,
           config_cls: type[Config] = Config, entry: str | Path | None = None
           ) -> tuple[int, Path]:
    """Start a job's ranks and wait. Blocks at most ``timeout_s`` (default: the job's
    ``run.duration_s`` + ``run.timeout_s`` + 60 s).

    Args:
        entry: the job script (default: the ``.py`` beside the TOML file).

    Returns:
        tuple[int, Path]: the exit status (0 on success) and the run directory.

    Raises:
        ConfigError: the config does not load (checked before any rank starts).
    """
    path = Path(config_path)
    cfg = _load_loose(path, overrides, config_cls)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    run_dir = Path(runs_root) / f"{cfg.run.name}-{stamp}"
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    raw = _raw_with_overrides(path, overrides)
    (run_dir / "config.toml").write_text(to_toml(raw))
    n = nranks or ranks_for(cfg)
    entry = Path(entry) if entry is not None else entry_for(path, cfg)
    job_args = ["--config", str((run_dir / "config.toml").resolve()), "--run-dir",
                str(run_dir.resolve())]
    if resume:
        job_args += ["--resume", resume]
    py = [sys.executable, "-m", "mpi4py", str(entry), *job_args]
    if os.environ.get("SLURM_JOB_ID") and shutil.which("srun") and \
            os.environ.get("CONDUIT_LAUNCHER", "") == "srun":
        cmd = ["srun", "--mpi=pmix", "-n", str(n), *py]
    else:
        cmd = ["mpirun", "-n", str(n), *py]
    budget = timeout_s or (cfg.run.duration_s + cfg.run.timeout_s + 60.0)
    (run_dir / "command.txt").write_text(" ".join(cmd) + "\n")
    with open(run_dir / "logs" / "launcher.log", "w") as launcher_log:
        proc = subprocess.Popen(cmd, env=mpi_env(), start_new_session=True,
                                stdout=launcher_log, stderr=subprocess.STDOUT)
        follower = _Follower(run_dir, quiet)
        deadline = time.monotonic() + budget
        graceful = _GracefulStop(proc, grace_s=cfg.run.timeout_s + 60.0)
        rc: int | None = None
        try:
            while rc is None:
                try:
                    rc = proc.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    follower.pump()
                    deadline = graceful.extend(deadline)
                    if time.monotonic() > deadline:
                        _stop(proc)
                        follower.pump()
                        print(f"{ERROR_PREFIX}: job ran past its {budget:.0f} s budget and "
                              f"was stopped; logs in {run_dir / 'logs'}", file=sys.stderr)
                        return 124, run_dir
        finally:
            graceful.close()
        follower.pump()
        follower.finish()
    if rc != 0:
        print(first_error(run_dir) or f"{ERROR_PREFIX}: job exited with status {rc}; "
              f"logs in {run_dir / 'logs'}", file=sys.stderr)
    return rc, run_dir


class _GracefulStop:
    """While a job runs, SIGTERM to this launcher (SLURM's preemption warning, ``kill``)
    becomes SIGUSR1 to ``mpirun``, which forwards it to every rank: the job stops, writes
    a final checkpoint and exits (``mpirun`` itself would kill the ranks within a
    fraction of a second of a SIGTERM). The launcher then waits up to ``grace_s`` more."""

    def __init__(self, proc: subprocess.Popen[bytes], grace_s: float) -> None:
        self.proc, self.grace_s = proc, grace_s
        self.at: float | None = None
        self._old: Any = None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum: int, frame: Any) -> None:
        if self.at is None:
            self.at = time.monotonic()
            print("conduit-hpc: SIGTERM: asking every rank to stop and checkpoint "
                  "(SIGUSR1 to mpirun)", file=sys.stderr, flush=True)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGUSR1)

    def extend(self, deadline: float) -> float:
        return deadline if self.at is None else max(deadline, self.at + self.grace_s)

    def close(self) -> None:
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
            self._old = None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class _Follower:
    """Copies what rank 0 writes to stdout onto ours while the job runs."""

    def __init__(self, run_dir: Path, quiet: bool) -> None:
        self.run_dir, self.quiet, self.pos, self.last = run_dir, quiet, 0, "\n"

    def finish(self) -> None:
        if self.last != "\n":
            sys.stdout.write("\n")
            sys.stdout.flush()

    def pump(self) -> None:
        if self.quiet:
            return
        f = _rank_log(self.run_dir, 0, "stdout")
        if f is None:
            return
        with open(f, "rb") as fh:
            fh.seek(self.pos)
            chunk = fh.read()
        if chunk:
            self.pos += len(chunk)
            text = chunk.decode(errors="replace")
            sys.stdout.write(text)
            sys.stdout.flush()
            self.last = text[-1]


def _rank_log(run_dir: Path, rank: int, name: str) -> Path | None:
    f = run_dir / "logs" / f"rank-{rank}.{'out' if name == 'stdout' else 'err'}"
    return f if f.exists() else None


def first_error(run_dir: Path) -> str | None:
    """The first ``conduit-hpc: error`` line any rank wrote, or the last line of the
    first Python traceback, as one message; ``None`` if there is neither."""
    logs = sorted((run_dir / "logs").glob("rank-*.err"),
                  key=lambda p: int(p.stem.split("-")[1]))
    launcher = run_dir / "logs" / "launcher.log"
    for f in logs:
        for line in f.read_text(errors="replace").splitlines():
            if line.startswith(ERROR_PREFIX):
                return line + f" (logs in {run_dir / 'logs'})"
    for f in [*logs, launcher] if launcher.exists() else logs:
        text = f.read_text(errors="replace")
        if "Traceback (most recent call last)" in text:
            tail = [ln for ln in text.splitlines() if re.match(r"^\w[\w.]*(Error|Exception)", ln)]
            where = (f"world rank {f.stem.split('-')[1]}" if f.name.startswith("rank-")
                     else "a rank")
            if tail:
                return (f"{ERROR_PREFIX} on {where}: {tail[-1]} "
                        f"(logs in {run_dir / 'logs'})")
    return None


def _raw_with_overrides(path: Path, overrides: Sequence[str]) -> dict[str, Any]:
    from .config import _set_dotted, parse_override, tomllib

    raw = tomllib.loads(path.read_text())
    for ov in overrides:
        k, v = parse_override(ov)
        _set_dotted(raw, k, v)
    return raw


def _load_loose(path: Path, overrides: Sequence[str], config_cls: type[Config]) -> Config:
    """Check the sections the library knows; job sections are checked by the job."""
    from .config import config_from_dict

    raw = _raw_with_overrides(path, overrides)
    known = {f for f in config_cls.__dataclass_fields__}
    return config_from_dict(config_cls, {k: v for k, v in raw.items() if k in known})
