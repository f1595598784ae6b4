"""Launching jobs from a login node: the ``mpirun``/``srun`` wrapper.

The rank side of a job (``job_main``, stop requests) is :mod:`conduit_hpc.job`.
:func:`launch` is what ``conduit-hpc run`` does: resolve the config, make the run
directory, and start the ranks with ``mpirun``, or with ``srun --mpi=pmix`` inside a
SLURM allocation (:func:`choose_launcher`), with the environment that the MPI wheel
needs, per-rank logs, under a timeout. A site's own MPI (``conduit-hpc slurm --mpi site``
exports these): ``CONDUIT_MPI=site`` leaves the environment as it is (none of the wheel's
settings), ``CONDUIT_MPIRUN`` names the ``mpirun`` to run and ``CONDUIT_SRUN_MPI`` the
``srun --mpi=`` plugin. ``SIGTERM``/``SIGINT``/``SIGUSR1`` sent to the launcher
are forwarded to the ranks as ``SIGUSR1`` (a stop request); a second ``SIGTERM`` or
``SIGINT`` (Ctrl-C) stops them.
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path

from conduit_hpc.config import Config, job_script_for, load, to_toml
from conduit_hpc.config.checks import MAX_COUNT, MAX_SECONDS
from conduit_hpc.config.jobs import contract_problem
from conduit_hpc.config.launch_world import LaunchWorld
from conduit_hpc.config.layout_rule import (
    assign_roles,
    delivery_per_learner,
    emulated_nodes_problem,
    ranks_needed,
    role_counts,
    world_problem,
)
from conduit_hpc.errors import ConduitError, ConfigError, WorldTooSmall
from conduit_hpc.job import ERROR_PREFIX
from conduit_hpc.tools.cli_support import local_ranks_problem
from conduit_hpc.tools.diagnose import failed_start, first_error, never_started, rank_death
from conduit_hpc.tools.mpi_start import StartRetry, choose_launcher
from conduit_hpc.tools.rundir import check_checkpoint_root, ended, lock_run_dir, unwritable
from conduit_hpc.tools.supervise import (
    Follower,
    Forwarder,
    parent_death_signal,
    rank_reported_error,
    stop_group,
)

__all__ = ["choose_launcher", "launch", "mpi_env"]


# ---------------------------------------------------------------------------------
# launcher side


_DEFAULT_LINE = re.compile(r"^\s*export (\w+)=\$\{(\w+):-([^$}]*)\}\s*(#.*)?$")


@functools.cache
def _script_defaults() -> tuple[tuple[str, str, bool], ...]:
    """``(name, value, root_only)`` from the ``export NAME=${NAME:-value}`` lines of the
    packaged ``scripts/mpi_env.sh`` - the one place these values are written; lines
    inside its ``if [ "$(id -u)" = 0 ]`` block are root-only."""
    text = resources.files("conduit_hpc.tools").joinpath("scripts", "mpi_env.sh").read_text()
    out, root_only = [], False
    for line in text.splitlines():
        if line.startswith("if ") and "id -u" in line:
            root_only = True
        elif line.startswith("fi"):
            root_only = False
        m = _DEFAULT_LINE.match(line)
        if m and m.group(1) == m.group(2):
            out.append((m.group(1), m.group(3), root_only))
    return tuple(out)


def mpi_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for ranks of the Open MPI pip wheel on a possibly oversubscribed
    machine (values already set win): the defaults of the packaged ``mpi_env.sh``, which
    the shell side (launch scripts, ``scripts/mpi_env.sh``) sources, plus this Python's
    ``bin`` first on ``PATH`` and ``OPAL_PREFIX`` when the wheel's Open MPI is here. See
    ``docs/sharp-bits.md``. With ``CONDUIT_MPI=site`` (a site's own MPI, see
    ``slurm/README.md``), ``base`` unchanged."""
    env = dict(os.environ if base is None else base)
    if site_mpi(env):
        return env
    prefix = sys.prefix
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    for name, value, root_only in _script_defaults():
        if is_root or not root_only:
            env.setdefault(name, value)
    if Path(prefix, "lib", "libmpi.so.40").exists():
        env.setdefault("OPAL_PREFIX", prefix)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def site_mpi(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``CONDUIT_MPI`` asks for the site's MPI (``site``) rather than the pip
    wheel's (``wheel``, the default).

    Raises:
        ConfigError: another value.
    """
    value = (os.environ if env is None else env).get("CONDUIT_MPI", "") or "wheel"
    if value not in ("wheel", "site"):
        raise ConfigError(f"CONDUIT_MPI must be wheel or site, got {value!r}",
                          key="CONDUIT_MPI")
    return value == "site"


def ranks_for(cfg: Config) -> int:
    """Ranks a config's layout uses on one node (counts mode; one actor when 'rest';
    the delivery ranks of ``scheduler.delivery = "process"``)."""
    return ranks_needed(cfg.layout, cfg.scheduler.delivery)


def ranks_problem(cfg: Config, n: int) -> ConduitError | None:
    """Why ``n`` ranks do not fit ``cfg``'s ``[layout]``, or ``None`` - the rule of
    :func:`conduit_hpc.config.layout_rule.assign_roles` (the one the ranks use) for
    ``per_node = false``, checked before any rank starts; it counts the delivery ranks
    of ``scheduler.delivery = "process"``. ``per_node = true`` is not checked (it depends
    on how the launcher fills nodes). Local; no MPI."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_COUNT:
        return ConfigError(f"-n must be a number of ranks between 1 and {MAX_COUNT}, "
                           f"got {n!r}", key="-n")
    lay = cfg.layout
    emulated = emulated_nodes_problem(lay, n)
    if emulated is not None:
        return emulated
    if lay.per_node:
        return None
    need = ranks_needed(lay, cfg.scheduler.delivery)
    # by counting: no list of roles for a world (or a layout) of a billion ranks
    err = world_problem(lay, n, cfg.scheduler.delivery)
    if err is None:
        return _longhaul_problem(cfg, n)
    d = lay.learners * delivery_per_learner(cfg.scheduler.delivery)
    roles = (f"{lay.learners} learner(s), " + (f"{d} delivery rank(s), " if d else "")
             + f"{lay.buffers} buffer(s), "
             f"{lay.min_actors}{'+' if lay.actors == 0 else ''} actor(s)")
    if n < need:
        fix = (f"use -n {need} or more" if lay.actors == 0 else
               f"use -n {need}, or change layout.learners/buffers/actors")
        return WorldTooSmall(f"-n {n} is too few: [layout] needs {need} ranks ({roles}); "
                             f"{fix}")
    if isinstance(err, ConfigError):
        return ConfigError(f"-n {n} is more than the {need} ranks [layout] uses ({roles}); "
                           f"use -n {need}, or --set layout.actors=0 to make every "
                           f"remaining rank an actor", key="layout.actors")
    return None


