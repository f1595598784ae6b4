"""Checkpoints cut at learner superstep boundaries of a real job (next_batch,
update_priorities), and restore of the learner's position and sampler state."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc import checkpoint as ck
from conduit_hpc.features.checkpointing import restore_data_plane, save_checkpoint
from conduit_hpc.features.checkpointing.agent import CheckpointAgent
from conduit_hpc.testing import checked_batch, make_config

COMM = MPI.COMM_WORLD
EVERY = 5


def config(mode: str):
    return make_config(layout={"learners": 1, "buffers": 1},
                       storage={"capacity_rows": 8192, "priority_exponent": 1.0},
                       scheduler={"mode": mode, "batch_rows": 16, "min_fill_rows": 64})


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["edp", "sync"])
def test_boundary_checkpoints_hold_exactly_the_updates_before_the_boundary(
        shared_dir, mode: str) -> None:
    model = {"model/w": np.arange(6.0).reshape(2, 3)}
    history: list[tuple[int, np.ndarray, float]] = []  # (superstep, indices, priority)
    with ExperienceDataPlane(config(mode)) as edp:
        agent = CheckpointAgent(edp, shared_dir, keep=0)
        agent.every_supersteps(EVERY, lambda: {"extra_state": model})
        if edp.role is Role.ACTOR:
            for i in range(40):  # a fixed set of rows: nothing is overwritten
                edp.ingest(checked_batch(edp.world_rank, 8 * i, 8))
            edp.done()
        elif edp.role is Role.LEARNER:
            for s in range(3 * EVERY + 2):
                b = edp.next_batch()
                p = float(s + 1)
                edp.update_priorities(b.indices, np.full(len(b), p))
                history.append((s, b.indices.copy(), p))
            edp.done()
        else:
            edp.serve()
        agent.finish()
        history = next(h for h in COMM.allgather(history) if h)
        learner = edp.roles.learner_ranks[0]
    done = [p for p in ck.list_checkpoints(shared_dir) if ck.is_complete(p)]
    assert len(done) >= 2
    for path in done:
        c = ck.open_checkpoint(path, spec=edp.spec)
        boundary = c.counters[learner]["superstep"]
        assert boundary % EVERY == 0 and boundary > 0
        np.testing.assert_array_equal(c.extra_state()["model/w"], model["model/w"])
        want: dict[tuple[int, int], float] = {}
        for s, idx, p in history:  # the last update sent before the boundary wins
            if s < boundary:
                for shard, _slot, gen in idx.tolist():
                    want[(shard, gen - 1)] = p
        for sid in range(len(c.shards)):
            snap = c.read_shard(sid)
            got = dict(zip(((sid, int(q)) for q in snap.seqs), snap.priority.tolist(),
                           strict=True))
            for key, p in want.items():
                if key[0] == sid:
                    assert got[key] == p, (boundary, key)
            # no row carries an update sent at or after the boundary: those are all
            # > boundary, while every priority before it (updates, and the running
            # maximum new rows enter at) is <= boundary
            later = {(sh, g - 1) for s, idx, _ in history if s >= boundary
                     for sh, _sl, g in idx.tolist() if sh == sid} - set(want)
            for key in later & set(got):  # (rows committed before the cut at all)
                assert got[key] <= boundary, (boundary, key, got[key])


@pytest.mark.mpi(min_size=3)
def test_restore_brings_back_the_learners_position_and_sampler_state(shared_dir) -> None:
    cfg = config("sync")
    with ExperienceDataPlane(cfg) as edp:
        agent = CheckpointAgent(edp, shared_dir, keep=0)
        agent.every_supersteps(EVERY, None)
        if edp.role is Role.ACTOR:
            for i in range(20):
                edp.ingest(checked_batch(edp.world_rank, 8 * i, 8))
            edp.done()
        elif edp.role is Role.LEARNER:
            for _ in range(EVERY + 2):
                b = edp.next_batch()
                edp.update_priorities(b.indices, np.ones(len(b)))
            edp.done()
        else:
            edp.serve()
        agent.finish()
    with ExperienceDataPlane(cfg) as edp:
        restored = restore_data_plane(edp, "latest", roots=[shared_dir])
        assert restored is not None
        if edp.role is Role.LEARNER:
            assert edp.learner.superstep_offset == EVERY
            first = edp.next_batch()
            assert first.superstep == EVERY  # the scheduler continues where it was
        elif edp.serves:
            edp.serve()
        edp.done()


@pytest.mark.mpi(min_size=3)
def test_a_final_checkpoint_resumes_the_samplers_own_state(shared_dir) -> None:
    """Issue 23 item 5: save_checkpoint without counters (as the DQN job calls it) used to
    restore the learner at superstep 0 with a fresh RNG: the beta schedule restarted.
    The sampler's state_dict now travels in the checkpoint (schema 2)."""
    cfg = config("sync")
    steps = EVERY + 2
    want = None
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            for i in range(20):
                edp.ingest(checked_batch(edp.world_rank, 8 * i, 8))
            edp.done()
        elif edp.role is Role.LEARNER:
            for _ in range(steps):
                b = edp.next_batch()
                edp.update_priorities(b.indices, np.ones(len(b)))
            edp.done()
            want = edp.learner.sampler_state()
        else:
            edp.serve()
        save_checkpoint(edp, shared_dir)
    assert want is None or want["superstep_offset"] == steps
    with ExperienceDataPlane(cfg) as edp:
        restored = restore_data_plane(edp, "latest", roots=[shared_dir])
        assert restored is not None
        if edp.role is Role.LEARNER:
            learner = edp.world_rank
            c = ck.open_checkpoint(restored.path, spec=edp.spec)
            assert c.schema_version == ck.SCHEMA_VERSION and c.sampler[learner] == want
            assert edp.learner.superstep_offset == steps
            assert edp.learner.sampler_state(0) == want  # the same RNG, the same offset
            assert edp.next_batch().superstep == steps
        elif edp.serves:
            edp.serve()
        edp.done()
