"""Example job: random actions on CartPole-v1 through uniform replay (docs/writing-a-job.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np

from conduit_hpc import Config, ExperienceDataPlane, Role
from conduit_hpc.config import require
from conduit_hpc.job import job_main


@dataclass(frozen=True, slots=True, kw_only=True)
class ExampleSection:
    batches: int = 200  # [example] batches: learner supersteps before the job ends

    def __post_init__(self) -> None:  # ranges, checked when the config loads
        require(self.batches >= 1, "batches", self.batches, ">= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class ExampleConfig(Config):
    example: ExampleSection = field(default_factory=ExampleSection)


def run(cfg: ExampleConfig, run_dir: Path | None, resume: str) -> None:
    with ExperienceDataPlane(cfg, run_dir=run_dir) as edp:  # collective
        if edp.role is Role.ACTOR:
            env = gym.make("CartPole-v1")
            obs, _ = env.reset(seed=cfg.run.seed + edp.world_rank)
            while not edp.should_stop:  # until every learner is done
                action = env.action_space.sample()
                next_obs, reward, terminated, truncated, _ = env.step(action)
                edp.ingest({"obs": obs[None], "action": np.array([action]),
                            "reward": np.array([reward]), "next_obs": next_obs[None],
                            "done": np.array([terminated])})
                obs = env.reset()[0] if terminated or truncated else next_obs
        elif edp.serves:
            edp.serve()  # until everyone is done
        else:
            for _ in range(cfg.example.batches):
                batch = edp.next_batch()
                edp.log(mean_reward=float(batch.data["reward"].mean()))
            print(f"learner {edp.world_rank}: {cfg.example.batches} batches", flush=True)
        edp.done()


JOB_CONFIG = ExampleConfig  # the loader finds [example] here

if __name__ == "__main__":
    job_main(ExampleConfig, run)
