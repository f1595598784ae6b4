"""Ape-X-style distributed DQN on Gymnasium CartPole-v1, through the data plane.

Ranks (``[layout]``): learners, buffers and actors. Each actor steps
``dqn.num_envs / actors`` vectorised environments with its slice of the Ape-X epsilon
ladder, emits n-step transitions with initial priorities (``|TD|`` from its copy of
the network) through :meth:`~conduit_hpc.ExperienceDataPlane.ingest`, and loads the
learner's weights when they are published (every ``scheduler.weights_every``
supersteps). The lead learner takes prioritized batches with ``next_batch()``, trains
with the importance-weighted double-DQN loss and a target network, and sends ``|TD|``
back with ``update_priorities()``. All of it is the public data-plane API plus
:mod:`conduit_hpc.rl` - the example to copy.

The job ends when the mean return of the last ``dqn.window`` *scored* episodes (env
slots whose ladder epsilon is at most ``dqn.score_max_epsilon``, as in the
single-process baseline) reaches ``dqn.target_return``, when ``dqn.max_env_steps`` env
steps (all actors), ``job.max_supersteps`` learner updates or ``run.duration_s`` seconds
of training are spent, or on SIGTERM /
SIGUSR1 to any rank. Actors report finished episodes and their env-step counts to the
lead learner (``EPISODES_TAG`` messages); the learner decides, stops, and every other
rank follows through the data plane's ``should_stop`` (actors) and the end of
``serve()`` (buffers). A signal goes through
:class:`~conduit_hpc.features.checkpointing.stopping.StopCoordinator`.

Checkpoints (``[checkpoint]``): every ``every_supersteps`` learner updates (the replay,
the networks and Adam's moments, the counters; ``every_seconds`` adds buffer-side ones
without the learner's state), and a final one when a signal stops the job;
``conduit-hpc run ... --resume`` continues from the newest complete one (the actors'
environments start new episodes).

Outputs under the run directory: ``metrics/learner-<rank>.csv`` (per superstep, with
``loss`` and ``td_abs_mean``), ``metrics/actor-<rank>.csv``, ``metrics/episodes.csv``
(``time_s,env_steps,actor,episode_return`` + ``epsilon,scored,actor_env_steps``; the
``env_steps`` column is the job's total) and ``metrics/summary.json``.

    conduit-hpc run jobs/dqn_cartpole.toml [--mode edp|sync|service] [--set run.seed=N]
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from conduit_hpc import Config, ConfigError, DataPlaneClosed, ExperienceDataPlane, Role, jsontext
from conduit_hpc.config import LaunchWorld, require
from conduit_hpc.features.checkpointing import (
    checkpoint_outcome,
    restore_data_plane,
    save_checkpoint,
)
from conduit_hpc.features.checkpointing.agent import CheckpointAgent
from conduit_hpc.features.checkpointing.resume import (
    checkpoint_root,
    restore_lines,
    resume_roots,
    resumed_counter,
)
from conduit_hpc.features.checkpointing.stopping import StopCoordinator
from conduit_hpc.job import job_main
from conduit_hpc.plane.headline import headline_figures
from conduit_hpc.plane.learner_group import LearnerGroup
from conduit_hpc.plane.metrics import exposed_story, write_summary
from conduit_hpc.rl import (
    EPISODES_TAG,
    ApexActor,
    DQNSection,
    DQNUpdater,
    QNetwork,
    check_actor_batch,
    check_dqn_launch,
    describe_transitions,
    has_episodes,
    make_vector_env,
    merge_episode_files,
)
from conduit_hpc.rl.section import require_polls_within
from conduit_hpc.transport.objects import allgather_json


@dataclass(frozen=True, slots=True, kw_only=True)
class ApexSection:
    """``[job]``: budgets and reporting of the distributed job (the algorithm's knobs
    are in ``[dqn]``).

    Attributes:
        max_supersteps (int): learner updates before the job ends (0: no such budget;
            ``dqn.max_env_steps`` always applies).
        progress_every_s (float): seconds between progress lines (0: none).
        poll_every_s (float): seconds between the learner's looks at episode reports
            and stop requests.
        report_every_s (float): an actor reports its env-step count at least this often
            (and its finished episodes within ``poll_every_s / 2``).
    """

    max_supersteps: int = 0
    progress_every_s: float = 5.0
    poll_every_s: float = 0.05
    report_every_s: float = 0.25

    def __post_init__(self) -> None:
        require(self.max_supersteps >= 0, "max_supersteps", self.max_supersteps,
                ">= 0 (0: no superstep budget)")
        for name in ("progress_every_s", "poll_every_s", "report_every_s"):
            v = getattr(self, name)
            require(math.isfinite(v) and v >= 0, name, v, ">= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class DQNCartPoleConfig(Config):
    job: ApexSection = field(default_factory=ApexSection)
    dqn: DQNSection = field(default_factory=DQNSection)

    def __post_init__(self) -> None:
        Config.__post_init__(self)
        require_polls_within(self.job, self.run.timeout_s)  # stop requests, budgets

    def check_launch(self, world: LaunchWorld) -> None:
        """:func:`check_config` with the launch's role counts, and the Q network and
        the actors' environments against a node's memory, before any rank starts."""
        Config.check_launch(self, world)
        if world.actors is not None and world.learners is not None:
            check_config(self, world.actors, world.learners)
        obs = self.spec.get("obs")
        check_dqn_launch(self.dqn, world,
                         in_features=math.prod(obs.shape) if obs is not None else 1)


def check_config(cfg: DQNCartPoleConfig, n_actors: int, n_learners: int = 1) -> int:
    """What this job needs of the layout and the sampler. The replay's semantics (batch,
    minimum fill, replay ratio, weight period, beta schedule, priority exponent) have
    one source of truth, ``[scheduler]`` and ``[storage]``, which the single-process
    baseline reads too. Deterministic: every rank raises together.

    Returns:
        int: environments per actor.
    """
    hp, sch = cfg.dqn, cfg.scheduler
    if sch.sampler != "prioritized":
        raise ConfigError(f"scheduler.sampler must be 'prioritized' for Ape-X DQN, got "
                          f"{sch.sampler!r}", key="scheduler.sampler")
    if n_learners < 1:
        raise ConfigError(f"layout.learners must be >= 1 for this job (data-parallel over "
                          f"the learners), got {n_learners}", key="layout.learners")
    if n_actors < 1 or hp.num_envs % n_actors:
        raise ConfigError(f"dqn.num_envs must be a positive multiple of the number of "
                          f"actor ranks ({n_actors}), got {hp.num_envs}", key="dqn.num_envs")
    check_actor_batch(hp, hp.num_envs // n_actors, cfg.scheduler)
    return hp.num_envs // n_actors


# ---------------------------------------------------------------------------------
# the lead learner's view of the episodes


class ReturnReferee:
    """On the lead learner: the actors' episode reports, the mean return of the last
    ``window`` scored episodes (in the order they reached the learner) and the env
    steps spent. Local; :meth:`poll` never blocks beyond one turn of the data-plane
    thread (it makes the rank's MPI calls there)."""

    def __init__(self, edp: ExperienceDataPlane, hp: DQNSection,
                 env_steps_offset: int = 0) -> None:
        self.edp, self.hp = edp, hp
        self.env_steps_offset = env_steps_offset  # steps of the run this one resumes
        self.recent: deque[float] = deque(maxlen=hp.window)
        self.actor_steps: dict[int, int] = {}
        self.episodes = 0
        self.reached_at: int | None = None
        self.reached_after_s: float | None = None
        self.t0 = time.perf_counter()

    @property
    def env_steps(self) -> int:
        return self.env_steps_offset + sum(self.actor_steps.values())

    @property
    def mean(self) -> float:
        return float(np.mean(self.recent)) if self.recent else math.nan

    def _drain(self) -> None:
        ch = self.edp.channel
        while (msg := ch.poll(tag=EPISODES_TAG)) is not None:
            v = msg.view(np.float64)
            self.actor_steps[msg.source] = int(v[0])
            for ret, scored in v[1:].reshape(-1, 2):
                self.episodes += 1
                if not scored:
                    continue
                self.recent.append(float(ret))
                if (self.reached_at is None and len(self.recent) == self.hp.window
                        and self.mean >= self.hp.target_return):
                    self.reached_at = self.env_steps
                    self.reached_after_s = time.perf_counter() - self.t0

    def poll(self) -> None:
        """Read every report that has arrived."""
        assert self.edp.learner is not None
        self.edp.learner.run_on_thread(self._drain, "episode reports")


# ---------------------------------------------------------------------------------
# roles


def actor_loop(edp: ExperienceDataPlane, cfg: DQNCartPoleConfig, net: torch.nn.Module,
               k: int, stop: StopCoordinator, run_dir: Path | None,
               t0: float) -> dict[str, Any]:
    hp, job = cfg.dqn, cfg.job
    a = edp.roles.role_rank
    path = run_dir / "metrics" / f"episodes-{edp.world_rank}.csv" if run_dir else None
    actor = ApexActor(hp, net, actor_index=a, envs_per_actor=k,
                      seed=cfg.run.seed * 1000 + a * k, episodes_path=path,
                      actor_id=edp.world_rank, t0=t0)
    actor.weights_loaded(edp.policy_version)
    lead = edp.roles.learner_ranks[0]
    pending: list[float] = []
    last_report = time.perf_counter()
    i = 0
    try:
        while not edp.should_stop:
            if i % 32 == 0 and stop.requested():
                break
            i += 1
            out = actor.step()
            if len(out.priorities):
                edp.ingest(out.rows, priorities=out.priorities)
            for ret, scored in zip(out.returns, out.scored, strict=True):
                pending += [ret, float(scored)]
            now = time.perf_counter()
            if ((pending and now - last_report >= job.poll_every_s / 2)
                    or now - last_report >= job.report_every_s):
                edp.channel.isend(lead, EPISODES_TAG,
                                  np.array([actor.env_steps, *pending], dtype=np.float64))
                pending, last_report = [], now
            if edp.pull_weights():
                actor.weights_loaded(edp.policy_version)
    finally:
        actor.close()
    return {"env_steps": actor.env_steps, "episodes": actor.episodes.count}


#: why the learners stop, in rising precedence: with several learners every learner
#: proposes one each superstep and all of them follow the largest (LearnerGroup.agree)
STOP_REASONS = ("", "stream closed", "time budget", "superstep budget", "env-step budget",
                "stop requested", "target")


def next_batch_together(edp: ExperienceDataPlane, group: LearnerGroup, why: str,
                        stop: StopCoordinator) -> tuple[Any, str]:
    """This superstep's batch and the agreed reason to stop (``""``: go on). With several
    learners, one small all-reduce decides for all of them after each took its batch, so
    that every learner runs the same supersteps (the gradient all-reduce needs all)."""
    batch = None
    if not why:
        try:
            batch = edp.next_batch()
        except DataPlaneClosed:
            # the actors stopped before the buffer was filled: the end of a stop request
            why = "stop requested" if stop.requested() else "stream closed"
    if group.size > 1:
        why = STOP_REASONS[group.agree(STOP_REASONS.index(why))]
    if why == "stream closed":
        raise DataPlaneClosed("every actor finished before the buffer held "
                              f"scheduler.min_fill_rows = {edp.config.scheduler.min_fill_rows} "
                              "rows, without a stop request")
    return batch, why


def learner_loop(edp: ExperienceDataPlane, cfg: DQNCartPoleConfig, updater: DQNUpdater,
                 stop: StopCoordinator, agent: CheckpointAgent, env_steps_offset: int,
                 group: LearnerGroup) -> dict[str, Any]:
    hp, job = cfg.dqn, cfg.job
    lead = edp.world_rank == edp.roles.learner_ranks[0]
    referee = ReturnReferee(edp, hp, env_steps_offset) if lead else None

    def state() -> dict[str, Any]:  # at checkpoint boundaries: the model and counters
        counters = {"updates": updater.updates,
                    "env_steps": referee.env_steps if referee else 0}
        if not lead:
            return {"counters": counters}
        return {"counters": counters, "extra_state": updater.state_arrays(),
                "extra_attrs": updater.state_attrs()}

    agent.every_supersteps(cfg.checkpoint.every_supersteps, state)
    board = edp.learner.progress if edp.learner is not None else None
    if board is not None and referee is not None:  # what ends the run, with its progress
        board.every_s = job.progress_every_s or math.inf  # 0: only the final state
        board.update("learner", total=job.max_supersteps)
        board.update("actors", referee.env_steps, total=hp.max_env_steps, unit="env steps",
                     time_s=cfg.run.duration_s,
                     note=lambda: f"mean-{hp.window} return {referee.mean:.1f} (target "
                                  f"{hp.target_return:g}, {referee.episodes:,} episodes)")
    t0 = last_poll = last_print = time.perf_counter()
    printed_updates = at_start = updater.updates  # (a resumed run's, from its checkpoint)
    why = ""
    while True:
        now = time.perf_counter()
        if now - last_poll >= job.poll_every_s:
            last_poll = now
            if referee is not None:
                referee.poll()
            if stop.requested():
                why = "stop requested"
        if referee is not None and not why:
            if referee.reached_at is not None:
                why = "target"
            elif referee.env_steps >= hp.max_env_steps:
                why = "env-step budget"
        if not why and job.max_supersteps and updater.updates >= job.max_supersteps:
            why = "superstep budget"
        if not why and cfg.run.duration_s and now - t0 >= cfg.run.duration_s:
            why = "time budget"
        batch, why = next_batch_together(edp, group, why, stop)
        if why:
            break
        loss, td = updater.update(batch.data, batch.weights)
        prio = td.abs().double().cpu().numpy() + 1e-6
        edp.update_priorities(batch.indices, prio)
        edp.log(loss=loss, td_abs_mean=float(prio.mean()),
                **({"mean_return": referee.mean} if referee is not None else {}))
        if board is not None and referee is not None:
            board.update("actors", referee.env_steps)
        elif (referee is not None and job.progress_every_s
                and now - last_print >= job.progress_every_s):
            rate = (updater.updates - printed_updates) / max(now - last_print, 1e-9)
            print(f"[dqn {cfg.scheduler.mode}] {now - t0:6.1f} s  env steps "
                  f"{referee.env_steps:>7,}  mean-{hp.window} return {referee.mean:6.1f}  "
                  f"supersteps {updater.updates:>6,}  {rate:6.0f} updates/s", flush=True)
            last_print, printed_updates = now, updater.updates
    wall = time.perf_counter() - t0
    out: dict[str, Any] = {"updates": updater.updates, "updates_at_start": at_start,
                           "why": why, "wall_s": wall, "env_steps_offset": env_steps_offset,
                           "param_checksum": group.checksum(updater.online),
                           **group.timings()}
    if referee is not None:
        out.update(reached_at=referee.reached_at, reached_after_s=referee.reached_after_s,
                   mean=referee.mean, episodes_seen=referee.episodes,
                   env_steps_seen=referee.env_steps)
    return out


# ---------------------------------------------------------------------------------


def build_net(cfg: DQNCartPoleConfig) -> torch.nn.Module:
    """The Q network, the same initial weights on every rank."""
    hp = cfg.dqn
    env, _ = make_vector_env(hp.env_id, 1, cfg.run.seed)
    obs_dim = int(np.prod(env.single_observation_space.shape))
    n_actions = int(env.single_action_space.n)
    env.close()
    torch.manual_seed(cfg.run.seed)
    return QNetwork(obs_dim, n_actions, hp.hidden, hp.dueling)


def run(cfg: DQNCartPoleConfig, run_dir: Path | None, resume: str) -> dict[str, Any]:
    torch.set_num_threads(1)
    # what reward and discount mean (n, gamma): attributes of the checkpoint's datasets
    cfg = replace(cfg, spec=describe_transitions(cfg.spec, n_step=cfg.dqn.n_step,
                                                 gamma=cfg.dqn.gamma))
    ccfg = cfg.checkpoint
    out: dict[str, Any] = {}
    with ExperienceDataPlane(cfg, run_dir=run_dir) as edp:
        k = check_config(cfg, len(edp.roles.actor_ranks), len(edp.roles.learner_ranks))
        stop = StopCoordinator(edp)  # SIGTERM / SIGUSR1 anywhere: every rank stops
        rank = edp.world_rank
        # the actors' episode files hold the earlier attempts (a resume in the same
        # run directory; looked at before the restore, a collective, so before any
        # actor of this attempt writes), else the merge adds the checkpoint's steps
        carried = rank == 0 and run_dir is not None and has_episodes(run_dir / "metrics")
        restored = (restore_data_plane(edp, resume, roots=resume_roots(cfg, run_dir))
                    if resume else None)
        root = checkpoint_root(cfg, run_dir)
        agent = CheckpointAgent(edp, root, every_seconds=ccfg.every_seconds, keep=ccfg.keep,
                                first_seq=restored.seq + 1 if restored else 1)
        net = build_net(cfg) if not edp.serves else None
        updater = None
        group = LearnerGroup.open(edp, cfg.transport.collectives,  # collective
                                  timeout_s=cfg.run.timeout_s,
                                  device=edp.device if edp.role is Role.LEARNER else None)
        if net is not None and edp.role is Role.LEARNER:
            net = net.to(edp.device)
            updater = DQNUpdater(cfg.dqn, net,
                                 group.average_gradients if group.size > 1 else None)
            updater.warm_up()
            if restored is not None and restored.extra_state:
                updater.load_state_arrays(restored.extra_state)
                print(f"resume: model, target network and optimizer from checkpoint "
                      f"{restored.seq} (after {updater.updates:,} updates)", flush=True)
            elif restored is not None:
                print(f"resume: checkpoint {restored.seq} holds no learner state (a "
                      f"buffer-side periodic one); the model starts fresh", flush=True)
            group.broadcast_module(updater.online)  # identical start on every learner
            group.broadcast_module(updater.target)
        edp.share_weights(net)  # collective; actors start from the learner's weights
        if rank == 0:
            for line in restore_lines(restored, resume):
                print(line, flush=True)
            print(f"dqn_cartpole: {len(edp.roles.learner_ranks)} learner(s) "
                  f"({group.backend if group.size > 1 else 'no'} all-reduce), "
                  f"{len(edp.roles.buffer_ranks)} buffer, {len(edp.roles.actor_ranks)} "
                  f"actor ranks x {k} envs, mode {cfg.scheduler.mode}, target mean-"
                  f"{cfg.dqn.window} return {cfg.dqn.target_return:g}", flush=True)
        t0 = time.perf_counter()
        if edp.role is Role.ACTOR:
            assert net is not None
            out = actor_loop(edp, cfg, net, k, stop, run_dir, t0)
        elif edp.serves:
            edp.serve()
        else:
            assert updater is not None
            offset = resumed_counter(restored, edp.roles.learner_ranks[0], "env_steps")
            out = learner_loop(edp, cfg, updater, stop, agent, offset, group)
        group.close()
        edp.done()
        agent.finish()
        stopped = stop.agree()
        final = None
        if stopped and ccfg.on_stop:  # collective: the replay, the model, the counters
            lead = updater is not None and rank == edp.roles.learner_ranks[0]
            final = save_checkpoint(edp, root, agent=agent, keep=ccfg.keep,
                counters={"updates": out.get("updates", 0),
                          "env_steps": out.get("env_steps_seen", 0)},
                extra_state=updater.state_arrays() if lead and updater else None,
                extra_attrs=updater.state_attrs() if lead and updater else None)
        outcome = checkpoint_outcome(edp, agent, final)  # collective
        summary = edp.summary()
        # JSON, not pickle (collective on the world; every rank gets every rank's stats)
        stats = [(str(role), int(r), dict(s)) for role, r, s in allgather_json(
            edp.roles.world, [edp.role.value, edp.world_rank, out])]
        stop.close()
        wall = time.perf_counter() - t0
    if rank == 0:
        if final is not None:
            print(f"final checkpoint written: {final.path}", flush=True)
        for line in outcome.lines():
            print(line, flush=True)
        flat = flat_summary(cfg, summary, stats, wall, stopped)
        if run_dir is not None:
            merge_episode_files(run_dir / "metrics", env_steps_offset=0 if carried
                                else flat["env_steps_offset"])
            # the figures `conduit-hpc report` prints, from the same files and function
            flat["env_steps_to_target_live"] = flat["env_steps_to_target"]
            flat.update(headline_figures(run_dir / "metrics",
                                         target_return=cfg.dqn.target_return,
                                         window=cfg.dqn.window))
            write_summary(run_dir / "metrics" / "summary.json", flat)
            print(return_curve(run_dir / "metrics" / "episodes.csv"), flush=True)
        report(flat)
    outcome.raise_if_none_written()  # every rank: the run cannot be resumed
    return summary


def flat_summary(cfg: DQNCartPoleConfig, summary: dict[str, Any],
                 stats: list[tuple[str, int, dict[str, Any]]], wall: float,
                 stopped: bool) -> dict[str, Any]:
    """The run's headline numbers (``summary.json``). A resumed run's counters
    (``updates``, ``env_steps``, ``env_steps_to_target``) count from the run's start,
    its attempts before this one included (``updates_at_start``, ``env_steps_offset``:
    the checkpoint's); its times and rates (``wall_s``, ``updates_per_s``, ``episodes``,
    ``supersteps``: the data plane's count) are this attempt's."""
    lead = min(r for role, r, _ in stats if role == "learner")
    learner = next(s for role, r, s in stats if r == lead)
    learners = {r: s for role, r, s in stats if role == "learner"}
    actors = [s for role, _, s in stats if role == "actor"]
    lat = summary["learners"].get(lead, {})
    learner_wall = float(learner.get("wall_s", wall))
    reached_at = learner.get("reached_at")
    return {
        "job": "dqn_cartpole", "mode": cfg.scheduler.mode, "seed": cfg.run.seed,
        "reached": reached_at is not None,
        "env_steps_to_target": reached_at,
        "wall_s_to_target": learner.get("reached_after_s"),
        "target_return": cfg.dqn.target_return,
        "stopped_by": "stop requested" if stopped else learner.get("why", ""),
        "wall_s": learner_wall,
        "env_steps": (learner.get("env_steps_offset", 0)
                      + sum(a.get("env_steps", 0) for a in actors)),
        "episodes": sum(a.get("episodes", 0) for a in actors),
        "updates": learner.get("updates", 0),
        "updates_at_start": learner.get("updates_at_start", 0),
        "env_steps_offset": learner.get("env_steps_offset", 0),
        "supersteps": int(lat.get("supersteps", learner.get("updates", 0))),
        # this attempt's updates over its time (the run's total over this attempt's time
        # said 194,799,749/s for a resume whose budget was already spent)
        "updates_per_s": ((learner.get("updates", 0) - learner.get("updates_at_start", 0))
                          / learner_wall if learner_wall else 0.0),
        "final_mean_return": learner.get("mean", math.nan),
        "exposed_mean_s": lat.get("exposed_mean_s", math.nan),
        "exposed_median_s": lat.get("exposed_median_s", math.nan),
        "iteration_mean_s": lat.get("iteration_mean_s", math.nan),
        "iteration_median_s": lat.get("iteration_median_s", math.nan),
        # the lead learner's exposed time by what it waited for (plane/metrics.py
        # exposed_split): path work, the rate limiter, neither (a core, other ranks)
        **{k: lat.get(k, math.nan) for k in ("exposed_total_s", "exposed_path_s",
                                             "exposed_limiter_s", "exposed_other_s",
                                             "path_work_s", "path_work_hidden")},
        "rows_ingested": summary["rows_ingested"],
        "ingest_rows_per_s": summary["rows_ingested"] / wall if wall > 0 else 0.0,
        "limiter_wait_s": sum(a["limiter_wait_s"] for a in summary["actors"].values()),
        "learners": len(learners),
        "learner_updates": {r: s.get("updates", 0) for r, s in sorted(learners.items())},
        # equal on every learner iff the all-reduced training kept them identical
        "param_checksums": {r: s.get("param_checksum") for r, s in sorted(learners.items())},
        "params_identical": len({s.get("param_checksum") for s in learners.values()}) == 1,
        # the learners' gradient all-reduce and per-superstep agreement (gloo/NCCL), mean
        # seconds per call on the lead learner (waiting for the other learners included)
        "allreduce_mean_s": learner.get("allreduce_mean_s", math.nan),
        "agree_mean_s": learner.get("agree_mean_s", math.nan),
        "allreduce_mean_s_per_learner": {
            r: s.get("allreduce_mean_s", math.nan) for r, s in sorted(learners.items())},
        "exposed_mean_s_per_learner": {
            r: summary["learners"].get(r, {}).get("exposed_mean_s", math.nan)
            for r in sorted(learners)},
        # rows drawn from learner_gpu shards on the learners' devices (plane/device_tier.py)
        "device_rows_drawn": sum(summary["learners"].get(r, {}).get("device_rows_drawn", 0.0)
                                 for r in learners),
    }


def return_curve(path: Path, bins: int = 10) -> str:
    """The return curve in one line: mean return of the scored episodes in each of
    ``bins`` equal spans of env steps (``conduit-hpc report RUN_DIR`` draws it)."""
    import csv

    if not path.exists():
        return "return curve: no episodes"
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("scored", "1") in ("1", "True", "true")]
    if not rows:
        return "return curve: no scored episodes"
    steps = np.array([int(r["env_steps"]) for r in rows], dtype=np.float64)
    rets = np.array([float(r["episode_return"]) for r in rows])
    edges = np.linspace(0.0, steps.max(), bins + 1)
    which = np.clip(np.searchsorted(edges, steps, side="right") - 1, 0, bins - 1)
    means = [f"{rets[which == b].mean():.0f}" if (which == b).any() else "-"
             for b in range(bins)]
    return (f"return curve (mean scored return per {edges[1]:,.0f} env steps): "
            + " ".join(means))


