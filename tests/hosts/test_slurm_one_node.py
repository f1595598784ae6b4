"""Rendered sbatch templates on a real one-node SLURM (Debian slurmctld/slurmd/munge).

The fixture starts the daemons with ``scripts/slurm/setup_slurm.sh`` (state under a
temporary directory, free ports), and stops them by PID at the end. Everything skips,
with the reason, where SLURM is not installed (``.ci/install_slurm.sh`` installs it) or
does not start. Every wait polls ``squeue`` under a deadline.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conduit_hpc.testing import REPO

DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scontrol", "srun")


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        pytest.skip(f"SLURM is not installed (missing {', '.join(missing)}); "
                    f"run .ci/install_slurm.sh as root")
    if os.geteuid() != 0:
        pytest.skip("the test SLURM runs its daemons as root; not root here")
    if not Path("/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so").exists():
        pytest.skip("libpmix.so link missing (srun --mpi=pmix cannot load PMIx); "
                    "run .ci/install_slurm.sh")
    base = tmp_path_factory.mktemp("slurm")
    ctld, slurmd = free_ports(2)
    env = {**os.environ, "BASE": str(base), "SLURMCTLD_PORT": str(ctld),
           "SLURMD_PORT": str(slurmd)}
    try:
        up = subprocess.run([str(REPO / "scripts/slurm/setup_slurm.sh")], env=env,
                            capture_output=True, text=True, timeout=90, check=False)
        if up.returncode != 0:
            pytest.skip(f"SLURM did not start (setup_slurm.sh exit {up.returncode}): "
                        f"{(up.stderr or up.stdout).strip()[-500:]}")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(base / "etc" / "slurm.conf")
        yield env
    finally:
        subprocess.run([str(REPO / "scripts/slurm/stop_slurm.sh")], env={**os.environ,
                       "BASE": str(base)}, capture_output=True, timeout=60, check=False)


def sh(env: dict[str, str], *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def render(tmp_path: Path, *args: str) -> Path:
    script = tmp_path / "job.sbatch"
    out = subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", "slurm",
                          "jobs/synthetic.toml", "--time", "5",
                          "--output", str(tmp_path / "%x-%j.out"),
                          "--runs", str(tmp_path / "runs"), "-o", str(script), *args],
                         cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return script


def job_state(env: dict[str, str], jid: str) -> dict[str, str]:
    text = sh(env, "scontrol", "show", "job", jid).stdout
    return dict(re.findall(r"(\w+)=(\S+)", text))


def ctld_log_tail(env: dict[str, str], lines: int = 30) -> str:
    log = Path(env["SLURM_CONF"]).parents[1] / "log" / "slurmctld.log"
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) \
        if log.exists() else f"(no {log})"


def wait_gone(env: dict[str, str], jid: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        q = sh(env, "squeue", "-h", "-j", jid)
        if q.returncode == 0 and not q.stdout.strip():
            return
        time.sleep(0.3)
    sh(env, "scancel", jid)
    pytest.fail(f"job {jid} still queued or running after {timeout_s} s: "
                f"{job_state(env, jid).get('JobState')}")


def wait_for_text(path: Path, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.2)
    pytest.fail(f"{text!r} did not appear in {path} within {timeout_s} s: "
                f"{path.read_text(errors='replace')[-2000:] if path.exists() else '(none)'}")


def submit(env: dict[str, str], script: Path) -> str:
    out = sh(env, "sbatch", "--parsable", str(script))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def run_to_completion(env: dict[str, str], script: Path, tmp_path: Path) -> tuple[str, str]:
    """Submit ``script``, wait (bounded) until SLURM forgets the job, assert it completed
    with exit code 0; returns its id and its output file's text."""
    jid = submit(env, script)
    wait_gone(env, jid, 120)
    state = job_state(env, jid)
    output = (tmp_path / f"synthetic-{jid}.out").read_text()
    assert state.get("JobState") == "COMPLETED" and state.get("ExitCode") == "0:0", output
    return jid, output


