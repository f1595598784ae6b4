"""The RLlib integration's checks, before Ray starts (the ``[rllib]`` extra; skipped only
where it is missing and ``CI`` is unset). No MPI, no Ray instance: RLlib's config object
is plain Python."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from extras import need_extra

from conduit_hpc import Config, ConfigError

need_extra("rllib", "ray.rllib", module_level=True)

from ray.rllib.algorithms.dqn import DQNConfig  # noqa: E402

from conduit_hpc.config import declared_config  # noqa: E402
from conduit_hpc.integrations import rllib  # noqa: E402
from conduit_hpc.testing import REPO  # noqa: E402

JOB = REPO / "jobs" / "rllib_dqn_cartpole.toml"


def job_config(*sets: str) -> Config:
    cls, _ = declared_config(JOB)
    assert cls is not None
    return cls.from_toml(JOB, list(sets))


def algo(**buffer: object) -> DQNConfig:
    return (DQNConfig().environment("CartPole-v1").learners(num_learners=0)
            .training(replay_buffer_config={"type": rllib.BUFFER_TYPE, **buffer},
                      train_batch_size_per_learner=32,
                      num_steps_sampled_before_learning_starts=1000))


def test_the_jobs_config_passes() -> None:
    rllib.check_algo_config(algo(), job_config())
    rllib.check_algo_config(algo(capacity=50000, alpha=0.6, beta=0.4), job_config())


@pytest.mark.parametrize(("make", "key"), [
    (lambda: algo(bogus_key=1), "replay_buffer_config.bogus_key"),
    (lambda: algo(capacity=10), "replay_buffer_config.capacity"),
    (lambda: algo(alpha=1.0), "replay_buffer_config.alpha"),
    (lambda: algo().training(n_step=(1, 3)), "n_step"),
    (lambda: algo().training(train_batch_size_per_learner=64),
     "train_batch_size_per_learner"),
    (lambda: algo().training(num_steps_sampled_before_learning_starts=100),
     "scheduler.min_fill_rows"),
    (lambda: algo().rl_module(model_config={"use_lstm": True}), "model_config"),
    # values RLlib's setters take as they are: each named, never a raw TypeError
    (lambda: algo().training(replay_buffer_config=None), "replay_buffer_config"),
    (lambda: algo().training(replay_buffer_config=["type"]), "replay_buffer_config"),
    (lambda: algo(capacity=10**400), "replay_buffer_config.capacity"),
    (lambda: algo().training(num_steps_sampled_before_learning_starts=None),
     "num_steps_sampled_before_learning_starts"),
    (lambda: algo().training(num_steps_sampled_before_learning_starts="1000"),
     "num_steps_sampled_before_learning_starts"),
    # accepted before: RLlib refused the old stack after Ray started (suggesting another
    # buffer), a multi-agent DQN failed at its first add(), and gamma None, "0.99" or
    # 2.0 reached the n-step sums (None: a TypeError in data_plane_for)
    (lambda: algo().api_stack(enable_rl_module_and_learner=False,
                              enable_env_runner_and_connector_v2=False),
     "enable_env_runner_and_connector_v2"),
    (lambda: algo().multi_agent(policies={"p0", "p1"},
                                policy_mapping_fn=lambda aid, *a, **k: "p0"), "policies"),
    (lambda: algo().training(gamma=None), "gamma"),
    (lambda: algo().training(gamma="0.99"), "gamma"),
    (lambda: algo().training(gamma=2.0), "gamma"),
])
def test_a_bad_rllib_config_is_refused_naming_the_key(make, key) -> None:
    with pytest.raises(ConfigError) as err:
        rllib.check_algo_config(make(), job_config())
    assert err.value.key == key and key.split(".")[-1] in str(err.value)


def test_the_buffer_type_and_layout_are_checked() -> None:
    other = DQNConfig().training(replay_buffer_config={"type": "EpisodeReplayBuffer"},
                                 train_batch_size_per_learner=32)
    with pytest.raises(ConfigError, match=r"replay_buffer_config\.type"):
        rllib.check_algo_config(other, job_config())
    with pytest.raises(ConfigError, match="learners_ingest"):
        rllib.check_algo_config(algo(), job_config("layout.learners_ingest=false",
                                                   "layout.actors=1"))
    # RLlib's own buffer (the benchmark's baseline) takes RLlib's keys
    base = algo().training(replay_buffer_config={"type": rllib.BASELINE_TYPE,
                                                 "capacity": 7, "alpha": 1.0})
    rllib.check_algo_config(base, job_config())


def test_the_buffer_refuses_an_unknown_key_and_a_build_outside_a_job() -> None:
    with pytest.raises(ConfigError, match=r"replay_buffer_config\.bogus"):
        rllib.DataPlaneEpisodeReplayBuffer(capacity=10, bogus=1)
    with pytest.raises(ConfigError, match="data_plane_for"):
        rllib.DataPlaneEpisodeReplayBuffer(capacity=10)


def test_the_job_refuses_a_bad_buffer_key_on_the_login_node() -> None:
    with pytest.raises(ConfigError, match=r"replay_buffer_config\.nope"):
        job_config("rllib.buffer_keys={nope = 1.0}")
    cls, _ = declared_config(JOB)
    assert cls is not None
    assert set(sys.modules[cls.__module__].BUFFER_EXTRA_KEYS) <= set(rllib.BUFFER_KEYS)



@pytest.mark.parametrize(("override", "key"), [
    ("rllib.gamma=nan", "rllib.gamma"),        # ran, then sample(gamma=nan) refused
    ("rllib.gamma=0", "rllib.gamma"),
    ("rllib.n_step=0", "rllib.n_step"),        # refused on the ranks only
    ("rllib.lr=-1", "rllib.lr"),               # trained uphill until the time budget
    ("rllib.lr=inf", "rllib.lr"),
    ("rllib.hidden=[0]", "rllib.hidden"),      # IndexError in RLlib on the learner rank
    ("rllib.learning_starts=-1", "rllib.learning_starts"),
    ("rllib.target_update_steps=-1", "rllib.target_update_steps"),
    ("rllib.epsilon_steps=0", "rllib.epsilon_steps"),
    ("rllib.epsilon_final=2", "rllib.epsilon_final"),  # epsilon beyond 1: ran
    ("rllib.epsilon_final=nan", "rllib.epsilon_final"),
    ("rllib.smoothing_episodes=0", "rllib.smoothing_episodes"),
    ("rllib.max_env_steps=0", "rllib.max_env_steps"),  # was named rllib.rllib.max_env_steps
])
def test_the_job_refuses_bad_hyperparameters_on_the_login_node(override, key) -> None:
    """Every [rllib] number RLlib takes as given is checked when the config loads (before
    mpirun), naming the key and the value."""
    with pytest.raises(ConfigError, match=rf": {key} must be .*, got "):
        job_config(override)

def chunks(steps: int, cut_at: tuple[int, ...], terminated: bool):
    """One RLlib episode of ``steps`` steps (observation t = [t]*4, reward t+1, action
    t % 2) handed over in chunks, cut as RLlib's env runner cuts them."""
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    ep = SingleAgentEpisode()
    ep.add_env_reset(np.zeros(4, np.float32))
    out = []
    for t in range(steps):
        last = t == steps - 1
        ep.add_env_step(np.full(4, t + 1, np.float32), t % 2, float(t + 1),
                        terminated=last and terminated, truncated=last and not terminated)
        if t + 1 in cut_at and not last:
            out.append(ep)
            ep = ep.cut()
    out.append(ep)
    return out


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("terminated", [True, False])
def test_episode_chunks_become_the_n_step_transitions_rllib_would_sample(n, terminated):
    asm = rllib.NStepAssembler(n, gamma=0.5)
    parts = [asm.add([c]) for c in chunks(7, (2, 3, 5), terminated)]
    got = {k: np.concatenate([p[k] for p in parts if p is not None]) for k in rllib.SPEC_FIELDS}
    steps = 7 - n + 1  # RLlib never samples a step whose t + n lies past the end
    assert got["obs"][:, 0].tolist() == list(range(steps))
    assert got["next_obs"][:, 0].tolist() == [t + n for t in range(steps)]
    assert got["action"].tolist() == [t % 2 for t in range(steps)]
    want = [sum(0.5 ** k * (t + k + 1) for k in range(n)) for t in range(steps)]
    assert np.allclose(got["reward"], want)
    assert got["terminated"].tolist() == [terminated and t == steps - 1 for t in range(steps)]
    assert (got["n_step"] == n).all() and not asm.open  # the finished episode is forgotten


