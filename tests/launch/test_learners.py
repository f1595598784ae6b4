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
