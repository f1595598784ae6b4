"""Weights from the lead learner to actors, and the policy-lag bound."""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import gave_up
from mpi4py import MPI

from conduit_hpc import ConfigError, ExperienceDataPlane, Role
from conduit_hpc.errors import ConduitError
from conduit_hpc.plane.control import C_LEARNER_VERSION
from conduit_hpc.plane.weights import flat_parameters
from conduit_hpc.testing import checked_batch, make_config


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["edp", "sync"])
def test_actors_receive_every_kth_publication_and_stay_within_the_lag(mode: str) -> None:
    k, lag = 3, 4
    cfg = make_config(layout={"learners": 1, "buffers": 1},
                      storage={"capacity_rows": 4096},
                      scheduler={"mode": mode, "batch_rows": 16, "min_fill_rows": 32,
                                 "weights_every": k, "max_policy_lag": lag})
    model = net()
    with ExperienceDataPlane(cfg) as edp:
        edp.share_weights(None if edp.serves else model)
        seen = []
        if edp.role is Role.ACTOR:
            wseq = 0
            while not edp.should_stop:
                before = edp.control.read(C_LEARNER_VERSION)
                edp.ingest(checked_batch(edp.world_rank, wseq, 8))
                wseq += 8
                # ingest returned: this actor's weights are at most `lag` supersteps
                # behind the learner (as it was when ingest checked, which is no earlier
                # than `before`)
                if not edp.should_stop:
                    assert before - edp.policy_version <= lag
                seen.append((edp.policy_version,
                             float(flat_parameters(model)[0])))
        elif edp.role is Role.LEARNER:
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(20):
                b = edp.next_batch()
                # a real update: parameters change every superstep
                loss = model(b.data["payload"][:, :4].float() / 1e12).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                seen.append(float(flat_parameters(model)[0]))
        else:
            edp.serve()
        edp.done()
        everyone = edp.roles.world.allgather((edp.role.value, seen))
        edp.summary()
    learner_params = next(s for r, s in everyone if r == "learner")
    initial = float(flat_parameters(net())[0])
    for role, s in everyone:
        if role != "actor":
            continue
        versions = [v for v, _ in s]
        assert all(v % k == 0 for v in versions), "only every k-th superstep is published"
        assert versions == sorted(versions)
        for v, p0 in s:
            # the weights pulled for version v are the learner's weights when superstep v
            # began (after v updates, i.e. learner_params[v - 1]; the initial ones at 0)
            want = initial if v == 0 else learner_params[v - 1]
            assert p0 == pytest.approx(want)


@pytest.mark.mpi(min_size=3)
def test_share_weights_refuses_a_different_model_everywhere() -> None:
    cfg = make_config(layout={"learners": 1, "buffers": 1})
    with ExperienceDataPlane(cfg) as edp:
        model = (torch.nn.Linear(3, 3) if edp.role is Role.LEARNER else
                 torch.nn.Linear(2, 2) if edp.role is Role.ACTOR else None)
        with pytest.raises(ConfigError, match="parameters"):
            edp.share_weights(model)
        # the same number of parameters in other shapes (Linear(5, 2): 10 + 2 = 12,
        # Linear(3, 3): 9 + 3 = 12): the flat weights would load into the wrong layers
        other = (torch.nn.Linear(3, 3) if edp.role is Role.LEARNER else
                 torch.nn.Linear(5, 2) if edp.role is Role.ACTOR else None)
        with pytest.raises(ConfigError, match="other parameter shapes"):
            edp.share_weights(other)
        if edp.serves:
            edp.serve()
        edp.done()
    assert MPI.COMM_WORLD.allreduce(1) == MPI.COMM_WORLD.Get_size()


@pytest.mark.mpi(min_size=3)
def test_policy_lag_needs_shared_weights() -> None:
    cfg = make_config(layout={"learners": 1, "buffers": 1},
                      scheduler={"max_policy_lag": 2})
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            with pytest.raises(ConfigError, match="share_weights"):
                edp.ingest(checked_batch(edp.world_rank, 0, 4))
        if edp.serves:
            edp.serve()
        edp.done()