def test_the_buffer_refuses_bad_priorities_episodes_and_state_naming_them() -> None:
    """Before: a scalar TD error was TypeError ('has no len()'), a tensor that requires
    grad torch's RuntimeError, complex TD errors lost their imaginary part, a non-episode
    in add() an AttributeError, and set_state took 'abc' (ValueError from int()), -5 and
    None (AttributeError). Now each is a ValueError naming what was expected, and a
    refused update keeps the batch's indices for a good one."""
    from types import SimpleNamespace

    import torch

    from conduit_hpc.errors import SpecError
    from conduit_hpc.testing import make_config

    sent: list[np.ndarray] = []
    edp = SimpleNamespace(
        config=make_config(spec={"obs": {"dtype": "float32"}}, scheduler={"batch_rows": 4},
                           layout={"learners": 1, "buffers": 1}),
        update_priorities=lambda idx, p: sent.append(p))
    rllib._ACTIVE.append(rllib._Active(edp, 0.99, 1, rllib.PathTimes()))
    try:
        rb = rllib.DataPlaneEpisodeReplayBuffer()
    finally:
        rllib._ACTIVE.pop()
    rb._last = np.zeros((4, 3), np.int64)  # as after sample()
    for bad in (1.0, None, "abcd", np.ones(3), np.ones((4, 2)), np.ones(4) * 1j):
        with pytest.raises(SpecError, match=r"update_priorities: priorities"):
            rb.update_priorities(bad)
    rb.update_priorities(-2 * torch.ones(4, requires_grad=True))
    np.testing.assert_array_equal(sent[0], [2.0] * 4)
    for bad in ([1, 2], None):
        with pytest.raises(SpecError, match="add\\(\\) takes RLlib SingleAgentEpisode"):
            rb.add(bad)
    for bad in ({"added": "abc"}, {"sampled": -5}, {"added": True}, None):
        with pytest.raises(ValueError, match="set_state"):
            rb.set_state(bad)
    rb.set_state({"added": 7, "sampled": np.int64(3)})
    assert rb.get_state() == {"added": 7, "sampled": 3}


