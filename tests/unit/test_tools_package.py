"""The login-node tools as package data: the one MPI environment script, the CLI's
command table and help, and the benchmark registry (no subprocess but ``bash``)."""

from __future__ import annotations

import ast
import re
import subprocess
from importlib import resources

import pytest

from conduit_hpc import __version__
from conduit_hpc.testing import REPO
from conduit_hpc.tools import cli
from conduit_hpc.tools.launcher import _script_defaults, mpi_env

SCRIPT = resources.files("conduit_hpc.tools").joinpath("scripts", "mpi_env.sh")


def test_every_default_of_the_mpi_env_script_reaches_python() -> None:
    # a line in another form would be set by the shell but not by `conduit-hpc run`
    names = set(re.findall(r"^\s*export (\w+)", SCRIPT.read_text(), flags=re.M))
    shell_only = {"VIRTUAL_ENV", "PATH", "OPAL_PREFIX"}  # derived from where things are
    parsed = {name for name, _, _ in _script_defaults()}
    assert names - shell_only == parsed
    assert {"OMPI_MCA_mpi_yield_when_idle", "OPENBLAS_NUM_THREADS",
            "PRTE_MCA_rmaps_default_mapping_policy"} <= parsed
    root_only = {name for name, _, root in _script_defaults() if root}
    assert root_only == {"OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"}


def test_python_and_the_sourced_script_give_the_same_environment() -> None:
    base = {"PATH": "/usr/bin:/bin", "OMPI_MCA_btl": "self,tcp"}  # a value already set wins
    out = subprocess.run(["bash", "-c", f"source {REPO / 'scripts' / 'mpi_env.sh'} && env"],
                         env=base, capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    shell = dict(ln.split("=", 1) for ln in out.stdout.splitlines() if "=" in ln)
    py = mpi_env(base)
    for name, _, _ in _script_defaults():
        assert shell.get(name) == py.get(name), name
    assert py["OMPI_MCA_btl"] == shell["OMPI_MCA_btl"] == "self,tcp"


def test_commands_are_registered_explicitly_with_their_functions() -> None:
    assert set(cli.COMMANDS) == {"run", "info", "plan", "probe", "bench", "inspect", "slurm",
                                 "report"}
    for name, c in cli.COMMANDS.items():
        assert c.name == name and callable(c.run) and callable(c.add_arguments)
    assert "globals()" not in (REPO / "conduit_hpc" / "tools" / "cli.py").read_text()


def test_help_is_plain_text_and_version_is_the_package_version(capsys) -> None:
    parser = cli.build_parser()
    text = parser.format_help()
    assert "``" not in text and ":class:" not in text and ":func:" not in text
    for name in cli.COMMANDS:
        assert name in text
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"conduit-hpc {__version__}"


def test_plan_method_has_help(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["plan", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--method {auto,symmetric,flat} LP the static planner solves" in out


def test_bench_help_lists_every_benchmark_module_with_its_first_docstring_line(capsys) -> None:
    pkg = REPO / "conduit_hpc" / "bench"
    modules = sorted(p.stem for p in pkg.glob("*.py")
                     if p.stem not in ("__init__", "common") and not p.stem.startswith("_"))
    names = cli.benchmarks()
    assert sorted(n.replace("-", "_") for n in names) == modules
    for stem in modules:
        tree = ast.parse((pkg / f"{stem}.py").read_text())
        first = (ast.get_docstring(tree) or "").splitlines()[0]
        assert first, f"{stem}.py has no docstring"
        assert names[stem.replace("_", "-")] == first.replace("``", "").replace("*", "")
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), stem
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    out = capsys.readouterr().out
    assert "``" not in out
    for name, line in names.items():
        assert re.search(rf"^  {re.escape(name)} +{re.escape(line)}$", out, flags=re.M), name


def test_an_unknown_benchmark_names_the_available_ones(capsys) -> None:
    assert cli.main(["bench", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "no benchmark 'nosuch'; available: adaptive, allreduce, capacity, checkpoint" in err
