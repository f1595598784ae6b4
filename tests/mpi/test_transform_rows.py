"""A learner's ``transform`` must keep one row per entry of ``Batch.indices`` and
``Batch.weights`` in the inline modes (the process delivery checks its own layout).

Layouts: world rank 0 the learner, 1 the buffer, the rest actors (3 ranks and more)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import play
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane
from conduit_hpc.errors import SpecError
from conduit_hpc.testing import make_config

COMM = MPI.COMM_WORLD


def _config(mode: str):
    fetch = "direct"
    if mode == "edp+owner":
        mode, fetch = "edp", "owner"
    return make_config(layout={"learners": 1, "buffers": 1},
                       storage={"capacity_rows": 4096},
                       run={"timeout_s": 30.0}, checkpoint={"on_stop": False},
                       scheduler={"mode": mode, "fetch": fetch, "batch_rows": 32,
                                  "prefetch_depth": 2, "min_fill_rows": 64})


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["sync", "edp", "edp+owner", "service"])
def test_a_transform_that_drops_rows_is_refused_naming_the_field(mode: str) -> None:
    """A transform that returned 16 of a batch's 32 rows was staged as it was: the batch
    had 16 rows of data beside 32 indices and weights, so a loss paired rows with other
    rows' weights and priorities went to rows never trained on. Now ``next_batch``
    raises a SpecError naming the output field, its shape and the rows expected; the
    learner that takes it ends the job cleanly."""
    seen = [0]

    def transform(batch):
        seen[0] += 1
        if seen[0] > 2:  # the first batches pass: the check is per batch
            return {k: v[:16] for k, v in batch.items()}
        return {k: v.astype(np.float64) if k == "wseq" else v for k, v in batch.items()}

    def learn(edp) -> str:
        with pytest.raises(SpecError) as info:
            for _ in range(50):
                b = edp.next_batch()
                # another dtype is a transform's own business (a cast): kept
                assert len(b.data["wseq"]) == len(b) == 32
                edp.update_priorities(b.indices, np.ones(len(b)))
        return str(info.value)

    with ExperienceDataPlane(_config(mode), transform=transform) as edp:
        got = play(edp, learn, checked=16)
        results = COMM.allgather((edp.role.value, got))
    msgs = [g for r, g in results if r == "learner"]
    assert len(msgs) == 1 and "transform output" in msgs[0]
    assert "[16" in msgs[0] and "expected 32 rows" in msgs[0], msgs[0]