@pytest.mark.parametrize("kwargs", [{"num_items": 0}, {"batch_size_B": 0},
                                    {"n_step": 0}])
def test_sample_refuses_a_zero_size_instead_of_taking_the_default(kwargs) -> None:
    """sample(num_items=0) (or batch_size_B, n_step = 0) was read as "the default" by
    an ``or`` and served a full batch. (batch_length_T = 0 is RLlib's own "no time
    axis": its DQN passes it, ``tests/launch/test_rllib.py``.)"""
    from types import SimpleNamespace

    from conduit_hpc.testing import make_config

    edp = SimpleNamespace(config=make_config(spec={"obs": {"dtype": "float32"}},
                                             scheduler={"batch_rows": 4},
                                             layout={"learners": 1, "buffers": 1}))
    rllib._ACTIVE.append(rllib._Active(edp, 0.99, 1, rllib.PathTimes()))
    try:
        rb = rllib.DataPlaneEpisodeReplayBuffer()
    finally:
        rllib._ACTIVE.pop()
    with pytest.raises(ConfigError, match=r"sample\((num_items|n_step)=0\)"):
        rb.sample(**kwargs, gamma=0.99)


def plane_stub(**more):
    """What the buffer reads of a data plane, without MPI (batch of 4 rows)."""
    from types import SimpleNamespace

    from conduit_hpc.testing import make_config

    return SimpleNamespace(config=make_config(spec={"obs": {"dtype": "float32"}},
                                              scheduler={"batch_rows": 4, "beta": 0.4},
                                              layout={"learners": 1, "buffers": 1}), **more)


def stub_buffer(edp) -> rllib.DataPlaneEpisodeReplayBuffer:
    rllib._ACTIVE.append(rllib._Active(edp, 0.99, 1, rllib.PathTimes()))
    try:
        return rllib.DataPlaneEpisodeReplayBuffer()
    finally:
        rllib._ACTIVE.pop()


