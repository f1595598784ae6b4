"""``scheduler.delivery = "process"``: a wait that runs out while the delivery rank
prepares a batch (the rate limiter's, when every row held has priority 0) is the
learner's to take, as in thread delivery.

Layout: world rank 0 the learner, 1 its delivery rank, 2 the buffer, the rest actors
(4 ranks and more)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import DataPlaneTimeout, ExperienceDataPlane, Role
from conduit_hpc.errors import RemoteFailure
from conduit_hpc.testing import checked_batch, make_config

COMM = MPI.COMM_WORLD


@pytest.mark.mpi(min_size=4)
def test_a_learner_that_takes_a_delivery_wait_timeout_ends_the_job_cleanly() -> None:
    """Every row ingested with priority 0: nothing can be drawn. The learner's
    ``next_batch`` times out; it takes the error and calls ``done``. Its ``done`` raised
    the delivery rank's own timeout as a RemoteFailure (and the delivery rank's
    ``serve`` raised it), so a job run with ``python -m mpi4py`` aborted, where thread
    delivery ends cleanly. Now ``done`` and ``serve`` return on every rank."""
    cfg = make_config(layout={"learners": 1, "buffers": 1}, storage={"capacity_rows": 1024},
                      run={"timeout_s": 3.0}, checkpoint={"on_stop": False},
                      scheduler={"mode": "edp", "delivery": "process", "batch_rows": 32,
                                 "min_fill_rows": 64, "sampler": "prioritized"})
    got = None
    with ExperienceDataPlane(cfg) as edp:
        try:
            if edp.role is Role.ACTOR:
                w = 0
                while not edp.should_stop:
                    edp.ingest(checked_batch(edp.world_rank, w, 16), priorities=np.zeros(16))
                    w += 16
            elif edp.role is Role.LEARNER:
                with pytest.raises((DataPlaneTimeout, RemoteFailure)):
                    edp.next_batch()
            else:
                edp.serve()
            edp.done()
            got = "ended"
        except Exception as err:  # reported on every rank below
            got = f"{type(err).__name__}: {err}"[:300]
        results = COMM.allgather((edp.role.value, got))
    assert all(g == "ended" for _, g in results), results
