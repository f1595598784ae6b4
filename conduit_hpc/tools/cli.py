"""``conduit-hpc``: run | info | plan | probe | bench | inspect | slurm | report.

Every sub-command is a :class:`Command` - its name, one line of help, a function that
adds its arguments and a function ``(args) -> int`` that runs it - listed in
:data:`COMMANDS` at the end of this module; :func:`main` turns a
:class:`~conduit_hpc.errors.ConduitError`, or an ``OSError`` about a path given, into one
``conduit-hpc: error`` line and exit status 2. Nothing here imports MPI.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from conduit_hpc import __version__, jsontext
from conduit_hpc.errors import ConduitError
from conduit_hpc.tools.cli_support import check_ranks, local_ranks_problem, run_bounded

__all__ = ["COMMANDS", "Command", "benchmarks", "build_parser", "main"]

DESCRIPTION = ("conduit_hpc: an experience data plane for distributed RL on MPI ranks. "
               "Run jobs, plan placements, render SLURM scripts, run benchmarks, inspect "
               "checkpoints and report on runs.")


@dataclass(frozen=True, slots=True)
class Command:
    """One sub-command: ``conduit-hpc NAME ...``.

    Attributes:
        name (str): the sub-command's name.
        help (str): one line for ``conduit-hpc --help`` (plain text).
        add_arguments (Callable[[argparse.ArgumentParser], None]): adds its arguments.
        run (Callable[[argparse.Namespace], int]): runs it; returns the exit status.
        epilog (Callable[[], str] | None): text after its option list (built on demand).
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    epilog: Callable[[], str] | None = None


# ---------------------------------------------------------------------------------
# run


def cmd_run(args: argparse.Namespace) -> int:
    from conduit_hpc.job import resume_argument
    from conduit_hpc.tools.launcher import launch

    resume = resume_argument(args.resume)  # --resume "" is refused, not a fresh start
    sets = list(args.set)
    if args.mode:
        sets.append(f"scheduler.mode={args.mode}")
    rc, run_dir = launch(args.config, nranks=args.n, overrides=sets, runs_root=args.runs,
                         resume=resume, timeout_s=args.timeout, launcher=args.launcher,
                         run_dir=args.run_dir or None, entry=args.entry or None)
    print(f"run directory: {run_dir}", file=sys.stderr)
    return rc


def _build_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="job TOML; the job script is the .py beside it")
    p.add_argument("-n", type=int, default=None, help="ranks (default: from [layout])")
    p.add_argument("--mode", choices=("edp", "sync", "service"), default=None,
                   help="delivery mode (sets scheduler.mode)")
    p.add_argument("--resume", nargs="?", const="latest", default=None,
                   help="resume from the latest complete checkpoint, or the one given")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set storage.capacity_rows=1000")
    p.add_argument("--runs", default="runs", help="parent of run directories")
    p.add_argument("--timeout", type=float, default=None, help="wall-clock limit (s)")
    p.add_argument("--launcher", choices=("auto", "mpirun", "srun"), default="auto",
                   help="auto: srun --mpi=pmix inside a SLURM allocation, else mpirun "
                        "($CONDUIT_LAUNCHER sets the default)")
    p.add_argument("--run-dir", default="", help="use this run directory (kept across a "
                   "requeued SLURM job) instead of a new one under --runs")
    p.add_argument("--entry", default="", help="the job script (default: the .py beside "
                   "the TOML file; see docs/writing-a-job.md)")


# ---------------------------------------------------------------------------------
# info


def cmd_info(args: argparse.Namespace) -> int:
    under_mpi = "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ
    n = args.n
    check_ranks(n, "-n", zero_ok=True)
    if not under_mpi and not args.config:  # info's own layout: a buffer and an actor
        from conduit_hpc.errors import ConfigError

        if n == 1:
            raise ConfigError("-n must be 0 (the default: 2 ranks) or at least 2 without "
                              "--config (info's layout has a buffer rank and an actor "
                              "rank), got 1", key="-n")
        n = n or 2
    if not under_mpi and (n or args.config):  # launch -n ranks, or the [layout]'s
        from conduit_hpc.tools.launcher import mpi_env, no_mpi_in_this_process, ranks_problem

        if args.config:
            from conduit_hpc import Config
            from conduit_hpc.tools.launcher import ranks_for

            no_mpi_in_this_process()
            cfg = Config.from_toml(args.config)
            n = n or ranks_for(cfg)  # none given: the ranks the job's [layout] uses
            bad = ranks_problem(cfg, n)  # refused before any rank starts, as `run` does
            if bad is not None:
                raise bad
        too_many = local_ranks_problem(n, "-n")
        if too_many is not None:
            raise too_many
        cmd = ["mpirun", "-n", str(n), sys.executable, "-m", "mpi4py", "-m",
               "conduit_hpc.plane.info"]
        if args.config:
            cmd += ["--config", args.config]
        return run_bounded(cmd, mpi_env(), 120.0)
    from conduit_hpc.plane.info import print_info

    return print_info(args.config)