def report(flat: dict[str, Any]) -> None:
    """The final summary, in words, then as one JSON line."""
    if flat["reached"]:
        steps = flat["env_steps_to_target"] or flat.get("env_steps_to_target_live") or 0
        head = (f"reached mean return {flat['target_return']:g} after "
                f"{steps:,} env steps "
                f"({flat['wall_s_to_target']:.1f} s)")
    else:
        head = (f"did not reach {flat['target_return']:g} (stopped by "
                f"{flat['stopped_by']}); final mean return {flat['final_mean_return']:.1f}")
    print(f"dqn_cartpole ({flat['mode']}): {head}\n"
          f"  {flat['env_steps']:,} env steps, {flat['episodes']:,} episodes, "
          f"{flat['supersteps']:,} supersteps ({flat['updates_per_s']:.0f}/s) in "
          f"{flat['wall_s']:.1f} s\n"
          f"  exposed latency mean {flat['exposed_mean_s'] * 1e3:.3f} ms, iteration mean "
          f"{flat['iteration_mean_s'] * 1e3:.3f} ms; ingest "
          f"{flat['ingest_rows_per_s']:,.0f} rows/s ({flat['rows_ingested']:,} rows, "
          f"limiter wait {flat['limiter_wait_s']:.1f} s over actors)", flush=True)
    story = exposed_story(flat, flat["wall_s"])
    if story:
        print(f"  lead learner {story}", flush=True)
    print(jsontext.dumps(flat, sort_keys=True, default=str), flush=True)


JOB_CONFIG = DQNCartPoleConfig  # [job] and [dqn] (see conduit_hpc.config.jobs)

if __name__ == "__main__":
    job_main(DQNCartPoleConfig, run)
