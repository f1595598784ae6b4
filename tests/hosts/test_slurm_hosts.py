"""Multi-node SLURM on the test cluster: one ``slurmd`` per host under one ``slurmctld``.

``scripts/hosts/slurm.sh`` starts munged and slurmctld on host0 and a slurmd on every host
of the session's cluster (state under a temporary folder); ``sbatch``/``squeue`` run on
host0, as on a login node. The scripts are rendered by ``conduit-hpc slurm -N 2`` / ``-N 3``
and run the synthetic job with the static planner, so the start-up probe measures the
link between the hosts and ``plan.json`` names the nodes the ranks found.

Without SLURM (``.ci/install_slurm.sh`` installs it) these tests skip with the reason -
and fail under CI, where the hosts tier must run them. Every wait has a deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hosts_cluster import Cluster, in_ci

from conduit_hpc.testing import REPO

SLURM = REPO / "scripts" / "hosts" / "slurm.sh"
DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scontrol", "srun")
PMIX = Path("/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so")


def _skip_or_fail(msg: str) -> None:
    if in_ci():
        pytest.fail(f"{msg} - under CI the hosts tier must run its SLURM test", pytrace=False)
    pytest.skip(msg)


class HostsSlurm:
    """The SLURM of the session's cluster: commands run on host0 with its SLURM_CONF."""

    def __init__(self, cluster: Cluster, base: Path) -> None:
        self.base = base
        # a job inherits the submitter's environment: none of an outer allocation's
        self.env = {k: v for k, v in cluster.env.items() if not k.startswith("SLURM_")}

    def sh(self, *cmd: str, env: dict[str, str] | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(SLURM), "exec", str(self.base), *cmd],
                              env=env or self.env, cwd=REPO, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def run_script(self, script: Path, timeout_s: float,
                   env: dict[str, str] | None = None) -> tuple[str, dict[str, str]]:
        """Submit ``script``, wait until it leaves the queue; its id and final state."""
        out = self.sh("sbatch", "--parsable", str(script), env=env)
        assert out.returncode == 0, out.stderr
        jid = out.stdout.strip().split(";")[0]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            q = self.sh("squeue", "-h", "-j", jid)
            if q.returncode == 0 and not q.stdout.strip():
                break
            time.sleep(0.5)
        else:
            self.sh("scancel", jid)
            pytest.fail(f"job {jid} still queued or running after {timeout_s} s: "
                        f"{self.state(jid)}")
        return jid, self.state(jid)

    def state(self, jid: str) -> dict[str, str]:
        text = self.sh("scontrol", "show", "job", jid).stdout
        return dict(kv.split("=", 1) for kv in text.split() if "=" in kv)


@pytest.fixture(scope="module")
def slurm(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostsSlurm]:
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        _skip_or_fail(f"SLURM is not installed (missing {', '.join(missing)}); run "
                      f".ci/install_slurm.sh as root")
    if not PMIX.exists():
        _skip_or_fail(f"{PMIX} missing (srun --mpi=pmix cannot load PMIx); run "
                      f".ci/install_slurm.sh")
    base = tmp_path_factory.mktemp("slurm-hosts")
    try:
        up = subprocess.run([str(SLURM), "up", str(base)], env=cluster.env, cwd=REPO,
                            capture_output=True, text=True, timeout=120, check=False)
        if up.returncode != 0:
            _skip_or_fail(f"SLURM did not start on the hosts (slurm.sh up, exit "
                          f"{up.returncode}): {up.stderr.strip()[-800:]}")
        yield HostsSlurm(cluster, base)
    finally:
        subprocess.run([str(SLURM), "down", str(base)], env=cluster.env, cwd=REPO,
                       capture_output=True, timeout=60, check=False)


def render(tmp_path: Path, nodes: int, *args: str) -> Path:
    script = tmp_path / f"job-{nodes}.sbatch"
    out = subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", "slurm",
                          "jobs/synthetic.toml", "--nodes", str(nodes), "--gpus-per-node", "0",
                          "--time", "5", "--output", str(tmp_path / "%x-%j.out"),
                          "--runs", str(tmp_path / "runs"), "-o", str(script),
                          # 3 s and one batch of fill: 1 s of ingest did not reach the
                          # default 1,000 rows at load 10
                          "--set", "run.duration_s=3.0", "--set", "scheduler.min_fill_rows=256",
                          # no periodic checkpoints: with a learner beside its shard's owner
                          # and actors on other hosts, a checkpoint cut across hosts leaves
                          # the shard's index lock held now and then (the learner's
                          # DataPlaneTimeout "index lock ... held by world rank 1"; also on
                          # the base commit; docs/hosts.md "Not understood yet")
                          "--set", "checkpoint.every_seconds=0",
                          "--set", "placement.planner=static",
                          *args], cwd=REPO, capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr
    return script