def test_one_node_template_runs_the_job_through_srun_pmix(slurm, tmp_path) -> None:
    script = render(tmp_path, "--nodes", "1", "--set", "run.duration_s=1.0")
    assert sh(slurm, "bash", "-n", str(script)).returncode == 0
    jid, output = run_to_completion(slurm, script, tmp_path)
    assert "attempt 1" in output and "launcher srun" in output
    assert "ingested" in output and "job finished with status 0" in output
    run_dir = tmp_path / "runs" / f"synthetic-{jid}"
    assert "srun --mpi=pmix -n 6" in (run_dir / "command.txt").read_text()
    # per-rank logs, one folder per rank
    assert sorted(p.name for p in (run_dir / "logs").glob("rank.*")) == \
        [f"rank.{r}" for r in range(6)]


def test_preemption_warning_checkpoints_requeues_and_resumes(slurm, tmp_path) -> None:
    script = render(tmp_path, "--nodes", "1", "--set", "run.duration_s=4.0")
    jid = submit(slurm, script)
    output = tmp_path / f"synthetic-{jid}.out"
    wait_for_text(output, "running: checkpoints under", 90)  # ranks up, SIGUSR1 handled
    # what --signal=B:TERM@secs does before the time limit: TERM to the batch shell
    sig = sh(slurm, "scancel", "--batch", "--signal=TERM", jid)
    assert sig.returncode == 0, sig.stderr
    wait_for_text(output, "requeueing job", 60)
    # SLURM holds a requeued job back for the credential lifetime (Reason=BeginTime;
    # setup_slurm.sh sets cred_expire=20 s). Forcing it earlier (StartTime=now) races the
    # revoked credential of attempt 1 and fails the job, so the test only waits.
    deadline = time.monotonic() + 180
    while "resumed from" not in output.read_text(errors="replace"):
        state = job_state(slurm, jid)
        assert time.monotonic() < deadline, (state, output.read_text(errors="replace"),
                                             ctld_log_tail(slurm))
        assert state.get("JobState") not in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                                             "BOOT_FAIL"), (state, ctld_log_tail(slurm))
        time.sleep(0.5)
    wait_gone(slurm, jid, 90)
    state = job_state(slurm, jid)
    text = output.read_text()
    assert state.get("JobState") == "COMPLETED" and state.get("Restarts") == "1", text
    first, _, second = text.partition("attempt 2")
    assert "preemption warning" in first and "stopped early: stop requested" in first
    assert "requeueing job" in first
    assert "resuming" in second and "resumed from" in second
    assert "stopped early" not in second and "job finished with status 0" in second
    run_dir = tmp_path / "runs" / f"synthetic-{jid}"
    assert (run_dir / "logs.1").is_dir() and (run_dir / "logs").is_dir()


def test_multi_node_template_runs_the_job_through_mpirun(slurm, tmp_path) -> None:
    script = render(tmp_path, "--nodes", "1", "--template", "multi-node",
                    "--gpus-per-node", "0", "--launcher", "mpirun",
                    "--set", "run.duration_s=1.0")
    text = script.read_text()
    assert "#SBATCH --gpus-per-node" not in text and "launch_mpirun.sh" in text
    jid = submit(slurm, script)
    wait_gone(slurm, jid, 120)
    state = job_state(slurm, jid)
    output = (tmp_path / f"synthetic-{jid}.out").read_text()
    assert state.get("JobState") == "COMPLETED", output
    assert "launcher mpirun" in output and "ingested" in output
    assert (tmp_path / "runs" / f"synthetic-{jid}" / "command.txt").read_text().startswith(
        "mpirun -n 6")


