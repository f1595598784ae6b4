"""The direct draw (``plane/direct_draw.py``) against the general path: from the same
sampler state over the same shards, both deliver the same rows, indices and weights."""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc.testing import checked_batch, make_config, row_consistent

COMM = MPI.COMM_WORLD


@pytest.mark.mpi(min_size=6)
@pytest.mark.skipif(COMM.size != 6, reason="one rank count (make test's time); 3 actors "
                                           "fill both shards")
def test_the_direct_draw_delivers_what_the_general_path_delivers() -> None:
    rows = 256  # per actor
    cfg = make_config(layout={"learners": 1, "buffers": 2, "actors": 3},
                      storage={"capacity_rows": 2048, "priority_exponent": 0.7},
                      scheduler={"mode": "sync", "fetch": "direct", "batch_rows": 64,
                                 "sampler": "prioritized", "beta": 0.5, "beta_final": 0.5,
                                 "min_fill_rows": 3 * rows},  # every row committed
                      run={"timeout_s": 30.0})
    problems: list[str] = []
    with ExperienceDataPlane(cfg) as edp:
        side = COMM.Split(0 if edp.serves else 1, 0)
        if edp.serves:
            edp.serve()
        elif edp.role is Role.ACTOR:
            for w in range(0, rows, 32):
                edp.ingest(checked_batch(edp.world_rank, w, 32))
            side.Barrier()  # the learner has drawn its pairs
        else:
            mode = edp.learner.mode
            d, fetch, rng = mode.d, mode.fetch, mode.d.sampler.rng
            end = time.monotonic() + 20  # every row in the owners' trees (the commit
            while sum(x.count for x in d.shard_stats()) < 3 * rows:  # cursor goes first)
                assert time.monotonic() < end, "the owners never indexed every row"
                time.sleep(0.01)
            shards: set[int] = set()
            direct_used = 0
            for i in range(12):
                state = rng.bit_generator.state
                b1 = edp.next_batch()  # the direct draw
                direct_used += fetch._rings is not None
                got1 = ({k: v.numpy().copy() for k, v in b1.data.items()},
                        b1.indices.copy(), b1.weights.numpy().copy())
                rng.bit_generator.state = state
                fetch._placed, fetch._rings = (id(d), d.placed), None  # the general path
                b2 = edp.next_batch()
                fetch._placed = (0, -1)  # looked up again: the direct draw next time
                got2 = ({k: v.numpy() for k, v in b2.data.items()}, b2.indices,
                        b2.weights.numpy())
                if not np.array_equal(got1[1], got2[1]):
                    problems.append(f"pair {i}: indices differ")
                if not np.array_equal(got1[2], got2[2]):
                    problems.append(f"pair {i}: weights differ")
                for k in got1[0]:
                    if not np.array_equal(got1[0][k], got2[0][k]):
                        problems.append(f"pair {i}: column {k} differs")
                if not row_consistent(got1[0]).all():
                    problems.append(f"pair {i}: a torn row")
                shards |= set(got1[1][:, 0].tolist())
                edp.update_priorities(b1.indices,
                                      np.random.default_rng(i).random(64) * 4 + 0.01)
            if direct_used != 12:
                problems.append(f"the direct draw ran for {direct_used} of 12 batches")
            if len(shards) < 2:
                problems.append(f"every row came from shards {sorted(shards)}: one part only")
            side.Barrier()
        edp.done()
        side.Free()
    assert not problems, problems
