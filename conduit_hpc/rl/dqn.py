"""DQN hyperparameters (the ``[dqn]`` section) and the single-process Ape-X-style DQN.

:func:`train_single_process` is the baseline that ``conduit_hpc/bench/convergence.py``
compares the data-plane modes against: the same network, n-step returns, epsilon ladder, double-DQN
loss, actor-side initial priorities and target updates as the distributed job, with a
plain in-process :class:`~conduit_hpc.rl.replay.PrioritizedReplay` in place of the data
plane. Both read the algorithm's hyperparameters from one :class:`DQNSection`, and the
replay's semantics - batch, minimum fill, replay ratio, weight period, beta schedule,
capacity and priority exponent - from the job's ``[scheduler]`` and ``[storage]``
sections, their one source of truth (``scheduler.batch_rows``, ``min_fill_rows``,
``samples_per_insert``, ``weights_every``, ``beta*``; ``storage.capacity_rows``,
``priority_exponent``).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from conduit_hpc import jsontext
from conduit_hpc.config import SchedulerConfig, StorageConfig, require
from conduit_hpc.rl.episodes import EpisodeLog
from conduit_hpc.rl.exploration import epsilon_greedy
from conduit_hpc.rl.losses import initial_priorities
from conduit_hpc.rl.nstep import NStepAccumulator, true_next_obs
from conduit_hpc.rl.qnet import QNetwork, copy_weights
from conduit_hpc.rl.replay import PrioritizedReplay
from conduit_hpc.rl.section import DQNSection, check_env_id
from conduit_hpc.rl.updater import DQNUpdater
from conduit_hpc.sampling import beta_at

__all__ = ["DQNSection", "make_vector_env", "train_single_process", "updates_due"]


def updates_due(scheduler: SchedulerConfig, inserted: int) -> int:
    """Learner updates that should have happened once ``inserted`` rows went in: none
    before ``scheduler.min_fill_rows``, then ``samples_per_insert / batch_rows`` per row."""
    if inserted < scheduler.min_fill_rows:
        return 0
    return int((inserted - scheduler.min_fill_rows) * scheduler.samples_per_insert
               / scheduler.batch_rows) + 1


def make_vector_env(env_id: str, num_envs: int, seed: int) -> Any:
    """A synchronous Gymnasium vector env in ``SAME_STEP`` autoreset mode (the step
    that ends an episode returns the next episode's first observation and the final one
    in ``info["final_obs"]``), reset with seeds ``seed .. seed + num_envs - 1``.

    Returns:
        tuple: ``(env, first_obs)``.
    """
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    check_env_id(env_id)
    env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})
    obs, _ = env.reset(seed=[seed + i for i in range(num_envs)])  # type: ignore[arg-type]
    env.action_space.seed(seed)
    return env, obs


def _build_nets(hp: DQNSection, obs_dim: int, n_actions: int) -> tuple[QNetwork, QNetwork]:
    online = QNetwork(obs_dim, n_actions, hp.hidden, hp.dueling)
    actor = copy.deepcopy(online)
    for p in actor.parameters():
        p.requires_grad_(False)
    return online, actor


def train_single_process(hp: DQNSection, scheduler: SchedulerConfig, storage: StorageConfig,
                         *, seed: int = 0, run_dir: str | Path | None = None,
                         time_limit_s: float = 0.0, progress_every_s: float = 0.0
                         ) -> dict[str, Any]:
    """Train DQN in this process until the mean return of the last ``hp.window`` scored
    episodes (see ``score_max_epsilon``) reaches ``hp.target_return``,
    ``hp.max_env_steps`` run out, or
    ``time_limit_s`` (0 = none) passes.

    Not collective (no MPI); blocks for the whole training. With ``run_dir``, writes
    ``metrics/episodes.csv`` and ``metrics/summary.json`` there. The replay follows the
    job's sections: ``scheduler.batch_rows`` rows per update, the first update at
    ``scheduler.min_fill_rows`` rows, ``scheduler.samples_per_insert`` rows sampled per
    row inserted, weights copied to the actor every ``scheduler.weights_every`` updates,
    importance weights' beta from ``scheduler.beta`` to ``beta_final`` over
    ``beta_anneal_supersteps`` updates (as the data plane anneals it),
    ``storage.capacity_rows`` rows held, ``storage.priority_exponent`` as alpha.

    Raises:
        ConfigError: ``scheduler.samples_per_insert`` is 0 (the baseline paces its
            updates by it).
        ValueError: ``time_limit_s`` or ``progress_every_s`` not a finite number >= 0
            (a negative limit stopped after the first step, NaN never stopped).

    Returns:
        dict: ``reached`` (bool), ``env_steps`` (at the stop), ``env_steps_to_target``
        (``None`` unless reached), ``wall_s``, ``updates``, ``episodes``,
        ``final_mean_return``, ``seed``.
    """
    require(scheduler.samples_per_insert > 0, "scheduler.samples_per_insert",
            scheduler.samples_per_insert, "> 0 for the single-process baseline (it makes "
            "samples_per_insert / batch_rows updates per inserted row)")
    for name, v in (("time_limit_s", time_limit_s), ("progress_every_s", progress_every_s)):
        if not (isinstance(v, int | float) and 0 <= v < float("inf")):
            raise ValueError(f"{name} must be a finite number >= 0 (0: none), got {v!r}")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    env, obs = make_vector_env(hp.env_id, hp.num_envs, seed)
    obs_dim = int(np.prod(env.single_observation_space.shape))
    n_actions = int(env.single_action_space.n)
    online, actor = _build_nets(hp, obs_dim, n_actions)
    updater = DQNUpdater(hp, online)  # the distributed learner's update, target included
    replay = PrioritizedReplay({"obs": ((obs_dim,), "float32"), "action": ((), "int64"),
                                "reward": ((), "float32"), "next_obs": ((obs_dim,), "float32"),
                                "discount": ((), "float32")},
                               storage.capacity_rows, storage.priority_exponent)
    nstep = NStepAccumulator(hp.num_envs, hp.n_step, hp.gamma)
    eps = hp.epsilons()
    metrics = Path(run_dir) / "metrics" if run_dir is not None else None
    t0 = time.perf_counter()
    episodes = EpisodeLog(hp.num_envs, window=hp.window, t0=t0, epsilons=eps,
                          scored=hp.scored_slots(),
                          path=metrics / "episodes.csv" if metrics else None)
    env_steps = 0
    reached_at: int | None = None
    last_print = t0
    try:
        while env_steps < hp.max_env_steps:
            with torch.no_grad():
                q = actor(torch.as_tensor(obs, dtype=torch.float32)).numpy()
            action = epsilon_greedy(q, eps, rng)
            next_obs, reward, term, trunc, info = env.step(action)
            env_steps += hp.num_envs
            rows = nstep.push(obs, action, reward, true_next_obs(next_obs, info), term, trunc)
            obs = next_obs
            episodes.step(reward, term | trunc, env_steps)
            if len(rows["action"]):
                replay.add(rows, initial_priorities(actor, rows))
            while updater.updates < updates_due(scheduler, replay.inserted):
                beta = beta_at(updater.updates, scheduler.beta, scheduler.beta_final,
                               scheduler.beta_anneal_supersteps)
                sample = replay.sample(scheduler.batch_rows, beta, rng)
                _, td = updater.update(sample.batch, sample.weights)
                replay.update_priorities(sample.slots, sample.gens, td.abs().numpy() + 1e-6)
                if updater.updates % scheduler.weights_every == 0:
                    copy_weights(online, actor)
            if episodes.reached(hp.target_return):
                reached_at = env_steps
                break
            now = time.perf_counter()
            if progress_every_s and now - last_print >= progress_every_s:
                last_print = now
                print(f"[dqn seed {seed}] {env_steps:>7} env steps  "
                      f"{updater.updates:>6} updates  "
                      f"mean return (last {hp.window} scored) {episodes.mean_recent:6.1f}  "
                      f"{now - t0:6.1f} s", flush=True)
            if time_limit_s and now - t0 > time_limit_s:
                break
    finally:
        episodes.close()
        env.close()
    wall = time.perf_counter() - t0
    result = {"mode": "single-process", "seed": seed, "reached": reached_at is not None,
              "env_steps": env_steps,
              "env_steps_to_target": reached_at, "wall_s": wall, "updates": updater.updates,
              "episodes": episodes.count, "final_mean_return": episodes.mean_recent}
    if metrics is not None:
        (metrics / "summary.json").write_text(jsontext.dumps(result, indent=1) + "\n")
    return result
