"""The priorities applied are the ones ``update_priorities`` checked, even when the caller
reuses its arrays the moment the call returns (a training loop that writes the next
step's TD errors into the same buffer). In ``edp`` mode the data-plane thread applies an
update after the call returned; it used the caller's float64 array itself, so a NaN
written into it afterwards went into the sum-tree unchecked (the shard's total became
NaN and every later draw was wrong)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc.testing import checked_batch, make_config

COMM = MPI.COMM_WORLD
STEPS, BATCH = 40, 16


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["edp", "sync"])
@pytest.mark.parametrize("kind", ["numpy", "numpy [n, 1]", "torch"])
def test_priorities_reused_after_the_call_are_not_applied(mode: str, kind: str) -> None:
    cap = 256
    cfg = make_config(run={"timeout_s": 60.0},
                      layout={"learners": 1, "buffers": 1, "actors": COMM.Get_size() - 2},
                      storage={"capacity_rows": cap, "priority_exponent": 0.6},
                      scheduler={"mode": mode, "fetch": "direct", "batch_rows": BATCH,
                                 "min_fill_rows": cap, "sampler": "prioritized"})
    problems: list[str] = []
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            w = 0
            while w < cap:  # the ring once: the rows updated stay held
                edp.ingest(checked_batch(edp.world_rank, w, 16))
                w += 16
            while not edp.should_stop:
                time.sleep(0.005)
        elif edp.role is Role.LEARNER:
            buf = np.empty(BATCH) if kind == "numpy" else np.empty((BATCH, 1))
            prio = torch.from_numpy(buf) if kind == "torch" else buf
            for step in range(STEPS):
                b = edp.next_batch()
                buf[:] = 2.0 + step  # the checked values ...
                edp.update_priorities(b.indices, prio)
                buf[:] = np.nan  # ... then the buffer is reused at once
        else:
            edp.serve()
        edp.done()
        if edp.serves:  # while the window is still there
            (shard,) = edp.owned_shards()
            shard.poll()
            ix = shard.index
            held = (ix.gens > 0) | (ix.hidden_gens > 0)
            bad = held & ~np.isfinite(ix.priority)
            if bad.any():
                problems.append(f"{int(bad.sum())} rows hold priority NaN (slot "
                                f"{int(np.flatnonzero(bad)[0])})")
            if not np.isfinite(ix.total):
                problems.append(f"the shard's total mass is {ix.total}")
            given = ix.priority[held & (ix.priority != 1.0)]
            if not np.isin(given, 2.0 + np.arange(STEPS)).all():
                problems.append(f"priorities never given: {sorted(set(given.tolist()))[:5]}")
    assert COMM.allreduce([f"rank {COMM.Get_rank()}: {p}" for p in problems]) == []
