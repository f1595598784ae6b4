"""The Ape-X halves (conduit_hpc.rl.apex), the episode-file merge, and the DQN job's
config checks - without MPI."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conduit_hpc.errors import ConfigError
from conduit_hpc.rl import (
    ApexActor,
    DQNSection,
    DQNUpdater,
    EpisodeLog,
    QNetwork,
    double_dqn_loss,
    initial_priorities,
    merge_episode_files,
    to_tensors,
)
from conduit_hpc.testing import REPO


def load_job():  # jobs/ is not a package: load the job module from its file
    name = "dqn_cartpole_job"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "jobs" / "dqn_cartpole.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_actor_takes_its_slice_of_the_ladder_and_emits_prioritised_n_step_rows(
        tmp_path: Path) -> None:
    hp = DQNSection(num_envs=8, n_step=3)
    torch.manual_seed(0)
    net = QNetwork(4, 2, (16,))
    actor = ApexActor(hp, net, actor_index=2, envs_per_actor=2, seed=5,
                      episodes_path=tmp_path / "ep.csv", actor_id=7)
    assert np.allclose(actor.epsilons, hp.epsilons()[4:6])
    assert actor.scored.tolist() == hp.scored_slots()[4:6].tolist()
    rows = 0
    ended: list[float] = []
    for _ in range(60):
        out = actor.step()
        n = len(out.rows["action"])
        rows += n
        assert set(out.rows) == {"obs", "action", "reward", "next_obs", "discount"}
        assert out.priorities.shape == (n,) and (out.priorities > 0).all()
        if n:  # the priorities are the double-DQN |TD| under the actor's two networks
            want = initial_priorities(net, out.rows, target=actor.target)
            assert np.allclose(out.priorities, want)
        assert len(out.returns) == len(out.scored)
        ended += out.returns
    actor.close()
    assert actor.env_steps == 120
    # every env step becomes exactly one transition once its episode ended or n passed
    assert rows == actor.env_steps - actor.nstep.pending()
    assert ended and sum(ended) <= actor.env_steps
    lines = (tmp_path / "ep.csv").read_text().splitlines()
    assert len(lines) == 1 + len(ended) and lines[1].split(",")[2] == "7"


def test_actor_refreshes_its_target_only_when_the_learners_target_synced() -> None:
    hp = DQNSection(num_envs=2, target_period=100)
    net = QNetwork(4, 2, (8,))
    actor = ApexActor(hp, net, actor_index=0, envs_per_actor=2, seed=0)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    actor.weights_loaded(99)  # the learner's target has not synced yet
    assert not torch.equal(actor.target.head.weight, net.head.weight)
    actor.weights_loaded(100)
    assert torch.equal(actor.target.head.weight, net.head.weight)
    actor.close()
    with pytest.raises(ValueError, match="num_envs = 2"):
        ApexActor(hp, net, actor_index=1, envs_per_actor=2, seed=0)


def test_updater_matches_a_hand_written_step_and_syncs_the_target() -> None:
    hp = DQNSection(lr=1e-2, target_period=2, max_grad_norm=0.0)
    torch.manual_seed(1)
    net = QNetwork(4, 2, (8,))
    ref = QNetwork(4, 2, (8,))
    ref.load_state_dict(net.state_dict())
    ref_target = QNetwork(4, 2, (8,))
    ref_target.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    up = DQNUpdater(hp, net)
    rng = np.random.default_rng(0)
    batch = {"obs": rng.standard_normal((5, 4)).astype(np.float32),
             "action": rng.integers(0, 2, 5), "reward": np.ones(5, np.float32),
             "next_obs": rng.standard_normal((5, 4)).astype(np.float32),
             "discount": np.full(5, 0.9, np.float32)}
    w = np.linspace(0.5, 1.0, 5).astype(np.float32)
    loss, td = up.update(batch, w)
    want, want_td = double_dqn_loss(ref, ref_target, to_tensors(batch), torch.from_numpy(w))
    opt.zero_grad()
    want.backward()
    opt.step()
    assert loss == pytest.approx(float(want.detach())) and torch.allclose(td, want_td)
    assert torch.allclose(net.head.weight, ref.head.weight)
    assert not torch.equal(up.target.head.weight, net.head.weight)  # 1 update: no sync
    up.update(batch, w)
    assert up.updates == 2 and torch.equal(up.target.head.weight, net.head.weight)


def test_merge_orders_by_time_and_counts_the_jobs_env_steps(tmp_path: Path) -> None:
    for actor, times in ((2, [(0.1, 10), (0.5, 50)]), (3, [(0.3, 20)])):
        log = EpisodeLog(1, actor=actor, path=tmp_path / f"episodes-{actor}.csv",
                         epsilons=np.array([0.1]))
        for _t, steps in times:
            log.step(np.array([1.0]), np.array([True]), env_steps=steps)
        log.close()
        # fix the times so that the order is known
        path = tmp_path / f"episodes-{actor}.csv"
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        for r, (t, _) in zip(rows, times, strict=True):
            r["time_s"] = str(t)
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    assert merge_episode_files(tmp_path) == 3
    with open(tmp_path / "episodes.csv", newline="") as f:
        merged = list(csv.DictReader(f))
    assert [r["actor"] for r in merged] == ["2", "3", "2"]
    assert [int(r["env_steps"]) for r in merged] == [10, 30, 70]
    assert [int(r["actor_env_steps"]) for r in merged] == [10, 20, 50]
    assert {"epsilon", "scored"} <= set(merged[0])
    assert merge_episode_files(tmp_path / "nothing-here") == 0


def test_job_checks_layout_and_keeps_one_source_of_truth_per_knob() -> None:
    job = load_job()
    cfg = job.DQNCartPoleConfig.from_toml(REPO / "jobs" / "dqn_cartpole.toml")
    assert job.check_config(cfg, 4) == 2
    with pytest.raises(ConfigError, match=r"dqn\.num_envs must be a positive multiple"):
        job.check_config(cfg, 3)
    assert job.check_config(cfg, 4, 2) == 2  # several learners train data-parallel
    with pytest.raises(ConfigError, match=r"layout\.learners must be >= 1"):
        job.check_config(cfg, 4, 0)
    bad = job.DQNCartPoleConfig.from_toml(REPO / "jobs" / "dqn_cartpole.toml",
                                          ["scheduler.sampler=uniform"])
    with pytest.raises(ConfigError, match=r"scheduler\.sampler must be 'prioritized'"):
        job.check_config(bad, 4)
    # the replay's knobs live in [scheduler]/[storage] only: [dqn] twins are unknown keys
    for twin in ("batch_size", "learning_starts", "samples_per_insert", "actor_sync_period",
                 "priority_exponent", "replay_capacity", "beta_start"):
        with pytest.raises(ConfigError, match=f"unknown key 'dqn.{twin}'"):
            job.DQNCartPoleConfig.from_toml(REPO / "jobs" / "dqn_cartpole.toml",
                                            [f"dqn.{twin}=1"])
    with pytest.raises(ConfigError, match="max_supersteps"):
        job.DQNCartPoleConfig.from_toml(REPO / "jobs" / "dqn_cartpole.toml",
                                        ["job.max_supersteps=-1"])


def test_updater_state_round_trips_through_named_arrays() -> None:
    hp = DQNSection(target_period=3)
    torch.manual_seed(2)
    a = DQNUpdater(hp, QNetwork(4, 2, (8,)))
    rng = np.random.default_rng(1)
    batch = {"obs": rng.standard_normal((6, 4)).astype(np.float32),
             "action": rng.integers(0, 2, 6), "reward": np.ones(6, np.float32),
             "next_obs": rng.standard_normal((6, 4)).astype(np.float32),
             "discount": np.full(6, 0.9, np.float32)}
    for _ in range(4):
        a.update(batch, None)
    arrays = a.state_arrays()
    assert all(isinstance(v, np.ndarray) for v in arrays.values())
    b = DQNUpdater(hp, QNetwork(4, 2, (8,)))
    b.load_state_arrays(arrays)
    assert b.updates == 4
    # the next step is the same on both: networks, target and Adam moments came back
    la, _ = a.update(batch, None)
    lb, _ = b.update(batch, None)
    assert la == pytest.approx(lb)
    for pa, pb in zip(a.online.parameters(), b.online.parameters(), strict=True):
        assert torch.allclose(pa, pb)
    with pytest.raises(KeyError, match="online/"):
        b.load_state_arrays({k: v for k, v in arrays.items() if not k.startswith("online")})
