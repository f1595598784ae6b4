"""`conduit-hpc plan`: tables, JSON, an infeasible plan explained, a bad file named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conduit_hpc.testing import REPO


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_plan_prints_tables_for_the_128x8_cluster(tmp_path: Path) -> None:
    wl = tmp_path / "atari.toml"
    wl.write_text("[workload]\ncapacity_rows = 20_000_000\nrow_bytes = 56_464\n"
                  "batch_rows = 512\nupdate_rate_hz = 20.0\nactor_rows_per_s = 250.0\n"
                  "scope = 'partitioned'\n")
    out = cli("plan", "jobs/cluster-128x8.toml", "--workload", str(wl), "--top", "5")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for fragment in ("cluster-128x8 (128 nodes, 1024 GPUs, 1024 learners, 128 buffer ranks",
                     "memory tiers", "shards (", "learners (1,024)", "busiest links",
                     "bottleneck: ", "planner  : symmetric LP"):
        assert fragment in text, fragment
    # the tiers table accounts for every row
    tiers = {ln.split("│")[1].strip(): ln.split("│")[3].strip().replace(",", "")
             for ln in text.splitlines() if ln.startswith("│ learner_") or
             ln.startswith("│ buffer_")}
    assert sum(int(v) for v in tiers.values()) == 20_000_000


def test_plan_json_is_complete() -> None:
    out = cli("plan", "jobs/cluster-dgx-h100.toml", "--workload", "jobs/synthetic.toml",
              "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["cluster"] == "dgx-h100"
    assert sum(s["capacity_rows"] for s in d["plan"]["shards"]) == 200_000
    pred = d["prediction"]
    assert len(pred["learners"]) == 8 and pred["bottleneck"]["link"]
    assert set(pred["tier_bytes"]) == {"learner_gpu", "learner_host", "buffer_host"}
    assert pred["objective_s"] >= 0 and pred["max_exposed_s"] >= 0


def test_infeasible_plan_is_explained(tmp_path: Path) -> None:
    wl = tmp_path / "huge.toml"
    wl.write_text("[workload]\ncapacity_rows = 1_000_000\nrow_bytes = 28_224\n")
    out = cli("plan", "jobs/cluster-local.toml", "--workload", str(wl))
    assert out.returncode == 2
    assert "no placement: tiers learner_gpu + learner_host + buffer_host cannot hold" \
        in out.stdout
    # 28,224 B of payload and at most 112 B of the ring's blocks and index a row
    assert "what the tiers hold" in out.stdout and "the replay needs 28.34 GB" in out.stdout
    err = [ln for ln in out.stderr.splitlines() if ln.startswith("conduit-hpc: error")]
    assert len(err) == 1 and "PlacementInfeasible" in err[0] and "short by" in err[0]
    js = cli("plan", "jobs/cluster-local.toml", "--workload", str(wl), "--json")
    assert js.returncode == 2
    d = json.loads(js.stdout)
    assert d["tier"] == "learner_gpu + learner_host + buffer_host"
    assert d["shortfall_bytes"] > 22 * 10**9


def test_bad_cluster_file_is_one_named_error(tmp_path: Path) -> None:
    bad = tmp_path / "c.toml"
    bad.write_text((REPO / "jobs" / "cluster-local.toml").read_text()
                   .replace("buffers = 1", "buffers = 1\nbufers = 2"))
    out = cli("plan", str(bad))
    assert out.returncode == 2
    assert "unknown key 'nodes[0].bufers'" in out.stderr


def test_probe_writes_a_cluster_file_that_plans(tmp_path: Path) -> None:
    out_file = tmp_path / "here.toml"
    out = cli("probe", "-n", "3", "--out", str(out_file), timeout=240)
    assert out.returncode == 0, out.stderr
    measured = json.loads(out.stdout.splitlines()[0])["measurements"]
    assert measured["memcpy_gbps"] > 0 and measured["shm_get_gbps"] > 0
    plan = cli("plan", str(out_file), "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["source"] == str(out_file)
