"""The TorchRL buffer on the data plane: collectors' TensorDicts in on actor ranks, the
loss's TensorDicts out on the learner rank (1 learner, 1 buffer, the rest actors)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import ConduitError, ExperienceDataPlane, Role
from conduit_hpc.testing import make_config

torch = pytest.importorskip("torch")

COMM = MPI.COMM_WORLD

# nested keys on purpose: ("next", "observation") is the field next__observation
SPEC = {"observation": {"dtype": "float32", "shape": [4]},
        "action": {"dtype": "int64", "shape": [2]},
        "next__observation": {"dtype": "float32", "shape": [4]},
        "next__done": {"dtype": "bool", "shape": [1]},
        "meta__writer": {"dtype": "int64"},
        "meta__seq": {"dtype": "int64"}}


@pytest.fixture(autouse=True)
def _extra() -> None:
    from extras import need_torchrl

    need_torchrl()


def rows_of(writer: int, first: int, n: int):
    """``n`` collector-like rows whose every entry is a function of (writer, seq)."""
    from tensordict import TensorDict

    seq = torch.arange(first, first + n, dtype=torch.int64)
    base = (writer * 100_000 + seq).to(torch.float32)
    obs = base[:, None] + torch.arange(4, dtype=torch.float32)
    act = torch.stack([seq % 2, 1 - seq % 2], dim=1)
    return TensorDict({"observation": obs, "action": act,
                       ("next", "observation"): obs + 0.5,
                       ("next", "done"): (seq % 5 == 0)[:, None],
                       ("meta", "writer"): torch.full((n,), writer, dtype=torch.int64),
                       ("meta", "seq"): seq,
                       ("collector", "traj_ids"): torch.zeros(n, dtype=torch.int64)},
                      batch_size=[n])


def check_rows(td) -> tuple[np.ndarray, np.ndarray]:
    """Every sampled row is exactly a row ``rows_of`` made (all entries agree)."""
    w, s = td.get(("meta", "writer")), td.get(("meta", "seq"))
    want = rows_of(0, 0, 1)  # for dtypes
    assert td.get("observation").dtype == want.get("observation").dtype
    assert td.get(("next", "done")).dtype == torch.bool
    for i in range(len(td)):
        ref = rows_of(int(w[i]), int(s[i]), 1)[0]
        for key in ("observation", "action", ("next", "observation"), ("next", "done")):
            assert torch.equal(td.get(key)[i], ref.get(key)), (key, int(w[i]), int(s[i]))
    return w.numpy(), s.numpy()


def config(mode: str, sampler: str = "prioritized", **scheduler):
    return make_config(spec=SPEC, layout={"learners": 1, "buffers": 1},
                       storage={"capacity_rows": 2048, "priority_exponent": 0.6},
                       scheduler={"mode": mode, "sampler": sampler, "batch_rows": 32,
                                  "prefetch_depth": 2, "min_fill_rows": 64, **scheduler})


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["edp", "sync", "service"])
def test_sampled_tensordicts_hold_exactly_rows_that_actors_extended(mode: str) -> None:
    from conduit_hpc.integrations.torchrl import WEIGHT_KEY, DataPlaneReplayBuffer

    cfg = config(mode)
    sampled: list[tuple[np.ndarray, np.ndarray]] = []
    extended = 0
    with ExperienceDataPlane(cfg) as edp:
        torch.manual_seed(edp.world_rank)  # different models: share_weights must align them
        model = torch.nn.Linear(4, 2) if not edp.serves else None
        rb = DataPlaneReplayBuffer(edp, model=model,
                                   exclude_keys=[("collector", "traj_ids")])
        if edp.role is Role.ACTOR:
            while not edp.should_stop and extended < 20_000:
                extended += rb.extend(rows_of(edp.world_rank, extended, 24))
            assert len(rb) >= min(extended, 2048) or edp.should_stop
            with pytest.raises(ConduitError, match="sample\\(\\) is for learner ranks"):
                rb.sample()
        elif edp.role is Role.LEARNER:
            with pytest.raises(ConduitError, match="extend\\(\\) is for actor ranks"):
                rb.extend(rows_of(0, 0, 4))
            for _ in range(15):
                td = rb.sample()
                assert td.batch_size == torch.Size([32])
                assert td.get("index").shape == (32, 3) and td.get(WEIGHT_KEY).shape == (32,)
                assert ("collector", "traj_ids") not in td.keys(include_nested=True)
                sampled.append(check_rows(td))
                td.set("td_error", torch.rand(32))
                rb.update_tensordict_priority(td)
            assert len(rb) >= 64
        else:
            edp.serve()
        edp.done()
        if edp.role is Role.LEARNER:  # iterating after done(): the mistake is named (it
            from conduit_hpc import UsedAfterClose  # ended silently, as if the actors

            with pytest.raises(UsedAfterClose, match="after done"):  # had finished)
                next(iter(rb))
        counts = edp.roles.world.allgather((edp.world_rank, extended))
        params = edp.roles.world.allgather(
            None if model is None else [p.detach().numpy().copy() for p in model.parameters()])
    made = dict(counts)
    for w, s in sampled:  # every row was extended by that actor, none made up
        for writer, seq in zip(w.tolist(), s.tolist(), strict=True):
            assert seq < made[writer], (writer, seq, made[writer])
    lead = params[0]  # world rank 0 is the learner
    for p in params[2:]:
        assert all(np.array_equal(a, b) for a, b in zip(p, lead, strict=True))
    if COMM.rank == 0:
        assert len(sampled) == 15


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("sampler", ["prioritized", "uniform"])
def test_update_tensordict_priority_changes_what_is_sampled(sampler: str) -> None:
    """Rows whose seq is a multiple of 8 get a large TD error, the others ~0: with the
    prioritized sampler later batches are nearly all such rows; with the uniform one
    (TorchRL's update is then a no-op) they stay about one in eight."""
    from conduit_hpc.integrations.torchrl import DataPlaneReplayBuffer

    cfg = config("edp", sampler, min_fill_rows=128)
    late = early = None
    with ExperienceDataPlane(cfg) as edp:
        rb = DataPlaneReplayBuffer(edp, share_weights=False,
                                   exclude_keys=[("collector", "traj_ids")])
        if edp.role is Role.ACTOR:
            per_actor = -(-128 // len(edp.roles.actor_ranks))
            rb.extend(rows_of(edp.world_rank, 0, per_actor))  # a fixed set, then done
        elif edp.role is Role.LEARNER:
            fractions = []
            for _ in range(40):
                td = rb.sample()
                _, seq = check_rows(td)
                favoured = seq % 8 == 0
                fractions.append(float(favoured.mean()))
                td.set("td_error", torch.from_numpy(np.where(favoured, 100.0, 0.0))[:, None])
                rb.update_tensordict_priority(td)
            early, late = fractions[0], float(np.mean(fractions[-10:]))
        else:
            edp.serve()
        edp.done()
        got = edp.roles.world.allgather((early, late))
    if not edp.serves:  # was TransportError 'window used after close()', naming no call
        from conduit_hpc import UsedAfterClose

        with pytest.raises(UsedAfterClose, match=rf"len\(\) called after close\(\) on "
                                                 rf"world rank {edp.world_rank}"):
            len(rb)
    early, late = got[0]
    assert early < 0.5  # before any update: about one in eight
    if sampler == "prioritized":
        assert late > 0.8, got[0]
    else:
        assert late < 0.5, got[0]


@pytest.mark.mpi(min_size=4)
@pytest.mark.skipif(COMM.size != 4, reason="one rank count (make test's time): a rule of "
                    "the config")
def test_the_torchrl_job_refuses_a_second_learner_on_every_rank() -> None:
    """jobs/torchrl_dqn_cartpole.py with layout.learners = 2 ran: the second learner
    trained a model of its own and, getting no episode reports, never saw the target
    return, so the job went on to run.duration_s after the lead had stopped. Now every
    rank raises the same ConfigError before the first collective of the job."""
    import sys

    from conduit_hpc import ConfigError
    from conduit_hpc.config import declared_config
    from conduit_hpc.testing import REPO

    path = REPO / "jobs" / "torchrl_dqn_cartpole.toml"
    cls, _ = declared_config(path)
    assert cls is not None
    cfg = cls.from_toml(path, ["layout.learners=2", "layout.actors=0", "run.duration_s=5",
                               "torchrl.max_updates=5", "torchrl.progress_every_s=0",
                               "scheduler.min_fill_rows=64", "run.timeout_s=30",
                               "checkpoint.on_stop=false"])
    with pytest.raises(ConfigError, match=r"one learner rank .* got 2 from \[layout\]"):
        sys.modules[cls.__module__].run_plane(cfg, None)
