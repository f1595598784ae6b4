"""Several learners, data-parallel, on real plane batches: two (or more) learner ranks
take their own prioritized batches from the data plane (``edp`` mode: the data-plane
thread owns MPI meanwhile), compute DQN gradients that differ, average them through the
gloo group, and end every superstep with bit-identical parameters; the group is agreed on
the whole world, so a bad backend fails every rank of the job together."""

from __future__ import annotations

import hashlib
import math
import re
import time

import numpy as np
import pytest
import torch
from conftest import gave_up
from mpi4py import MPI

from conduit_hpc import ConduitError, ConfigError, ExperienceDataPlane, Role
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


class _Leave(Exception):
    """A learner leaving its with-block (caught outside it)."""


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("how", ["raise", "exit"])
def test_a_learner_leaving_on_an_exception_ends_the_others_collective_naming_it(how):
    """Learner 1 leaves the data plane on an exception (or ``sys.exit(0)`` before
    ``done()``) while learner 0 waits for it in the gradient all-reduce. Before, learner 0
    waited out the whole gloo timeout and then raised a CollectiveFailed that named
    nobody ("a peer failed or did not arrive"); with its process ending, torch's
    "Connection closed by peer". Now the leaver's group shuts down on its way out and
    learner 0's CollectiveFailed names the world rank that left - within run.timeout_s,
    and every other rank stops too (RemoteFailure)."""
    from conduit_hpc.errors import CollectiveFailed, RemoteFailure

    timeout = 30.0
    cfg = make_config(spec=SPEC, run={"timeout_s": timeout},
                      layout={"learners": 2, "buffers": 1, "actors": 0},
                      storage={"capacity_rows": 4096}, checkpoint={"on_stop": False},
                      scheduler={"mode": "edp", "batch_rows": 32, "min_fill_rows": 64})
    t0 = time.monotonic()
    seen, me = "nothing", -1
    try:
        with ExperienceDataPlane(cfg, COMM) as edp:
            group = LearnerGroup.open(edp, "gloo", timeout_s=timeout)
            me = group.rank
            if edp.role is Role.ACTOR:
                rng = np.random.default_rng(edp.world_rank)
                while not edp.should_stop:
                    edp.ingest(transitions(rng, 32))
                    time.sleep(0.01)
            elif edp.serves:
                edp.serve()
            else:
                param = torch.nn.Parameter(torch.zeros(100))
                for _ in range(3):
                    edp.next_batch()
                    param.grad = torch.ones(100)
                    group.average_gradients([param])
                if group.rank == 1:
                    if how == "exit":
                        raise SystemExit(0)
                    raise _Leave("learner 1's own bug")
                for _ in range(10_000):  # learner 0: until the group fails
                    param.grad = torch.ones(100)
                    group.average_gradients([param])
            edp.done()
    except (_Leave, SystemExit):
        seen = "left"
    except CollectiveFailed as err:
        seen = f"CollectiveFailed: {err}"
    except RemoteFailure as err:
        seen = f"RemoteFailure: {err}"
    except Exception as err:  # anything else is a finding
        seen = f"{type(err).__name__}: {err}"
    took = time.monotonic() - t0
    every = COMM.allgather((COMM.rank, me, seen, took))
    leaver = next(r for r, m, s, _ in every if m == 1)
    for _, member, what, t in every:
        assert t < timeout, every
        if member == 1:
            assert what == "left", every
        elif member == 0:
            assert what.startswith("CollectiveFailed: allreduce of 100 values"), every
            # (across hosts the rank's host follows it: "world rank 1 (host host1) left")
            assert re.search(rf"world rank {leaver}( \(host [^)]*\))? left the data plane",
                             what), every
        else:
            assert what.startswith(("RemoteFailure", "CollectiveFailed")), every
            assert f"world rank {leaver}" in what, every


