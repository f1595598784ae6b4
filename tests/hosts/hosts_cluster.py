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
