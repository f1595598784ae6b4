"""Several learners, data-parallel, on real plane batches: two (or more) learner ranks
take their own prioritized batches from the data plane (``edp`` mode: the data-plane
thread owns MPI meanwhile), compute DQN gradients that differ, average them through the
gloo group, and end every superstep with bit-identical parameters; the group is agreed on
the whole world, so a bad backend fails every rank of the job together."""

from __future__ import annotations

import hashlib
import math
import time

import numpy as np
import pytest
import torch
from mpi4py import MPI

from conduit_hpc import ConfigError, ExperienceDataPlane, Role
from conduit_hpc.plane.learner_group import LearnerGroup
from conduit_hpc.rl import DQNSection, DQNUpdater, QNetwork
from conduit_hpc.testing import make_config

COMM = MPI.COMM_WORLD
SPEC = {"obs": {"dtype": "float32", "shape": [4]}, "action": {"dtype": "int64"},
        "reward": {"dtype": "float32"}, "next_obs": {"dtype": "float32", "shape": [4]},
        "discount": {"dtype": "float32"}}
STEPS = 12


def config(**scheduler):
    return make_config(spec=SPEC, run={"timeout_s": 60.0},
                       layout={"learners": 2, "buffers": 1, "actors": 0},
                       storage={"capacity_rows": 4096},
                       scheduler={"mode": "edp", "sampler": "prioritized", "batch_rows": 32,
                                  "min_fill_rows": 256, **scheduler})


def transitions(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    obs = rng.normal(size=(n, 4)).astype(np.float32)
    return {"obs": obs, "action": rng.integers(0, 2, n), "reward": rng.normal(size=n)
            .astype(np.float32), "next_obs": obs + 0.1, "discount": np.full(n, 0.97, np.float32)}


def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.mpi(min_size=4)
def test_two_learners_hold_identical_parameters_after_every_superstep() -> None:
    edp = ExperienceDataPlane(config(), COMM)
    group = LearnerGroup.open(edp.roles, "gloo", timeout_s=30.0)
    same_after: list[bool] = []
    local_grads: list[str] = []
    if edp.role is Role.ACTOR:
        rng = np.random.default_rng(edp.world_rank)
        end = time.monotonic() + 120
        while not edp.should_stop and time.monotonic() < end:
            edp.ingest(transitions(rng, 64), priorities=rng.uniform(0.1, 2.0, 64))
            time.sleep(0.002)  # leave the shared cores to the learners
    elif edp.serves:
        edp.serve()
    else:
        assert group.size == 2 and group.backend == "gloo"
        torch.manual_seed(1000 + group.rank)  # different on purpose: the broadcast fixes it
        net = QNetwork(4, 2, (32, 32))
        group.broadcast_module(net)

        def averaged(params) -> None:  # record this learner's own gradient, then average
            params = list(params)
            local_grads.append(digest(p.grad for p in params))
            group.average_gradients(params)

        updater = DQNUpdater(DQNSection(lr=1e-2, target_period=5), net, averaged)
        lead = [torch.empty_like(p) for p in net.parameters()]
        for _ in range(STEPS):
            batch = edp.next_batch()
            _, td = updater.update(batch.data, batch.weights)
            edp.update_priorities(batch.indices, td.abs().double().numpy() + 1e-6)
            for mine, theirs in zip(net.parameters(), lead, strict=True):
                theirs.copy_(mine.detach())
            group.broadcast_(lead)  # the lead learner's parameters, through the group
            same_after.append(all(torch.equal(a, b) for a, b in
                                  zip(net.parameters(), lead, strict=True)))
        assert updater.updates == STEPS
        t = group.timings()  # what the DQN job's summary reports per learner
        assert t["allreduce_calls"] == STEPS and t["agree_calls"] == 0
        assert 0 < t["allreduce_mean_s"] < 30 and math.isnan(t["agree_mean_s"])
        assert group.agree(0) == 0 and group.timings()["agree_calls"] == 1
    edp.done()
    group.close()
    edp.close()
    learners = [x for x in COMM.allgather((same_after, local_grads)) if x[0]]
    assert len(learners) == 2
    for same, _ in learners:
        assert same == [True] * STEPS  # identical after every superstep
    # ... although each learner's own batch gave it a different gradient every time
    assert all(a != b for a, b in zip(learners[0][1], learners[1][1], strict=True))


@pytest.mark.mpi(min_size=4)
def test_nccl_without_a_gpu_fails_every_rank_of_the_job_together() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    edp = ExperienceDataPlane(config(mode="sync"), COMM)
    try:
        with pytest.raises(ConfigError, match=r"on world rank 0: transport\.collectives = "
                                              r"'nccl' needs a CUDA device per rank"):
            LearnerGroup.open(edp.roles, "nccl", timeout_s=30.0)
    finally:
        edp.close()  # every rank raised, so every rank is here to close together