def _longhaul_problem(cfg: Config, n: int) -> ConduitError | None:
    """``longhaul.edge_ranks`` against the roles of ``n`` ranks (the check every rank
    makes at start, :meth:`LinkSides.build`), before any rank starts."""
    if cfg.longhaul.mode == "off" or n > 1 << 16:
        return None  # above 2**16 ranks: left to the ranks' own check
    from conduit_hpc.features.longhaul.topology import LinkSides

    got, _ = assign_roles(cfg.layout, (0,) * n, cfg.scheduler.delivery)
    if got is None:
        return None
    try:
        LinkSides.build(cfg, world_size=n, actor_ranks=got.ranks("actor"),
                        buffer_ranks=got.ranks("buffer"), learner_ranks=got.ranks("learner"))
    except ConfigError as err:
        return err
    return None


def launch_world(cfg: Config, n: int) -> LaunchWorld:
    """The world of ``n`` ranks as the launcher knows it: the role counts of a
    ``per_node = false`` layout that fits ``n`` (:func:`ranks_problem` first), and this
    machine's physical memory as one node's. Local; no MPI."""
    try:
        memory: int | None = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not on this platform
        memory = None
    if cfg.layout.per_node:
        return LaunchWorld(n, memory_bytes=memory)
    counts = role_counts(cfg.layout, n, cfg.scheduler.delivery)
    return LaunchWorld(n, learners=counts["learner"], buffers=counts["buffer"],
                       actors=counts["actor"], memory_bytes=memory)


