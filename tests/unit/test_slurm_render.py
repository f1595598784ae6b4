"""`conduit-hpc slurm` renders scripts bash accepts, with values from the job's [layout],
and refuses layouts that cannot fit (the SLURM run itself: tests/hosts/test_slurm_one_node.py)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from conduit_hpc.config import LayoutConfig
from conduit_hpc.errors import ConfigError
from conduit_hpc.testing import REPO
from conduit_hpc.tools.slurm import SlurmRequest, plan_tasks, render_sbatch

JOB = REPO / "jobs" / "synthetic.toml"


def sbatch_options(text: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)=?(\S*)", text, flags=re.M))


def bash_ok(text: str, tmp_path: Path) -> None:
    f = tmp_path / "job.sbatch"
    f.write_text(text)
    out = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True, timeout=30,
                         check=False)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    ("sets", "req", "tasks_per_node", "gpus", "roles"),
    [
        ((), SlurmRequest(nodes=1), 6, 0, "rank 0 learner, rank 1 buffer, ranks 2-5 actors"),
        (("layout.actors=0",), SlurmRequest(nodes=2, ntasks_per_node=4), 4, 1,
         "ranks 2-7 actors"),
        (("layout.per_node=true", "layout.actors=0"),
         SlurmRequest(nodes=4, ntasks_per_node=8, launcher="mpirun"), 8, 1,
         "per node: rank 0 learner, rank 1 buffer, ranks 2-7 actors"),
        (("layout.per_node=true", "layout.learners=2", "layout.buffers=2", "layout.actors=4"),
         SlurmRequest(nodes=16, gpus_per_node=4, partition="gpu", account="rl",
                      modules=("cuda/12.4",), sbatch=("--qos=high",)), 8, 4,
         "per node: ranks 0-1 learners, ranks 2-3 buffers, ranks 4-7 actors"),
        (("layout.learners=3", "layout.actors=10"), SlurmRequest(nodes=2), 7, 3,
         "ranks 0-2 learners"),
    ],
)
def test_renders_valid_scripts_for_several_layouts(tmp_path, sets, req, tasks_per_node, gpus,
                                                   roles) -> None:
    req = SlurmRequest(**{**{f: getattr(req, f) for f in req.__dataclass_fields__},
                          "overrides": sets})
    text = render_sbatch(JOB, req)
    bash_ok(text, tmp_path)
    opts = sbatch_options(text)
    assert opts["nodes"] == str(req.nodes)
    assert opts["ntasks-per-node"] == str(tasks_per_node)
    assert opts.get("gpus-per-node", "0") == str(gpus)
    assert "requeue" in opts and opts["signal"] == "B:TERM@120"
    assert roles in text
    assert f"tools/scripts/launch_{req.launcher}.sh " in text
    assert f"-n {tasks_per_node * req.nodes} " in text
    if req.partition:
        assert opts["partition"] == "gpu" and opts["account"] == "rl" and opts["qos"] == "high"
        assert "module load cuda/12.4" in text
    for s in sets:
        assert f"--set {s}" in text
    assert "{{" not in text


def test_no_requeue_and_no_signal(tmp_path) -> None:
    text = render_sbatch(JOB, SlurmRequest(requeue=False, signal_s=0))
    bash_ok(text, tmp_path)
    opts = sbatch_options(text)
    assert "requeue" not in opts and "signal" not in opts
    assert "export CONDUIT_REQUEUE=0" in text


@pytest.mark.parametrize(
    ("layout", "req", "fragments"),
    [
        (LayoutConfig(learners=1, buffers=1, per_node=True), SlurmRequest(ntasks_per_node=2),
         ["--ntasks-per-node must be >= 3", "more roles than tasks", "got 2"]),
        (LayoutConfig(learners=1, buffers=1, actors=4, per_node=True),
         SlurmRequest(ntasks_per_node=8), ["--ntasks-per-node must be 6", "got 8"]),
        (LayoutConfig(learners=1, buffers=1, actors=4), SlurmRequest(nodes=4),
         ["--nodes 4 cannot hold", "exactly 6 ranks", "layout.actors = 0"]),
        (LayoutConfig(learners=2, buffers=2, actors=0), SlurmRequest(nodes=2, ntasks_per_node=2),
         ["2 x --ntasks-per-node 2 = 4 tasks", "needs 5", "more roles than tasks"]),
        (LayoutConfig(learners=1, buffers=1, actors=4), SlurmRequest(nodes=2, ntasks_per_node=4),
         ["= 8 tasks", "uses exactly 6"]),
        (LayoutConfig(learners=2, buffers=1, per_node=True),
         SlurmRequest(nodes=2, gpus_per_node=1), ["--gpus-per-node must be >= 2", "got 1"]),
        (LayoutConfig(learners=1, buffers=1, emulate_nodes=7), SlurmRequest(nodes=2),
         ["layout.emulate_nodes = 7", "the world has 4 ranks", "1 to 4"]),
        (LayoutConfig(learners=1, buffers=1, per_node=True, emulate_nodes=9),
         SlurmRequest(nodes=2), ["layout.emulate_nodes = 9", "the world has 6 ranks"]),
    ],
)
def test_refuses_impossible_layouts(layout, req, fragments) -> None:
    with pytest.raises(ConfigError) as info:
        plan_tasks(layout, req)
    for f in fragments:
        assert f in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [({"nodes": 0}, "--nodes must be >= 1, got 0"),
     ({"time": "soon"}, "--time must be a SLURM time"),
     ({"launcher": "mpiexec"}, "--launcher must be srun or mpirun, got 'mpiexec'"),
     ({"sbatch": ("qos=high",)}, "--sbatch must be a long sbatch option")],
)
def test_bad_requests_name_the_option(kwargs, fragment) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        SlurmRequest(**kwargs)


def test_one_node_template_refuses_several_nodes() -> None:
    with pytest.raises(ConfigError, match="one-node is for 1 node"):
        render_sbatch(JOB, SlurmRequest(nodes=2, template="one-node",
                                        overrides=("layout.actors=0",)))


# --mpi wheel|site, --env venv|conda, the job's checkout, runs/ and idle GPUs

WHEEL_SETTINGS = ("OMPI_MCA", "PRTE_MCA", "oversubscribe", "yield_when_idle", "OPAL_PREFIX",
                  "mpi_env.sh")


def test_site_mpi_script_has_none_of_the_wheel_settings(tmp_path) -> None:
    req = SlurmRequest(nodes=2, mpi="site", mpirun="/opt/site/openmpi/bin/mpirun",
                       launcher="mpirun", modules=("openmpi/5.0", "ucx"),
                       overrides=("layout.per_node=true", "layout.actors=0"),
                       ntasks_per_node=4)
    text = render_sbatch(JOB, req)
    bash_ok(text, tmp_path)
    assert "export CONDUIT_MPI=site" in text
    assert "export CONDUIT_MPIRUN=/opt/site/openmpi/bin/mpirun" in text
    assert "module load openmpi/5.0\nmodule load ucx" in text
    for s in WHEEL_SETTINGS:
        assert s not in text, s
    # the modules come before anything that needs them
    assert text.index("module load") < text.index("CONDUIT_MPI=") < text.index("exec bash")
    srun = render_sbatch(JOB, SlurmRequest(mpi="site", srun_mpi="pmi2"))
    assert "export CONDUIT_SRUN_MPI=pmi2" in srun and "CONDUIT_MPIRUN" not in srun
    wheel = render_sbatch(JOB, SlurmRequest())
    assert "export CONDUIT_MPI=wheel" in wheel and "CONDUIT_SRUN_MPI" not in wheel


def test_the_launch_script_skips_the_wheel_environment_only_for_site_mpi() -> None:
    text = (REPO / "conduit_hpc/tools/scripts/launch.sh").read_text()
    assert re.search(r'case "\$\{CONDUIT_MPI:-wheel\}" in\s+wheel\)[^;]*source "\$here/mpi_env'
                     r'\.sh";;\s+site\) ;;', text), "launch.sh: mpi_env.sh for wheel only"
    from conduit_hpc.tools.launcher import mpi_env, site_mpi

    base = {"PATH": "/usr/bin:/bin", "CONDUIT_MPI": "site"}
    assert mpi_env(base) == base  # nothing added: no OMPI_MCA_*, no venv on PATH
    assert "OMPI_MCA_pml" in mpi_env({"PATH": "/usr/bin"})
    with pytest.raises(ConfigError, match="CONDUIT_MPI must be wheel or site, got 'sitee'"):
        site_mpi({"CONDUIT_MPI": "sitee"})


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [({"mpi": "system"}, "--mpi must be wheel or site, got 'system'"),
     ({"env": "conda"}, "--env must be venv:PATH or conda:NAME"),
     ({"env": "pyenv:/x"}, "got 'pyenv:/x'")],
)
def test_bad_mpi_or_env_requests_name_the_option(kwargs, fragment) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        SlurmRequest(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [({"mpirun": "/opt/mpirun"}, "--mpirun must be only with --mpi site"),
     ({"mpi": "site", "mpirun": "bin/mpirun"}, "an absolute path or a command name"),
     ({"mpi": "site", "srun_mpi": "pmix; rm"}, "--srun-mpi must be an srun --mpi plugin")],
)
def test_bad_mpirun_or_plugin_is_refused(kwargs, fragment) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        render_sbatch(JOB, SlurmRequest(**kwargs))


def run_lines(lines: str, env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    f = tmp_path / "activate.sh"
    f.write_text(lines + '\necho "reached VIRTUAL_ENV=$VIRTUAL_ENV"\n')
    return subprocess.run(["bash", str(f)], env=env, capture_output=True, text=True,
                          timeout=30, check=False)


def block(text: str) -> str:
    return text.split("# ---- site setup")[1].split("\ncd ")[0].split("\n", 1)[1]


def test_venv_activation_runs_and_a_missing_venv_is_one_clear_line(tmp_path) -> None:
    import sys

    venv = Path(sys.prefix)
    if not (venv / "bin" / "activate").is_file():
        pytest.skip(f"{venv} is not a virtualenv with bin/activate")
    env = {"PATH": "/usr/bin:/bin"}
    ok = run_lines(block(render_sbatch(JOB, SlurmRequest(env=f"venv:{venv}"))), env, tmp_path)
    assert ok.returncode == 0 and f"reached VIRTUAL_ENV={venv}" in ok.stdout, ok.stderr
    bad = run_lines(block(render_sbatch(JOB, SlurmRequest(env="venv:/no/such/venv"))), env,
                    tmp_path)
    assert bad.returncode == 2 and "reached" not in bad.stdout
    assert "--env venv:/no/such/venv: no bin/activate there" in bad.stderr


def test_conda_activation_sources_the_profile_script_and_fails_clearly_without_conda(
        tmp_path) -> None:
    text = render_sbatch(JOB, SlurmRequest(env="conda:rl"))
    bash_ok(text, tmp_path)
    lines = block(text)
    no_conda = run_lines(lines, {"PATH": "/usr/bin:/bin"}, tmp_path)
    assert no_conda.returncode == 2 and "reached" not in no_conda.stdout
    assert "--env conda:rl: conda is not on PATH on this node" in no_conda.stderr
    # a conda install laid out as conda's is: bin/conda answers `info --base`;
    # etc/profile.d/conda.sh defines the shell function that `conda activate` needs
    base = tmp_path / "miniconda"
    (base / "bin").mkdir(parents=True)
    (base / "etc" / "profile.d").mkdir(parents=True)
    (base / "envs" / "rl").mkdir(parents=True)
    (base / "bin" / "conda").write_text(f'#!/bin/bash\n[ "$1 $2" = "info --base" ] && '
                                        f'echo {base}\n')
    (base / "bin" / "conda").chmod(0o755)
    (base / "etc" / "profile.d" / "conda.sh").write_text(
        f'conda() {{ [ "$1" = activate ] && [ -d {base}/envs/$2 ] && '
        f'export CONDA_PREFIX={base}/envs/$2; }}\n')
    env = {"PATH": f"{base / 'bin'}:/usr/bin:/bin"}
    ok = run_lines(lines, env, tmp_path)
    assert ok.returncode == 0 and f"reached VIRTUAL_ENV={base}/envs/rl" in ok.stdout, ok.stderr
    missing = run_lines(block(render_sbatch(JOB, SlurmRequest(env="conda:nosuch"))), env,
                        tmp_path)
    assert missing.returncode == 2 and "conda activate nosuch failed" in missing.stderr


def test_paths_come_from_the_job_files_checkout(tmp_path) -> None:
    text = render_sbatch(JOB, SlurmRequest())
    assert f"exec bash {REPO}/conduit_hpc/tools/scripts/launch_srun.sh " in text
    assert f"export PYTHONPATH={REPO}${{PYTHONPATH:+:$PYTHONPATH}}" in text
    for name in ("synthetic.toml", "synthetic.py"):  # a job outside any checkout
        (tmp_path / name).write_text((REPO / "jobs" / name).read_text())
    outside = render_sbatch(tmp_path / "synthetic.toml", SlurmRequest())
    assert "PYTHONPATH" not in outside


def test_the_script_creates_its_runs_folder_before_the_launch(tmp_path) -> None:
    from conduit_hpc.tools.slurm import output_folder

    runs = tmp_path / "my runs"
    text = render_sbatch(JOB, SlurmRequest(runs=str(runs)))
    assert f"mkdir -p '{runs}'\n" in text and text.index("mkdir -p") < text.index("exec bash")
    # quoted: sbatch splits an #SBATCH line at whitespace (it wrote the log to .../my)
    assert f'#SBATCH --output="{runs}/slurm-%x-%j.out"' in text
    assert output_folder(SlurmRequest(runs=str(runs))) == runs
    assert output_folder(SlurmRequest(output="logs/%u/x.out")) is None


@pytest.mark.parametrize(
    ("layout", "nodes", "tasks", "gpus", "fragment"),
    [(LayoutConfig(learners=1, buffers=1, actors=30), 4, 8, 4,
      "15 of 16 GPUs would idle: --gpus-per-node 4 on 4 node(s), but 3 of 4 nodes hold no "
      "learner"),
     (LayoutConfig(learners=1, buffers=1, actors=0, per_node=True), 4, 8, 2,
      "4 of 8 GPUs would idle"),
     (LayoutConfig(learners=1, buffers=1, actors=0, per_node=True), 4, 8, 1, ""),
     (LayoutConfig(learners=10, buffers=1, actors=5), 2, 8, 8, "6 of 16 GPUs would idle"),
     (LayoutConfig(learners=1, buffers=1, actors=4), 1, 6, 0, "")],
)
def test_idle_gpus_are_named(layout, nodes, tasks, gpus, fragment) -> None:
    from conduit_hpc.tools.slurm import idle_gpus

    got = idle_gpus(layout, nodes, tasks, gpus)
    assert (fragment in got) if fragment else got == ""


def test_idle_gpus_warn_and_are_written_into_the_script() -> None:
    warnings: list[str] = []
    text = render_sbatch(JOB, SlurmRequest(nodes=4, ntasks_per_node=8, gpus_per_node=4,
                                           overrides=("layout.actors=0",)), warnings=warnings)
    assert len(warnings) == 1
    assert warnings[0].startswith("15 of 16 GPUs would idle")
    assert f"# WARNING: {warnings[0]}" in text
    quiet: list[str] = []
    render_sbatch(JOB, SlurmRequest(nodes=4, ntasks_per_node=8, overrides=(
        "layout.per_node=true", "layout.actors=0")), warnings=quiet)
    assert quiet == []


def sbatch_line_arguments(line: str) -> list[str]:
    """The arguments sbatch reads from one ``#SBATCH`` line: a port of ``_get_argument``
    in SLURM's ``src/sbatch/opt.c`` (whitespace ends an argument outside double quotes,
    which group and are dropped; a backslash escapes the next character; an unescaped
    ``#`` ends the line, inside quotes too)."""
    args, i, rest = [], 0, line[len("#SBATCH"):]
    while True:
        while i < len(rest) and rest[i].isspace():
            i += 1
        if i >= len(rest):
            return args
        arg, quoted, escape = "", False, False
        while i < len(rest) and (quoted or not rest[i].isspace()) and rest[i] != "\n":
            c = rest[i]
            i += 1
            if escape:
                escape, arg = False, arg + c
            elif c == "\\":
                escape = True
            elif c == '"':
                quoted = not quoted
            elif c == "#":
                return [*args, arg] if arg else args
            else:
                arg += c
        if arg:
            args.append(arg)


