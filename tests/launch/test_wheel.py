"""The built wheel works without a checkout: its SLURM templates and launch scripts,
its benchmarks and a short job run from an install outside the repository.

The wheel is built from a copy of the sources (``pyproject.toml``, ``README.md``,
``conduit_hpc/``), so nothing stale under the checkout's ``build/`` can leak into it, and
installed with ``pip install --target`` into a temporary folder that becomes the only
``PYTHONPATH`` entry; numpy, torch and mpi4py come from this test's own environment.
Every command runs with its working directory outside the checkout, under a timeout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conduit_hpc.testing import REPO

BENCHMARKS = ("adaptive", "allreduce", "capacity", "checkpoint", "convergence",
              "exposed-latency", "frames", "hosts-placement", "ingest", "longhaul",
              "longhaul-tbf", "peers", "plan", "rllib", "scale", "tiers", "tiers-job",
              "torchrl")


def run(cmd: list[str], *, cwd: Path, timeout: float,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``site``: the wheel installed with ``pip install --target``."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    shutil.copy2(REPO / "pyproject.toml", src)
    shutil.copy2(REPO / "README.md", src)
    shutil.copytree(REPO / "conduit_hpc", src / "conduit_hpc",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = root / "dist"
    # no build isolation: the build backend (setuptools) comes from this environment,
    # which also works without network access
    out = run([sys.executable, "-m", "pip", "wheel", str(src), "-w", str(dist), "--no-deps",
               "--no-build-isolation", "-q"], cwd=root, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    (wheel,) = dist.glob("conduit_hpc-*.whl")
    site = root / "site"
    out = run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
               str(site), str(wheel)], cwd=root, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    return site


@pytest.fixture()
def outside(installed: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A working directory outside the checkout, and an environment whose only
    ``PYTHONPATH`` entry is the install."""
    work = tmp_path / "work"
    work.mkdir()
    assert not work.resolve().is_relative_to(REPO)
    env = {**os.environ, "PYTHONPATH": str(installed)}
    return work, env


def cli(args: list[str], work: Path, env: dict[str, str], *,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-m", "conduit_hpc.tools.cli", *args], cwd=work, env=env,
               timeout=timeout)


def test_the_install_is_what_runs(installed: Path, outside) -> None:
    work, env = outside
    out = run([sys.executable, "-c", "import conduit_hpc; print(conduit_hpc.__file__)"],
              cwd=work, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).resolve().is_relative_to(installed.resolve())
    version = cli(["--version"], work, env, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("conduit-hpc "), version


def test_slurm_renders_from_the_packaged_templates(installed: Path, outside) -> None:
    work, env = outside
    for name in ("synthetic.toml", "synthetic.py"):  # a job file and its script
        shutil.copy2(REPO / "jobs" / name, work)
    script = work / "job.sbatch"
    # a job file outside any checkout: the installed package's launch scripts (a job file
    # inside a checkout gets that checkout's: tests/unit/test_slurm_render.py)
    out = cli(["slurm", str(work / "synthetic.toml"), "--nodes", "2",
               "--set", "layout.actors=0", "--ntasks-per-node", "4", "-o", str(script)],
              work, env)
    assert out.returncode == 0, out.stderr
    text = script.read_text()
    assert "#SBATCH --nodes=2" in text and f"cd {work.resolve()}" in text
    launch_sh = installed.resolve() / "conduit_hpc" / "tools" / "scripts" / "launch_srun.sh"
    assert f"exec bash {launch_sh} " in text
    assert launch_sh.is_file() and (launch_sh.parent / "mpi_env.sh").is_file()
    assert run(["bash", "-n", str(script)], cwd=work, timeout=30).returncode == 0
    one = cli(["slurm", "synthetic.toml", "--launcher", "mpirun"], work, env)
    assert one.returncode == 0, one.stderr
    assert "#SBATCH --nodes=1" in one.stdout and "launch_mpirun.sh synthetic.toml" in one.stdout


def test_bench_help_lists_the_packaged_benchmarks(outside) -> None:
    work, env = outside
    out = cli(["bench", "--help"], work, env, timeout=60)
    assert out.returncode == 0, out.stderr
    listed = {ln.split()[0] for ln in out.stdout.split("benchmarks:")[1].splitlines()
              if ln.startswith("  ")}
    assert listed == set(BENCHMARKS), out.stdout
    unknown = cli(["bench", "nosuch"], work, env, timeout=60)
    assert unknown.returncode == 2 and "available: adaptive" in unknown.stderr


def test_a_short_synthetic_job_runs_from_the_install(outside) -> None:
    work, env = outside
    for name in ("synthetic.toml", "synthetic.py"):
        shutil.copy2(REPO / "jobs" / name, work)
    # 3 ranks (one actor) keep this light on an oversubscribed test machine
    out = cli(["run", "synthetic.toml", "--runs", str(work / "runs"),
               "--set", "synthetic.supersteps=10", "--set", "layout.actors=1",
               "--timeout", "150"], work, env, timeout=200)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "learner 0 (edp): 10 supersteps" in out.stdout, out.stdout[-2000:]
    (run_dir,) = (work / "runs").iterdir()
    assert (run_dir / "config.toml").exists() and (run_dir / "logs" / "rank.2").is_dir()


def test_a_rendered_sbatch_script_runs_through_the_packaged_launch_scripts(
        installed: Path, outside) -> None:
    # what the batch node does, without SLURM: bash runs the script (mpirun launcher);
    # the only conduit-hpc is the install's (its bin/ first on PATH, no VIRTUAL_ENV)
    work, env = outside
    for name in ("synthetic.toml", "synthetic.py"):
        shutil.copy2(REPO / "jobs" / name, work)
    env = {k: v for k, v in env.items() if not k.startswith("SLURM_") and k != "VIRTUAL_ENV"}
    env["PATH"] = f"{installed / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    out = cli(["slurm", "synthetic.toml", "--launcher", "mpirun", "--runs", str(work / "runs"),
               "--set", "synthetic.supersteps=10", "--set", "layout.actors=1",
               "-o", str(work / "job.sbatch")], work, env)
    assert out.returncode == 0, out.stderr
    job = run(["bash", str(work / "job.sbatch")], cwd=installed,
              env={**env, "SLURM_JOB_ID": "4242"}, timeout=200)
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
    assert "launcher mpirun" in job.stdout and "job finished with status 0" in job.stdout
    assert (work / "runs" / "synthetic-4242" / "logs" / "rank.2").is_dir()
