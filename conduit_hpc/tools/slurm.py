"""``conduit-hpc slurm JOB.toml --nodes N ...``: render an sbatch script from a template.

The templates are package data, ``conduit_hpc/tools/templates/`` (``one_node.sbatch``,
``multi_node_gpu.sbatch``), rendered with :class:`string.Template` (``${name}``
placeholders; ``$$`` is a literal ``$`` for the shell). The script runs in the directory
``conduit-hpc slurm`` was called from, creates ``runs/`` (its parent of run directories)
and starts the job through ``conduit_hpc/tools/scripts/launch_{srun,mpirun}.sh``: the
job file's checkout's when the job file is in one (and that checkout on ``PYTHONPATH``),
else the installed package's, so a wheel install renders working scripts without a
checkout. Its environment block (modules, ``--env venv:PATH|conda:NAME``, ``--mpi
wheel|site``) is :mod:`conduit_hpc.tools.slurm_env`. What comes from the job's
``[layout]``:

* **tasks per node** - with ``per_node = true`` the layout's per-node count
  (``learners + buffers + actors``; with ``actors = 0``, "the rest", at least one actor
  unless ``--ntasks-per-node`` says more); with whole-world counts, the layout's world
  size spread over the nodes;
* **GPUs per node** - on several nodes, one per learner on a node unless given; on one
  node none unless given;
* the **role comment** in the script: which node-local ranks are learners, buffers and
  actors;
* a **warning** (in the script and from ``conduit-hpc slurm``) when GPUs would idle on
  nodes, or beyond the learners of a node (:func:`idle_gpus`).

Impossible layouts (more roles than tasks, a fixed-size layout that cannot fill the
nodes, more learners on a node than GPUs) are refused with a :class:`ConfigError` that
names the option, the value and what the layout needs. Pure Python; no MPI.
"""

from __future__ import annotations

import argparse
import re
import shlex
import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from conduit_hpc.config import Config, LaunchWorld, LayoutConfig, load, require
from conduit_hpc.config.layout_rule import (
    delivery_per_learner,
    emulated_nodes_problem,
    ranks_needed,
    role_counts,
)
from conduit_hpc.errors import ConduitError, ConfigError
from conduit_hpc.tools.sbatch_line import SBATCH_OPTION, sbatch_arg, sbatch_option
from conduit_hpc.tools.slurm_env import MPI_KINDS, checkout_of, parse_env, setup_block
from conduit_hpc.tools.slurm_time import check_signal

__all__ = ["SlurmRequest", "idle_gpus", "launch_script", "plan_tasks", "render_sbatch"]

TEMPLATES = {"one-node": "one_node.sbatch", "multi-node": "multi_node_gpu.sbatch"}
#: control characters (line breaks included); a tab is text
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


