"""With ``scheduler.sampler = "uniform"`` (or ``"prioritized"`` with
``storage.priority_exponent = 0``) every held row is equally likely, whatever
priorities the job gives (as TorchRL's and Reverb's uniform samplers ignore them).
Priorities of 0 - at ingest (``priorities=reward`` with sparse rewards) or from
``update_priorities`` (a TD error of exactly 0) - made those rows mass 0 in the owners'
index, never drawn again: a "uniform" replay that sampled only the other rows."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc.testing import checked_batch, make_config

COMM = MPI.COMM_WORLD
ROWS = 128


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("where", ["ingest", "update"])
@pytest.mark.parametrize("mode,sampler", [("sync", "uniform"), ("edp", "uniform"),
                                          ("service", "uniform"), ("edp", "prioritized")])
def test_uniform_draws_ignore_zero_priorities(where: str, mode: str, sampler: str) -> None:
    # prioritized with priority_exponent 0 is uniform too ("0 = uniform")
    cfg = make_config(layout={"learners": 1, "buffers": 1},
                      storage={"capacity_rows": 4 * ROWS, "priority_exponent": 0.0},
                      scheduler={"mode": mode, "sampler": sampler, "batch_rows": 64,
                                 "min_fill_rows": ROWS})
    late = -1.0
    with ExperienceDataPlane(cfg, COMM) as edp:
        if edp.role is Role.ACTOR:
            n_actors = len(edp.roles.actor_ranks)
            me = edp.roles.actor_ranks.index(edp.world_rank)
            mine = np.arange(me, ROWS, n_actors)  # a fixed set of rows, then done
            rows = checked_batch(edp.world_rank, 0, len(mine))
            rows["wseq"][:] = mine  # the row's number in the set
            prio = np.where(mine % 8 == 0, 1.0, 0.0) if where == "ingest" else None
            edp.ingest({k: v for k, v in rows.items()}, priorities=prio)
        elif edp.role is Role.LEARNER:
            fractions = []
            for _ in range(30):
                b = edp.next_batch()
                favoured = b.data["wseq"].numpy() % 8 == 0
                fractions.append(float(favoured.mean()))
                if where == "update":
                    edp.update_priorities(b.indices, np.where(favoured, 5.0, 0.0))
            late = float(np.mean(fractions[-10:]))
        else:
            edp.serve()
        edp.done()
    late = max(COMM.allgather(late))
    # one row in eight is favoured: 640 draws give ~0.125 +- 0.013; all favoured
    # (1.0) when the others were hidden by their zero priority
    assert 0.05 < late < 0.25, late
