"""DQN pieces against a hostile caller: the epsilon ladder and epsilon-greedy, the
double-DQN loss and initial priorities (columns that would broadcast or index wrongly),
and the updater's state loading (a refused state changes nothing)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conduit_hpc.config import SchedulerConfig, StorageConfig
from conduit_hpc.rl import (
    ApexActor,
    DQNSection,
    DQNUpdater,
    EpisodeLog,
    QNetwork,
    copy_weights,
    double_dqn_loss,
    epsilon_greedy,
    epsilon_ladder,
    initial_priorities,
    sync_target,
    to_tensors,
    train_single_process,
    true_next_obs,
)


@pytest.mark.parametrize("args, match", [
    ((3, 0.4, float("inf")), "alpha must be a finite number >= 0, got inf"),  # eps[0] NaN
    ((2.5,), "n must be an integer >= 1, got 2.5"),  # gave 3 epsilons
    ((True,), "n must be an integer >= 1, got True"),
    ((3, "0.4"), r"eps must be a number in \(0, 1\], got '0.4'"),
    ((3, float("nan")), r"eps must be a number in \(0, 1\], got nan"),
])
def test_a_ladder_of_bad_arguments_is_refused(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        epsilon_ladder(*args)


@pytest.mark.parametrize("q, eps, match", [
    (np.zeros((3, 2)), [0.1, 0.2], r"epsilons must have shape \(3,\)"),
    (np.zeros((3, 2)), [np.nan] * 3, r"epsilons\[0\] must be in \[0, 1\], got nan"),  # greedy
    (np.zeros((3, 2)), [0.1, 2.0, 0.1], r"epsilons\[1\] must be in \[0, 1\], got 2.0"),
    (np.zeros(3), [0.1] * 3, r"q_values must have shape \(rows, actions\)"),
    (np.zeros((3, 0)), [0.1] * 3, r"q_values must have shape \(rows, actions\)"),
])
def test_epsilon_greedy_refuses_bad_arguments(q: np.ndarray, eps: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        epsilon_greedy(q, np.asarray(eps), np.random.default_rng(0))


def test_epsilon_greedy_explores_at_each_rows_rate() -> None:
    rng = np.random.default_rng(3)
    q = np.tile([[0.0, 1.0, 0.0, 0.0]], (4, 1))
    eps = np.array([0.0, 0.2, 0.6, 1.0])
    draws = 20_000
    greedy = np.zeros(4)
    for _ in range(draws // 100):
        for _ in range(100):
            greedy += epsilon_greedy(q, eps, rng) == 1
    p = 1 - eps + eps / 4  # greedy chosen, or drawn at random
    sd = np.sqrt(draws * p * (1 - p))
    assert (np.abs(greedy - draws * p) <= 5 * sd + 1e-9).all(), greedy / draws


def nets() -> tuple[QNetwork, QNetwork, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    rows = 5
    batch = {"obs": torch.randn(rows, 4), "action": torch.randint(0, 2, (rows,)),
             "reward": torch.randn(rows), "next_obs": torch.randn(rows, 4),
             "discount": torch.full((rows,), 0.9)}
    return QNetwork(4, 2, (8,)), QNetwork(4, 2, (8,)), batch


@pytest.mark.parametrize("change, match", [
    # a (rows, 1) column made every TD error a rows x rows matrix, silently
    ({"reward": lambda b: b["reward"][:, None]}, r"reward must have shape \(5,\)"),
    ({"discount": lambda b: b["discount"][:, None]}, r"discount must have shape \(5,\)"),
    ({"weights": lambda b: torch.linspace(0.1, 1, 5)[:, None]}, r"weights must have shape"),
    ({"action": lambda b: b["action"][:, None]}, r"action must have shape \(5,\)"),
    ({"next_obs": lambda b: b["next_obs"][:3]}, "obs and next_obs must have one shape"),
    ({"action": lambda b: torch.tensor([0, 1, 2, 0, 1])}, r"action\[2\] must be in \[0, 2\)"),
    ({"action": lambda b: torch.tensor([0, -1, 1, 0, 1])}, r"action\[1\] must be in \[0, 2\)"),
    ({"reward": lambda b: torch.tensor([0, 0, 0, float("nan"), 0])}, r"reward\[3\] must be"),
    ({"discount": lambda b: torch.full((5,), 1.5)}, r"discount\[0\] must be in \[0, 1\]"),
    ({"weights": lambda b: torch.tensor([1, 1, -1.0, 1, 1])}, r"weights\[2\] must be finite"),
])
def test_the_loss_refuses_columns_that_would_broadcast_or_index_wrongly(
        change: dict, match: str) -> None:
    online, target, batch = nets()
    weights = None
    for k, f in change.items():
        if k == "weights":
            weights = f(batch)
        else:
            batch[k] = f(batch)
    with pytest.raises(ValueError, match=match):
        double_dqn_loss(online, target, batch, weights)


def test_the_weighted_loss_is_the_mean_of_weighted_rows_by_hand() -> None:
    online, target, batch = nets()
    w = torch.linspace(0.1, 1.0, 5)
    loss, td = double_dqn_loss(online, target, batch, w, huber_delta=float("inf"))
    assert loss.item() == pytest.approx(float((0.5 * td.pow(2) * w).mean()), rel=1e-6)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="huber_delta must be > 0"):
            double_dqn_loss(online, target, batch, w, huber_delta=bad)


def test_initial_priorities_refuse_a_bad_floor_columns_and_non_finite_errors() -> None:
    """A NaN floor (or a NaN Q-value) made NaN priorities, which a replay takes for "the
    running maximum"; a negative floor made negative ones; float actions were
    truncated."""
    online, _, batch = nets()
    rows = {k: v.numpy() for k, v in batch.items()}
    for floor in (float("nan"), -1.0, float("inf")):
        with pytest.raises(ValueError, match="floor must be a finite number >= 0"):
            initial_priorities(online, rows, floor=floor)
    with pytest.raises(ValueError, match=r"reward must have shape \(5,\)"):
        initial_priorities(online, {**rows, "reward": rows["reward"][:, None]})
    with pytest.raises(ValueError, match=r"action\[0\] must be an integer.*1.7"):
        to_tensors({**rows, "action": np.full(5, 1.7)})
    broken = QNetwork(4, 2, (8,))
    with torch.no_grad():
        broken.head.bias.fill_(float("nan"))
    with pytest.raises(ValueError, match="initial priority of row 0 is not finite"):
        initial_priorities(broken, rows)
    assert (initial_priorities(online, rows) >= 1e-6).all()


def trained() -> tuple[DQNUpdater, dict[str, np.ndarray]]:
    _, _, batch = nets()
    up = DQNUpdater(DQNSection(hidden=(8,), target_period=1), QNetwork(4, 2, (8,)))
    up.update(batch, None)
    return up, up.state_arrays()


@pytest.mark.parametrize("key, value, error, match", [
    # the online network was loaded before the target's shape failed
    ("target/body.0.weight", np.zeros((3, 3), np.float32), ValueError,
     r"'target/body.0.weight' has shape \(3, 3\), the network's has \(8, 4\)"),
    # taken, then the next update failed
    ("adam/body.0.weight/exp_avg", np.zeros((2, 2), np.float32), ValueError,
     r"'adam/body.0.weight/exp_avg' has shape \(2, 2\)"),
    ("updates", np.array([np.nan]), ValueError, "'updates' must be one integer >= 0"),
    ("updates", np.array([-5]), ValueError, "'updates' must be one integer >= 0"),
    ("adam/99/exp_avg", np.zeros(2), KeyError, "names no parameter"),  # ignored
    ("adam/head.bias/step", np.array([1.0, 2.0]), ValueError, "one finite step count"),
    ("online/head.bias", np.array(["a", "b"]), ValueError, "'online/head.bias': dtype"),
])
def test_a_refused_state_changes_nothing(key: str, value: np.ndarray, error: type,
                                         match: str) -> None:
    _, good = trained()
    other, _ = trained()
    other.update(nets()[2], None)
    before = other.state_arrays()
    with pytest.raises(error, match=match):
        other.load_state_arrays({**good, key: value})
    after = other.state_arrays()
    assert after.keys() == before.keys()
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    other.load_state_arrays(good)
    for k, v in other.state_arrays().items():
        np.testing.assert_array_equal(v, good[k], err_msg=k)
    other.update(nets()[2], None)  # the loaded state trains on


@pytest.mark.parametrize("reward, done, match", [
    (1.0, [False] * 3, r"reward must have shape \(3,\)"),  # added to every env
    ([1.0] * 3, True, r"done must have shape \(3,\)"),  # ended env 0's episode only
    ([1.0] * 3, [False, False, False, True], r"done must have shape \(3,\)"),  # IndexError
    ([np.nan, 0.0, 0.0], [True, False, False], r"reward\[0\] must be finite, got nan"),
])
def test_a_refused_episode_step_changes_nothing(reward: object, done: object, match: str
                                                ) -> None:
    log = EpisodeLog(3, window=1)
    log.step(np.ones(3), np.zeros(3, bool), 3)
    with pytest.raises(ValueError, match=match):
        log.step(reward, done, 6)
    assert log.step(np.ones(3), np.array([True, True, True]), 9) == [2.0, 2.0, 2.0]
    assert log.count == 3


@pytest.mark.parametrize("kwargs, match", [
    ({"window": 0}, "window must be an integer >= 1, got 0"),  # never reached
    ({"window": -1}, "window must be an integer >= 1, got -1"),
    ({"num_envs": 0}, "num_envs must be an integer >= 1, got 0"),
    ({"scored": [True]}, r"scored must have shape \(3,\)"),  # IndexError at env 1's end
    ({"epsilons": [0.1]}, r"epsilons must have shape \(3,\)"),
])
def test_an_episode_log_of_bad_arguments_is_refused(kwargs: dict, match: str) -> None:
    args = {"num_envs": 3, **kwargs}
    with pytest.raises(ValueError, match=match):
        EpisodeLog(args.pop("num_envs"), **args)


def test_true_next_obs_refuses_a_mask_of_another_length() -> None:
    info = {"_final_obs": np.array([False, True, True]),
            "final_obs": np.array([None, np.ones(2), np.ones(2)], dtype=object)}
    with pytest.raises(ValueError, match=r"info\['_final_obs'\] must have one flag per env"):
        true_next_obs(np.zeros((2, 2)), info)


@pytest.mark.parametrize("sync", [lambda a, b: sync_target(a, b, 0.5),
                                  lambda a, b: sync_target(a, b, 1.0), copy_weights])
@pytest.mark.parametrize("other", [lambda: QNetwork(4, 2, (8, 8)), lambda: QNetwork(4, 3, (8,)),
                                   lambda: QNetwork(4, 2, (8,), dueling=True)])
def test_syncing_networks_of_another_architecture_changes_nothing(sync, other) -> None:
    """Polyak averaging went parameter by parameter and failed at the first that did not
    fit (or broadcast into it), torch's load copied the entries that fit, then raised:
    the target was left half-updated."""
    torch.manual_seed(0)
    for src, dst in ((QNetwork(4, 2, (8,)), other()), (other(), QNetwork(4, 2, (8,)))):
        before = {k: v.clone() for k, v in dst.state_dict().items()}
        with pytest.raises(ValueError, match="networks differ at"):
            sync(src, dst)
        assert all(torch.equal(before[k], v) for k, v in dst.state_dict().items())
    a, b = QNetwork(4, 2, (8,)), QNetwork(4, 2, (8,))
    sync_target(a, b, np.float32(0.25))  # numpy numbers are numbers
    with pytest.raises(ValueError, match="tau must be a number in"):
        sync_target(a, b, "0.5")


@pytest.mark.parametrize("kwargs, match", [
    ({"reward_clip": -1.0}, "reward_clip must be a finite number >= 0"),  # unclipped
    ({"reward_clip": float("nan")}, "reward_clip must be a finite number >= 0"),
    ({"stream_field": "env", "stream_dtype": "uint8"}, "must be an integer type that holds "
                                                       "env slot 299"),  # 299 -> 43
    ({"stream_field": "env", "stream_dtype": "float32"}, "must be an integer type"),
])
def test_an_actor_of_bad_arguments_is_refused_before_its_envs_start(kwargs: dict,
                                                                     match: str) -> None:
    def make_env(k: int, seed: int) -> tuple:
        raise AssertionError("no env is made for a refused actor")

    hp = DQNSection(num_envs=300)
    with pytest.raises(ValueError, match=match):
        ApexActor(hp, QNetwork(4, 2, (8,)), actor_index=0, envs_per_actor=2, seed=0,
                  make_env=make_env, **kwargs)


@pytest.mark.parametrize("kwargs", [{"time_limit_s": -1.0}, {"time_limit_s": float("nan")},
                                    {"progress_every_s": float("inf")}])
def test_the_single_process_baseline_refuses_bad_limits(kwargs: dict) -> None:
    """A negative time limit stopped after the first step (as if converged too slowly),
    a NaN one never stopped."""
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=f"{name} must be a finite number >= 0"):
        sch = SchedulerConfig(batch_rows=64, min_fill_rows=1000, samples_per_insert=16.0,
                              max_insert_batch=64, error_buffer=2000.0)
        train_single_process(DQNSection(max_env_steps=8), sch, StorageConfig(), **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_loss_checks_values_on_either_path(dtype: torch.dtype) -> None:
    """float32 columns on the host are checked with numpy; bfloat16 ones (no numpy type)
    take the torch reductions a device uses."""
    online, target, batch = nets()
    batch = {**batch, "reward": batch["reward"].to(dtype), "discount":
             batch["discount"].to(dtype)}
    w = torch.ones(5, dtype=dtype)
    double_dqn_loss(online, target, batch, w)
    bad = {"action": torch.tensor([0, 1, 0, 2, 1]),
           "reward": torch.tensor([0, 0, float("inf"), 0, 0], dtype=dtype),
           "discount": torch.tensor([0.5, float("nan"), 0.5, 0.5, 0.5], dtype=dtype)}
    for name, value in bad.items():
        with pytest.raises(ValueError, match=f"{name}\\[\\d\\] must be"):
            double_dqn_loss(online, target, {**batch, name: value}, w)
    with pytest.raises(ValueError, match=r"weights\[4\] must be finite and >= 0"):
        double_dqn_loss(online, target, batch, torch.tensor([1, 1, 1, 1, -0.5], dtype=dtype))