@dataclass(frozen=True, slots=True, kw_only=True)
class SlurmRequest:
    """What the user asked ``conduit-hpc slurm`` for (``None`` = from the layout).

    Attributes:
        nodes (int): nodes to allocate.
        ntasks_per_node (int | None): MPI ranks per node.
        gpus_per_node (int | None): GPUs per node (0 = none).
        time (str): wall-time limit in a SLURM format (``MM``, ``HH:MM:SS``, ``D-HH``...).
        launcher (str): ``srun`` (``srun --mpi=pmix``) or ``mpirun``.
        template (str): ``auto``, ``one-node`` or ``multi-node``.
        partition (str): ``#SBATCH --partition`` (empty: the cluster default).
        account (str): ``#SBATCH --account`` (empty: none).
        modules (tuple[str, ...]): ``module load`` lines.
        env (str): the Python environment, ``venv:PATH`` or ``conda:NAME`` ("": none
            activated; the launch script finds the checkout's ``.venv``).
        mpi (str): ``wheel`` (the pip wheel's Open MPI and its settings) or ``site``
            (the site's MPI as its modules set it up; none of the wheel's settings).
        mpirun (str): with ``mpi = "site"``: the site's ``mpirun`` (default: on PATH).
        srun_mpi (str): the ``srun --mpi=`` plugin (default: pmix; the wheel: by its MPI).
        setup (tuple[str, ...]): extra shell lines before the launch (e.g. ``source``).
        sbatch (tuple[str, ...]): extra ``#SBATCH`` options, e.g. ``--qos=high``.
        signal_s (int): seconds of preemption warning (``--signal=B:TERM@s``); 0 = none.
        requeue (bool): ``#SBATCH --requeue`` and requeue after a preemption warning.
        output (str): ``#SBATCH --output`` path.
        runs (str): parent of run directories.
        overrides (tuple[str, ...]): ``--set key=value`` passed to ``conduit-hpc run``.
    """

    nodes: int = 1
    ntasks_per_node: int | None = None
    gpus_per_node: int | None = None
    time: str = "01:00:00"
    launcher: str = "srun"
    template: str = "auto"
    partition: str = ""
    account: str = ""
    modules: tuple[str, ...] = ()
    env: str = ""
    mpi: str = "wheel"
    mpirun: str = ""
    srun_mpi: str = ""
    setup: tuple[str, ...] = ()
    sbatch: tuple[str, ...] = ()
    signal_s: int = 120
    requeue: bool = True
    output: str = ""
    runs: str = ""
    overrides: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        require(self.nodes >= 1, "--nodes", self.nodes, ">= 1")
        require(self.ntasks_per_node is None or self.ntasks_per_node >= 1,
                "--ntasks-per-node", self.ntasks_per_node, ">= 1")
        require(self.gpus_per_node is None or self.gpus_per_node >= 0, "--gpus-per-node",
                self.gpus_per_node, ">= 0")
        check_signal(self.signal_s, self.time)  # checks --time too
        require(self.launcher in ("srun", "mpirun"), "--launcher", self.launcher,
                "srun or mpirun")
        require(self.template in ("auto", *TEMPLATES), "--template", self.template,
                "auto, one-node or multi-node")
        require(self.mpi in MPI_KINDS, "--mpi", self.mpi, "wheel or site")
        parse_env(self.env)
        for opt in self.sbatch:
            require(bool(SBATCH_OPTION.fullmatch(opt)), "--sbatch", opt,
                    "a long sbatch option such as --qos=high (--NAME or --NAME=VALUE)")
        # every value lands on a line of a shell script (an #SBATCH line, a comment, a
        # command): a line break or another control character would start a line of
        # its own - a command the user did not mean to write
        for flag, values in (("--partition", (self.partition,)),
                             ("--account", (self.account,)), ("--module", self.modules),
                             ("--env", (self.env,)), ("--mpirun", (self.mpirun,)),
                             ("--srun-mpi", (self.srun_mpi,)), ("--setup", self.setup),
                             ("--output", (self.output,)), ("--runs", (self.runs,)),
                             ("--set", self.overrides)):
            for v in values:
                require(not _CONTROL.search(v), flag, v,
                        "one line of text without control characters")
        for v in self.modules:
            require(bool(v.strip()), "--module", v, "a module name (not empty)")
        for flag, v, many in (("--partition", self.partition, " (several partitions: a,b)"),
                              ("--account", self.account, "")):
            require(not any(c.isspace() for c in v), flag, v,
                    f"a SLURM name without spaces{many}")


def _roles(layout: LayoutConfig, tasks: int, d: int = 0) -> str:
    lo, b = layout.learners, layout.buffers
    parts = []
    if lo:
        parts.append(f"{_span(0, lo)} learner{'s' if lo > 1 else ''}")
    if d:
        parts.append(f"{_span(lo, d)} delivery")
    lo += d
    parts.append(f"{_span(lo, b)} buffer{'s' if b > 1 else ''}")
    parts.append(f"{_span(lo + b, tasks - lo - b)} actor{'s' if tasks - lo - b > 1 else ''}")
    return ", ".join(parts)


