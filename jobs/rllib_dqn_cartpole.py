"""RLlib's DQN on CartPole-v1 with its replay on the data plane (see the TOML file).

Rank 0 (the learner, which also ingests) runs RLlib's unchanged ``algo.train()`` loop;
its replay buffer is ``conduit_hpc.integrations.rllib.DataPlaneEpisodeReplayBuffer``.
The buffer rank serves the replay. RLlib's config is checked on every rank before any
collective and before Ray starts, so a bad key fails the whole job at once.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from conduit_hpc import Config, ConfigError, ExperienceDataPlane, Role, jsontext
from conduit_hpc.config import LaunchWorld
from conduit_hpc.config.checks import require
from conduit_hpc.job import job_main

#: what ``rllib.buffer_keys`` may set (``conduit_hpc.integrations.rllib.BUFFER_KEYS``
#: less the type and RLlib's own smoothing key)
BUFFER_EXTRA_KEYS = ("capacity", "alpha", "beta")


@dataclass(frozen=True, slots=True, kw_only=True)
class RllibSection:
    """``[rllib]``: RLlib's DQN hyperparameters and the stopping rule.

    Attributes:
        replay (str): ``"data_plane"`` or ``"rllib"`` (RLlib's own prioritized buffer,
            timed the same way: the baseline of ``conduit-hpc bench rllib``).
        buffer_keys (dict[str, float]): more ``replay_buffer_config`` keys (checked).
        target_return (float): stop once RLlib's smoothed mean return reaches it.
        max_env_steps (int): stop after this many env steps.
        gamma, n_step, lr, hidden, learning_starts, target_update_steps: RLlib DQN's
            ``gamma``, ``n_step``, ``lr``, ``fcnet_hiddens``,
            ``num_steps_sampled_before_learning_starts``, ``target_network_update_freq``.
        epsilon_steps, epsilon_final: epsilon falls linearly from 1 to ``epsilon_final``
            over ``epsilon_steps`` env steps.
        rollout_fragment_length (int): env steps per collection (and per update).
        smoothing_episodes (int): episodes RLlib's mean return is over.
    """

    replay: Literal["data_plane", "rllib"] = "data_plane"
    buffer_keys: dict[str, float] = field(default_factory=dict)
    target_return: float = 475.0
    max_env_steps: int = 200_000
    gamma: float = 0.99
    n_step: int = 1
    lr: float = 5e-4
    hidden: tuple[int, ...] = (64, 64)
    learning_starts: int = 1000
    target_update_steps: int = 500
    epsilon_steps: int = 10_000
    epsilon_final: float = 0.02
    rollout_fragment_length: int = 4
    smoothing_episodes: int = 20

    def __post_init__(self) -> None:
        # refused on the login node already (conduit-hpc run loads the config), without
        # importing Ray; check_algo_config checks the whole RLlib config again on the ranks
        for k, v in self.buffer_keys.items():
            if k not in BUFFER_EXTRA_KEYS:
                raise ConfigError(f"rllib.buffer_keys: replay_buffer_config.{k} is not a key "
                                  f"of the replay buffer (got {v!r}); expected one of "
                                  f"{', '.join(BUFFER_EXTRA_KEYS)}",
                                  key=f"replay_buffer_config.{k}")
        require(self.max_env_steps >= 1, "max_env_steps", self.max_env_steps, ">= 1")
        require(self.rollout_fragment_length >= 1, "rollout_fragment_length",
                self.rollout_fragment_length, ">= 1")
        require(math.isfinite(self.target_return), "target_return", self.target_return,
                "a finite number")
        # RLlib takes each of these as given and fails (or trains nonsense) on the ranks
        require(0 < self.gamma <= 1, "gamma", self.gamma, "in (0, 1]")
        require(self.n_step >= 1, "n_step", self.n_step, ">= 1")
        require(math.isfinite(self.lr) and self.lr > 0, "lr", self.lr,
                "a finite number > 0")
        require(all(h >= 1 for h in self.hidden), "hidden", self.hidden,
                "widths >= 1")
        require(self.learning_starts >= 0, "learning_starts", self.learning_starts,
                ">= 0")
        require(self.target_update_steps >= 0, "target_update_steps",
                self.target_update_steps, ">= 0")
        require(self.epsilon_steps >= 1, "epsilon_steps", self.epsilon_steps, ">= 1")
        require(0 <= self.epsilon_final <= 1, "epsilon_final", self.epsilon_final,
                "in [0, 1]")
        require(self.smoothing_episodes >= 1, "smoothing_episodes",
                self.smoothing_episodes, ">= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class RllibDQNConfig(Config):
    rllib: RllibSection = field(default_factory=RllibSection)

    def check_launch(self, world: LaunchWorld) -> None:
        """RLlib's ``fcnet_hiddens`` against a node's memory, before any rank starts."""
        Config.check_launch(self, world)
        from conduit_hpc.rl.section import require_network

        obs = self.spec.get("obs")
        require_network(world, "rllib.hidden", self.rllib.hidden,
                        math.prod(obs.shape) if obs is not None else 1)


def algo_config(cfg: RllibDQNConfig) -> Any:
    """RLlib's DQN config as a user writes it; only ``replay_buffer_config`` says where
    the replay is."""
    from ray.rllib.algorithms.dqn import DQNConfig

    from conduit_hpc.integrations.rllib import BASELINE_TYPE, BUFFER_TYPE

    hp = cfg.rllib
    buffer = {"type": BUFFER_TYPE if hp.replay == "data_plane" else BASELINE_TYPE,
              **hp.buffer_keys}
    if hp.replay == "rllib":  # RLlib's own buffer, sized like the data plane's
        buffer.update(capacity=cfg.storage.capacity_rows,
                      alpha=cfg.storage.priority_exponent, beta=cfg.scheduler.beta)
    return (DQNConfig()
            .environment("CartPole-v1")
            .env_runners(num_env_runners=0,
                         rollout_fragment_length=hp.rollout_fragment_length)
            .learners(num_learners=0)
            .training(replay_buffer_config=buffer, gamma=hp.gamma, n_step=hp.n_step,
                      lr=hp.lr, train_batch_size_per_learner=cfg.scheduler.batch_rows,
                      num_steps_sampled_before_learning_starts=hp.learning_starts,
                      target_network_update_freq=hp.target_update_steps,
                      epsilon=[[0, 1.0], [hp.epsilon_steps, hp.epsilon_final]])
            .rl_module(model_config={"fcnet_hiddens": list(hp.hidden)})
            .reporting(min_sample_timesteps_per_iteration=500,
                       metrics_num_episodes_for_smoothing=hp.smoothing_episodes)
            .debugging(seed=cfg.run.seed))


def train(cfg: RllibDQNConfig, edp: ExperienceDataPlane, dqn: Any) -> dict[str, Any]:
    """RLlib's own loop until the target return, the step budget or the time budget."""
    import numpy as np
    import torch

    from conduit_hpc.integrations.rllib import data_plane_for

    torch.set_num_threads(1)
    hp = cfg.rllib
    curve: list[tuple[int, float, float]] = []
    t0 = time.perf_counter()
    reached: tuple[int, float] | None = None
    with data_plane_for(edp, dqn) as times:
        t_ray = time.perf_counter()
        algo = dqn.build_algo()
        t_built = time.perf_counter()
        try:
            steps = 0
            while steps < hp.max_env_steps and time.perf_counter() - t0 < cfg.run.duration_s:
                er = algo.train()["env_runners"]
                steps = int(er.get("num_env_steps_sampled_lifetime", 0))
                ret = float(er.get("episode_return_mean", float("nan")))
                curve.append((steps, round(ret, 2), round(time.perf_counter() - t_built, 2)))
                print(f"env steps {steps}  mean return {ret:.1f}", flush=True)
                if ret >= hp.target_return:
                    reached = (steps, time.perf_counter() - t_built)
                    break
        finally:
            algo.stop()

    def med(xs: list[float], skip: int = 10) -> float:
        return float(np.median(xs[skip:] if len(xs) > 2 * skip else xs)) if xs else math.nan

    # per training step once learning started: its add, sample and update
    n = min(len(times.add_s), len(times.sample_s), len(times.update_s))
    exposed = [a + s + u for a, s, u in zip(times.add_s[len(times.add_s) - n:],
                                            times.sample_s[:n], times.update_s[:n],
                                            strict=True)]
    return {"replay": hp.replay, "mode": cfg.scheduler.mode, "seed": cfg.run.seed,
            "reached": reached is not None,
            "env_steps_to_target": reached[0] if reached else None,
            "seconds_to_target": round(reached[1], 2) if reached else None,
            "target_return": hp.target_return, "curve": curve,
            "best_return": max((r for _, r, _ in curve if r == r), default=math.nan),
            "iteration_ms": med(times.iteration_s) * 1e3,
            "exposed_sample_ms": med(times.sample_s) * 1e3,
            "exposed_fetch_ms": med(times.fetch_s) * 1e3,
            "exposed_path_ms": med(exposed) * 1e3,
            "add_ms": med(times.add_s) * 1e3, "update_ms": med(times.update_s) * 1e3,
            "train_steps": len(times.sample_s), "ray_start_s": round(t_ray - t0, 2),
            "build_s": round(t_built - t_ray, 2),
            "train_s": round(time.perf_counter() - t_built, 2)}


