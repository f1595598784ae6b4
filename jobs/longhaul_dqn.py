"""Long-haul edge/cloud job: the same actors, link and learner in two placements.

Ranks (``[layout]``): 0 the learner, 1 the data-centre buffer, 2 the edge buffer, 3..
the actors; ``[longhaul]`` joins the edge (actors + edge buffer) and the data centre by
one emulated link. ``longhaul.mode = "forward"`` ships every experience to the replay
beside the learner (what the link cannot carry is dropped at the edge, oldest first);
``"edge_replay"`` keeps the prioritized replay on the edge buffer and ships only the
learner's sampled batches (priority updates flow back). See ``docs/longhaul.md``.

Workloads (``job.workload``):

* ``dqn`` - Ape-X-style DQN on Gymnasium CartPole-v1 with the pieces of
  :mod:`conduit_hpc.rl` (issue 6): each actor steps ``dqn.num_envs / layout.actors``
  environments with its slice of the epsilon ladder, emits n-step transitions with
  initial priorities (``|TD|`` from its copy of the network) and pulls the learner's
  weights; the learner trains with the double-DQN loss, importance weights and target
  syncs, and sends ``|TD|`` back as priorities.
* ``regression`` - the same rows and the same loop without the DQN pieces: actors draw
  observations and a noisy, heavy-tailed target ``reward = f*(obs) + noise`` and give
  each row the priority ``|reward - f(obs)|`` under their copy of the learner's model;
  the learner fits ``f`` (a small MLP) by importance-weighted Huber regression and sends
  ``|error|`` back. A real prioritized learning problem for the data-plane mechanics.

Both pace actors at ``job.actor_rows_s`` rows per second each and give every learner
superstep at least ``job.learner_step_s`` (the compute of a bigger model), so that the
link budget, not this machine's two cores, decides what crosses. Per-superstep metrics
(``learner-0.csv``: the data plane's columns, the link's, ``loss`` and ``td_abs_mean``),
``link-<rank>.csv`` (buffer ranks), ``episodes.csv`` (``dqn``) and ``summary.json``.

    conduit-hpc run jobs/longhaul_dqn.toml --set longhaul.mode=forward|edge_replay
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from conduit_hpc import Config, ConfigError, ExperienceDataPlane, Role, jsontext
from conduit_hpc.config import LaunchWorld, require
from conduit_hpc.features.longhaul.metrics import settled_mean
from conduit_hpc.job import job_main
from conduit_hpc.plane.metrics import write_summary
from conduit_hpc.transport.objects import allgather_json

try:  # the DQN pieces (issue 6); the regression workload runs without them
    from conduit_hpc.rl import DQNSection
except ImportError:  # pragma: no cover - depends on the checkout
    DQNSection = None

FIELDS = ("obs", "action", "reward", "next_obs", "discount")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSection:
    """``[job]``: the workload and its pace.

    Attributes:
        workload (str): ``dqn`` or ``regression``.
        supersteps (int): learner updates before the job ends.
        learner_step_s (float): least wall time of one superstep (emulated compute).
        actor_rows_s (float): rows per second each actor produces (0: as fast as it can).
        rows_per_ingest (int): ``regression``: rows per ingest (``dqn`` ingests what its
            ``dqn.num_envs / layout.actors`` environments produce).
        noise_scale (float): ``regression``: scale of the heavy-tailed target noise.
    """

    workload: str = "dqn"
    supersteps: int = 3000
    learner_step_s: float = 0.01
    actor_rows_s: float = 1000.0
    rows_per_ingest: int = 4
    noise_scale: float = 0.3

    def __post_init__(self) -> None:
        require(self.workload in ("dqn", "regression"), "workload", self.workload,
                "'dqn' or 'regression'")
        require(self.supersteps >= 1, "supersteps", self.supersteps, ">= 1")
        # bounded as synthetic.compute_s: the learner sleeps it out, no data-plane wait
        # bounds it, and the other ranks wait for the learner
        require(0 <= self.learner_step_s <= 3600, "learner_step_s", self.learner_step_s,
                ">= 0 and <= 3600 (seconds per superstep)")
        require(math.isfinite(self.actor_rows_s) and self.actor_rows_s >= 0, "actor_rows_s",
                self.actor_rows_s, ">= 0 (0: as fast as possible)")
        require(1 <= self.rows_per_ingest <= 2**20, "rows_per_ingest", self.rows_per_ingest,
                ">= 1 and <= 2**20")
        require(math.isfinite(self.noise_scale) and self.noise_scale >= 0, "noise_scale",
                self.noise_scale, ">= 0")


if DQNSection is not None:
    @dataclass(frozen=True, slots=True, kw_only=True)
    class LongHaulJobConfig(Config):
        job: JobSection = field(default_factory=JobSection)
        dqn: DQNSection = field(default_factory=DQNSection)

        def check_launch(self, world: LaunchWorld) -> None:
            """The ``dqn`` workload's :func:`check_dqn` with the launch's actors, and its
            Q network and environments against a node's memory, before any rank
            starts."""
            Config.check_launch(self, world)
            if self.job.workload != "dqn":
                return
            if world.actors is not None:
                check_dqn(self, world.actors)
            from conduit_hpc.rl import check_dqn_launch

            obs = self.spec.get("obs")
            check_dqn_launch(self.dqn, world,
                             in_features=math.prod(obs.shape) if obs is not None else 1)
else:
    @dataclass(frozen=True, slots=True, kw_only=True)
    class LongHaulJobConfig(Config):  # type: ignore[no-redef]
        job: JobSection = field(default_factory=JobSection)
        # without conduit_hpc.rl the [dqn] table is kept unchecked (regression ignores it)
        dqn: dict[str, int | float | bool | str | tuple[int, ...]] = field(
            default_factory=dict)


# ---------------------------------------------------------------------------------
# workloads: what an actor produces and what the learner computes


class Regression:
    """``regression``: ``reward = sin(obs @ w1) @ w2 + noise`` (Student-t noise)."""

    def __init__(self, cfg: LongHaulJobConfig, rank: int) -> None:
        self.cfg = cfg
        g = torch.Generator().manual_seed(cfg.run.seed)  # the same target on every rank
        self.w1 = torch.randn(4, 16, generator=g)
        self.w2 = torch.randn(16, generator=g) / 4
        self.rng = np.random.default_rng(cfg.run.seed + 1000 + rank)
        torch.manual_seed(cfg.run.seed)  # the same initial model on every rank
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(),
                                         torch.nn.Linear(64, 1))

    # actor side
    def actor_rows(self, n: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        obs = self.rng.standard_normal((n, 4)).astype(np.float32)
        noise = self.cfg.job.noise_scale * self.rng.standard_t(2.5, n)
        with torch.no_grad():
            t = torch.from_numpy(obs)
            target = (torch.sin(t @ self.w1) @ self.w2).numpy() + noise
            pred = self.model(t).squeeze(1).numpy()
        rows = {"obs": obs, "action": np.zeros(n, np.int64),
                "reward": target.astype(np.float32), "next_obs": obs,
                "discount": np.zeros(n, np.float32)}
        return rows, np.abs(target - pred) + 1e-3

    # learner side
    def loss(self, data: dict[str, torch.Tensor], weights: torch.Tensor,
             online: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        pred = online(data["obs"].float()).squeeze(1)
        err = data["reward"].float() - pred
        per_row = torch.nn.functional.huber_loss(pred, data["reward"].float(),
                                                 reduction="none", delta=1.0)
        return (per_row * weights).mean(), err.detach()


def check_dqn(cfg: LongHaulJobConfig, n_actors: int) -> int:
    """Deterministic checks of the ``dqn`` workload (every rank raises together).

    Returns:
        int: environments per actor (``dqn.num_envs`` over all actors: one epsilon
        ladder runs over every environment of every actor).
    """
    if DQNSection is None:
        raise ConfigError("job.workload = 'dqn' needs the DQN pieces (conduit_hpc.rl, "
                          "issue 6), which this checkout does not have; use "
                          "--set job.workload=regression", key="job.workload")
    hp = cfg.dqn
    if n_actors < 1 or hp.num_envs % n_actors:
        raise ConfigError(f"dqn.num_envs must be a positive multiple of the number of "
                          f"actor ranks ({n_actors}), got {hp.num_envs}", key="dqn.num_envs")
    from conduit_hpc.rl import check_actor_batch

    check_actor_batch(hp, int(hp.num_envs) // n_actors, cfg.scheduler)
    return int(hp.num_envs) // n_actors


# ---------------------------------------------------------------------------------
# actors


class Pacer:
    """Keeps a producer at ``rate`` items per second (0: unpaced)."""

    def __init__(self, rate: float) -> None:
        self.rate, self.t0, self.done = rate, time.perf_counter(), 0

    def wait(self, edp: ExperienceDataPlane) -> None:
        if self.rate <= 0:
            return
        while not edp.should_stop:
            ahead = self.done / self.rate - (time.perf_counter() - self.t0)
            if ahead <= 0:
                return
            time.sleep(min(ahead, 0.005))


def actor_regression(edp: ExperienceDataPlane, cfg: LongHaulJobConfig, wl: Regression,
                     t0: float) -> dict[str, Any]:
    n = cfg.job.rows_per_ingest
    pace = Pacer(cfg.job.actor_rows_s)
    while not edp.should_stop:
        pace.wait(edp)
        if edp.should_stop:
            break
        rows, prio = wl.actor_rows(n)
        edp.ingest(rows, priorities=prio)
        pace.done += n
        edp.pull_weights()
    return {"rows": pace.done}


def actor_dqn(edp: ExperienceDataPlane, cfg: LongHaulJobConfig, net: torch.nn.Module,
              run_dir: Path | None, t0: float) -> dict[str, Any]:
    from conduit_hpc.rl import ApexActor

    hp, job = cfg.dqn, cfg.job
    k = check_dqn(cfg, len(edp.roles.actor_ranks))
    a = edp.roles.role_rank
    path = run_dir / "metrics" / f"episodes-{edp.world_rank}.csv" if run_dir else None
    actor = ApexActor(hp, net, actor_index=a, envs_per_actor=k,
                      seed=cfg.run.seed * 1000 + a * k, episodes_path=path,
                      actor_id=edp.world_rank, t0=t0)
    actor.weights_loaded(edp.policy_version)
    pace = Pacer(job.actor_rows_s)
    try:
        while not edp.should_stop:
            pace.wait(edp)
            if edp.should_stop:
                break
            out = actor.step()
            if len(out.priorities):
                edp.ingest(out.rows, priorities=out.priorities)
            pace.done += k
            if edp.pull_weights():
                actor.weights_loaded(edp.policy_version)
    finally:
        actor.close()
    return {"env_steps": actor.env_steps, "episodes": actor.episodes.count,
            "returns": list(actor.episodes.returns)[-hp.window:]}


# ---------------------------------------------------------------------------------
# the learner


def learner_loop(edp: ExperienceDataPlane, cfg: LongHaulJobConfig, online: torch.nn.Module,
                 wl: Regression | None) -> dict[str, Any]:
    job = cfg.job
    target = copy.deepcopy(online)
    for p in target.parameters():
        p.requires_grad_(False)
    opt = torch.optim.Adam(online.parameters(),
                           lr=cfg.dqn.lr if wl is None else 1e-3)  # type: ignore[union-attr]
    losses: list[float] = []
    for step in range(job.supersteps):
        t0 = time.perf_counter()
        batch = edp.next_batch()
        data = {k: v.to(edp.device) for k, v in batch.data.items()}
        if wl is None:
            from conduit_hpc.rl import double_dqn_loss, sync_target, to_tensors

            hp = cfg.dqn
            loss, td = double_dqn_loss(online, target, to_tensors(data, edp.device),
                                       batch.weights, hp.huber_delta)
        else:
            loss, td = wl.loss(data, batch.weights, online)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(online.parameters(), 10.0)
        opt.step()
        edp.update_priorities(batch.indices, td.abs().cpu().double().numpy() + 1e-6)
        if wl is None and (step + 1) % cfg.dqn.target_period == 0:  # type: ignore[union-attr]
            sync_target(online, target)
        value = float(loss.detach())
        losses.append(value)
        edp.log(loss=value, td_abs_mean=float(td.abs().mean()))
        rest = job.learner_step_s - (time.perf_counter() - t0)
        if rest > 0:
            time.sleep(rest)
    return {"updates": job.supersteps, "loss_settled": settled_mean(losses)}


# ---------------------------------------------------------------------------------


def warm_up_optimizer() -> None:
    """One Adam step on a throwaway parameter, so that the imports torch makes at the
    first step happen before the actors start, not in the first superstep."""
    w = torch.zeros(1, requires_grad=True)
    opt = torch.optim.Adam([w])
    (w * 2).sum().backward()
    opt.step()


def build_model(cfg: LongHaulJobConfig, wl: Regression | None) -> torch.nn.Module:
    if wl is not None:
        return wl.model
    from conduit_hpc.rl import QNetwork

    hp = cfg.dqn
    torch.manual_seed(cfg.run.seed)
    net = QNetwork(4, 2, hp.hidden, hp.dueling)  # CartPole: 4 observations, 2 actions
    return net


def run(cfg: LongHaulJobConfig, run_dir: Path | None, resume: str) -> dict[str, Any]:
    if resume:
        raise ConfigError(f"this job writes no checkpoints, so --resume {resume!r} has "
                          f"nothing to resume from", key="resume")
    if cfg.longhaul.mode == "off":
        raise ConfigError("longhaul.mode must be 'forward' or 'edge_replay' for this job, "
                          "got 'off'", key="longhaul.mode")
    torch.set_num_threads(1)
    out: dict[str, Any] = {}
    with ExperienceDataPlane(cfg, run_dir=run_dir) as edp:
        if cfg.job.workload == "dqn":
            check_dqn(cfg, len(edp.roles.actor_ranks))
        wl = Regression(cfg, edp.world_rank) if cfg.job.workload == "regression" else None
        model = build_model(cfg, wl) if not edp.serves else None
        if model is not None and edp.role is Role.LEARNER:
            model = model.to(edp.device)
            warm_up_optimizer()  # torch.optim's first step imports for seconds
        edp.share_weights(model)  # collective; actors start from the learner's weights
        t0 = time.perf_counter()
        if edp.role is Role.ACTOR:
            assert model is not None
            out = (actor_regression(edp, cfg, wl, t0) if wl is not None
                   else actor_dqn(edp, cfg, model, run_dir, t0))
        elif edp.serves:
            edp.serve()
        else:
            assert model is not None
            out = learner_loop(edp, cfg, model, wl)
        edp.done()
        summary = edp.summary()
        # JSON, not pickle (collective on the world; every rank gets every rank's stats)
        job_stats = [(str(role), dict(s)) for role, s in allgather_json(
            edp.roles.world, [edp.role.value, out])]
        wall = time.perf_counter() - t0
        rank = edp.world_rank
    if rank == 0:
        flat = flat_summary(cfg, summary, job_stats, wall)
        print(jsontext.dumps(flat, sort_keys=True), flush=True)
        if run_dir is not None:
            from conduit_hpc.rl.episodes import merge_episode_files

            merge_episode_files(run_dir / "metrics")
            write_summary(run_dir / "metrics" / "summary.json", flat)
    return summary


def flat_summary(cfg: LongHaulJobConfig, summary: dict[str, Any],
                 job_stats: list[tuple[str, dict[str, Any]]], wall: float) -> dict[str, Any]:
    lh = summary["longhaul"]
    learner = next(s for r, s in job_stats if r == "learner")
    actors = [s for r, s in job_stats if r == "actor"]
    returns = [x for a in actors for x in a.get("returns", [])]
    lat = next(iter(summary["learners"].values()), {})
    out: dict[str, Any] = {
        "job": "longhaul_dqn", "workload": cfg.job.workload, "mode": lh["mode"],
        "seed": cfg.run.seed, "wall_s": wall, "updates": learner.get("updates", 0),
        "loss_settled": learner.get("loss_settled", math.nan),
        "rows_ingested": summary["rows_ingested"],
        "env_steps": sum(a.get("env_steps", 0) for a in actors),
        "final_mean_return": float(np.mean(returns)) if returns else math.nan,
        "exposed_median_s": lat.get("exposed_median_s", math.nan),
        "exposed_mean_s": lat.get("exposed_mean_s", math.nan),
        "iteration_median_s": lat.get("iteration_median_s", math.nan)}
    for k, v in lh.items():
        out[f"link_{k}"] = v
    bps = lh["bandwidth_bytes_s"]
    out["link_e2c_util"] = lh["e2c_bytes"] / (bps * wall) if wall > 0 else math.nan
    out["link_c2e_util"] = lh["c2e_bytes"] / (bps * wall) if wall > 0 else math.nan
    out["actor_bytes_per_s"] = summary["bytes_ingested"] / wall if wall > 0 else math.nan
    return out


JOB_CONFIG = LongHaulJobConfig  # [job] and [dqn] (see conduit_hpc.config.jobs)

if __name__ == "__main__":
    job_main(LongHaulJobConfig, run)