def _span(start: int, count: int) -> str:
    return f"rank {start}" if count == 1 else f"ranks {start}-{start + count - 1}"


def plan_tasks(layout: LayoutConfig, req: SlurmRequest,
               delivery: str = "thread") -> tuple[int, int, list[str]]:
    """Tasks per node, GPUs per node and the role comment for a layout on ``req.nodes``.

    Not collective; pure.

    Raises:
        ConfigError: the layout does not fit the request (names the option and why).
    """
    n, t = req.nodes, req.ntasks_per_node
    lo, b, a = layout.learners, layout.buffers, layout.actors
    d = lo * delivery_per_learner(delivery)  # scheduler.delivery = "process": one each
    roles_desc = (f"{lo} learner(s) + " + (f"{d} delivery rank(s) + " if d else "")
                  + f"{b} buffer(s) + "
                  f"{a if a else 'at least 1'} actor(s)")
    if layout.per_node:
        need = ranks_needed(layout, delivery)
        if t is None:
            t = need
        if t < need:
            raise ConfigError(
                f"--ntasks-per-node must be >= {need} for this job's [layout] "
                f"(per node: {roles_desc}), got {t}: more roles than tasks",
                key="ntasks_per_node")
        if a and t != need:
            raise ConfigError(
                f"--ntasks-per-node must be {need} for this job's [layout] (per node: "
                f"{roles_desc}; layout.actors = 0 would take the rest), got {t}",
                key="ntasks_per_node")
        comment = [f"#   per node: {_roles(layout, t, d)} (node-local ranks; "
                   f"[layout] per_node = true)"]
        gpus_default = lo
        learners_per_node = lo
    else:
        need = ranks_needed(layout, delivery)
        if t is None:
            if a and need % n:
                raise ConfigError(
                    f"--nodes {n} cannot hold this job's [layout] of exactly {need} ranks "
                    f"({roles_desc}) evenly; give --ntasks-per-node, set layout.actors = 0 "
                    f"(the rest are actors) or use per_node = true", key="nodes")
            t = -(-need // n)
        total = n * t
        if total < need:
            raise ConfigError(
                f"--nodes {n} x --ntasks-per-node {t} = {total} tasks, but this job's "
                f"[layout] needs {need} ({roles_desc}): more roles than tasks",
                key="ntasks_per_node")
        if a and total != need:
            raise ConfigError(
                f"--nodes {n} x --ntasks-per-node {t} = {total} tasks, but this job's "
                f"[layout] uses exactly {need} ({roles_desc}); set layout.actors = 0 to "
                f"make every remaining rank an actor", key="ntasks_per_node")
        comment = [f"#   world ranks: {_roles(layout, total, d)} ([layout] counts for the "
                   f"whole job; ranks fill node 0 first, {t} per node)"]
        learners_per_node = min(lo, t)
        gpus_default = learners_per_node
    emulated = emulated_nodes_problem(layout, n * t)  # every task is a world rank
    if emulated is not None:
        raise emulated
    if req.gpus_per_node is not None:
        gpus = req.gpus_per_node
    else:  # one node: CPU unless asked; several nodes: a GPU per learner
        gpus = gpus_default if req.nodes > 1 else 0
    if gpus and learners_per_node > gpus:
        raise ConfigError(
            f"--gpus-per-node must be >= {learners_per_node} (the learners this [layout] "
            f"puts on one node; each binds a GPU by node-local rank), got {gpus}",
            key="gpus_per_node")
    return t, gpus, comment


def idle_gpus(layout: LayoutConfig, nodes: int, tasks_per_node: int, gpus: int) -> str:
    """Why some of ``gpus`` GPUs per node on ``nodes`` nodes would hold no learner ("" if
    every GPU has one). Learners bind GPUs by node-local rank; with whole-job counts,
    world ranks fill node 0 first, so learners sit on the first nodes only. Pure."""
    lo = layout.learners
    if not gpus:
        return ""
    if layout.per_node:
        on_node = [lo] * nodes
    else:
        on_node = [max(0, min(tasks_per_node, lo - k * tasks_per_node)) for k in range(nodes)]
    idle = sum(gpus - min(gpus, c) for c in on_node)
    if not idle:
        return ""
    without = sum(1 for c in on_node if c == 0)
    where = (f"{without} of {nodes} nodes hold no learner ([layout] has {lo} learner(s) "
             f"in all; world ranks fill node 0 first)" if without else
             f"[layout] puts at most {max(on_node)} learner(s) on a node")
    return (f"{idle} of {gpus * nodes} GPUs would idle: --gpus-per-node {gpus} on {nodes} "
            f"node(s), but {where}; use --gpus-per-node {max(on_node)} with layout.per_node "
            f"= true (learners on every node), fewer nodes, or --gpus-per-node 0 for CPU "
            f"learners")


def render_sbatch(config_path: str | Path, req: SlurmRequest, *,
                  config_cls: type[Config] = Config, command: str = "",
                  warnings: list[str] | None = None) -> str:
    """The sbatch script for a job on ``req.nodes`` nodes.

    The script changes to the current directory (a relative config path is given
    relative to it; ``runs/`` there is the default parent of run directories, which the
    script creates) and runs :func:`launch_script` of the job file's checkout, else the
    installed one. Warnings (GPUs that would idle) are appended to ``warnings`` and
    written into the script as comments. Not collective; reads the job's TOML and the
    template; writes nothing.

    Raises:
        ConfigError: the config does not load, or the layout does not fit the request.
    """
    path = Path(config_path)
    cfg = load(config_cls, path, req.overrides)
    cfg.check_runnable()  # the ranks would fail only once the job left the queue
    t, gpus, comment = plan_tasks(cfg.layout, req, cfg.scheduler.delivery)
    # the job's own checks of its world (conduit-hpc run makes them again on the node,
    # with the node's memory): here the counts only, the login node's memory is not it
    counts = (None if cfg.layout.per_node else
              role_counts(cfg.layout, req.nodes * t, cfg.scheduler.delivery))
    cfg.check_launch(LaunchWorld(req.nodes * t, **({} if counts is None else {
        "learners": counts["learner"], "buffers": counts["buffer"],
        "actors": counts["actor"]})))
    template = req.template
    if template == "auto":
        template = "one-node" if req.nodes == 1 and not gpus else "multi-node"
    if template == "one-node" and (req.nodes != 1 or gpus):
        raise ConfigError(f"--template one-node is for 1 node without GPUs, got --nodes "
                          f"{req.nodes} and {gpus} GPUs per node; use multi-node",
                          key="template")
    workdir = Path.cwd().resolve()
    try:
        config_arg = str(path.resolve().relative_to(workdir))
    except ValueError:
        config_arg = str(path.resolve())
    runs = req.runs or str(workdir / "runs")
    idle = idle_gpus(cfg.layout, req.nodes, t, gpus)
    if idle and warnings is not None:
        warnings.append(idle)
    if idle:
        comment.append(f"# WARNING: {idle}")
    checkout = checkout_of(path)
    requeue = []
    if req.requeue:
        requeue.append("#SBATCH --requeue")
    if req.signal_s:
        requeue.append(f"#SBATCH --signal=B:TERM@{req.signal_s}")
    site = ([f"#SBATCH --partition={sbatch_arg(req.partition)}"] if req.partition else []) + \
        ([f"#SBATCH --account={sbatch_arg(req.account)}"] if req.account else []) + \
        [f"#SBATCH {sbatch_option(opt)}" for opt in req.sbatch]
    setup = setup_block(modules=req.modules, env=req.env, setup=req.setup, mpi=req.mpi,
                        mpirun=req.mpirun, srun_mpi=req.srun_mpi, checkout=checkout)
    run_args = [f"--set {shlex.quote(o)}" for o in req.overrides]
    if not req.requeue:
        setup.append("export CONDUIT_REQUEUE=0")
    values = {
        "name": cfg.run.name,
        "config": shlex.quote(config_arg),
        # a comment line: control characters (a line break in an argument) escaped
        "command": _CONTROL.sub(lambda m: repr(m.group())[1:-1],
                                command or f"conduit-hpc slurm {config_arg} --nodes "
                                           f"{req.nodes}"),
        "layout_comment": "\n".join(comment),
        "nodes": str(req.nodes),
        "ntasks_per_node": str(t),
        "tasks": str(t * req.nodes),
        "gpus_per_node": str(gpus),
        "gpu_lines": f"#SBATCH --gpus-per-node={gpus}" if gpus else "",
        "time": req.time,
        # a filename pattern: a % of the folder's own name is written %%
        "output": sbatch_arg(req.output or f"{runs.replace('%', '%%')}/slurm-%x-%j.out"),
        "requeue_lines": "\n".join(requeue),
        "site_lines": "\n".join(site),
        "setup_lines": "\n".join(setup),
        "workdir": shlex.quote(str(workdir)),
        "runs": shlex.quote(runs),
        "launch_script": shlex.quote(str(launch_script(req.launcher, checkout))),
        "run_args": " ".join(run_args),
    }
    # substitute() raises KeyError for a placeholder this renderer does not fill: a bug
    # in the template or here, not a user error
    text = string.Template(_template_text(TEMPLATES[template])).substitute(values)
    # drop the lines that an empty optional placeholder left behind
    lines = [ln.rstrip() for ln in text.splitlines()]
    out: list[str] = []
    for ln in lines:
        if not ln and out and not out[-1]:
            continue
        out.append(ln)
    return "\n".join(out).rstrip() + "\n"


def _template_text(name: str) -> str:
    return resources.files("conduit_hpc.tools").joinpath("templates", name).read_text()


def launch_script(launcher: str, checkout: Path | None = None) -> Path:
    """The path of ``launch_<launcher>.sh`` (``srun`` or ``mpirun``), which a rendered
    sbatch script runs with ``bash``: in ``checkout`` when given, else the installed
    package's. Not collective."""
    if checkout is not None:
        return checkout / "conduit_hpc" / "tools" / "scripts" / f"launch_{launcher}.sh"
    res = resources.files("conduit_hpc.tools").joinpath("scripts", f"launch_{launcher}.sh")
    path = Path(str(res))
    if not path.is_file():  # e.g. a zipped install: an sbatch script needs a real file
        raise ConduitError(f"launch script {res} is not a file on disk; install "
                           f"conduit_hpc unzipped (pip install) to render sbatch scripts")
    return path


def request_from_args(args: argparse.Namespace) -> SlurmRequest:
    """A :class:`SlurmRequest` from the parsed ``conduit-hpc slurm`` arguments."""
    g = vars(args)
    return SlurmRequest(nodes=g["nodes"], ntasks_per_node=g["ntasks_per_node"],
                        gpus_per_node=g["gpus_per_node"], time=g["time"],
                        launcher=g["launcher"], template=g["template"],
                        partition=g["partition"], account=g["account"],
                        modules=tuple(g["module"]), env=g["env"], mpi=g["mpi"],
                        mpirun=g["mpirun"], srun_mpi=g["srun_mpi"], setup=tuple(g["setup"]),
                        sbatch=tuple(g["sbatch"]), signal_s=g["signal_secs"],
                        requeue=not g["no_requeue"], output=g["output"], runs=g["runs"],
                        overrides=tuple(g["set"]))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``conduit-hpc slurm`` options."""
    add = p.add_argument
    add("config", help="job TOML; the job script is the .py beside it")
    add("--nodes", "-N", type=int, default=1, help="nodes (default 1)")
    add("--ntasks-per-node", type=int, default=None,
        help="MPI ranks per node (default: from the job's [layout])")
    add("--gpus-per-node", type=int, default=None,
        help="GPUs per node (default: one per learner on a node in the multi-node "
             "template, 0 for one node)")
    add("--time", "-t", default="01:00:00", help="wall-time limit: M, M:S, H:M:S, D-H, "
        "D-H:M or D-H:M:S (default 01:00:00; longer than --signal-secs)")
    add("--launcher", choices=("srun", "mpirun"), default="srun",
        help="srun --mpi=pmix (default) or mpirun inside the allocation")
    add("--template", choices=("auto", *TEMPLATES), default="auto",
        help="auto: one-node for 1 node without GPUs, else multi-node")
    add("--partition", "-p", default="", help="#SBATCH --partition")
    add("--account", "-A", default="", help="#SBATCH --account")
    add("--module", action="append", default=[], metavar="NAME",
        help="module load NAME (repeatable)")
    add("--env", default="", metavar="venv:PATH|conda:NAME",
        help="activate this Python environment first (a virtualenv, or a conda "
             "environment by name or prefix; conda's profile script is sourced)")
    add("--mpi", choices=MPI_KINDS, default="wheel",
        help="wheel: the pip wheel's Open MPI with the settings of mpi_env.sh (default); "
             "site: the site's MPI from its modules (--module), none of those settings")
    add("--mpirun", default="", metavar="PATH",
        help="with --mpi site and --launcher mpirun: the site's mpirun (default: on PATH)")
    add("--srun-mpi", default="", metavar="PLUGIN",
        help="srun --mpi=PLUGIN (default pmix; srun --mpi=list shows your SLURM's)")
    add("--setup", action="append", default=[], metavar="LINE",
        help="a shell line run before the launch (repeatable)")
    add("--sbatch", action="append", default=[], metavar="OPTION",
        help="an extra #SBATCH option, e.g. --sbatch=--qos=high (repeatable)")
    add("--signal-secs", type=int, default=120,
        help="preemption warning: SIGTERM this many seconds before the end; the job "
             "checkpoints and is requeued (0: no warning; below --time and at most 65535)")
    add("--no-requeue", action="store_true", help="no --requeue, no requeue on warning")
    add("--output", default="", help="#SBATCH --output (default RUNS/slurm-%%x-%%j.out; "
        "its folder is created now, since SLURM opens it before the script runs)")
    add("--runs", default="", help="parent of run directories (default: runs/ in "
        "the current directory, where the script runs)")
    add("--set", action="append", default=[], metavar="KEY=VALUE",
        help="override a config value (passed to conduit-hpc run)")
    add("-o", "--out", default="", help="write the script here (default: stdout): a new "
        "file or a script rendered before; never the job's TOML or script")
    add("--force", action="store_true", help="let -o write over an existing file that is "
        "not a rendered sbatch script (the job's own files stay refused)")


def output_folder(req: SlurmRequest) -> Path | None:
    """The folder of the script's ``#SBATCH --output`` file, which must exist when the
    job starts (slurmd opens it before the script runs, so the script cannot create
    it); ``None`` when it has a ``%`` pattern. Not collective; pure."""
    out = Path(req.output or Path(req.runs or Path.cwd() / "runs") / "x.out")
    return None if "%" in str(out.parent) else out.parent


def write_or_print(text: str, out: str) -> None:
    """Write the script to ``out`` (executable) or print it.

    Raises:
        ConfigError: ``out`` cannot be written (a directory, a parent that cannot be
            made, no permission), naming ``-o``.
    """
    if out:
        p = Path(out)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
            p.chmod(0o755)
        except OSError as err:
            raise ConfigError(f"-o must be a file path that can be written, got {out!r}: "
                              f"{err}", key="-o") from err
    else:
        print(text, end="")