def run(cfg: RllibDQNConfig, run_dir: Path | None, resume: str) -> None:
    if resume:
        raise ConfigError("this job does not resume (RLlib's state is not checkpointed "
                          "here)", key="resume")
    from conduit_hpc.integrations.rllib import check_algo_config

    dqn = algo_config(cfg)
    check_algo_config(dqn, cfg)  # every rank, before any collective and before Ray
    with ExperienceDataPlane(cfg, run_dir=run_dir) as edp:
        idle = len(edp.roles.actor_ranks)  # layout.actors = 0 is "the rest of -n"
        if idle:  # every rank alike (the roles are agreed), before Ray or a collective
            raise ConfigError(f"this job runs on learner and buffer ranks only (RLlib's "
                              f"process collects), but -n leaves {idle} actor rank(s) with "
                              f"nothing to do; use -n {edp.roles.world.size - idle}",
                              key="layout.actors")
        if edp.serves:
            edp.serve()
        elif edp.role is Role.LEARNER:
            result = train(cfg, edp, dqn)
            edp.done()
            print("rllib-result " + jsontext.dumps({k: v for k, v in result.items()
                                                 if k != "curve"}), flush=True)
            if run_dir is not None:
                (run_dir / "rllib-result.json").write_text(jsontext.dumps(result, indent=1))
        edp.done()


JOB_CONFIG = RllibDQNConfig

if __name__ == "__main__":
    job_main(RllibDQNConfig, run)
