"""`conduit-hpc bench peers --smoke`: our figures beside the in-process peers, in one run
(every subprocess has a timeout)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conduit_hpc.bench import peers
from conduit_hpc.testing import REPO


def test_peers_smoke_reports_ours_and_each_peer_or_why_not() -> None:
    out = subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", "bench", "--json",
                          "peers", "--smoke", "--kinds", "cartpole"], cwd=REPO,
                         capture_output=True, text=True, timeout=400, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    ours = [r for r in result["results"] if r["system"] == "conduit_hpc"]
    assert {r["sampler"] for r in ours} == {"prioritized", "uniform"}
    for r in ours:
        assert r["insert_rows_per_s"] > 0 and r["inserting_rows_per_s"] > 0
        for phase in ("idle", "inserting"):
            assert r[phase]["batches"] == 30 and r[phase]["batches_per_s"] > 0
            assert r[phase]["latency_p99_s"] >= r[phase]["latency_median_s"] > 0
    others = {r["system"]: r for r in result["results"] if r["system"] != "conduit_hpc"}
    assert set(others) == {"cpprb", "torchrl"}
    for name, r in others.items():
        # a peer ran, or says why not (not installed, or built for another torch)
        assert "skipped" in r or "uniform" in r, (name, r)
        assert "prioritized" in r or "skipped" in r or "prioritized_skipped" in r
    for t in result["ratios"]:  # ours / peer, for every peer figure that exists
        assert t["rate_ratio_idle"] > 0 and t["median_latency_ratio"] > 0


def test_an_absent_peer_is_skipped_with_a_note(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "cpprb", None)  # import cpprb -> ImportError
    peers.main(["--peer", "cpprb", "--kind", "cartpole", "--smoke", "--batches", "5"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    r = json.loads(line.removeprefix("RESULT "))
    assert "not installed" in r["skipped"] and "[peers]" in r["skipped"]


def test_capacity_smoke_reports_every_delivery_mode_and_the_ratios() -> None:
    # sync, a data-plane thread, a delivery rank, and owner fetch: each a figure with 0
    # and 2 actors inserting, beside cpprb (or the reason it is missing)
    modes = ["sync", "edp", "edp-process", "sync:owner"]
    out = subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", "bench", "--json",
                          "capacity", "--smoke", "--kinds", "cartpole", "--peers", "cpprb",
                          "--modes", ",".join(modes)], cwd=REPO,
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    ours = {r["mode"]: r for r in result["results"] if r["system"] == "conduit_hpc"}
    assert set(ours) == set(modes)
    for mode, r in ours.items():
        assert "failed" not in r, (mode, r)
        for phase in ("idle", "inserting"):
            assert r[phase]["batches"] == 30 and r[phase]["batches_per_s"] > 0
        assert r["inserting_rows_per_s"] > 0
    assert {t["mode"] for t in result["ratios"]} == set(modes)
    for t in result["ratios"]:
        assert t["inserting_over_idle"] > 0
    (cpprb,) = [r for r in result["results"] if r["system"] == "cpprb"]
    if "skipped" not in cpprb:  # then every mode has its ratio to it
        assert all(t["over_cpprb"] > 0 for t in result["ratios"])