class _Leave(Exception):
    """A rank leaving its with-block (caught outside it)."""


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("how", ["never", "left"])
def test_a_rank_that_never_calls_share_weights_ends_the_others_in_bounded_time(how: str):
    """``share_weights`` is collective; one rank never calls it. Before, the others waited
    forever in its Allgather. Now they raise: ``CollectiveFailed`` after
    ``run.timeout_s`` when the rank is silent ("never"; or RemoteFailure naming the first
    rank that gave up: it marks itself), ``RemoteFailure`` naming it at once when it
    left the data plane on an exception ("left")."""
    import time

    from conduit_hpc.errors import CollectiveFailed, RemoteFailure

    comm = MPI.COMM_WORLD
    timeout = 4.0
    cfg = make_config(layout={"learners": 1, "buffers": 1},
                      storage={"capacity_rows": 256}, run={"timeout_s": timeout},
                      checkpoint={"on_stop": False})
    skip = comm.size - 1  # an actor
    seen, t0 = "nothing", time.monotonic()
    try:
        with ExperienceDataPlane(cfg) as edp:
            if edp.world_rank == skip:
                if how == "never":
                    time.sleep(timeout + 3)  # the others have given up by now
                raise _Leave
            edp.share_weights(None if edp.serves else net())
            seen = "shared"
    except _Leave:
        seen = "left"
    except (CollectiveFailed, RemoteFailure) as err:
        seen = f"{type(err).__name__}: {err}"
    took = time.monotonic() - t0
    every = comm.allgather(seen)
    ok = seen == "left" if comm.rank == skip else (
        (how == "never" and gave_up(every, comm.rank, "share_weights()")) or
        (how == "left" and seen.startswith("RemoteFailure")
         and f"world rank {skip} left" in seen and took < timeout))
    assert comm.allreduce(int(ok), op=MPI.MIN), (comm.rank, seen, took)



@pytest.mark.mpi(min_size=3)
def test_batchnorm_statistics_reach_the_actors_and_a_resized_model_is_refused() -> None:
    """The actors' copy of a BatchNorm network: its running mean and variance (buffers,
    not parameters) stayed at their initial zeros and ones while the learner's moved,
    so an actor acting in eval mode normalized with other statistics than the learner's
    model. Now the floating-point buffers travel with the parameters. And a learner that
    replaces a layer after share_weights() got numpy's "could not broadcast" from the
    data-plane thread with the board's version left odd; now a ConfigError naming both
    sizes at its next_batch, before anything is written."""
    def bn_net() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                   torch.nn.Linear(8, 2))

    cfg = make_config(layout={"learners": 1, "buffers": 1}, storage={"capacity_rows": 4096},
                      scheduler={"mode": "sync", "batch_rows": 16, "min_fill_rows": 32,
                                 "weights_every": 1})
    model, stats, refused = bn_net(), None, ""
    with ExperienceDataPlane(cfg) as edp:
        edp.share_weights(None if edp.serves else model)
        if edp.role is Role.ACTOR:
            w = 0
            while not edp.should_stop:
                edp.ingest(checked_batch(edp.world_rank, w, 8))
                w += 8
                edp.pull_weights()
            # the learner's last publication came before its done(): under load the loop
            # could end (should_stop) before any pull after it - the test raced
            edp.pull_weights()
        elif edp.serves:
            edp.serve()
        else:
            g = torch.Generator().manual_seed(1)
            for _ in range(4):
                edp.next_batch()
                with torch.no_grad():  # train mode: the running statistics move
                    model(torch.randn(16, 4, generator=g) * 5 + 3)
            edp.next_batch()
            stats = [model[1].running_mean.tolist(), model[1].running_var.tolist()]
            model[2] = torch.nn.Linear(8, 3)  # another size than share_weights agreed
            try:
                edp.next_batch()
            except ConfigError as err:
                refused = str(err)
        edp.done()
        if edp.role is Role.ACTOR:
            stats = [model[1].running_mean.tolist(), model[1].running_var.tolist()]
    every = MPI.COMM_WORLD.allgather((edp.role.value, stats, refused))
    learner = next(s for r, s, _ in every if r == "learner")
    assert learner[0] != [0.0] * 8
    for role, s, text in every:
        if role == "actor":
            assert s[0] + s[1] == pytest.approx(learner[0] + learner[1]), every
        if role == "learner":
            assert "the shared model now has 99 parameter and buffer values; " \
                   "share_weights() agreed 90" in text, every


@pytest.mark.mpi(min_size=3)
def test_pull_weights_is_refused_on_a_learner_and_leaves_its_model() -> None:
    """A learner's pull_weights (job code shared by every role) would load the last
    publication into the model it trains: with weights_every = 10, after 15 steps its
    weights went back 5 updates, silently. It is refused, naming the role, and the model
    keeps its own weights; on actors it still loads the newest publication."""
    cfg = make_config(layout={"learners": 1, "buffers": 1}, storage={"capacity_rows": 1000},
                      scheduler={"mode": "sync", "batch_rows": 4, "min_fill_rows": 8,
                                 "weights_every": 10})
    model = net()
    with ExperienceDataPlane(cfg) as edp:
        edp.share_weights(None if edp.serves else model)
        if edp.role is Role.ACTOR:
            edp.ingest(checked_batch(edp.world_rank, 0, 64))
            edp.done()
        elif edp.serves:
            with pytest.raises(ConduitError, match=r"pull_weights\(\) is for actor ranks"):
                edp.pull_weights(net())
            edp.serve()
        else:
            for _ in range(15):
                edp.next_batch()
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(1.0)
            mine = flat_parameters(model).copy()
            with pytest.raises(ConduitError, match=rf"pull_weights\(\) is for actor ranks; "
                                                   rf"world rank {edp.world_rank} has the "
                                                   rf"role 'learner'"):
                edp.pull_weights()
            assert (flat_parameters(model) == mine).all()
            edp.done()


