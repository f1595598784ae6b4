"""A job checkpointed with ``delivery = "thread"`` resumed with ``delivery = "process"``
(a process-delivery job cuts no checkpoints, but it may restore one): the delivery
rank's sampler, which draws and weighs the batches, continues from the learner's
restored state.

Layouts: thread: world rank 0 the learner, 1 the buffer, the rest actors; process:
0 the learner, 1 its delivery rank, 2 the buffer, the rest actors (4 ranks and more)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc.features.checkpointing import restore_data_plane
from conduit_hpc.features.checkpointing.agent import CheckpointAgent
from conduit_hpc.testing import checked_batch, make_config, row_consistent

COMM = MPI.COMM_WORLD
EVERY = 5


def _config(delivery: str):
    actors = COMM.size - (3 if delivery == "process" else 2)
    return make_config(layout={"learners": 1, "buffers": 1, "actors": actors},
                       storage={"capacity_rows": 4096, "priority_exponent": 1.0},
                       checkpoint={} if delivery == "thread" else {"on_stop": False},
                       run={"timeout_s": 30.0},
                       scheduler={"mode": "edp", "delivery": delivery, "batch_rows": 16,
                                  "min_fill_rows": 64, "beta": 0.4, "beta_final": 1.0,
                                  "beta_anneal_supersteps": EVERY})


def _priorities(wseq: np.ndarray) -> np.ndarray:
    """1 for even rows, 4 for odd ones: at beta = 1 an odd row weighs 1/4 of an even one."""
    return 1.0 + 3.0 * (np.asarray(wseq) % 2)


@pytest.mark.mpi(min_size=4)
def test_a_process_delivery_job_resumes_the_learners_sampler(shared_dir) -> None:
    """The learner restored its sampler (superstep offset, random state), but the batches
    came from its delivery rank's sampler, which kept its fresh state: the first batch
    after the restore said superstep 0 (the learner's metrics said the offset) and its
    importance weights used the beta of superstep 0 (0.4 here: an odd row weighed 0.57)
    instead of the annealed one (1.0: 0.25). The learner now hands its sampler state to
    the delivery rank before the first batch is drawn."""
    with ExperienceDataPlane(_config("thread")) as edp:
        agent = CheckpointAgent(edp, shared_dir, keep=0)
        agent.every_supersteps(EVERY, None)
        if edp.role is Role.ACTOR:
            for i in range(20):
                rows = checked_batch(edp.world_rank, 8 * i, 8)
                edp.ingest(rows, priorities=_priorities(rows["wseq"]))
            edp.done()
        elif edp.role is Role.LEARNER:
            for _ in range(EVERY + 2):
                b = edp.next_batch()
                edp.update_priorities(b.indices, _priorities(b.data["wseq"].numpy()))
            edp.done()
        else:
            edp.serve()
        agent.finish()
    got = None
    with ExperienceDataPlane(_config("process")) as edp:
        restored = restore_data_plane(edp, "latest", roots=[shared_dir])
        assert restored is not None
        if edp.role is Role.LEARNER:
            offset = edp.learner.superstep_offset
            batches = []
            for _ in range(3):
                b = edp.next_batch()
                cols = {k: v.numpy().copy() for k, v in b.data.items()}
                assert row_consistent(cols).all()
                batches.append((b.superstep, cols["wseq"], b.weights.numpy().copy()))
                edp.update_priorities(b.indices, _priorities(cols["wseq"]))
            got = (offset, batches)
        elif edp.serves:
            edp.serve()
        edp.done()
    offset, batches = next(g for g in COMM.allgather(got) if g is not None)
    assert offset >= EVERY and offset % EVERY == 0
    assert [s for s, _, _ in batches] == [offset, offset + 1, offset + 2]
    for _, wseq, weights in batches:
        assert ((weights > 0) & (weights <= 1)).all(), weights
        # beta is annealed to 1 by superstep EVERY: weights are 1 / priority, scaled by
        # the largest (the even rows': every shard holds both kinds)
        want = np.where(wseq % 2, 0.25, 1.0)
        np.testing.assert_allclose(weights, want, rtol=1e-5)


@pytest.mark.mpi(min_size=4)
def test_a_final_checkpoint_of_a_process_delivery_job_saves_the_draws_random_state(
        shared_dir) -> None:
    """A checkpoint saved at the end of a process-delivery job (save_checkpoint, after
    every rank is done) stored the learner's sampler state, whose random generator only
    the delivery rank's draws had advanced - the learner's was still the fresh seed's, so
    a resumed job drew the same random stream again. The delivery rank now hands its
    random state back as it stops; the checkpoint holds it."""
    from conduit_hpc import checkpoint as ck
    from conduit_hpc.features.checkpointing import save_checkpoint

    drew = None
    with ExperienceDataPlane(_config("process")) as edp:
        if edp.role is Role.ACTOR:
            for i in range(20):
                edp.ingest(checked_batch(edp.world_rank, 8 * i, 8))
            edp.done()
        elif edp.role is Role.LEARNER:
            for _ in range(EVERY):
                b = edp.next_batch()
                edp.update_priorities(b.indices, np.ones(len(b)))
            edp.done()
        else:
            edp.serve()
            if edp.delivery is not None:
                drew = edp.delivery.d.sampler.rng.bit_generator.state
        edp.done()
        result = save_checkpoint(edp, shared_dir)
        learner = edp.roles.learner_ranks[0]
    drew = next(d for d in COMM.allgather(drew) if d is not None)
    state = ck.open_checkpoint(result.path).sampler[learner]
    assert state["superstep_offset"] == EVERY
    fresh = np.random.default_rng(_config("process").run.seed + learner).bit_generator.state
    assert drew != fresh  # the delivery rank drew
    assert json.loads(state["rng"]) == drew
