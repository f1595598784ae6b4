"""Smoke runs of the placement benchmarks (scale model, planning time, adaptive on/off)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conduit_hpc.testing import REPO


def bench(*args: str, timeout: float = 300) -> dict:
    out = subprocess.run([sys.executable, "-m", "conduit_hpc.cli", "bench", "--json", *args],
                         cwd=REPO, capture_output=True, text=True, timeout=timeout,
                         check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_scale_smoke_draws_curves_and_predicts_every_mode(tmp_path: Path) -> None:
    png = tmp_path / "scale.png"
    r = bench("scale", "--smoke", "--png", str(png))
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
    r = bench("adaptive", "--smoke")
    first = r["results"][0]
    assert not first["skew_known_at_start"] and first["moves"] == 1
    assert first["on_mean_exposed_s"] < first["off_mean_exposed_s"]
