"""End to end: a learner that fails while the other learners wait in the gradient
all-reduce ends the whole job with one message (every subprocess has a timeout)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conduit_hpc.testing import REPO


@pytest.mark.timeout(240)
def test_a_learner_failing_beside_the_all_reduce_ends_the_job_with_one_message(
        tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "conduit_hpc.tools.cli", "run",
         "tests/launch/jobs/learner_fails_in_allreduce.toml", "--runs", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=220, check=False)
    assert out.returncode != 0
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("conduit-hpc: error")]
    assert len(errors) == 1, out.stderr
    # the failing learner's own error, not the other learner's collective timeout
    assert "world rank 1" in errors[0], errors[0]
    assert "injected failure on learner 1 at superstep 10" in errors[0], errors[0]


def test_allreduce_benchmark_smoke() -> None:
    from conduit_hpc.bench.allreduce import CARTPOLE_PARAMS, main, ring_allreduce_s

    out = main(["--smoke"])
    ops = {r["op"]: r for r in out["results"]}
    assert set(ops) == {"allreduce_mean_", "agree", "mpi_allreduce", "broadcast_", "rma_board"}
    assert ops["broadcast_"]["model_us"] is None and ops["rma_board"]["floats"] == CARTPOLE_PARAMS
    for r in ops.values():
        assert r["ranks"] == 2 and r["backend"] == "gloo" and r["median_us"] > 0
    assert ops["allreduce_mean_"]["floats"] == CARTPOLE_PARAMS
    # the ring term: 2 (p - 1) steps of latency + bytes / p over the link; none alone
    assert ring_allreduce_s(8e9, 4, 1.0, 1e-6) == 6 * (1e-6 + 2.0)
    assert ring_allreduce_s(1e9, 1, 1.0, 1e-6) == 0.0
    assert ops["allreduce_mean_"]["model_us"] == ring_allreduce_s(
        4.0 * CARTPOLE_PARAMS, 2, 8.0, 1.5e-6) * 1e6
