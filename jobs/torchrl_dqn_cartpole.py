"""TorchRL's DQN on Gymnasium CartPole-v1, with the data plane as its replay buffer.

Everything but the buffer is TorchRL's (0.14): ``GymEnv("CartPole-v1")`` with
``RewardSum``, ``QValueActor(MLP)`` and ``EGreedyModule``, a ``Collector`` (TorchRL's
new name for ``SyncDataCollector``), ``DQNLoss`` (double DQN, importance-weighted by
``priority_weight``) and ``HardUpdate`` / ``SoftUpdate``. Collectors run on the actor
ranks, the loss on the learner rank, the replay on the buffer rank.

A plain one-process TorchRL script and this job differ in the buffer (and in which rank
runs which loop)::

    -rb = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, batch_size=64,
    -                                       storage=LazyTensorStorage(100_000))
    +edp = ExperienceDataPlane(cfg, run_dir=run_dir)        # [storage], [scheduler]
    +rb = DataPlaneReplayBuffer(edp, model=actor, exclude_keys=EXCLUDED)
     for data in collector:                                  # actor ranks
         rb.extend(data)
     ...
     td = rb.sample()                                        # learner rank
     loss_td = loss(td); loss_td["loss"].backward(); optim.step(); optim.zero_grad()
     rb.update_tensordict_priority(td)
     target_updater.step()

With ``torchrl.single_process = true`` the same script runs that plain loop in one
process (no MPI) on TorchRL's own prioritized buffer (numpy trees where TorchRL's C++
extension does not load; see :mod:`conduit_hpc.integrations.torchrl_fallback`), with the
replay's numbers from the same ``[storage]`` and ``[scheduler]``: the baseline of
``conduit-hpc bench torchrl``.

The run ends when the mean return of the last ``torchrl.window`` episodes (all actors,
epsilon-greedy as collected) reaches ``torchrl.target_return``, or when
``max_env_steps``, ``max_updates`` or ``run.duration_s`` is spent. Actors send their
finished episodes to the learner (``EPISODES_TAG``), which decides; the others follow
(``edp.should_stop``, the end of ``serve()``). ``metrics/summary.json`` holds the
headline numbers: env steps and wall time to the target, updates per second, and per
update the mean iteration time and the time in ``sample()`` + priority update
(``exposed_mean_s``), measured the same way in every mode.

    conduit-hpc run jobs/torchrl_dqn_cartpole.toml [--mode edp|sync|service]
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from conduit_hpc import Config, ConfigError, ExperienceDataPlane, Role, jsontext
from conduit_hpc.config import LaunchWorld, require
from conduit_hpc.job import job_main
from conduit_hpc.plane.metrics import write_summary
from conduit_hpc.rl import EPISODES_TAG
from conduit_hpc.rl.section import require_network

try:  # the [torchrl] extra; without it the config class still loads (conduit-hpc info)
    from tensordict.nn import TensorDictSequential
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv, RewardSum, TransformedEnv
    from torchrl.modules import MLP, EGreedyModule, QValueActor
    from torchrl.objectives import DQNLoss, HardUpdate, SoftUpdate

    from conduit_hpc.integrations.torchrl import DataPlaneReplayBuffer
    from conduit_hpc.integrations.torchrl_fallback import torchrl_prioritized_buffer
    MISSING = ""
except ImportError as err:
    MISSING = (f"jobs/torchrl_dqn_cartpole needs the [torchrl] extra (pip install "
               f"'conduit-hpc[torchrl]'): {err}")

#: collector entries that DQNLoss does not read (not stored)
EXCLUDED = ("done", "terminated", "truncated", ("next", "truncated"), "episode_reward",
            ("next", "episode_reward"), ("collector", "traj_ids"), "action_value",
            "chosen_action_value")


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchRLSection:
    """``[torchrl]``: the algorithm (the replay's numbers are in ``[scheduler]`` and
    ``[storage]``).

    Attributes:
        hidden (tuple[int, ...]): MLP widths.
        lr (float): Adam's learning rate.
        gamma (float): discount.
        double_dqn (bool): DQNLoss's double-DQN target.
        target_update_period (int): HardUpdate every this many updates (0: SoftUpdate).
        tau (float): SoftUpdate's rate (when ``target_update_period = 0``).
        max_grad_norm (float): gradient clipping.
        frames_per_batch (int): env steps per collector batch (per actor).
        eps_init, eps_end (float): epsilon-greedy, annealed over ``annealing_frames``
            env steps of each collector.
        target_return (float): mean return that ends the run.
        window (int): episodes in that mean.
        max_env_steps (int): env-step budget (all actors).
        max_updates (int): update budget (0: none).
        progress_every_s (float): seconds between progress lines (0: none).
        single_process (bool): run the plain TorchRL loop in one process on TorchRL's
            own buffer, without the data plane.
    """

    hidden: tuple[int, ...] = (256, 256)
    lr: float = 2.3e-3
    gamma: float = 0.99
    double_dqn: bool = True
    target_update_period: int = 10
    tau: float = 0.005
    max_grad_norm: float = 10.0
    frames_per_batch: int = 16
    eps_init: float = 1.0
    eps_end: float = 0.04
    annealing_frames: int = 4000
    target_return: float = 475.0
    window: int = 20
    max_env_steps: int = 150_000
    max_updates: int = 0
    progress_every_s: float = 5.0
    single_process: bool = False

    def __post_init__(self) -> None:
        require(bool(self.hidden) and all(h > 0 for h in self.hidden), "hidden",
                self.hidden, "positive widths")
        require(0 < self.lr < 1, "lr", self.lr, "in (0, 1)")
        require(0 < self.gamma <= 1, "gamma", self.gamma, "in (0, 1]")
        require(self.target_update_period >= 0, "target_update_period",
                self.target_update_period, ">= 0")
        require(0 < self.tau <= 1, "tau", self.tau, "in (0, 1]")
        require(self.max_grad_norm > 0, "max_grad_norm", self.max_grad_norm, "> 0")
        require(self.frames_per_batch >= 1, "frames_per_batch", self.frames_per_batch, ">= 1")
        require(0 <= self.eps_init <= 1, "eps_init", self.eps_init, "in [0, 1]")
        require(0 <= self.eps_end <= self.eps_init, "eps_end", self.eps_end,
                f"in [0, eps_init = {self.eps_init}]")
        require(not math.isnan(self.target_return), "target_return", self.target_return,
                "a number (NaN is never reached)")
        require(self.annealing_frames >= 1, "annealing_frames", self.annealing_frames, ">= 1")
        require(self.window >= 1, "window", self.window, ">= 1")
        require(self.max_env_steps >= 1, "max_env_steps", self.max_env_steps, ">= 1")
        require(self.max_updates >= 0, "max_updates", self.max_updates, ">= 0")
        require(math.isfinite(self.progress_every_s) and self.progress_every_s >= 0,
                "progress_every_s", self.progress_every_s, ">= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchRLDQNConfig(Config):
    torchrl: TorchRLSection = field(default_factory=TorchRLSection)

    def check_launch(self, world: LaunchWorld) -> None:
        """The Q network's widths against a node's memory, before any rank starts."""
        Config.check_launch(self, world)
        obs = self.spec.get("observation")
        require_network(world, "torchrl.hidden", self.torchrl.hidden,
                        math.prod(obs.shape) if obs is not None else 1)


# ---------------------------------------------------------------------------------
# TorchRL pieces, the same in every mode


def make_env(seed: int) -> TransformedEnv:
    env = TransformedEnv(GymEnv("CartPole-v1"), RewardSum())
    env.set_seed(seed)
    return env


def make_actor(env: TransformedEnv, hp: TorchRLSection, seed: int) -> QValueActor:
    """The Q network: the same initial weights on every rank (seeded)."""
    torch.manual_seed(seed)
    net = MLP(out_features=env.action_spec.shape[-1], num_cells=list(hp.hidden),
              activation_class=torch.nn.ReLU)
    actor = QValueActor(net, in_keys=["observation"], spec=env.action_spec)
    actor(env.reset())  # materialise lazy layers
    return actor


def make_collector(env: TransformedEnv, actor: QValueActor,
                   hp: TorchRLSection) -> tuple[Collector, EGreedyModule]:
    greedy = EGreedyModule(env.action_spec, annealing_num_steps=hp.annealing_frames,
                           eps_init=hp.eps_init, eps_end=hp.eps_end)
    policy = TensorDictSequential(actor, greedy)
    return Collector(env, policy, frames_per_batch=hp.frames_per_batch,
                     total_frames=-1), greedy


class Trainer:
    """DQNLoss, Adam and the target updater; one :meth:`step` per sampled batch."""

    def __init__(self, env: TransformedEnv, actor: QValueActor, hp: TorchRLSection) -> None:
        self.hp = hp
        self.loss = DQNLoss(actor, action_space=env.action_spec, delay_value=True,
                            double_dqn=hp.double_dqn)
        self.loss.make_value_estimator(gamma=hp.gamma)
        self.optim = torch.optim.Adam(self.loss.parameters(), lr=hp.lr)
        self.target = (HardUpdate(self.loss, value_network_update_interval=hp.target_update_period)
                       if hp.target_update_period else SoftUpdate(self.loss, tau=hp.tau))
        self.updates = 0
        self.sample_s: list[float] = []
        self.iteration_s: list[float] = []
        self._last = 0.0

    def step(self, rb: Any) -> float:
        t0 = time.perf_counter()
        td = rb.sample()
        t1 = time.perf_counter()
        loss = self.loss(td)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.loss.parameters(), self.hp.max_grad_norm)
        self.optim.step()
        self.optim.zero_grad()
        t2 = time.perf_counter()
        rb.update_tensordict_priority(td)
        self.target.step()
        t3 = time.perf_counter()
        self.sample_s.append(t1 - t0 + t3 - t2)
        if self._last:
            self.iteration_s.append(t3 - self._last)
        self._last = t3
        self.updates += 1
        return float(loss.detach())


class Referee:
    """The mean return of the last ``window`` episodes and the env steps spent."""

    def __init__(self, hp: TorchRLSection) -> None:
        self.hp = hp
        self.recent: deque[float] = deque(maxlen=hp.window)
        self.steps: dict[int, int] = {}
        self.episodes = 0
        self.reached_at: int | None = None
        self.reached_after_s: float | None = None
        self.t0 = time.perf_counter()

    @property
    def env_steps(self) -> int:
        return sum(self.steps.values())

    @property
    def mean(self) -> float:
        return float(np.mean(self.recent)) if self.recent else math.nan

    def record(self, source: int, env_steps: int, returns: Any) -> None:
        self.steps[source] = env_steps
        for r in returns:
            self.episodes += 1
            self.recent.append(float(r))
            if (self.reached_at is None and len(self.recent) == self.hp.window
                    and self.mean >= self.hp.target_return):
                self.reached_at = self.env_steps
                self.reached_after_s = time.perf_counter() - self.t0

    def why_stop(self, updates: int, t0: float, duration_s: float) -> str:
        if self.reached_at is not None:
            return "target"
        if self.env_steps >= self.hp.max_env_steps:
            return "env-step budget"
        if self.hp.max_updates and updates >= self.hp.max_updates:
            return "update budget"
        if duration_s and time.perf_counter() - t0 >= duration_s:
            return "time budget"
        return ""


def finished_returns(data: Any) -> np.ndarray:
    done = data.get(("next", "done")).reshape(-1)
    return data.get(("next", "episode_reward")).reshape(-1)[done].numpy()


def progress(tag: str, ref: Referee, tr: Trainer, t0: float) -> None:
    print(f"[torchrl {tag}] {time.perf_counter() - t0:6.1f} s  env steps "
          f"{ref.env_steps:>7,}  mean-{ref.hp.window} return {ref.mean:6.1f}  "
          f"updates {tr.updates:>6,}", flush=True)


# ---------------------------------------------------------------------------------
# on the data plane


def actor_loop(edp: ExperienceDataPlane, rb: DataPlaneReplayBuffer, env: TransformedEnv,
               actor: QValueActor, hp: TorchRLSection) -> dict[str, Any]:
    collector, greedy = make_collector(env, actor, hp)
    lead = edp.roles.learner_ranks[0]
    steps = 0
    try:
        for data in collector:
            if edp.should_stop:
                break
            rb.extend(data)
            greedy.step(data.numel())
            steps += data.numel()
            msg = np.array([steps, *finished_returns(data)], dtype=np.float64)
            edp.channel.isend(lead, EPISODES_TAG, msg)
    finally:
        collector.shutdown()
    return {"env_steps": steps}


def learner_loop(edp: ExperienceDataPlane, rb: DataPlaneReplayBuffer, tr: Trainer,
                 cfg: TorchRLDQNConfig) -> dict[str, Any]:
    hp = cfg.torchrl
    ref = Referee(hp)
    assert edp.learner is not None

    def drain() -> None:
        while (msg := edp.channel.poll(tag=EPISODES_TAG)) is not None:
            v = msg.view(np.float64)
            ref.record(msg.source, int(v[0]), v[1:])

    t0 = last_poll = last_print = time.perf_counter()
    why = ""
    while not why:
        loss = tr.step(rb)
        edp.log(loss=loss)
        now = time.perf_counter()
        if now - last_poll >= 0.05:
            last_poll = now
            edp.learner.run_on_thread(drain, "episode reports")
            why = ref.why_stop(tr.updates, t0, cfg.run.duration_s)
        if hp.progress_every_s and now - last_print >= hp.progress_every_s:
            last_print = now
            progress(cfg.scheduler.mode, ref, tr, t0)
    return outcome(cfg, ref, tr, why, time.perf_counter() - t0)


def outcome(cfg: TorchRLDQNConfig, ref: Referee, tr: Trainer, why: str,
            wall: float) -> dict[str, Any]:
    mode = "torchrl" if cfg.torchrl.single_process else cfg.scheduler.mode
    return {"job": "torchrl_dqn_cartpole", "mode": mode, "seed": cfg.run.seed,
            "reached": ref.reached_at is not None, "env_steps_to_target": ref.reached_at,
            "wall_s_to_target": ref.reached_after_s, "stopped_by": why,
            "target_return": cfg.torchrl.target_return, "final_mean_return": ref.mean,
            "env_steps": ref.env_steps, "episodes": ref.episodes, "updates": tr.updates,
            "wall_s": wall, "updates_per_s": tr.updates / wall if wall else 0.0,
            "iteration_mean_s": float(np.mean(tr.iteration_s)) if tr.iteration_s else None,
            "exposed_mean_s": float(np.mean(tr.sample_s)) if tr.sample_s else None,
            "exposed_median_s": float(np.median(tr.sample_s)) if tr.sample_s else None}


def run_plane(cfg: TorchRLDQNConfig, run_dir: Path | None) -> dict[str, Any]:
    hp = cfg.torchrl
    out: dict[str, Any] = {}
    with ExperienceDataPlane(cfg, run_dir=run_dir) as edp:
        n_learners = len(edp.roles.learner_ranks)
        if n_learners != 1:  # every rank alike (the roles are agreed), before a collective
            raise ConfigError(f"this job has one learner rank (TorchRL's loss trains alone, "
                              f"and the actors report episodes to it), got {n_learners} "
                              f"from [layout]; set layout.learners = 1",
                              key="layout.learners")
        rank, role = edp.world_rank, edp.role
        env = make_env(cfg.run.seed * 1000 + rank) if not edp.serves else None
        actor = make_actor(env, hp, cfg.run.seed) if env is not None else None
        tr = Trainer(env, actor, hp) if role is Role.LEARNER else None
        # the only TorchRL line that differs from a plain script (collective here)
        rb = DataPlaneReplayBuffer(edp, model=actor, exclude_keys=EXCLUDED)
        if rank == 0:
            print(f"torchrl_dqn_cartpole: {len(edp.roles.actor_ranks)} actor ranks, mode "
                  f"{cfg.scheduler.mode}, {rb!r}", flush=True)
        if role is Role.ACTOR:
            out = actor_loop(edp, rb, env, actor, hp)
        elif role is Role.LEARNER:
            assert tr is not None
            out = learner_loop(edp, rb, tr, cfg)
        else:
            edp.serve()
        edp.done()
        summary = edp.summary()
        if role is Role.LEARNER:
            lat = summary["learners"].get(rank, {})
            out["plane_exposed_mean_s"] = lat.get("exposed_mean_s")
            out["plane_iteration_mean_s"] = lat.get("iteration_mean_s")
            out["rows_ingested"] = summary["rows_ingested"]
            if env is not None:
                env.close()
    return out


# ---------------------------------------------------------------------------------
# the plain TorchRL loop, one process


def run_single_process(cfg: TorchRLDQNConfig) -> dict[str, Any]:
    hp, sch = cfg.torchrl, cfg.scheduler
    env = make_env(cfg.run.seed * 1000)
    actor = make_actor(env, hp, cfg.run.seed)
    tr = Trainer(env, actor, hp)
    rb, trees = torchrl_prioritized_buffer(
        cfg.storage.capacity_rows, alpha=cfg.storage.priority_exponent, beta=sch.beta,
        batch_size=sch.batch_rows)
    collector, greedy = make_collector(env, actor, hp)
    ref = Referee(hp)
    per_batch = sch.samples_per_insert * hp.frames_per_batch / sch.batch_rows
    owed = 0.0
    t0 = last_print = time.perf_counter()
    why = ""
    steps = 0
    for data in collector:
        rb.extend(data.reshape(-1))
        greedy.step(data.numel())
        steps += data.numel()
        ref.record(0, steps, finished_returns(data))
        if len(rb) >= sch.min_fill_rows:
            owed += per_batch if per_batch > 0 else 1.0
            while owed >= 1.0:
                tr.step(rb)
                owed -= 1.0
        why = ref.why_stop(tr.updates, t0, cfg.run.duration_s)
        if hp.progress_every_s and time.perf_counter() - last_print >= hp.progress_every_s:
            last_print = time.perf_counter()
            progress("torchrl", ref, tr, t0)
        if why:
            break
    collector.shutdown()
    env.close()
    return {**outcome(cfg, ref, tr, why, time.perf_counter() - t0), "trees": trees}


def run(cfg: TorchRLDQNConfig, run_dir: Path | None, resume: str) -> dict[str, Any]:
    if MISSING:  # on every rank alike, before any collective
        raise ConfigError(MISSING, key="torchrl")
    torch.set_num_threads(1)
    out = run_single_process(cfg) if cfg.torchrl.single_process else run_plane(cfg, run_dir)
    if out.get("job"):  # the learner (or the one process)
        if run_dir is not None:
            write_summary(run_dir / "metrics" / "summary.json", out)
        head = (f"reached mean return {out['target_return']:g} after "
                f"{out['env_steps_to_target']:,} env steps ({out['wall_s_to_target']:.1f} s)"
                if out["reached"] else f"did not reach {out['target_return']:g} (stopped "
                f"by {out['stopped_by']}); final mean return {out['final_mean_return']:.1f}")
        print(f"torchrl_dqn_cartpole ({out['mode']}): {head}; {out['env_steps']:,} env "
              f"steps, {out['updates']:,} updates ({out['updates_per_s']:.0f}/s) in "
              f"{out['wall_s']:.1f} s", flush=True)
        print(jsontext.dumps(out, sort_keys=True, default=str), flush=True)
    return out


JOB_CONFIG = TorchRLDQNConfig

if __name__ == "__main__":
    job_main(TorchRLDQNConfig, run)