def four_rows():
    """A Batch as next_batch() gives one (4 rows of the SPEC_FIELDS)."""
    from types import SimpleNamespace

    import torch

    data = {"obs": torch.zeros(4, 4), "next_obs": torch.ones(4, 4),
            "action": torch.zeros(4, dtype=torch.int64), "reward": torch.ones(4),
            "terminated": torch.zeros(4, dtype=torch.bool),
            "n_step": torch.ones(4, dtype=torch.int64)}
    return SimpleNamespace(data=data, weights=torch.ones(4),
                           indices=np.arange(12, dtype=np.int64).reshape(4, 3))


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"beta": 1.0}, "beta"),                    # served scheduler.beta's weights silently
    ({"lookback": 1}, "lookback"),              # a stateful module's: silently none
    ({"min_batch_length_T": 5}, "min_batch_length_T"),
    ({"bogus": 1}, "bogus"),                    # any other keyword: silently ignored
])
def test_sample_refuses_what_it_would_ignore_naming_it(kwargs, key) -> None:
    edp = plane_stub(next_batch=four_rows)
    rb = stub_buffer(edp)
    with pytest.raises(ConfigError) as err:
        rb.sample(4, gamma=0.99, **kwargs)
    assert err.value.key == key and f"sample({key}=" in str(err.value)
    # what RLlib's DQN passes (its beta, 0 for a stateless module) is served
    got = rb.sample(num_items=4, n_step=1, batch_length_T=0, lookback=0, min_batch_length_T=0,
                    gamma=0.99, beta=0.4 + 1e-12, sample_episodes=True)
    assert len(got) == 4


def test_update_priorities_without_a_sample_to_update_is_refused() -> None:
    """Before a sample and after the sample's update, update_priorities returned without
    a word (RLlib's own buffer fails an assertion there): the TD errors were dropped."""
    from conduit_hpc.errors import SpecError

    sent: list[np.ndarray] = []
    edp = plane_stub(next_batch=four_rows, update_priorities=lambda i, p: sent.append(p))
    rb = stub_buffer(edp)
    with pytest.raises(SpecError, match=r"4 values but no sample to update \(before the "
                                        r"first sample\(\)"):
        rb.update_priorities(np.ones(4))
    rb.update_priorities(np.ones(0))  # nothing to update: RLlib's buffer takes it too
    rb.sample(4, gamma=0.99)
    rb.update_priorities(np.full(4, 2.0))
    with pytest.raises(SpecError, match=r"a second update of one sample"):
        rb.update_priorities(np.full(4, 3.0))
    assert len(sent) == 1 and sent[0].tolist() == [2.0] * 4


def test_a_refused_add_stores_nothing_and_loses_no_pending_step() -> None:
    """An add() whose rows the data plane refused (a wrong observation shape, say) had
    already counted them as added and moved its episodes' pending steps on: once the
    caller mended the chunk and added it again, the steps of the refused call were
    gone. Now a refused add leaves both as they were."""
    from conduit_hpc.errors import SpecError

    stored: list[dict[str, np.ndarray]] = []
    refuse = [True]

    def ingest(batch):
        if refuse[0]:
            raise SpecError("field 'obs': refused")
        stored.append(batch)

    rb = stub_buffer(plane_stub(ingest=ingest))
    parts = chunks(7, (3,), True)
    with pytest.raises(SpecError, match="refused"):
        rb.add(parts[0])
    assert rb.get_added_timesteps() == 0 and not rb.assembler.open and not stored
    refuse[0] = False
    for p in parts:
        rb.add(p)
    assert np.concatenate([b["obs"][:, 0] for b in stored]).tolist() == list(range(7))
    assert rb.get_added_timesteps() == 7


def test_data_plane_for_refuses_a_ray_the_script_started_and_leaves_it_running() -> None:
    """An RLlib script that calls ray.init() itself (as RLlib's examples do) got Ray's
    RuntimeError ("Maybe you called ray.init twice by accident?") from data_plane_for,
    whose clean-up then shut the script's own Ray down. Now a ConfigError says what to
    drop, before anything is started or stopped."""
    from types import SimpleNamespace

    import ray

    from conduit_hpc import Role

    edp = SimpleNamespace(role=Role.LEARNER, world_rank=0, config=job_config())
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        with pytest.raises(ConfigError, match=r"Ray is already running in this process") \
                as err, rllib.data_plane_for(edp, algo()):  # type: ignore[arg-type]
            pass
        assert err.value.key == "ray.init" and ray.is_initialized() and not rllib._ACTIVE
    finally:
        ray.shutdown()
