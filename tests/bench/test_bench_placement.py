"""Smoke runs of the placement benchmarks (scale model, planning time, adaptive on/off)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conduit_hpc.testing import REPO


def bench(*args: str, timeout: float = 300) -> dict:
    out = subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", "bench", "--json", *args],
                         cwd=REPO, capture_output=True, text=True, timeout=timeout,
                         check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def fake_run(run_dir: Path) -> None:
    """Metrics in the scheduler's format, as the exposed-latency benchmark writes them."""
    (run_dir / "metrics").mkdir(parents=True)
    cols = ("superstep,time_s,mode,iteration_s,exposed_s,compute_s,sample_s,gather_s,"
            "transform_s,copy_s,rows,staleness,limiter_wait_s")
    lines = [cols]
    for mode, it, ex in (("edp", 0.011, 0.001), ("sync", 0.014, 0.004),
                         ("service", 0.02, 0.01)):
        for k in range(20):
            lines.append(f"{k},{k * it},{mode},{it},{ex},0.01,0,0,0,0,64,0,0")
    (run_dir / "metrics" / "learner-0.csv").write_text("\n".join(lines) + "\n")


def test_scale_smoke_draws_curves_and_predicts_every_mode(tmp_path: Path) -> None:
    recorded = (REPO / "bench" / "scale.png").read_bytes()
    fake_run(tmp_path / "run")
    r = bench("scale", "--smoke", "--measured", str(tmp_path / "run"))
    png = Path(r["png"])  # a smoke run replaced the recorded figure before
    assert png == REPO / "bench" / "out" / "scale-smoke.png", png
    assert (REPO / "bench" / "scale.png").read_bytes() == recorded
    # predicted vs measured, side by side, for each mode the runs measured
    assert [c["mode"] for c in r["comparison"]] == ["edp", "sync", "service"]
    assert r["comparison"][1]["exposed_meas_s"] == 0.004
    assert png.exists() and png.stat().st_size > 10_000
    assert r["costs"]["gather_s_per_byte"] > 0 and r["costs"]["sample_s_per_row"] > 0
    modes = {x["mode"] for x in r["results"]}
    assert modes == {"edp", "sync", "service"}
    for x in r["results"]:
        assert x["iteration_s"] >= x["exposed_s"] >= 0
    by = {(x["gpus"], x["mode"]): x for x in r["results"]}
    for g in (8, 16):  # the semantics of the modes, whatever the machine measured
        assert by[(g, "sync")]["exposed_s"] == by[(g, "sync")]["path_s"]
        assert by[(g, "edp")]["exposed_s"] <= by[(g, "sync")]["exposed_s"]


def test_plan_smoke_reports_planning_time() -> None:
    r = bench("plan", "--smoke")
    assert {x["gpus"] for x in r["results"]} == {8, 32}
    assert all(x["best_s"] > 0 and x["shards"] > 0 for x in r["results"])


def test_adaptive_smoke_compares_on_and_off() -> None:
    r = bench("adaptive", "--smoke", "--no-live")
    first = r["results"][0]
    assert not first["skew_known_at_start"] and first["moves"] == 1
    assert first["on_mean_exposed_s"] < first["off_mean_exposed_s"]
    assert "live" not in r


def test_adaptive_live_smoke_runs_off_and_on_on_the_real_data_plane() -> None:
    r = bench("adaptive", "--smoke", "--taus", "300")["live"]
    (pair,) = r["pairs"]
    # the off run never looks; the on run's coordinator looked at measured telemetry
    assert pair["off_looks"] == 0 and pair["looks"] >= 1
    assert pair["remote_gbps_measured"] > 0
    for mode in ("off", "on"):
        assert pair[mode]["mean_exposed_s"] > 0 and len(pair["trace_ms"][mode]) == 15
    assert pair["off"]["local_share"] == 0.0  # the start plan: every row on node 1
    if pair["moves"]:  # the policy moved: rows came to the learner's node
        assert pair["moved_rows"] > 0 and pair["on"]["local_share"] > 0


def test_scale_model_adds_the_gradient_all_reduce_to_every_superstep() -> None:
    from conduit_hpc.bench.allreduce import ring_allreduce_s
    from conduit_hpc.bench.scale import run_scale

    costs = {"gather_s_per_row": 1e-7, "gather_s_per_byte": 2e-9, "sample_s_per_row": 1e-6,
             "update_s_per_row": 3e-6, "rma_message_s": 8e-6, "handoff_s": 1e-5,
             "request_s": 2e-5}
    common = dict(row_bytes=28_224, batch_rows=256, rows_per_learner=100_000,
                  compute_s=0.004, update_rate_hz=200.0, actor_rows_per_s=250.0,
                  actors_per_learner=4, scope="global")
    cluster = REPO / "jobs" / "cluster-128x8.toml"
    base = run_scale(cluster, [8, 16], costs, **common)
    with_ar = run_scale(cluster, [8, 16], costs, gradient_bytes=6.7e6, **common)
    for a, b in zip(base, with_ar, strict=True):
        assert a["allreduce_s"] == 0.0 and a["exposed_s"] == b["exposed_s"]
        # one node: NVLink (300 GB/s, 3 us); two nodes: the adapters (100 GB/s, 3 us)
        bw = 300.0 if b["nodes"] == 1 else 100.0
        want = ring_allreduce_s(6.7e6, b["gpus"], bw, 3e-6)
        assert b["allreduce_s"] == want > 0
        assert b["iteration_s"] == a["iteration_s"] + want