@pytest.mark.parametrize("name", ["my runs", "runs #1", 'say "hi"', "back\\slash", "tab\tx",
                                  "100% done", "plain"])
def test_sbatch_lines_carry_paths_and_options_whole(tmp_path, name: str) -> None:
    """Every value on an ``#SBATCH`` line reaches sbatch as written: the output path and
    the runs folder of a working directory with a space, a '#', a quote, a backslash or a
    '%' in its name, and --sbatch option values (before, sbatch took ``--output=/a`` from
    ``--output=/a b/x.out``, and a '#' cut the rest of the line off as a comment)."""
    runs = str(tmp_path / name / "runs")
    text = render_sbatch(JOB, SlurmRequest(runs=runs, sbatch=(f"--comment={name}",
                                                              "--exclusive"),
                                           partition="debug", account="p#1"))
    lines = {a[0].split("=", 1)[0]: a for a in (sbatch_line_arguments(ln) for ln in
                                                 text.splitlines() if ln.startswith("#SBATCH"))}
    # the default log is a filename pattern: a % of the folder's name is written %%
    assert lines["--output"] == [f"--output={runs.replace('%', '%%')}/slurm-%x-%j.out"]
    assert lines["--comment"] == [f"--comment={name}"]
    assert lines["--exclusive"] == ["--exclusive"]
    assert lines["--account"] == ["--account=p#1"] and lines["--partition"] == ["--partition=debug"]
    own = tmp_path / name / "x %j.out"
    text = render_sbatch(JOB, SlurmRequest(output=str(own)))  # given: taken as a pattern
    assert [sbatch_line_arguments(ln) for ln in text.splitlines()
            if ln.startswith("#SBATCH --output")] == [[f"--output={own}"]]
    bash_ok(text, tmp_path)


@pytest.mark.parametrize("opt", ["--qos high", "--", "---x", "--=x", "-q"])
def test_sbatch_options_that_are_no_long_option_are_refused(opt: str) -> None:
    with pytest.raises(ConfigError, match=r"--sbatch must be a long sbatch option"):
        SlurmRequest(sbatch=(opt,))


def test_an_account_with_a_space_is_not_told_about_partitions() -> None:
    with pytest.raises(ConfigError) as info:
        SlurmRequest(account="a b")
    assert "partitions" not in str(info.value) and "--account" in str(info.value)