def _build_info(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", type=int, default=0, help="launch this many ranks with mpirun "
                   "(default: 2, or with --config the ranks of the job's [layout])")
    p.add_argument("--config", default="", help="job TOML whose [layout] to show")


# ---------------------------------------------------------------------------------
# plan


def cmd_plan(args: argparse.Namespace) -> int:
    from conduit_hpc.tools.report.plan import plan_command

    return plan_command(args.cluster, args.workload, as_json=args.json, method=args.method,
                        scope=args.scope, top=args.top, min_shard_rows=args.min_shard_rows)


def _build_plan(p: argparse.ArgumentParser) -> None:
    p.add_argument("cluster", help="cluster model TOML (see jobs/cluster-*.toml)")
    p.add_argument("--workload", default=None,
                   help="job TOML: its [workload] table, or derived from [storage]/[spec]")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--method", choices=("auto", "symmetric", "flat"), default="auto",
                   help="LP the static planner solves: symmetric (over placement patterns "
                        "per class of interchangeable learners; small for any cluster "
                        "size), flat (over every partition-location pair; exact, for small "
                        "clusters) or auto (flat when small, else symmetric; default)")
    p.add_argument("--scope", choices=("global", "partitioned"), default=None,
                   help="override the workload's sampling scope")
    p.add_argument("--top", type=int, default=24, help="rows shown per table")
    p.add_argument("--min-shard-rows", type=int, default=None, metavar="N",
                   help="no shard smaller than N rows (default: the workload's batch; 0: "
                        "no floor)")


def cmd_probe(args: argparse.Namespace) -> int:
    from conduit_hpc.tools.launcher import mpi_env

    check_ranks(args.n, "-n")
    from conduit_hpc.config import LayoutConfig
    from conduit_hpc.errors import ConfigError

    too_many = local_ranks_problem(args.n, "-n")
    if too_many is not None:
        raise too_many
    if args.n < 2:  # the world the probe's layout needs, whatever --learners says
        raise ConfigError(f"-n must be at least 2 for the probe (a buffer rank and an "
                          f"actor rank, besides any learners), got {args.n}", key="-n")

    # the ranks' own rule for these values, here before anything is launched
    fit = max(args.n - 2, 0)  # a buffer rank and an actor rank besides the learners
    if args.learners is None:
        args.learners = min(1, fit)
    LayoutConfig(learners=args.learners, emulate_nodes=args.emulate_nodes)
    if args.learners > fit:
        raise ConfigError(f"--learners {args.learners} does not fit -n {args.n}: the probe "
                          f"needs a buffer rank and an actor rank besides the learners "
                          f"(use --learners {fit} or fewer, or -n {args.learners + 2})",
                          key="--learners")
    if args.emulate_nodes > args.n:
        raise ConfigError(f"--emulate-nodes {args.emulate_nodes} is more nodes than the "
                          f"-n {args.n} ranks (use at most {args.n})", key="--emulate-nodes")
    out = Path(args.out) if args.out else None
    if out is not None and (out.is_dir() or not out.parent.is_dir()):
        raise ConfigError(f"--out must be a file path in an existing directory, got "
                          f"{args.out!r}", key="--out")
    from conduit_hpc.config.outfile import PROBE_HEADER, check_out_file

    check_out_file(args.out, "--out", marker=PROBE_HEADER, force=args.force)
    cmd = ["mpirun", "-n", str(args.n), sys.executable, "-m", "mpi4py", "-m",
           "conduit_hpc.plane.probe", "--learners", str(args.learners), "--emulate-nodes",
           str(args.emulate_nodes)]
    if args.out:
        cmd += ["--out", args.out, "--force"]  # checked above, with the user's --force
    return run_bounded(cmd, mpi_env(), 300.0)