@pytest.mark.mpi(min_size=4)
def test_a_learner_closing_its_group_without_leaving_the_plane_is_named() -> None:
    """Learner 1 closes its group (``LearnerGroup.close()``) but stays in the data plane
    while learner 0 waits for it in the gradient all-reduce. Before, learner 0's
    CollectiveFailed said only "a peer failed, left or did not arrive" (the plane's
    record names ranks that left on an exception; this one did not). Now the closer
    leaves word in the group's store and learner 0's error names it, by learner index
    and world rank; both then end the job normally."""
    from conduit_hpc.errors import CollectiveFailed

    timeout = 30.0
    cfg = make_config(spec=SPEC, run={"timeout_s": timeout},
                      layout={"learners": 2, "buffers": 1, "actors": 0},
                      storage={"capacity_rows": 4096}, checkpoint={"on_stop": False},
                      scheduler={"mode": "edp", "batch_rows": 32, "min_fill_rows": 64})
    t0 = time.monotonic()
    seen, me = "nothing", -1
    with ExperienceDataPlane(cfg, COMM) as edp:
        group = LearnerGroup.open(edp, "gloo", timeout_s=timeout)
        me = group.rank
        if edp.role is Role.ACTOR:
            rng = np.random.default_rng(edp.world_rank)
            while not edp.should_stop:
                edp.ingest(transitions(rng, 32))
                time.sleep(0.01)
        elif edp.serves:
            edp.serve()
        else:
            param = torch.nn.Parameter(torch.zeros(100))
            for _ in range(3):
                edp.next_batch()
                param.grad = torch.ones(100)
                group.average_gradients([param])
            if group.rank == 1:
                group.close()
                seen = "closed"
            else:
                try:
                    for _ in range(10_000):  # learner 0: until the group fails
                        param.grad = torch.ones(100)
                        group.average_gradients([param])
                except CollectiveFailed as err:
                    seen = f"CollectiveFailed: {err}"
        edp.done()
    every = COMM.allgather((COMM.rank, me, seen, time.monotonic() - t0))
    closer = next(r for r, m, _, _ in every if m == 1)
    for _, member, what, took in every:
        assert took < timeout, every
        if member == 1:
            assert what == "closed", every
        elif member == 0:
            assert what.startswith("CollectiveFailed: allreduce of 100 values"), every
            assert (f"learner 1 (world rank {closer}) closed its process group"
                    in what), every