def uniform_version(model: torch.nn.Module) -> float | None:
    """The value every parameter holds (a publication of :func:`publish_steps`), or
    None when they differ (parameters of two publications)."""
    flat = flat_parameters(model)
    return float(flat[0]) if (flat == flat[0]).all() else None


@pytest.mark.mpi(min_size=3)
def test_pull_weights_loads_each_model_and_threads_take_turns() -> None:
    """The learner publishes every superstep a model whose parameters all hold the
    superstep's number. An actor's second model (a copy per env thread) loads the newest
    publication too (before: the board remembered the shared model's version, so any
    other model got False and kept its initial weights). Threads that pull at once into
    the shared model leave it holding one publication, the one policy_version names
    (checked between rounds, every thread at a barrier; before, a model was found with
    parameters of two publications)."""
    cfg = make_config(layout={"learners": 1, "buffers": 1}, storage={"capacity_rows": 1000},
                      scheduler={"mode": "sync", "batch_rows": 4, "min_fill_rows": 8,
                                 "weights_every": 1})

    def many() -> torch.nn.Module:
        return torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(40)])

    model = many()
    with ExperienceDataPlane(cfg) as edp:
        edp.share_weights(None if edp.serves else model)
        if edp.role is Role.ACTOR:
            edp.ingest(checked_batch(edp.world_rank, 0, 64))
            threads, bad, checks, stop = 4, [], [0], [False]
            rounds = threading.Barrier(threads)

            def work() -> None:
                while not stop[0]:
                    for _ in range(3):
                        edp.pull_weights()
                    if rounds.wait(timeout=60.0) == 0:  # every thread here: no load
                        checks[0] += 1
                        v = uniform_version(model)
                        if edp.policy_version > 0 and v != edp.policy_version + 2:
                            bad.append((v, edp.policy_version))
                        stop[0] = edp.should_stop
                    rounds.wait(timeout=60.0)

            pool = [threading.Thread(target=work) for _ in range(threads)]
            for th in pool:
                th.start()
            for th in pool:
                th.join()
            assert checks[0] > 0 and not bad, bad
            # the learner is done: nothing newer comes; a second model loads the newest
            edp.pull_weights()
            other = many()
            assert edp.pull_weights(other)
            assert uniform_version(other) == uniform_version(model) == 300.0
            assert not edp.pull_weights(other)
            edp.done()
        elif edp.serves:
            edp.serve()
        else:
            for s in range(1, 300):
                with torch.no_grad():
                    for p in model.parameters():
                        p.fill_(float(s + 1))  # published at superstep s - 1
                edp.next_batch()
            edp.done()


@pytest.mark.mpi(min_size=3)
def test_a_second_share_weights_is_refused_on_every_rank_and_the_first_board_stays() -> None:
    """share_weights() called twice (a job that calls it and also builds a
    DataPlaneReplayBuffer that does): before, the second call opened a second weights
    window and the first was never freed (one leak per call, on every rank). Now every
    rank refuses the second call before any collective, naming its world rank, and the
    first board goes on carrying the learner's updates to the actors."""
    cfg = make_config(layout={"learners": 1, "buffers": 1}, storage={"capacity_rows": 4096},
                      scheduler={"mode": "edp", "batch_rows": 16, "min_fill_rows": 32,
                                 "weights_every": 1})
    model, snapshots = net(), []
    with ExperienceDataPlane(cfg) as edp:
        mine = None if edp.serves else model
        edp.share_weights(mine)
        with pytest.raises(ConduitError, match=rf"share_weights\(\) was already called on "
                                               rf"world rank {edp.world_rank}; expected one"):
            edp.share_weights(mine)
        if edp.role is Role.ACTOR:
            wseq = 0
            while not edp.should_stop:
                edp.ingest(checked_batch(edp.world_rank, wseq, 8))
                wseq += 8
        elif edp.role is Role.LEARNER:
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(10):
                b = edp.next_batch()
                loss = model(b.data["payload"][:, :4].float() / 1e12).pow(2).mean() + \
                    sum(p.sum() for p in model.parameters())
                opt.zero_grad()
                loss.backward()
                opt.step()
                snapshots.append(flat_parameters(model).tolist())
        else:
            edp.serve()
        edp.done()
        if edp.role is Role.ACTOR:
            edp.pull_weights()
        got = edp.roles.world.allgather(
            (edp.role.value, edp.policy_version,
             snapshots if edp.role is Role.LEARNER else
             None if mine is None else flat_parameters(mine).tolist()))
    updates = next(p for r, _, p in got if r == "learner")
    for role, version, params in got:
        if role == "actor":  # a late publication reached it through the first board
            assert version >= 8 and params in updates[7:], (version, role)
