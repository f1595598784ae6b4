"""The test cluster of the hosts tier (scripts/hosts/cluster.sh) as seen from pytest."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conduit_hpc.testing import REPO

CLUSTER = REPO / "scripts" / "hosts" / "cluster.sh"
#: hosts of the session's cluster; tests use the first 2 or 3 of them
HOSTS = 3


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


class Cluster:
    """The session's test cluster: its state directory and a way into its hosts."""

    def __init__(self, name: str, state: Path) -> None:
        self.name = name
        self.state = state
        self.env = {**os.environ, "CONDUIT_HOSTS_NAME": name, "CONDUIT_HOSTS_DIR": str(state)}

    def sh(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``cluster.sh ARGS...`` (bounded by ``timeout``), output captured."""
        return subprocess.run([str(CLUSTER), *args], env=self.env, cwd=REPO,
                              capture_output=True, text=True, timeout=timeout, check=False)

    def hostfile(self, hosts: int, slots: int) -> Path:
        """A hostfile of the first ``hosts`` hosts, ``slots`` ranks each."""
        path = self.state / f"hostfile-{hosts}x{slots}"
        path.write_text("".join(f"host{i} slots={slots}\n" for i in range(hosts)))
        return path

    def mpirun(self, hosts: int, per_host: int, *args: str, timeout: float = 300,
               extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``mpirun`` inside host0 over ``hosts`` hosts, ``per_host`` ranks each, ranks
        dealt round-robin over the hosts (rank r on host r % hosts)."""
        hf = self.hostfile(hosts, per_host)
        env = {**self.env, **(extra_env or {})}
        return subprocess.run([str(CLUSTER), "mpirun", "--hostfile", str(hf), "-n",
                               str(hosts * per_host), "--map-by", "node", *args],
                              env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=timeout, check=False)


def synthetic_job_on_2_hosts(cluster: Cluster, runs: Path, *, timeout: int,
                             duration_s: float, timeout_s: float
                             ) -> tuple[dict[str, str], list[str]]:
    """``(env, argv)`` of ``conduit-hpc run jobs/synthetic.toml`` on 2 hosts of
    ``cluster`` with 2 slots each (1 learner, 1 buffer, 2 actors; no checkpoints), its run
    directory under ``runs``, the launcher's budget ``timeout`` seconds."""
    env = {**cluster.env, "CONDUIT_MPIRUN": str(REPO / "scripts/hosts/mpirun.sh"),
           "CONDUIT_HOSTS_HOSTFILE": str(cluster.hostfile(2, 2))}
    cmd = ["python", "-m", "conduit_hpc.tools.cli", "run", "jobs/synthetic.toml", "--runs",
           str(runs), "--timeout", str(timeout), "--set", f"run.duration_s={duration_s}",
           "--set", f"run.timeout_s={timeout_s}", "--set", "layout.actors=2", "--set",
           "checkpoint.every_seconds=0", "--set", "checkpoint.on_stop=false"]
    return env, cmd


def wait_until_started(proc: subprocess.Popen[str], runs: Path, timeout_s: float = 120
                       ) -> None:
    """Until the job ``proc`` launched into ``runs`` has made its run directory's
    ``checkpoints`` (its ranks are past the constructor); it must not end first."""
    import time

    deadline = time.monotonic() + timeout_s
    while not any(p.name == "checkpoints" for p in runs.glob("*/*")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.5)