def test_a_runs_folder_with_a_space_and_a_hash_gets_the_log_and_the_run(slurm,
                                                                        tmp_path) -> None:
    """The default ``#SBATCH --output`` lies under ``--runs``; sbatch reads that line
    without a shell, so a folder named ``my runs #1`` sent the log to ``.../my`` (its
    whitespace split the argument). Now the log and the run directory both land there."""
    runs = tmp_path / "my runs #1"
    script = tmp_path / "job.sbatch"
    out = subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", "slurm",
                          "jobs/synthetic.toml", "--time", "5", "--runs", str(runs),
                          "--set", "run.duration_s=1.0", "-o", str(script)],
                         cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    jid = submit(slurm, script)
    wait_gone(slurm, jid, 120)
    state = job_state(slurm, jid)
    log = runs / f"slurm-synthetic-{jid}.out"
    assert log.is_file(), (f"no {log}; {sorted(p.name for p in tmp_path.rglob('*'))}; "
                           f"StdOut={state.get('StdOut')}")
    assert state.get("JobState") == "COMPLETED", log.read_text()
    assert "ingested" in log.read_text()
    assert (runs / f"synthetic-{jid}" / "command.txt").is_file()


def test_rank_failure_under_srun_is_one_message_and_nonzero(slurm, tmp_path) -> None:
    out = sh(slurm, "salloc", "-Q", "-n", "4", sys.executable, "-m", "conduit_hpc.tools.cli",
             "run", str(REPO / "tests/launch/jobs/fail_one_rank.toml"), "--runs",
             str(tmp_path), timeout=120)
    assert out.returncode != 0
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("conduit-hpc: error")]
    assert len(errors) == 1, out.stderr
    assert "RuntimeError: deliberate failure on world rank 2" in errors[0]
    assert "srun --mpi=pmix" in next(tmp_path.iterdir()).joinpath("command.txt").read_text()


SITE_MPIRUN = """#!/bin/bash
# a site's mpirun, outside any virtualenv: its own settings (as its module or its
# openmpi-mca-params.conf would give them), then the MPI library
env | sort > "$(dirname "$0")/env-at-mpirun.txt"
echo "site mpirun: $*" >> "$(dirname "$0")/calls.txt"
export OPAL_PREFIX={prefix} OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec {prefix}/bin/mpirun --bind-to none --oversubscribe --mca btl ^ofi --mca osc ^ucx \\
    --mca mpi_yield_when_idle 1 "$@"
"""


def test_site_mpi_script_runs_with_the_users_mpirun_and_no_wheel_environment(
        slurm, tmp_path) -> None:
    if not Path(sys.prefix, "bin", "mpirun").is_file():
        pytest.skip(f"no Open MPI mpirun in {sys.prefix} to stand for a site's MPI")
    site = tmp_path / "site" / "bin"
    site.mkdir(parents=True)
    mpirun = site / "mpirun"
    mpirun.write_text(SITE_MPIRUN.format(prefix=sys.prefix))
    mpirun.chmod(0o755)
    script = render(tmp_path, "--nodes", "1", "--mpi", "site", "--launcher", "mpirun",
                    "--mpirun", str(mpirun), "--env", f"venv:{sys.prefix}",
                    "--set", "run.duration_s=1.0", "--set", "layout.actors=1")
    text = script.read_text()
    assert sh(slurm, "bash", "-n", str(script)).returncode == 0
    assert "OMPI_MCA" not in text and "PRTE_MCA" not in text and "mpi_env.sh" not in text
    # submit from an environment without the wheel's settings or the venv on PATH
    venv_bin = str(Path(sys.prefix, "bin"))
    env = {k: v for k, v in slurm.items()
           if not k.startswith(("OMPI_", "PRTE_", "OPAL_", "PMIX_"))
           and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != venv_bin)
    jid, output = run_to_completion(env, script, tmp_path)
    assert "launcher mpirun, MPI site" in output and "ingested" in output
    run_dir = tmp_path / "runs" / f"synthetic-{jid}"
    assert (run_dir / "command.txt").read_text().startswith(f"{mpirun} -n 3 ")
    assert (site / "calls.txt").read_text().startswith("site mpirun: -n 3 ")
    seen = dict(ln.split("=", 1) for ln in (site / "env-at-mpirun.txt").read_text()
                .splitlines() if "=" in ln)
    wheel = sorted(k for k in seen if k.startswith(("OMPI_MCA_", "PRTE_MCA_", "OPAL_")))
    assert wheel == [], f"the wheel's settings reached the site's mpirun: {wheel}"
    assert seen.get("CONDUIT_MPI") == "site" and seen.get("VIRTUAL_ENV") == sys.prefix
