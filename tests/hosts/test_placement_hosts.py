"""Placement on a real link: the hosts' links shaped by ``tc tbf`` (``cluster.sh shape``).

The probe measures what the shaper lets through between two hosts, and the
static plan made on it keeps the learner's rows on the learner's host when the link is
slow - where a plan on the same measurements with the link as fast as memory (a plan that
ignores the link) puts half of them across it. ``plan.json`` and the report show the
nodes, the probe's figures and predicted against measured time per learner.

Every test leaves the links unshaped again (the session's cluster is shared by the tier).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hosts_cluster import Cluster

from conduit_hpc.bench.hosts_placement import (
    JOB_SETS,
    RATE_BYTES_S,
    blind_cluster,
    learner_host_share,
    roles_per_node,
)
from conduit_hpc.testing import REPO


@contextmanager
def shaped(cluster: Cluster, rate: str) -> Iterator[None]:
    got = cluster.sh("shape", "--rate", rate)
    assert got.returncode == 0, got.stderr
    try:
        yield
    finally:
        cluster.sh("shape")


def probe(cluster: Cluster) -> dict[str, float]:
    out = cluster.mpirun(2, 2, "python", "-m", "mpi4py", "-m", "conduit_hpc.plane.probe",
                         "--learners", "1", "--buffers", "1", "--bytes", str(2 << 20),
                         timeout=180)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith('{"measurements"'))
    return json.loads(line)["measurements"]


def test_probe_measures_a_1_gbit_link(cluster: Cluster) -> None:
    """RMA between the hosts never beats the shaper, and beats what a 100 Mbit/s link
    would allow (the 100 Mbit/s case is the job's start-up probe, below)."""
    with shaped(cluster, "1gbit"):
        m = probe(cluster)
    assert m["nodes"] == 2
    assert m["net_put_gbps"] <= 1.1 * RATE_BYTES_S["1gbit"] / 1e9, m
    assert m["net_get_gbps"] <= 1.1 * RATE_BYTES_S["1gbit"] / 1e9, m
    assert m["net_put_gbps"] > 1.5 * RATE_BYTES_S["100mbit"] / 1e9, m


def test_static_plan_keeps_rows_on_the_learners_host_over_a_slow_link(
        cluster: Cluster, tmp_path: Path) -> None:
    """The synthetic job over 2 hosts at 100 Mbit/s (learner 0 and buffer 2 on host0,
    buffer 1 on host1): the start-up probe measures the link and the plan puts every row
    the learner reads on host0; the same measurements with the link as fast as memory
    give a plan with half the rows on host1."""
    hostfile = cluster.hostfile(2, 3)
    env = {**cluster.env, "CONDUIT_MPIRUN": str(REPO / "scripts/hosts/mpirun.sh"),
           "CONDUIT_HOSTS_HOSTFILE": str(hostfile)}
    cmd = [sys.executable, "-m", "conduit_hpc.tools.cli", "run", "jobs/synthetic.toml",
           "--runs", str(tmp_path), "--timeout", "200", "--mode", "sync",
           "--set", "run.duration_s=2", "--set", "placement.planner=static"]
    for s in JOB_SETS:
        cmd += ["--set", s]
    with shaped(cluster, "100mbit"):
        run = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True,
                             timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["nodes"] == [{"node": 0, "host": "host0", "ranks": [0, 2, 4]},
                             {"node": 1, "host": "host1", "ranks": [1, 3, 5]}], plan["nodes"]
    # the start-up probe measured the shaped link: never above it, put close to it
    m = plan["probe"]
    limit = RATE_BYTES_S["100mbit"] / 1e9
    assert m["nodes"] == 2 and 0.4 * limit <= m["net_put_gbps"] <= 1.1 * limit, m
    assert m["net_get_gbps"] <= 1.1 * limit, m
    # every row the learner samples is on its own host (learner_host or host0's buffer)
    assert learner_host_share(plan) == 1.0, plan["placement"]["shards"]
    assert all(s["owner_rank"] in (0, 2, 4) for s in plan["placement"]["shards"])
    # the plan that ignores the link: the same probe, the link as fast as memory
    from conduit_hpc.placement.cluster import Roster
    from conduit_hpc.placement.static import plan_static
    from conduit_hpc.placement.workload import Workload

    per_node = roles_per_node(plan, 1, 2, 3)
    assert per_node == [(1, 1, 1), (0, 1, 2)]
    blind = blind_cluster(m, per_node, int(os.sysconf("SC_PHYS_PAGES")
                                           * os.sysconf("SC_PAGE_SIZE")))
    roster = Roster.from_ranks(blind, [0, 1, 0, 1, 0, 1], [0], [1, 2], [3, 4, 5])
    other = plan_static(blind, Workload(**plan["workload"]), roster=roster)
    on_host1 = sum(s.share for s in other.shards if s.location.startswith("node1"))
    assert 0.3 <= on_host1 <= 0.7, other.shards
    # predicted against measured per learner, in plan.json and the report
    pred = plan["prediction"]["learners"]["0"]
    assert pred["node"] == "node0" and pred["exposed_s"] is not None
    report = subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", "report",
                             str(run_dir)], cwd=REPO, capture_output=True, text=True,
                            timeout=120, check=False)
    assert report.returncode == 0, report.stderr
    text = (run_dir / "report" / "report.md").read_text()
    assert "nodes: 2 - node 0 host0: world ranks 0, 2, 4" in text
    assert "node to node" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| 0 | node0 |"))
    assert row.count("|") == 8 and " - |" not in row, row  # every column has a figure