def check_run(tmp_path: Path, jid: str, state: dict[str, str], nodes: int,
              launcher: str) -> dict:
    output = (tmp_path / f"synthetic-{jid}.out").read_text(errors="replace")
    assert state.get("JobState") == "COMPLETED" and state.get("ExitCode") == "0:0", \
        (state, output[-3000:])
    hosts = [f"host{i}" for i in range(nodes)]
    assert state.get("NodeList") == f"host[0-{nodes - 1}]", state
    assert f"launcher {launcher}" in output and "job finished with status 0" in output
    run_dir = tmp_path / "runs" / f"synthetic-{jid}"
    plan = json.loads((run_dir / "plan.json").read_text())
    # the ranks found one node per host (Split_type over real hosts), 6 ranks dealt evenly
    per = 6 // nodes
    assert plan["nodes"] == [{"node": i, "host": h, "ranks": list(range(i * per, (i + 1) * per))}
                             for i, h in enumerate(hosts)], plan["nodes"]
    assert f"{nodes} node(s), node to node" in plan["cluster"], plan["cluster"]
    learner = plan["prediction"]["learners"]["0"]
    assert learner["node"] == "node0" and learner["exposed_s"] is not None
    report = subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", "report",
                             str(run_dir)], cwd=REPO, capture_output=True, text=True,
                            timeout=120, check=False)
    assert report.returncode == 0, report.stderr
    text = (run_dir / "report" / "report.md").read_text()
    assert f"nodes: {nodes} - node 0 host0" in text, text[-3000:]
    return plan


def test_two_node_script_runs_through_srun_pmix(slurm: HostsSlurm, tmp_path: Path) -> None:
    script = render(tmp_path, 2)
    text = script.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=3" in text
    jid, state = slurm.run_script(script, 180)
    check_run(tmp_path, jid, state, 2, "srun")
    cmd = (tmp_path / "runs" / f"synthetic-{jid}" / "command.txt").read_text()
    assert cmd.startswith("srun --mpi=pmix -n 6"), cmd


def test_two_node_script_runs_through_mpirun_wheel(slurm: HostsSlurm, tmp_path: Path) -> None:
    """mpirun (PRRTE) inside the allocation starts its daemon on the second node through
    SLURM and, with the wheel's by-slot mapping, puts 3 ranks on each node."""
    jid, state = slurm.run_script(render(tmp_path, 2, "--launcher", "mpirun"), 180)
    check_run(tmp_path, jid, state, 2, "mpirun")
    cmd = (tmp_path / "runs" / f"synthetic-{jid}" / "command.txt").read_text()
    assert cmd.startswith("mpirun -n 6"), cmd


SITE_MPIRUN = """#!/bin/bash
# a site's mpirun, outside any virtualenv: its own settings, then the MPI library
echo "site mpirun: $*" >> "$(dirname "$0")/calls.txt"
export OPAL_PREFIX={prefix} OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec {prefix}/bin/mpirun --bind-to none --map-by slot:oversubscribe --mca btl ^ofi \\
    --mca osc ^ucx --mca mpi_yield_when_idle 1 "$@"
"""


def test_three_node_script_runs_through_a_site_mpirun(slurm: HostsSlurm,
                                                       tmp_path: Path) -> None:
    """``--mpi site``: none of the wheel's settings in the script or the job's
    environment; the site's mpirun (here the wheel's, wrapped) spreads 2 ranks per node."""
    if not Path(sys.prefix, "bin", "mpirun").is_file():
        _skip_or_fail(f"no Open MPI mpirun in {sys.prefix} to stand for a site's MPI")
    site = tmp_path / "site" / "bin"
    site.mkdir(parents=True)
    mpirun = site / "mpirun"
    mpirun.write_text(SITE_MPIRUN.format(prefix=sys.prefix))
    mpirun.chmod(0o755)
    script = render(tmp_path, 3, "--mpi", "site", "--launcher", "mpirun", "--mpirun",
                    str(mpirun), "--env", f"venv:{sys.prefix}")
    text = script.read_text()
    assert "OMPI_MCA" not in text and "PRTE_MCA" not in text and "#SBATCH --nodes=3" in text
    venv_bin = str(Path(sys.prefix, "bin"))
    env = {k: v for k, v in slurm.env.items()
           if not k.startswith(("OMPI_", "PRTE_", "OPAL_", "PMIX_"))
           and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != venv_bin)
    jid, state = slurm.run_script(script, 180, env=env)
    check_run(tmp_path, jid, state, 3, "mpirun")
    assert (site / "calls.txt").read_text().startswith("site mpirun: -n 6 ")