def _build_probe(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", type=int, default=3, help="ranks to launch with mpirun")
    p.add_argument("--learners", type=int, default=None,
                   help="learner ranks in the layout (default 1; 0 with -n 2)")
    p.add_argument("--emulate-nodes", type=int, default=0,
                   help="treat the ranks as N nodes (RMA between them)")
    p.add_argument("--out", default="", help="also write the cluster TOML here (a new "
                   "file, or one an earlier probe wrote; see --force)")
    p.add_argument("--force", action="store_true", help="let --out write over an existing "
                   "file that an earlier probe did not write")


# ---------------------------------------------------------------------------------
# bench


def benchmarks() -> dict[str, str]:
    """``{name: first docstring line}`` of every benchmark module in
    :mod:`conduit_hpc.bench` (names with ``-`` for ``_``), read from the source without
    importing it. Not collective."""
    out: dict[str, str] = {}
    for res in sorted(resources.files("conduit_hpc.bench").iterdir(), key=lambda r: r.name):
        stem, dot, ext = res.name.rpartition(".")
        if not dot or ext != "py" or stem.startswith("_") or stem == "common":
            continue
        doc = ast.get_docstring(ast.parse(res.read_text())) or ""
        out[stem.replace("_", "-")] = _plain(doc.strip().splitlines()[0] if doc.strip() else "")
    return out


def _plain(text: str) -> str:
    """Docstring text without reStructuredText markup, for ``--help``."""
    return text.replace("``", "").replace("*", "")


def _bench_epilog() -> str:
    rows = benchmarks()
    width = max(map(len, rows), default=0)
    return "benchmarks:\n" + "\n".join(f"  {name:<{width}}  {line}"
                                        for name, line in rows.items()) + \
        "\n\nconduit-hpc bench NAME --help shows a benchmark's own options."


def cmd_bench(args: argparse.Namespace) -> int:
    names = benchmarks()
    name = args.name.replace("_", "-")
    if name not in names:
        raise ConduitError(f"no benchmark {args.name!r}; available: {', '.join(names)}")
    mod = importlib.import_module(f"conduit_hpc.bench.{name.replace('-', '_')}")
    result = mod.main(args.args)
    if args.json:
        print(jsontext.dumps(result, default=str))
    return 0


def _build_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="benchmark name (listed below)")
    p.add_argument("--json", action="store_true", help="print the result dict as JSON")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="arguments for the benchmark")


# ---------------------------------------------------------------------------------
# inspect


def _checkpoints_of_run(path: str) -> str:
    """``path``, or its checkpoint root when it is a run directory (``config.toml``,
    ``logs/`` or ``checkpoints/`` in it, and no checkpoint itself); the root is
    ``[checkpoint] directory`` of its ``config.toml`` (default ``checkpoints``).

    Raises:
        ConduitError: a run directory without that root.
    """
    p = Path(path)
    if not p.is_dir() or (p / "DONE").exists() or (p / "manifest.h5").exists() or \
            any(p.glob("ckpt-*")):
        return path
    sub, conf = "checkpoints", p / "config.toml"
    if conf.is_file():
        try:
            import tomllib
        except ImportError:  # Python 3.10
            import tomli as tomllib  # type: ignore[no-redef]
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sub = str(tomllib.loads(conf.read_text()).get("checkpoint", {}).get(
                "directory", sub))
    root = p / sub
    if not (conf.is_file() or (p / "logs").is_dir() or root.is_dir()):
        return path
    if not root.is_dir():
        raise ConduitError(f"{p} is a run directory without checkpoints: no {root} "
                           f"([checkpoint] directory = {sub!r})")
    print(f"inspect: {p} is a run directory; its checkpoints are under {root}",
          file=sys.stderr)
    return str(root)


def cmd_inspect(args: argparse.Namespace) -> int:
    from conduit_hpc.checkpoint import format_report, inspect_checkpoint

    report = inspect_checkpoint(_checkpoints_of_run(args.path), verify=args.verify)
    print(jsontext.dumps(report, default=str) if args.json else format_report(report))
    if not report["ok"]:
        print(f"conduit-hpc: error: CheckpointError: {report['error']}", file=sys.stderr)
        return 1
    return 0


def _build_inspect(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a checkpoint directory, a root holding several, or a "
                   "run directory (its checkpoints)")
    p.add_argument("--verify", action="store_true", help="read every dataset and check "
                   "its checksum")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


# ---------------------------------------------------------------------------------
# slurm


