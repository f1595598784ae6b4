"""Benchmark smoke runs through the CLI (`conduit-hpc bench ... --smoke`): the benchmark
tier (`make bench-smoke`, run by `.ci/run` after `make test`; every subprocess has a
timeout)."""

from __future__ import annotations

import subprocess
import sys

from conduit_hpc.testing import REPO


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_ingest_benchmark_smoke() -> None:
    out = cli("bench", "--json", "ingest", "--smoke", timeout=300)
    assert out.returncode == 0, out.stderr
    assert "single-core numpy memcpy" in out.stdout
    import json

    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["memcpy_gbps"] > 0
    assert all(r["rows"] > 0 and r["ratio_to_memcpy"] > 0 for r in result["results"])


def test_exposed_latency_benchmark_smoke(tmp_path) -> None:
    import json

    out = cli("bench", "--json", "exposed-latency", "--smoke", "--out", str(tmp_path),
              timeout=300)  # --smoke: 40 supersteps of float4 rows at 1x, no files
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    runs = result["results"]
    assert {r["mode"] for r in runs} == {"edp", "sync", "service"}
    assert all(r["supersteps"] > 0 and r["iteration_median_s"] > 0 for r in runs)
    assert {r["case"] for r in result["reductions"]} == {"float4"}


def test_convergence_smoke_then_report_draws_the_return_curve(tmp_path) -> None:
    import json

    out = cli("bench", "--json", "convergence", "--smoke", "--modes", "single", "--out",
              str(tmp_path), timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    (single,) = result["results"]
    assert single["env_steps"] >= 3000 and single["episodes"] > 10
    rep = cli("report", single["run_dir"], timeout=120)
    assert rep.returncode == 0, rep.stderr
    report_dir = tmp_path / "single-seed0" / "report"
    png = report_dir / "returns.png"
    assert png.exists() and png.stat().st_size > 10_000
    md = (report_dir / "report.md").read_text()
    assert "![Return curve](returns.png)" in md
    assert "timeline of dqn [single-process] skipped (no learner-*.csv)" in md


def test_checkpoint_benchmark_smoke() -> None:
    import json

    out = cli("bench", "--json", "checkpoint", "--smoke", timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["checkpoints"] == 2 and result["failed"] == 0
    assert result["pause_s_max"] > 0 and result["write_gbps"] > 0
    assert result["plain_write_gbps"] > 0 and result["read_gbps"] > 0
    assert "pause (cut) per checkpoint" in out.stdout