@pytest.mark.mpi(min_size=4)
def test_unused_frozen_and_misplaced_parameters_in_the_gradient_average() -> None:
    """A parameter without a gradient on one learner (unused this step) counted as zeros
    and took the mean (before, the learners passed lists of other lengths: gloo aborted
    the process or averaged the wrong tensors); one without a gradient anywhere stays
    None; a frozen one (requires_grad=False) takes no part; another architecture on one
    learner is refused on both; an actor or buffer calling the learners' collectives is
    told so (before: silently nothing)."""
    from conduit_hpc.errors import CollectiveMismatch

    cfg = make_config(spec=SPEC, run={"timeout_s": 30.0},
                      layout={"learners": 2, "buffers": 1, "actors": 0},
                      storage={"capacity_rows": 64}, checkpoint={"on_stop": False},
                      scheduler={"mode": "sync", "batch_rows": 8, "min_fill_rows": 8})
    ok = False
    with ExperienceDataPlane(cfg, COMM) as edp:
        group = LearnerGroup.open(edp, "gloo", timeout_s=30.0)
        if edp.role is Role.LEARNER:
            a, b, c = (torch.nn.Parameter(torch.zeros(3)) for _ in range(3))
            frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
            a.grad = torch.full((3,), 4.0)
            if group.rank == 0:  # b unused on learner 1; c nowhere
                b.grad = torch.full((3,), 2.0)
                frozen.grad = torch.full((2,), 7.0)  # stale, never averaged
            group.average_gradients([a, frozen, b, c])
            assert torch.equal(a.grad, torch.full((3,), 4.0))
            assert torch.equal(b.grad, torch.full((3,), 1.0))  # (2 + 0) / 2 learners
            assert c.grad is None
            assert frozen.grad is None or torch.equal(frozen.grad, torch.full((2,), 7.0))
            other = torch.nn.Parameter(torch.zeros(4 if group.rank else 3))
            other.grad = torch.ones_like(other)
            with pytest.raises(CollectiveMismatch, match="rank 0: 1 tensors of 3 values, "
                                                         "rank 1: 1 tensors of 4 values"):
                group.average_gradients([other])
            assert group.agree(group.rank) == 1  # still in step
            # not parameters on one learner: it raised AttributeError alone before, while
            # the other waited out the timeout in the all-reduce
            with pytest.raises(CollectiveMismatch, match=r"rank 1: not a torch.Tensor"):
                group.average_gradients([a] if group.rank == 0 else [None])
            assert group.agree(0) == 0  # still in step
            # a code that is not an int64 on one learner: refused on both, and the one
            # that passed it is told its value (before: the value was not quoted)
            with pytest.raises(CollectiveMismatch) as err:
                group.agree(1.5 if group.rank == 0 else 0)  # type: ignore[arg-type]
            assert ("agree(1.5)" in str(err.value)) == (group.rank == 0), err.value
            assert group.agree(True) == 1  # flags are 1/0; still in step
            ok = True
        else:
            with pytest.raises(ConduitError, match=rf"LearnerGroup.average_gradients\(\) "
                                                   rf"is for learner ranks .*world rank "
                                                   rf"{COMM.rank} has the role"):
                group.average_gradients([torch.nn.Parameter(torch.zeros(1))])
            with pytest.raises(ConduitError, match="is for learner ranks"):
                group.agree(1)
            ok = True
            if edp.role is Role.ACTOR:
                edp.ingest(transitions(np.random.default_rng(0), 8))
        if edp.serves:
            edp.serve()
        else:
            edp.done()
        group.close()
    assert all(COMM.allgather(ok))


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("how", ["never", "left"])
def test_a_rank_that_never_opens_the_group_ends_the_others_in_bounded_time(how):
    """``LearnerGroup.open`` is collective on the world; one actor never calls it (a job
    that opens it on learners only, or an actor that left on an exception caught outside
    its with-block). Before, every other rank waited forever in the world's Allgather.
    Now they raise: CollectiveFailed naming the call after ``timeout_s`` ("never"; or
    RemoteFailure naming the first rank that gave up: it marks itself), or
    RemoteFailure naming the actor at once when it left the data plane ("left")."""
    from conduit_hpc.errors import CollectiveFailed, RemoteFailure

    timeout = 4.0
    cfg = make_config(spec=SPEC, run={"timeout_s": timeout},
                      layout={"learners": 2, "buffers": 1, "actors": 0},
                      storage={"capacity_rows": 256}, checkpoint={"on_stop": False})
    skip = COMM.size - 1  # an actor
    seen, t0 = "nothing", time.monotonic()
    try:
        with ExperienceDataPlane(cfg, COMM) as edp:
            if edp.world_rank == skip:
                if how == "never":
                    time.sleep(timeout + 3)  # the others have given up by now
                raise _Leave
            LearnerGroup.open(edp, "gloo", timeout_s=timeout).close()
            seen = "opened"
    except _Leave:
        seen = "left"
    except (CollectiveFailed, RemoteFailure) as err:
        seen = f"{type(err).__name__}: {err}"
    took = time.monotonic() - t0
    every = COMM.allgather(seen)
    ok = seen == "left" if COMM.rank == skip else (
        (how == "never" and gave_up(every, COMM.rank, "LearnerGroup.open()")) or
        (how == "left" and seen.startswith("RemoteFailure")
         and re.search(rf"world rank {skip}( \(host [^)]*\))? left", seen) is not None
         and took < timeout))
    assert COMM.allreduce(int(ok), op=MPI.MIN), (COMM.rank, seen, took)


@pytest.mark.mpi(min_size=3)
def test_one_learners_agree_takes_only_what_a_group_would() -> None:
    """With one learner ``agree`` exchanges nothing; it returned any value as it came
    (1.5, 2**63, a string), which a second learner's collective refuses. Same rule now."""
    from conduit_hpc.errors import CollectiveMismatch

    cfg = make_config(spec=SPEC, run={"timeout_s": 30.0},
                      layout={"learners": 1, "buffers": 1}, storage={"capacity_rows": 64},
                      checkpoint={"on_stop": False},
                      scheduler={"mode": "sync", "batch_rows": 8, "min_fill_rows": 8})
    ok = True
    with ExperienceDataPlane(cfg, COMM) as edp:
        group = LearnerGroup.open(edp, "gloo", timeout_s=30.0)
        if edp.role is Role.LEARNER:
            for bad in (1.5, 2 ** 63, "1", None):
                with pytest.raises(CollectiveMismatch, match=rf"agree\(\): code must be an "
                                                             rf"int64, got {bad!r}"):
                    group.agree(bad)  # type: ignore[arg-type]
            ok = group.agree(np.int32(3)) == 3 and group.agree(False) == 0
        if edp.serves:
            edp.serve()
        else:
            edp.done()
        group.close()
    assert all(COMM.allgather(ok))
