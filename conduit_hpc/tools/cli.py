"""``conduit-hpc``: run | info | plan | probe | bench | inspect | slurm | report.

Every sub-command is a function ``cmd_<name>(args) -> int`` registered in
:data:`COMMANDS`; :func:`main` turns a :class:`~conduit_hpc.errors.ConduitError` into one
``conduit-hpc: error`` line and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from conduit_hpc.errors import ConduitError

__all__ = ["COMMANDS", "main"]

REPO = Path(__file__).resolve().parents[2]

Command = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int],
                str]
COMMANDS: dict[str, Command] = {}


def command(name: str, help: str) -> Callable[[Callable[[argparse.ArgumentParser], None]],
                                              Callable[[argparse.ArgumentParser], None]]:
    """Register ``cmd_<name>`` with the decorated argument builder."""
    def deco(build: Callable[[argparse.ArgumentParser], None]
             ) -> Callable[[argparse.ArgumentParser], None]:
        COMMANDS[name] = (build, globals()[f"cmd_{name.replace('-', '_')}"], help)
        return build
    return deco


# ---------------------------------------------------------------------------------
# run


def cmd_run(args: argparse.Namespace) -> int:
    from conduit_hpc.tools.launcher import launch

    sets = list(args.set)
    if args.mode:
        sets.append(f"scheduler.mode={args.mode}")
    rc, run_dir = launch(args.config, nranks=args.n, overrides=sets, runs_root=args.runs,
                         resume=args.resume, timeout_s=args.timeout, launcher=args.launcher,
                         run_dir=args.run_dir or None)
    print(f"run directory: {run_dir}", file=sys.stderr)
    return rc


@command("run", "run a job (TOML) through mpirun, or srun inside a SLURM allocation")
def _build_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="job TOML; the job script is the .py beside it")
    p.add_argument("-n", type=int, default=None, help="ranks (default: from [layout])")
    p.add_argument("--mode", choices=("edp", "sync", "service"), default=None,
                   help="delivery mode (sets scheduler.mode)")
    p.add_argument("--resume", nargs="?", const="latest", default="",
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


# ---------------------------------------------------------------------------------
# info


def cmd_info(args: argparse.Namespace) -> int:
    if args.n and "OMPI_COMM_WORLD_SIZE" not in os.environ and "PMI_SIZE" not in os.environ:
        from conduit_hpc.tools.launcher import mpi_env

        cmd = ["mpirun", "-n", str(args.n), sys.executable, "-m", "mpi4py", "-m",
               "conduit_hpc.plane.info"]
        if args.config:
            cmd += ["--config", args.config]
        return subprocess.run(cmd, env=mpi_env(), timeout=120, check=False).returncode
    from conduit_hpc.plane.info import print_info

    return print_info(args.config)


@command("info", "print MPI library, thread level, world size, roles and node sharing")
def _build_info(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", type=int, default=0, help="launch this many ranks with mpirun")
    p.add_argument("--config", default="", help="job TOML whose [layout] to show")


# ---------------------------------------------------------------------------------
# plan


def cmd_plan(args: argparse.Namespace) -> int:
    from conduit_hpc.tools.report.plan import plan_command

    return plan_command(args.cluster, args.workload, as_json=args.json, method=args.method,
                        scope=args.scope, top=args.top)


@command("plan", "plan where shards live on a cluster model and print the plan")
def _build_plan(p: argparse.ArgumentParser) -> None:
    p.add_argument("cluster", help="cluster model TOML (see jobs/cluster-*.toml)")
    p.add_argument("--workload", default=None,
                   help="job TOML: its [workload] table, or derived from [storage]/[spec]")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--method", choices=("auto", "symmetric", "flat"), default="auto")
    p.add_argument("--scope", choices=("global", "partitioned"), default=None,
                   help="override the workload's sampling scope")
    p.add_argument("--top", type=int, default=24, help="rows shown per table")


def cmd_probe(args: argparse.Namespace) -> int:
    from conduit_hpc.tools.launcher import mpi_env

    cmd = ["mpirun", "-n", str(args.n), sys.executable, "-m", "mpi4py", "-m",
           "conduit_hpc.plane.probe", "--learners", str(args.learners), "--emulate-nodes",
           str(args.emulate_nodes)]
    if args.out:
        cmd += ["--out", args.out]
    return subprocess.run(cmd, env=mpi_env(), timeout=300, check=False).returncode


@command("probe", "measure this machine's links and print it as a cluster model (TOML)")
def _build_probe(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", type=int, default=3, help="ranks to launch with mpirun")
    p.add_argument("--learners", type=int, default=1, help="learner ranks in the layout")
    p.add_argument("--emulate-nodes", type=int, default=0,
                   help="treat the ranks as N nodes (RMA between them)")
    p.add_argument("--out", default="", help="also write the cluster TOML here")


# ---------------------------------------------------------------------------------
# bench


def cmd_bench(args: argparse.Namespace) -> int:
    name = args.name.replace("-", "_")
    path = REPO / "bench" / f"{name}.py"
    if not path.exists():
        avail = sorted(p.stem.replace("_", "-") for p in (REPO / "bench").glob("*.py")
                       if not p.stem.startswith("_"))
        raise ConduitError(f"no benchmark {args.name!r}; available: {', '.join(avail)}")
    spec = importlib.util.spec_from_file_location(f"conduit_bench_{name}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    result = mod.main(args.args)
    if args.json:
        print(json.dumps(result, default=str))
    return 0


@command("bench", "run a benchmark from bench/ (e.g. ingest, exposed-latency)")
def _build_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="benchmark name")
    p.add_argument("--json", action="store_true", help="print the result dict as JSON")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")


# ---------------------------------------------------------------------------------
# inspect


def cmd_inspect(args: argparse.Namespace) -> int:
    from conduit_hpc.checkpoint import format_report, inspect_checkpoint

    report = inspect_checkpoint(args.path, verify=args.verify)
    print(json.dumps(report, default=str) if args.json else format_report(report))
    if not report["ok"]:
        print(f"conduit-hpc: error: CheckpointError: {report['error']}", file=sys.stderr)
        return 1
    return 0


@command("inspect", "describe a checkpoint (spec, rows, priorities, config, position)")
def _build_inspect(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a checkpoint directory, or a root holding several")
    p.add_argument("--verify", action="store_true", help="read every dataset and check "
                   "its checksum")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
# slurm


def cmd_slurm(args: argparse.Namespace) -> int:
    from conduit_hpc.tools.slurm import render_sbatch, request_from_args, write_or_print

    cmd = "conduit-hpc " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["slurm"] else ""
    text = render_sbatch(args.config, request_from_args(args), command=cmd)
    write_or_print(text, args.out)
    if args.out:
        print(f"wrote {args.out}; submit with: sbatch {args.out}", file=sys.stderr)
    return 0


@command("slurm", "render an sbatch script for a job (one node, or many nodes with GPUs)")
def _build_slurm(p: argparse.ArgumentParser) -> None:
    from conduit_hpc.tools.slurm import add_arguments

    add_arguments(p)


# ---------------------------------------------------------------------------------
# report


def cmd_report(args: argparse.Namespace) -> int:
    from conduit_hpc.tools.report.run import write_report

    md = write_report(args.run_dirs, args.out or None)
    print(f"report: {md} (plots beside it)")
    return 0


@command("report", "PNG plots and a markdown summary of one or several runs")
def _build_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories")
    p.add_argument("--out", default="", help="output folder (default RUN_DIR/report for "
                   "one run, report-<time> beside the first run for several)")


# ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="conduit-hpc", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, (build, _, help) in COMMANDS.items():
        build(sub.add_parser(name, help=help, description=help))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _, fn, _ = COMMANDS[args.command]
    try:
        return fn(args)
    except ConduitError as err:
        print(f"conduit-hpc: error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
