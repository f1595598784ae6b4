"""The hosts tier: MPI jobs across N hosts of a test cluster on one machine.

``scripts/hosts/cluster.sh`` makes the hosts (network, UTS, mount and IPC namespaces, a
private /dev/shm each, a bridge between them); it needs root. Without the privilege every
test here skips with the reason - and fails under CI, never a silent skip there.
``ranks/`` holds tests that run on every rank *inside* the hosts (``--with-mpi``): the
tier's tests start them; a plain ``pytest tests/hosts`` does not collect them.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hosts_cluster import HOSTS, Cluster, in_ci


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.name == "ranks" and not config.getoption("with_mpi", False):
        return True
    return None


def remove_stale_clusters(root: Path) -> None:
    """``cluster.sh down`` for the clusters of test sessions that died without their own
    teardown (named ``pytest-PID`` after a process that no longer exists)."""
    for state in root.glob("pytest-*"):
        pid = state.name.removeprefix("pytest-")
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            Cluster(state.name, state).sh("down", timeout=120)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = Path("/run/conduit-hosts")
    remove_stale_clusters(root)
    name = f"pytest-{os.getpid()}"
    c = Cluster(name, root / name)
    try:
        up = c.sh("up", str(HOSTS), timeout=120)
    except subprocess.TimeoutExpired as err:
        c.sh("down")
        pytest.fail(f"cluster.sh up {HOSTS} timed out: {err}", pytrace=False)
    if up.returncode != 0:
        msg = f"no test cluster (cluster.sh up {HOSTS}, exit {up.returncode}): {up.stderr.strip()}"
        if in_ci():
            pytest.fail(f"{msg} - under CI (root) the hosts tier must run", pytrace=False)
        pytest.skip(msg)
    try:
        yield c
    finally:
        c.sh("down", timeout=120)