def cmd_slurm(args: argparse.Namespace) -> int:
    from conduit_hpc.tools.launcher import no_mpi_in_this_process
    from conduit_hpc.tools.slurm import (
        output_folder,
        render_sbatch,
        request_from_args,
        write_or_print,
    )

    no_mpi_in_this_process()

    cmd = shlex.join(["conduit-hpc", *sys.argv[1:]]) if sys.argv[1:2] == ["slurm"] else ""
    req = request_from_args(args)
    from conduit_hpc.config import job_script_for
    from conduit_hpc.errors import ConfigError

    script = job_script_for(Path(args.config))
    if Path(args.config).is_file() and not script.is_file():  # else the loader says why
        # the job would fail only once it left the queue; conduit-hpc run refuses it too
        raise ConfigError(f"no job script {str(script)!r} (the job script of "
                          f"{args.config!r} is the .py beside it; the rendered job would "
                          f"start it)", key="config")
    from conduit_hpc.config.outfile import SBATCH_HEADER, check_out_file

    check_out_file(args.out, "-o", marker=SBATCH_HEADER, force=args.force,
                   keep=(args.config, script))
    warnings: list[str] = []
    text = render_sbatch(args.config, req, command=cmd, warnings=warnings)
    for w in warnings:
        print(f"conduit-hpc: warning: {w}", file=sys.stderr)
    folder = output_folder(req)
    if folder is not None:  # slurmd opens #SBATCH --output before the script runs
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            print(f"conduit-hpc: warning: cannot create {folder} for #SBATCH --output "
                  f"({err}); create it before sbatch", file=sys.stderr)
    write_or_print(text, args.out)
    if args.out:
        print(f"wrote {args.out}; submit with: sbatch {args.out}", file=sys.stderr)
    return 0


def _build_slurm(p: argparse.ArgumentParser) -> None:
    from conduit_hpc.tools.slurm import add_arguments

    add_arguments(p)


# ---------------------------------------------------------------------------------
# report


def cmd_report(args: argparse.Namespace) -> int:
    from conduit_hpc.tools.report.run import write_report

    for d in map(Path, args.run_dirs):  # before anything is written
        if d.is_dir() and not (d / "metrics").is_dir():
            raise ConduitError(f"{str(d)!r} is not a run directory: it has no metrics/ "
                               f"(conduit-hpc run writes RUN_DIR/metrics/; nothing to "
                               f"report)")
    md = write_report(args.run_dirs, args.out or None)
    print(f"report: {md} (plots beside it)")
    return 0


def _build_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories")
    p.add_argument("--out", default="", help="output folder (default RUN_DIR/report for "
                   "one run, report-<time> beside the first run for several)")


# ---------------------------------------------------------------------------------


COMMANDS: dict[str, Command] = {c.name: c for c in (
    Command("run", "run a job (TOML) through mpirun, or srun inside a SLURM allocation",
            _build_run, cmd_run),
    Command("info", "print MPI library, thread level, world size, roles and node sharing",
            _build_info, cmd_info),
    Command("plan", "plan where shards live on a cluster model and print the plan",
            _build_plan, cmd_plan),
    Command("probe", "measure this machine's links and print it as a cluster model (TOML)",
            _build_probe, cmd_probe),
    Command("bench", "run a benchmark (conduit-hpc bench --help lists them)",
            _build_bench, cmd_bench, epilog=_bench_epilog),
    Command("inspect", "describe a checkpoint (spec, rows, priorities, config, position)",
            _build_inspect, cmd_inspect),
    Command("slurm", "render an sbatch script for a job (one node, or many nodes with GPUs)",
            _build_slurm, cmd_slurm),
    Command("report", "PNG plots and a markdown summary of one or several runs",
            _build_report, cmd_report),
)}


def build_parser() -> argparse.ArgumentParser:
    """The ``conduit-hpc`` argument parser with every command of :data:`COMMANDS`."""
    p = argparse.ArgumentParser(prog="conduit-hpc", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"conduit-hpc {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for c in COMMANDS.values():
        epilog = c.epilog() if c.epilog is not None else None
        c.add_arguments(sub.add_parser(c.name, help=c.help, description=c.help,
                                       epilog=epilog,
                                       formatter_class=argparse.RawDescriptionHelpFormatter))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``conduit-hpc ARGS``; returns the exit status (2 for a ConduitError)."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command].run(args)
    except ConduitError as err:
        print(f"conduit-hpc: error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        # a path the system refuses, wherever a command first touches it (a name past
        # NAME_MAX, a symbolic-link loop, a directory it may not list): one line naming
        # the path and the system's reason, not a traceback (before: Path.exists() and
        # the like raised it from deep inside for run, slurm, inspect, report, probe)
        print(f"conduit-hpc: error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C outside a run's wait (which forwards it)
        print("conduit-hpc: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