def job_problem(cfg: Config, n: int) -> ConfigError | None:
    """What the job's own sections refuse of a world of ``n`` ranks
    (:meth:`Config.check_launch`), before any rank starts."""
    try:
        cfg.check_launch(launch_world(cfg, n))
    except ConfigError as err:
        return err
    except Exception as err:  # the job's own code: anything can go wrong
        return ConfigError(f"{type(cfg).__name__}.check_launch (the job's checks before "
                           f"launch) failed: {type(err).__name__}: {err}", key="")
    return None


def _cluster_problem(cfg: Config) -> ConfigError | None:
    """A ``placement.cluster`` file the ranks could not load (relative to the launcher's
    working directory, as here), before any rank starts; also where no planner reads it."""
    pc = cfg.placement
    if not pc.cluster:  # (round_robin took a bad one in silence: a typo in its path)
        return None
    from conduit_hpc.placement.cluster import ClusterModel

    try:
        ClusterModel.from_toml(pc.cluster)
    except ConfigError as err:
        return ConfigError(f"placement.cluster = {pc.cluster!r}: {err}",
                           key="placement.cluster")
    return None


def no_mpi_in_this_process() -> None:
    """Loading a job file imports its job script, which may import ``mpi4py.MPI``: on a
    login node (and in the launcher, whose children are the MPI job) that must not
    initialise MPI. Call before loading; a no-op once MPI is loaded."""
    if "mpi4py.MPI" not in sys.modules:
        import mpi4py

        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False


def entry_for(config_path: Path, cfg: Config) -> Path:
    """The job script: ``<config>.py`` beside the TOML file (the one that declares the
    job's config class, see :mod:`conduit_hpc.config.jobs`)."""
    return job_script_for(config_path)


#: seconds the job may go on after a rank reported its error (it normally aborts the
#: job within a second); past it the launcher stops the job - a rank on a host that
#: stopped answering cannot be told to abort (docs/hosts.md, "Faults")
ABORT_GRACE_S = 20.0


