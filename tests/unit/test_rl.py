"""DQN building blocks against hand-computed values: the epsilon ladder, n-step targets
(termination vs truncation), the double-DQN target and loss, initial priorities, target
sync, prioritized replay, and a short real training run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from conduit_hpc.config import SchedulerConfig, StorageConfig
from conduit_hpc.errors import ConfigError
from conduit_hpc.rl import (
    DQNSection,
    EpisodeLog,
    NStepAccumulator,
    PrioritizedReplay,
    QNetwork,
    double_dqn_loss,
    double_dqn_targets,
    epsilon_greedy,
    epsilon_ladder,
    initial_priorities,
    make_vector_env,
    sync_target,
    to_tensors,
    train_single_process,
    true_next_obs,
    updates_due,
)

# ---------------------------------------------------------------------------------
# epsilon ladder


def test_epsilon_ladder_matches_hand_computed_values() -> None:
    # eps_i = 0.4 ** (1 + i / (N - 1) * 7): i=0 -> 0.4, i=N-1 -> 0.4**8 = 0.00065536
    np.testing.assert_allclose(epsilon_ladder(4, 0.4, 7.0),
                               [0.4, 0.04715560318259695, 0.005559127278786369, 0.00065536],
                               rtol=1e-12)
    np.testing.assert_allclose(epsilon_ladder(8), 0.4 ** np.arange(1, 9), rtol=1e-12)
    assert epsilon_ladder(1).tolist() == [0.4]
    np.testing.assert_allclose(epsilon_ladder(3, 0.5, 2.0), [0.5, 0.25, 0.125])
    assert (np.diff(epsilon_ladder(16)) < 0).all()


@pytest.mark.parametrize(("args", "fragment"), [
    ((0,), "n must be an integer >= 1, got 0"),
    ((4, 0.0), "eps must be a number in (0, 1], got 0.0"),
    ((4, 0.4, -1.0), "alpha must be a finite number >= 0")])
def test_epsilon_ladder_refuses_bad_values(args, fragment) -> None:
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")
                       .replace("]", r"\]")):
        epsilon_ladder(*args)


def test_epsilon_greedy_explores_at_each_rows_rate() -> None:
    rng = np.random.default_rng(0)
    q = np.tile([[0.0, 1.0, 0.5]], (20_000, 1))
    eps = np.repeat([0.0, 0.3, 1.0], [5000, 5000, 10_000])
    a = epsilon_greedy(q, eps, rng)
    assert (a[:5000] == 1).all()
    # exploring picks uniformly, so the greedy action still comes up 1/3 of the time
    assert abs((a[5000:10_000] != 1).mean() - 0.3 * 2 / 3) < 0.02
    assert abs(np.bincount(a[10_000:], minlength=3) / 10_000 - 1 / 3).max() < 0.02


# ---------------------------------------------------------------------------------
# n-step transitions


def obs(t: int) -> np.ndarray:
    return np.array([[float(t), -float(t)]], dtype=np.float32)


def push(acc: NStepAccumulator, t: int, reward: float, term: bool = False,
         trunc: bool = False) -> dict[str, np.ndarray]:
    return acc.push(obs(t), np.array([t % 2]), np.array([reward]), obs(t + 1),
                    np.array([term]), np.array([trunc]))


def test_n_step_returns_and_termination_by_hand() -> None:
    acc = NStepAccumulator(1, n=3, gamma=0.5)
    assert len(push(acc, 0, 1.0)["action"]) == 0
    assert len(push(acc, 1, 2.0)["action"]) == 0
    r = push(acc, 2, 3.0)  # first full window: 1 + 0.5*2 + 0.25*3
    assert r["reward"].tolist() == [2.75] and r["discount"].tolist() == [0.125]
    assert r["obs"][0, 0] == 0 and r["next_obs"][0, 0] == 3 and r["action"].tolist() == [0]
    r = push(acc, 3, 4.0)  # 2 + 0.5*3 + 0.25*4
    assert r["reward"].tolist() == [4.5] and r["next_obs"][0, 0] == 4
    r = push(acc, 4, 5.0, term=True)  # flush o2, o3, o4; no bootstrap after termination
    assert r["obs"][:, 0].tolist() == [2, 3, 4]
    assert r["reward"].tolist() == [3 + 0.5 * 4 + 0.25 * 5, 4 + 0.5 * 5, 5]
    assert r["discount"].tolist() == [0, 0, 0]
    assert (r["next_obs"][:, 0] == 5).all()
    assert acc.pending() == 0


def test_truncation_bootstraps_from_the_final_observation() -> None:
    acc = NStepAccumulator(1, n=3, gamma=0.5)
    push(acc, 0, 1.0)
    r = push(acc, 1, 2.0, trunc=True)  # time limit after two steps
    assert r["reward"].tolist() == [1 + 0.5 * 2, 2]
    assert r["discount"].tolist() == [0.25, 0.5]  # gamma^k, k steps to the final obs
    assert (r["next_obs"][:, 0] == 2).all()


def test_episode_shorter_than_n_and_n_equal_one() -> None:
    acc = NStepAccumulator(1, n=5, gamma=0.9)
    r = push(acc, 0, 1.0, term=True)
    assert r["reward"].tolist() == [1.0] and r["discount"].tolist() == [0.0]
    one = NStepAccumulator(1, n=1, gamma=0.9)
    r = push(one, 0, 2.0)
    assert r["reward"].tolist() == [2.0] and r["discount"].tolist() == [pytest.approx(0.9)]


def test_n_step_matches_a_direct_computation_on_random_episodes() -> None:
    """Several envs ending at different steps; every emitted row is checked against the
    n-step return computed from the whole recorded trajectory."""
    rng = np.random.default_rng(1)
    envs, n, g = 3, 4, 0.9
    acc = NStepAccumulator(envs, n, g)
    traj: list[list[tuple[float, bool, bool]]] = [[] for _ in range(envs)]
    episode = np.zeros(envs, dtype=np.int64)
    t_in_ep = np.zeros(envs, dtype=np.int64)
    rows = []
    for _ in range(200):
        o = np.stack([[float(episode[e]), float(t_in_ep[e])] for e in range(envs)])
        reward = rng.normal(size=envs)
        term = rng.random(envs) < 0.08
        trunc = ~term & (rng.random(envs) < 0.05)
        nxt = o + np.array([0.0, 1.0])
        for e in range(envs):
            traj[e].append((float(reward[e]), bool(term[e]), bool(trunc[e])))
        out = acc.push(o, np.zeros(envs, np.int64), reward, nxt, term, trunc)
        rows.append(out)
        for e in range(envs):
            if term[e] or trunc[e]:
                episode[e] += 1
                t_in_ep[e] = 0
                traj[e].append((np.nan, False, False))  # episode separator
            else:
                t_in_ep[e] += 1
    cols = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
    # split each env's records into episodes
    eps: list[list[list[tuple[float, bool, bool]]]] = []
    for e in range(envs):
        cur: list[list[tuple[float, bool, bool]]] = [[]]
        for rec in traj[e]:
            if np.isnan(rec[0]):
                cur.append([])
            else:
                cur[-1].append(rec)
        eps.append(cur)
    assert len(cols["reward"]) > 100
    for i in range(len(cols["reward"])):
        e, ep, t = int(cols["env"][i]), int(cols["obs"][i, 0]), int(cols["obs"][i, 1])
        steps = eps[e][ep]
        k = min(n, len(steps) - t)
        expected = sum(g ** j * steps[t + j][0] for j in range(k))
        ended = steps[t + k - 1]
        expected_disc = 0.0 if ended[1] else g ** k
        assert cols["reward"][i] == pytest.approx(expected, abs=1e-5)
        assert cols["discount"][i] == pytest.approx(expected_disc, abs=1e-6)
        assert cols["next_obs"][i, 1] == t + k
    # every complete step of every finished episode was emitted exactly once
    finished = sum(len(x) for e in range(envs) for x in eps[e][:-1])
    in_last = sum(len(eps[e][-1]) for e in range(envs))
    assert len(cols["reward"]) == finished + in_last - acc.pending()


def test_true_next_obs_takes_final_observations_from_a_real_vector_env() -> None:
    env, _o = make_vector_env("CartPole-v1", 2, seed=0)
    try:
        for _ in range(200):
            nxt, _, term, trunc, info = env.step(np.zeros(2, dtype=np.int64))
            fixed = true_next_obs(nxt, info)
            for e in np.flatnonzero(term | trunc):
                assert np.array_equal(fixed[e], info["final_obs"][e])
                assert not np.array_equal(fixed[e], nxt[e])  # nxt[e] is the reset obs
                return
            assert np.array_equal(fixed, nxt)
        pytest.fail("no episode ended in 200 steps of always-left CartPole")
    finally:
        env.close()


# ---------------------------------------------------------------------------------
# double DQN


class Table(nn.Module):
    """Q(s, .) = table[s] for one-hot states: values set by hand."""

    def __init__(self, table: list[list[float]]) -> None:
        super().__init__()
        self.lin = nn.Linear(len(table), len(table[0]), bias=False)
        with torch.no_grad():
            self.lin.weight.copy_(torch.tensor(table).T)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def onehot(states: list[int], n: int = 3) -> torch.Tensor:
    return torch.eye(n)[states]


def test_double_dqn_target_uses_online_argmax_and_target_value() -> None:
    online = Table([[0.0, 0.0], [1.0, 3.0], [5.0, 4.0]])
    target = Table([[0.0, 0.0], [10.0, 2.0], [7.0, 9.0]])
    y = double_dqn_targets(online, target, torch.tensor([1.0, 0.5]), onehot([1, 2]),
                           torch.tensor([0.9, 0.0]))
    # state 1: online argmax = 1 -> target value 2 (not the max 10): 1 + 0.9 * 2 = 2.8
    # state 2: discount 0 (terminated): just the reward
    assert y.tolist() == pytest.approx([2.8, 0.5])


def test_double_dqn_loss_weights_and_td_errors_by_hand() -> None:
    online = Table([[1.0, 2.0], [1.0, 3.0], [5.0, 4.0]])
    target = Table([[0.0, 0.0], [10.0, 2.0], [7.0, 9.0]])
    batch = {"obs": onehot([0, 0]), "action": torch.tensor([1, 0]),
             "reward": torch.tensor([1.0, 0.0]), "next_obs": onehot([1, 2]),
             "discount": torch.tensor([0.9, 0.5])}
    w = torch.tensor([1.0, 0.5])
    loss, td = double_dqn_loss(online, target, batch, w, huber_delta=1.0)
    # y = [1 + 0.9*2, 0 + 0.5*7] = [2.8, 3.5]; q = [2, 1]; td = [0.8, 2.5]
    assert td.tolist() == pytest.approx([0.8, 2.5])
    # huber(0.8) = 0.5*0.64 = 0.32; huber(2.5) = 2.5 - 0.5 = 2.0; weighted mean
    assert loss.item() == pytest.approx((1.0 * 0.32 + 0.5 * 2.0) / 2)
    loss.backward()
    assert online.lin.weight.grad is not None and target.lin.weight.grad is None
    sq, _ = double_dqn_loss(online, target, batch, None, huber_delta=float("inf"))
    assert sq.item() == pytest.approx((0.5 * 0.64 + 0.5 * 6.25) / 2)


def test_initial_priorities_are_abs_td_from_the_actors_network() -> None:
    net = Table([[1.0, 2.0], [1.0, 3.0], [5.0, 4.0]])
    batch = {"obs": np.eye(3, dtype=np.float32)[[0, 2]], "action": np.array([1, 0]),
             "reward": np.array([1.0, -1.0], np.float32),
             "next_obs": np.eye(3, dtype=np.float32)[[1, 1]],
             "discount": np.array([0.5, 0.0], np.float32)}
    p = initial_priorities(net, batch, floor=0.0)
    # row 0: 1 + 0.5 * max(1, 3) - 2 = 0.5; row 1: -1 + 0 - 5 = -6
    assert p.tolist() == pytest.approx([0.5, 6.0])


def test_target_sync_hard_and_soft() -> None:
    torch.manual_seed(0)
    a, b = QNetwork(4, 2, (8,)), QNetwork(4, 2, (8,))
    before = [p.clone() for p in b.parameters()]
    sync_target(a, b, tau=0.25)
    for pa, pb, p0 in zip(a.parameters(), b.parameters(), before, strict=True):
        assert torch.allclose(pb, 0.25 * pa + 0.75 * p0, atol=1e-6)
    sync_target(a, b)
    assert all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters(),
                                                     strict=True))
    with pytest.raises(ValueError, match="tau must be a number in"):
        sync_target(a, b, tau=0.0)


def test_q_network_shapes_and_dueling() -> None:
    q = QNetwork(4, 3, (16, 16), dueling=True)
    assert q(torch.zeros(5, 4)).shape == (5, 3)
    with pytest.raises(KeyError, match="needs column 'action'"):
        to_tensors({"obs": np.zeros((1, 4))})


# ---------------------------------------------------------------------------------
# prioritized replay


def columns() -> dict[str, tuple[tuple[int, ...], str]]:
    return {"x": ((), "int64")}


def test_replay_samples_in_proportion_to_priority_alpha() -> None:
    rb = PrioritizedReplay(columns(), capacity=4, alpha=0.5)
    rb.add({"x": np.arange(4)}, priorities=np.array([1.0, 4.0, 9.0, 16.0]))
    rng = np.random.default_rng(0)
    counts = np.zeros(4)
    for _ in range(200):
        s = rb.sample(50, beta=1.0, rng=rng)
        counts += np.bincount(s.batch["x"], minlength=4)
        # w = (N P)^-beta / max: P = sqrt(p) / 10 -> w proportional to 1 / sqrt(p)
        np.testing.assert_allclose(s.weights, 1.0 / np.sqrt([1, 4, 9, 16])[s.slots],
                                   rtol=1e-5)
    np.testing.assert_allclose(counts / counts.sum(), [0.1, 0.2, 0.3, 0.4], atol=0.01)


def test_replay_overwrites_oldest_and_drops_stale_priority_updates() -> None:
    rb = PrioritizedReplay(columns(), capacity=3, alpha=1.0)
    rb.add({"x": np.array([0, 1, 2])})
    s = rb.sample(3, beta=0.4, rng=np.random.default_rng(0))
    rb.add({"x": np.array([3])})  # overwrites slot 0 (row 0)
    assert len(rb) == 3 and rb.inserted == 4
    dropped = rb.update_priorities(s.slots, s.gens, np.full(3, 5.0))
    assert dropped == int((s.slots == 0).sum())
    with pytest.raises(ValueError, match="empty"):
        PrioritizedReplay(columns(), capacity=2).sample(1, 0.4, np.random.default_rng(0))


# ---------------------------------------------------------------------------------
# hyperparameters and a short real run


def test_dqn_section_names_bad_values() -> None:
    with pytest.raises(ConfigError, match=r"gamma must be in \[0, 1\], got 1.5"):
        DQNSection(gamma=1.5)
    sch = SchedulerConfig(batch_rows=64, min_fill_rows=1000, samples_per_insert=16.0,
                          max_insert_batch=64, error_buffer=2000.0)
    assert updates_due(sch, 999) == 0 and updates_due(sch, 1000) == 1
    assert updates_due(sch, 1004) == 2  # 16 / 64 updates per inserted row
    # non-finite values are refused by name (lr = inf trained on NaN weights before)
    for key, value in (("lr", float("inf")), ("lr", float("nan")),
                       ("epsilon_alpha", float("inf")), ("max_grad_norm", float("nan")),
                       ("huber_delta", float("inf")), ("target_return", float("nan"))):
        with pytest.raises(ConfigError, match=f"{key} must be"):
            DQNSection(**{key: value})
    DQNSection(target_return=float("inf"))  # never stop at a return: allowed


def test_an_unknown_env_id_is_refused_naming_the_key() -> None:
    from conduit_hpc.rl.section import check_env_id

    check_env_id("CartPole-v1")
    for bad in ("NoSuchEnv-v9", "CartPole-v99", "ALE/NoSuchGame-v5", ""):
        with pytest.raises(ConfigError, match=r"dqn\.env_id must be a registered") as exc:
            check_env_id(bad)
        assert exc.value.key == "dqn.env_id"


def test_episode_log_writes_the_episodes_csv(tmp_path) -> None:
    log = EpisodeLog(2, actor=3, path=tmp_path / "episodes.csv", window=2)
    log.step(np.array([1.0, 1.0]), np.array([False, True]), env_steps=2)
    log.step(np.array([1.0, 1.0]), np.array([True, False]), env_steps=4)
    log.close()
    lines = (tmp_path / "episodes.csv").read_text().splitlines()
    assert lines[0] == "time_s,env_steps,actor,episode_return"
    assert [ln.split(",")[1:] for ln in lines[1:]] == [["2", "3", "1"], ["4", "3", "2"]]
    assert log.mean_recent == 1.5 and log.reached(1.5) and not log.reached(2)


def test_only_near_greedy_slots_are_scored(tmp_path) -> None:
    hp = DQNSection(num_envs=8, score_max_epsilon=0.05)
    # ladder 0.4 ** (1 .. 8): 0.4, 0.16, 0.064, 0.0256, ... -> slots 3..7 scored
    assert hp.scored_slots().tolist() == [False] * 3 + [True] * 5
    assert DQNSection(num_envs=1).scored_slots().tolist() == [True]  # the least-exploring
    assert DQNSection(score_max_epsilon=1.0).scored_slots().all()
    log = EpisodeLog(2, path=tmp_path / "e.csv", window=2, epsilons=np.array([0.4, 0.01]),
                     scored=np.array([False, True]))
    log.step(np.array([1.0, 1.0]), np.array([True, False]), env_steps=2)  # explorer ends
    log.step(np.array([1.0, 1.0]), np.array([True, True]), env_steps=4)
    log.close()
    assert list(log.recent) == [2.0] and list(log.returns) == [1.0, 1.0, 2.0]
    lines = (tmp_path / "e.csv").read_text().splitlines()
    assert lines[0] == "time_s,env_steps,actor,episode_return,epsilon,scored"
    assert [ln.split(",")[3:] for ln in lines[1:]] == [["1", "0.4", "0"], ["1", "0.4", "0"],
                                                       ["2", "0.01", "1"]]


def test_short_single_process_run_trains_and_writes_metrics(tmp_path) -> None:
    torch.set_num_threads(1)
    hp = DQNSection(max_env_steps=2400)
    sch = SchedulerConfig(batch_rows=64, min_fill_rows=400, samples_per_insert=16.0,
                          max_insert_batch=64, error_buffer=2000.0, weights_every=10,
                          beta_anneal_supersteps=1000)
    with pytest.raises(ConfigError, match=r"scheduler\.samples_per_insert must be > 0"):
        train_single_process(hp, SchedulerConfig(), StorageConfig(), seed=0)
    result = train_single_process(hp, sch, StorageConfig(capacity_rows=5000), seed=0,
                                  run_dir=tmp_path)
    assert result["env_steps"] >= 2400 and result["updates"] > 200
    assert result["episodes"] > 10
    summary = json.loads((tmp_path / "metrics" / "summary.json").read_text())
    assert summary["updates"] == result["updates"]
    episodes = (tmp_path / "metrics" / "episodes.csv").read_text().splitlines()
    assert len(episodes) == result["episodes"] + 1


def test_episode_log_keeps_the_latest_episodes_and_counts_every_one(tmp_path) -> None:
    # every finished episode's return, env steps and env were kept (~80 bytes each) for
    # as long as the actor ran: short episodes on many envs grew it by GBs a day
    log = EpisodeLog(4, path=tmp_path / "e.csv", window=3)
    done = np.ones(4, bool)
    for step in range(3_000):  # 12,000 episodes of one step
        log.step(np.full(4, float(step)), done, env_steps=4 * (step + 1))
    log.close()
    assert len(log.returns) == len(log.steps_at) == len(log.envs) == 10_000  # the latest
    assert log.count == 12_000
    assert log.returns[-1] == 2_999.0 and log.steps_at[-1] == 12_000 and log.envs[-1] == 3
    assert list(log.recent) == [2_999.0] * 3 and log.mean_recent == 2_999.0
    # the file has every one
    assert len((tmp_path / "e.csv").read_text().splitlines()) == 1 + 12_000
    with pytest.raises(ValueError, match="keep must be an integer >= 1, got 0"):
        EpisodeLog(1, keep=0)
