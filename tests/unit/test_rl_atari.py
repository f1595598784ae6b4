"""The Atari pieces of conduit_hpc.rl: the Nature CNN's shapes, uint8 n-step rows, clipped
rewards, the [atari] section's checks, and (with the [atari] extra) a real preprocessed
ALE env."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conduit_hpc.errors import ConfigError
from conduit_hpc.rl import (
    ApexActor,
    AtariSection,
    DQNSection,
    NatureQNetwork,
    NStepAccumulator,
    double_dqn_loss,
    initial_priorities,
    to_tensors,
)


def test_nature_cnn_shapes_and_parameter_count() -> None:
    net = NatureQNetwork((4, 84, 84), 6)
    assert net.features == 64 * 7 * 7  # 84 -> 20 -> 9 -> 7
    assert [m.out_channels for m in net.torso if isinstance(m, torch.nn.Conv2d)] == [32, 64, 64]
    assert [m.kernel_size for m in net.torso if isinstance(m, torch.nn.Conv2d)] == [
        (8, 8), (4, 4), (3, 3)]
    assert [m.stride for m in net.torso if isinstance(m, torch.nn.Conv2d)] == [
        (4, 4), (2, 2), (1, 1)]
    # conv 4*32*64+32, 32*64*16+64, 64*64*9+64; fc 3136*512+512; head 512*6+6
    assert sum(p.numel() for p in net.parameters()) == (
        8224 + 32832 + 36928 + 1606144 + 3078)
    pixels = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    q = net(pixels)
    assert q.shape == (5, 6) and q.dtype == torch.float32
    # uint8 pixels and the same pixels as floats give the same values (scaled inside)
    torch.testing.assert_close(q, net(pixels.float()))
    dueling = NatureQNetwork((2, 36, 36), 3, hidden=(16, 8), dueling=True)
    assert dueling.features == 64 and dueling(torch.zeros(1, 2, 36, 36)).shape == (1, 3)


@pytest.mark.parametrize("shape", [(84, 84), (4, 35, 84), (0, 84, 84)])
def test_nature_cnn_refuses_bad_shapes(shape) -> None:
    with pytest.raises(ValueError, match="obs_shape"):
        NatureQNetwork(shape, 6)


def test_nstep_keeps_uint8_frames_and_the_loss_runs_on_them() -> None:
    acc = NStepAccumulator(2, 2, 0.9, obs_dtype="uint8")
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (2, 4, 36, 36), dtype=np.uint8) for _ in range(4)]
    out = [acc.push(frames[t], np.array([0, 1]), np.array([1.0, -1.0]), frames[t + 1],
                    np.zeros(2, bool), np.zeros(2, bool)) for t in range(3)]
    assert len(out[0]["action"]) == 0 and out[0]["obs"].dtype == np.uint8
    rows = out[1]
    assert rows["obs"].dtype == np.uint8 and rows["next_obs"].dtype == np.uint8
    np.testing.assert_array_equal(rows["obs"], frames[0])
    np.testing.assert_array_equal(rows["next_obs"], frames[2])
    np.testing.assert_allclose(rows["reward"], [1.9, -1.9])
    batch = {k: rows[k] for k in ("obs", "action", "reward", "next_obs", "discount")}
    net = NatureQNetwork((4, 36, 36), 2, hidden=(16,))
    loss, td = double_dqn_loss(net, net, to_tensors(batch))
    assert torch.isfinite(loss) and td.shape == (2,)
    assert initial_priorities(net, batch).shape == (2,)


def test_atari_section_names_bad_values() -> None:
    assert AtariSection().obs_shape == (4, 84, 84)
    for key, value in [("frame_skip", 0), ("frame_stack", 0), ("screen_size", 20),
                       ("sticky_actions", 1.5), ("reward_clip", -1.0), ("noop_max", -1),
                       ("max_episode_frames", 0),
                       ("max_episode_frames", 2**31)]:  # ALE's setInt raised TypeError
        with pytest.raises(ConfigError, match=key) as err:
            AtariSection(**{key: value})
        assert err.value.key == key
    for key, value in [("frame_skip", 1.5), ("terminal_on_life_loss", 1)]:  # by hand:
        with pytest.raises(ConfigError, match=f"{key} must be a"):  # was accepted (then
            AtariSection(**{key: value})  # ALE's setInt raised TypeError on the ranks)
    with pytest.raises(ConfigError, match=r"n_step must be an integer, got 2\.0"):
        DQNSection(n_step=2.0)


class _FakeVectorEnv:
    """Two envs of 4x36x36 uint8 frames whose reward is 5, ending every third step."""

    def __init__(self) -> None:
        self.t = 0

    def step(self, action):
        self.t += 1
        done = np.full(2, self.t % 3 == 0)
        obs = np.full((2, 4, 36, 36), self.t, np.uint8)
        return obs, np.array([5.0, -5.0]), done, np.zeros(2, bool), {}

    def close(self) -> None:
        pass


def test_apex_actor_clips_rewards_for_replay_but_logs_raw_returns() -> None:
    hp = DQNSection(num_envs=2, n_step=1, gamma=0.5, window=1)
    net = NatureQNetwork((4, 36, 36), 3, hidden=(8,))
    actor = ApexActor(hp, net, actor_index=0, envs_per_actor=2, seed=0,
                      make_env=lambda n, seed: (_FakeVectorEnv(),
                                                np.zeros((n, 4, 36, 36), np.uint8)),
                      obs_dtype="uint8", reward_clip=1.0)
    outs = [actor.step() for _ in range(3)]
    assert outs[0].rows["obs"].dtype == np.uint8
    np.testing.assert_array_equal(outs[0].rows["reward"], [1.0, -1.0])  # clipped
    assert sorted(outs[2].returns) == [-15.0, 15.0]  # the game's score, unclipped
    actor.close()


def test_a_real_preprocessed_ale_env() -> None:
    from extras import need_extra

    need_extra("atari", "ale_py", "cv2")
    from conduit_hpc.rl import make_atari_vector_env

    env, obs = make_atari_vector_env("ALE/Pong-v5", 2, 0, AtariSection())
    try:
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
        nxt, *_ = env.step(np.array([0, 1]))
        assert nxt.shape == (2, 4, 84, 84) and nxt.dtype == np.uint8
        # the stack moved on by one frame: the newest frame of obs is now the one before
        np.testing.assert_array_equal(nxt[:, 2], obs[:, 3])
        assert int(env.single_action_space.n) == 6
    finally:
        env.close()


@pytest.mark.parametrize(("dtype", "num_envs", "ok"), [
    ("int32", 6, True), ("uint8", 256, True), ("int8", 129, False), ("uint8", 257, False)])
def test_the_atari_jobs_stream_field_of_any_integer_type_that_holds_every_env_slot(
        dtype: str, num_envs: int, ok: bool) -> None:
    """jobs/apex_atari.py with ``[spec.env]`` (the frame stacks' stream) of another integer
    type: the actors' rows carry the env slot in that type, so ingest takes them; a type
    too small for ``dqn.num_envs`` slots is refused when the config is checked, naming
    the field (before: accepted, and every actor's first ingest raised a SpecError)."""
    import sys
    from pathlib import Path

    from conduit_hpc.config import tomllib
    from conduit_hpc.spec import Spec

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    try:
        import jobs.apex_atari as job
    finally:
        sys.path.remove(str(root))
    raw = tomllib.loads((root / "jobs" / "apex_atari.toml").read_text())
    raw["spec"]["env"]["dtype"] = dtype
    raw["dqn"]["num_envs"] = num_envs
    # a step of 256 envs may ingest 256 x n_step rows at once (rl.check_actor_batch)
    raw["scheduler"].update(max_insert_batch=4096, error_buffer=65536)
    cfg = job.ApexAtariConfig.from_dict(raw)
    actors = 1 if num_envs % 3 else 3
    if not ok:
        with pytest.raises(ConfigError, match=rf"spec\.env\.dtype .* {num_envs - 1}.* "
                                              rf"got {dtype}") as err:
            job.check_config(cfg, actors, 1)
        assert err.value.key == "spec.env.dtype"
        return
    assert job.check_config(cfg, actors, 1) == num_envs // actors
    hp = DQNSection(num_envs=2, n_step=1, gamma=0.5, window=1)
    actor = ApexActor(hp, NatureQNetwork((4, 36, 36), 3, hidden=(8,)), actor_index=0,
                      envs_per_actor=2, seed=0,
                      make_env=lambda n, seed: (_FakeVectorEnv(),
                                                np.zeros((n, 4, 36, 36), np.uint8)),
                      obs_dtype="uint8", stream_field="env", stream_dtype=dtype)
    rows = [actor.step().rows for _ in range(3)][-1]
    actor.close()
    spec = Spec.from_config(cfg.spec)
    batch = spec.empty(len(rows["env"]))
    batch["env"] = rows["env"]
    assert spec.validate(batch)["env"].dtype == np.dtype(dtype)


@pytest.mark.parametrize(("sets", "key"), [
    (["spec.obs.stack.stream=action"], "spec.obs.stack.stream"),  # actions became env slots
    (["spec.obs.stack.stream=slot", "spec.slot.dtype=int64"], "spec.env"),  # env unwritten
    (["spec.extra.dtype=int64"], "spec.extra"),
    (["spec.action.dtype=int32"], "spec.action"),
    (["spec.reward.shape=[2]"], "spec.reward"),
])
def test_the_atari_jobs_spec_must_fit_the_rows_its_actors_write(sets: list[str],
                                                                 key: str) -> None:
    """``conduit-hpc run jobs/apex_atari.toml --set ...`` of a spec the actors' rows do not
    fit: refused before launch naming the field (before: accepted; every ingest then
    failed on the actor ranks, or, with the stream set to ``action``, the actors wrote
    env slots over the actions and the learner trained on them)."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    try:
        import jobs.apex_atari as job
    finally:
        sys.path.remove(str(root))
    cfg = job.ApexAtariConfig.from_toml(root / "jobs" / "apex_atari.toml", sets)
    with pytest.raises(ConfigError, match=rf"^{key} must ") as err:
        job.check_config(cfg, 3, 1)
    assert err.value.key == key
    assert job.check_config(job.ApexAtariConfig.from_toml(
        root / "jobs" / "apex_atari.toml", ["spec.reward.dtype=float64"]), 3, 1) == 2