def launch(config_path: str | Path, *, nranks: int | None = None,
           overrides: Sequence[str] = (), runs_root: str | Path = "runs",
           resume: str = "", timeout_s: float | None = None, quiet: bool = False,
           config_cls: type[Config] = Config, launcher: str = "auto",
           run_dir: str | Path | None = None, entry: str | Path | None = None,
           check_entry: bool = True) -> tuple[int, Path]:
    """Start a job's ranks and wait. Blocks at most ``timeout_s`` (default: the job's
    ``run.duration_s`` + ``run.timeout_s`` + 60 s). A launch that Open MPI failed to
    start (no rank wrote ``logs/rank.N``; see :mod:`conduit_hpc.tools.mpi_start`) is
    tried again, at most twice, unless a stop was asked for meanwhile.

    Per-rank output goes to ``RUN_DIR/logs/rank.N/{stdout,stderr}`` (written by the
    ranks themselves; rank 0's stdout is also copied to ours while the job runs).
    ``SIGTERM``, ``SIGINT`` (Ctrl-C) or ``SIGUSR1`` received while waiting is forwarded
    to the ranks as ``SIGUSR1`` (see :func:`stop_requested`), and the budget is extended
    by ``run.timeout_s`` + 60 s so that they can write a final checkpoint; a second
    ``SIGTERM`` or ``SIGINT`` stops them.

    Args:
        launcher (str): ``auto``, ``mpirun`` or ``srun`` (see :func:`choose_launcher`).
        run_dir (str | Path | None): use this directory (created if needed; kept across a
            requeued SLURM job so that ``--resume`` finds its checkpoints) instead of a
            new ``runs_root/<name>-<timestamp>``; earlier logs move to ``logs.<k>``.
            One that holds checkpoints is refused without ``resume``.
        entry (str | Path | None): the job script (default: the ``.py`` beside the TOML).
        check_entry (bool): check before launch that the job script exists, calls
            ``job_main`` under ``__main__`` and defines ``run`` (tests of launcher
            failures turn it off).

    Returns:
        tuple[int, Path]: the exit status (0 on success) and the run directory.

    Raises:
        ConfigError: the config does not load, ``n`` is more than a layout with fixed
            counts uses, the job script does not keep the contract of
            ``docs/writing-a-job.md``, the checkpoint root is a file, or a fresh run
            (no ``resume``) would start in a checkpoint root holding checkpoints (all
            checked before any rank starts or any directory is made).
        WorldTooSmall: ``n`` is fewer ranks than the layout needs.
        ConduitError: a bad launcher, or more ranks than the SLURM allocation has tasks.
    """
    path = Path(config_path)
    # the one loading path: job sections are checked here too, before any rank starts
    no_mpi_in_this_process()
    beside = job_script_for(path)
    # the job config class is the one the script the ranks run declares (job_main
    # loads RUN_DIR/config.toml with it): the entry when given; with check_entry off
    # (tests of launcher failures, whose entries may not import) the script beside
    use_entry = entry is not None and (check_entry or not beside.is_file())
    cfg = load(config_cls, path, overrides, script=entry if use_entry else None)
    cfg.check_runnable()
    which, plugin = choose_launcher(launcher)
    mpirun = os.environ.get("CONDUIT_MPIRUN", "") or "mpirun"
    if which == "mpirun" and shutil.which(mpirun, path=mpi_env().get("PATH")) is None:
        raise ConduitError(f"mpirun {mpirun!r} ($CONDUIT_MPIRUN, else mpirun on PATH) is not "
                           f"an executable; give the site's with conduit-hpc slurm --mpirun "
                           f"or load its module")
    site_mpi()  # a bad CONDUIT_MPI is refused before the run directory is made
    slots = os.environ.get("SLURM_NTASKS", "")  # ASCII digits ("²".isdigit(): int fails)
    tasks = int(slots) if slots.isascii() and slots.isdigit() else None
    if nranks is not None:
        n = nranks
    else:
        n = tasks if which == "srun" and tasks is not None else ranks_for(cfg)
    if which == "srun" and tasks is not None and n > tasks:
        raise ConduitError(f"-n {n} exceeds the {slots} tasks of this SLURM allocation "
                           f"(SLURM_NTASKS); ask sbatch for more tasks or use "
                           f"--launcher mpirun (which may oversubscribe)")
    bad_n = (ranks_problem(cfg, n) or _cluster_problem(cfg) or job_problem(cfg, n)
             or (local_ranks_problem(n, "-n") if which == "mpirun" else None))
    if bad_n is not None:
        raise bad_n
    if timeout_s is not None and not (isinstance(timeout_s, int | float)
                                      and 0 < timeout_s <= MAX_SECONDS):
        # NaN or inf would never end the wait below; 0 or less would end it at once
        raise ConfigError(f"--timeout must be a number of seconds > 0 and <= "
                          f"{MAX_SECONDS:g}, got {timeout_s!r}", key="--timeout")
    entry = Path(entry) if entry is not None else entry_for(path, cfg)
    if check_entry:
        problem = contract_problem(entry)
        if problem:
            raise ConfigError(problem + (f" (the job script of {str(path)!r} is the .py "
                                         f"beside it)" if not entry.is_file() else ""))
    if run_dir is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        run_dir = Path(runs_root) / f"{cfg.run.name}-{stamp}"
    run_dir = Path(run_dir)
    check_checkpoint_root(cfg, run_dir, resume)
    logs = run_dir / "logs"
    lock = lock_run_dir(run_dir, runs_root, cfg, fresh=not resume)  # (logs/ set aside)
    try:
        logs.mkdir(parents=True, exist_ok=True)
        # the resolved config (overrides applied, defaults filled in), written by
        # tomli-w; every rank loads this file with the job's class
        (run_dir / "config.toml").write_text(to_toml(cfg.to_dict()))
    except OSError as err:
        lock.close()
        raise unwritable(run_dir, runs_root, err) from err
    try:
        job_args = ["--config", str((run_dir / "config.toml").resolve()), "--run-dir",
                    str(run_dir.resolve())]
        if resume:
            job_args += ["--resume", resume]
        if lock.root is not None:
            # the ranks must not take the root's lock this process holds (a fresh open by
            # a child would conflict with it): said on the command line, which reaches
            # every rank under mpirun (local or remote) and srun alike, unlike a variable
            job_args += ["--launcher-holds-root", str(lock.root)]
        py = [sys.executable, "-m", "mpi4py", str(entry), *job_args]
        # ranks write their own logs (logs/rank.N/); what comes before that (a failed
        # start) is in logs/launcher.log
        if which == "srun":
            cmd = ["srun", f"--mpi={plugin}", "-n", str(n), "--kill-on-bad-exit=1", *py]
        else:
            cmd = [mpirun, "-n", str(n), *py]
        budget = timeout_s or (cfg.run.duration_s + cfg.run.timeout_s + 60.0)
        (run_dir / "command.txt").write_text(" ".join(cmd) + "\n")
        with open(logs / "launcher.log", "w") as launcher_log, Forwarder() as fwd:
            tries = StartRetry(cmd, launcher_log)  # (Open MPI failed to start it)

            def start() -> subprocess.Popen[bytes]:
                tries.mark()
                fwd.proc = subprocess.Popen(cmd, env=mpi_env(), start_new_session=True,
                                            stdout=launcher_log, stderr=subprocess.STDOUT,
                                            preexec_fn=parent_death_signal())
                return fwd.proc
            proc = start()
            fwd.ready = lambda: all((logs / f"rank.{r}").is_dir() for r in range(n))
            follower = Follower(run_dir, quiet)
            deadline = time.monotonic() + budget
            fwd.grace_s = cfg.run.timeout_s + 60.0
            rc: int | None = None
            reported_at: float | None = None
            next_look = 0.0
            while rc is None:
                try:
                    rc = proc.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    follower.pump()
                    fwd.act()
                    deadline = fwd.extend(deadline)
                    now = time.monotonic()
                    if reported_at is None and now >= next_look:
                        next_look = now + 1.0
                        if rank_reported_error(logs):
                            reported_at = now
                    if reported_at is not None and now - reported_at > ABORT_GRACE_S:
                        # the ranks have failed already: no final checkpoint to wait for
                        # (mpirun, unable to reach a silent host, may not end on TERM)
                        stop_group(proc, term_wait_s=3.0)
                        follower.pump()
                        # one message: the rank's error, and why the launcher ended the job
                        first = first_error(run_dir) or f"{ERROR_PREFIX}: a rank reported an error"
                        return ended(run_dir, 1, (
                            f"{first}; the job did not end within {ABORT_GRACE_S:.0f} s of it "
                            f"and was stopped (a rank that cannot be told to abort: a node or "
                            f"link that stopped answering?)"))
                    if time.monotonic() > deadline:
                        stop_group(proc)
                        follower.pump()
                        return ended(run_dir, 124, (
                            f"{ERROR_PREFIX}: job ran past its {budget:.0f} s budget and was "
                            f"stopped; logs in {logs}"))
                if rc is not None and not (fwd.pending or fwd.held or fwd.forwarded) and \
                        tries.again(rc, ranks_ran=any(logs.glob("rank.*"))):
                    proc, rc = start(), None
            follower.pump()
            follower.finish()
        missing = [r for r in range(n) if not (logs / f"rank.{r}").is_dir()]
        if rc == 0 and missing:
            return ended(run_dir, 1, never_started(which, missing, n, entry, logs))
        if rc != 0:
            # a rank's own report first (under srun, the ranks that srun kills after one
            # failed are reported as killed too); else the rank the launcher saw die
            from conduit_hpc.tools.diagnose import disk_full_note

            return ended(run_dir, rc, (
                first_error(run_dir) or rank_death(run_dir, cfg)
                or (failed_start(which, rc, logs) if len(missing) == n else "")
                or f"{ERROR_PREFIX}: job exited with status {rc}; logs in {logs}")
                + disk_full_note(run_dir))
        return ended(run_dir, rc)
    finally:
        lock.close()  # the run directory is free again
