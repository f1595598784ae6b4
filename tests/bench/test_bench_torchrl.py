"""`conduit-hpc bench torchrl --smoke` reports TorchRL's own buffer beside the data plane
(the benchmark tier). Needs the [torchrl] extra (a failure under CI without it, see
tests/extras.py). Every subprocess has a timeout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conduit_hpc.testing import REPO


@pytest.fixture(autouse=True)
def _extra() -> None:
    from extras import need_torchrl

    need_torchrl()


@pytest.mark.timeout(540)
def test_bench_torchrl_smoke_reports_torchrl_beside_the_data_plane(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "conduit_hpc.tools.cli", "bench", "torchrl", "--smoke",
         "--modes", "torchrl,edp", "--out", str(tmp_path),
         "--set", "torchrl.max_env_steps=600"],
        cwd=REPO, capture_output=True, text=True, timeout=510, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    by_mode = {r["mode"]: r for r in rows}
    assert set(by_mode) == {"torchrl", "edp"}, proc.stdout[-2000:]
    for mode, r in by_mode.items():
        assert "failed" not in r, (mode, r)
        assert r["updates"] > 0 and r["iteration_mean_s"] > 0 and r["exposed_mean_s"] > 0
        assert r["env_steps"] >= 600 or r["reached"]
    assert by_mode["torchrl"]["trees"] in ("c++", "numpy")
    assert "iter/torchrl" in proc.stdout

