"""`conduit-hpc bench longhaul --smoke`: the long-haul job in both placements at a tight
link, its metrics files and the side-by-side report (the benchmark tier). Every
subprocess has a timeout."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

from conduit_hpc.features.longhaul.metrics import LINK_COLUMNS
from conduit_hpc.testing import REPO


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_both_placements_run_end_to_end_at_a_tight_link(tmp_path: Path) -> None:
    out = cli("bench", "--json", "longhaul", "--smoke", "--out", str(tmp_path), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    runs = {r["mode"]: r for r in result["results"]}
    assert set(runs) == {"forward", "edge_replay"}
    for mode, r in runs.items():
        metrics = Path(r["run_dir"]) / "metrics"
        with open(metrics / "learner-0.csv") as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == r["updates"] == 60
        assert set(LINK_COLUMNS) | {"loss", "td_abs_mean", "exposed_s"} <= set(rows[0])
        assert {row["mode"] for row in rows} == {"edp"}
        for rank in (1, 2):  # both buffer ranks log their side of the link
            assert (metrics / f"link-{rank}.csv").exists()
        summary = json.loads((metrics / "summary.json").read_text())
        assert summary["mode"] == mode and summary["workload"] == "regression"
        # every byte sent across arrived, both ways
        assert summary["link_e2c_bytes"] == summary["link_e2c_received_bytes"] > 0
        assert summary["link_c2e_bytes"] == summary["link_c2e_received_bytes"]
        assert 0 < summary["link_e2c_util"] <= 1.0 + 1e-6
    fwd = json.loads((Path(runs["forward"]["run_dir"]) / "metrics" / "summary.json")
                     .read_text())
    # forward: the link carried less than the actors produced; the rest was dropped,
    # counted, or still queued at the edge when the job ended
    assert fwd["link_rows_dropped"] > 0
    assert fwd["link_edge_rows_committed"] == (fwd["link_rows_forwarded"]
                                               + fwd["link_rows_dropped"]
                                               + fwd["link_rows_unsent"])
    assert fwd["link_rows_received"] == fwd["link_rows_forwarded"]
    edge = json.loads((Path(runs["edge_replay"]["run_dir"]) / "metrics" / "summary.json")
                      .read_text())
    # edge_replay: only sampled batches crossed, and priority updates crossed back
    assert edge["link_rows_dropped"] == edge["link_rows_forwarded"] == 0
    assert edge["link_rows_crossed"] >= 60 * 32
    assert edge["link_c2e_bytes"] >= 60 * 32 * 24  # (slot, generation, priority) per row
    (ratio,) = result["ratios"]
    assert ratio["priority_ratio"] > 0 and ratio["loss_ratio"] > 0
    # the side-by-side report
    assert (tmp_path / "longhaul.png").stat().st_size > 10_000
    md = (tmp_path / "longhaul.md").read_text()
    assert "edge_replay / forward" in md and md.count("| forward |") == 1
