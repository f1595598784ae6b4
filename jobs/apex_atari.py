"""Ape-X DQN on an ALE game (``[dqn] env_id``, e.g. ``"ALE/Pong-v5"``), through the data
plane.

The Atari counterpart of ``jobs/dqn_cartpole.py``, with the same :mod:`conduit_hpc.rl`
pieces: each actor steps ``dqn.num_envs / actors`` games preprocessed as in the DQN
papers (``[atari]``: no-op starts, frame skip 4, 84 x 84 grayscale, 4 frames stacked;
see :mod:`conduit_hpc.rl.atari`) with its slice of the epsilon ladder, emits n-step
transitions (uint8 frame stacks, clipped rewards) with initial priorities ``|TD|`` from
its copies of the network and the target network, and loads the learner's weights when
they are published. One learner takes prioritized batches, trains the Nature CNN
(:class:`~conduit_hpc.rl.NatureQNetwork`) with the importance-weighted double-DQN loss
and a target network, and sends ``|TD|`` back as priorities.

Each frame is stored once: ``[spec.obs] stack`` / ``[spec.next_obs] next_of`` declare
the frame stacks, with ``[spec.env]`` (the env slot over all actors) as their stream, so
the replay's shards hold one 84 x 84 frame a row plus references (about 7 kB a row,
against 56 kB for whole stacks) and rebuild ``obs`` and ``next_obs`` at gather (see
docs/frame-stacks.md). Without the declarations rows are stored whole.

The job ends when the mean return of the last ``dqn.window`` scored episodes reaches
``dqn.target_return``, or on a budget: ``dqn.max_env_steps`` agent steps (each is
``atari.frame_skip`` emulator frames) and ``job.max_supersteps`` learner updates (both
counted over resumed runs), ``run.duration_s`` seconds (of this run), or on SIGTERM /
SIGUSR1 to any rank (through
:class:`~conduit_hpc.features.checkpointing.stopping.StopCoordinator`, as in
``jobs/dqn_cartpole.py``). One learner in this version.

Checkpoints (``[checkpoint]``), as in ``jobs/dqn_cartpole.py``: every
``every_supersteps`` learner updates (the replay, the Nature CNN, its target network
and Adam's moments, the counters), and a final one when a signal stops the job
(``on_stop``). The replay is saved as the shards hold it, each frame once (a frame
column and a references column for ``obs``, none for ``next_obs``), with
``compression = { obs = "gzip" }`` on those columns (gzip-1: ~1/30 of their bytes on
real frames; bench/README.md, "Compression where bytes are dear").
``conduit-hpc run ... --resume`` continues from the newest complete checkpoint, falling
back past damaged ones (a corrupted compressed block is refused naming its dataset); the
actors' games start new episodes, the learner's updates, agent steps and beta schedule
go on counting.

Outputs under the run directory: ``metrics/learner-0.csv`` (per superstep, with
``loss``, ``td_abs_mean``, ``mean_return``), ``metrics/actor-<rank>.csv``,
``metrics/episodes.csv`` and ``metrics/summary.json`` (frames/s, ingest rows/s, the
delivery figures: exposed latency and iteration time per superstep, and what the replay
holds: rows per tier and bytes a row takes stored against the full layout).

    conduit-hpc run jobs/apex_atari.toml [--set dqn.env_id=ALE/Breakout-v5]
    conduit-hpc run jobs/apex_atari.toml --resume     # from the newest checkpoint
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
from conduit_hpc.config import LaunchWorld, require, require_types
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
from conduit_hpc.placement.placement import Placement
from conduit_hpc.placement.workload import Workload
from conduit_hpc.plane.metrics import write_summary
from conduit_hpc.rl import (
    EPISODES_TAG,
    ApexActor,
    AtariSection,
    DQNSection,
    DQNUpdater,
    NatureQNetwork,
    check_actor_batch,
    check_dqn_launch,
    describe_transitions,
    has_episodes,
    make_atari_vector_env,
    merge_episode_files,
)
from conduit_hpc.rl.section import ENV_BYTES_FLOOR, check_actor_rows, require_polls_within
from conduit_hpc.spec import frame_stacks
from conduit_hpc.transport.objects import allgather_json


@dataclass(frozen=True, slots=True, kw_only=True)
class AtariJobSection:
    """``[job]``: budgets and reporting (the algorithm's knobs are in ``[dqn]``, the
    preprocessing in ``[atari]``).

    Attributes:
        max_supersteps (int): learner updates before the job ends (0: no such budget).
        progress_every_s (float): seconds between progress lines (0: none).
        poll_every_s (float): seconds between the learner's looks at episode reports.
        report_every_s (float): an actor reports its step count at least this often.
    """

    max_supersteps: int = 0
    progress_every_s: float = 10.0
    poll_every_s: float = 0.05
    report_every_s: float = 0.25

    def __post_init__(self) -> None:
        require_types(self)
        require(self.max_supersteps >= 0, "max_supersteps", self.max_supersteps,
                ">= 0 (0: no superstep budget)")
        for name in ("progress_every_s", "poll_every_s", "report_every_s"):
            v = getattr(self, name)
            require(math.isfinite(v) and v >= 0, name, v, ">= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class ApexAtariConfig(Config):
    job: AtariJobSection = field(default_factory=AtariJobSection)
    dqn: DQNSection = field(default_factory=DQNSection)
    atari: AtariSection = field(default_factory=AtariSection)

    def __post_init__(self) -> None:
        Config.__post_init__(self)
        require_polls_within(self.job, self.run.timeout_s)  # stop requests, budgets

    def check_launch(self, world: LaunchWorld) -> None:
        """:func:`check_config` with the launch's role counts, and the Nature CNN's head
        and the actors' games (frame stacks) against a node's memory, before any rank
        starts."""
        Config.check_launch(self, world)
        if world.actors is not None and world.learners is not None:
            check_config(self, world.actors, world.learners)
        side = self.atari.screen_size
        for kernel, stride in ((8, 4), (4, 2), (3, 1)):  # the Nature CNN's torso
            side = (side - kernel) // stride + 1
        frames = self.atari.frame_stack * self.atari.screen_size ** 2
        # a game's stacked observation, held by the env and by the vector env's buffer
        check_dqn_launch(self.dqn, world, in_features=64 * side * side,
                         env_bytes=ENV_BYTES_FLOOR + 2 * frames)


def check_config(cfg: ApexAtariConfig, n_actors: int, n_learners: int) -> int:
    """What this job needs of the layout, the sampler and the spec. Deterministic:
    every rank raises together.

    Returns:
        int: environments per actor.
    """
    hp = cfg.dqn
    if cfg.scheduler.sampler != "prioritized":
        raise ConfigError(f"scheduler.sampler must be 'prioritized' for Ape-X DQN, got "
                          f"{cfg.scheduler.sampler!r}", key="scheduler.sampler")
    if n_learners != 1:
        raise ConfigError(f"layout.learners must be 1 for this job (one learner; the "
                          f"data-parallel learners of dqn_cartpole are not wired here "
                          f"yet), got {n_learners}", key="layout.learners")
    if n_actors < 1 or hp.num_envs % n_actors:
        raise ConfigError(f"dqn.num_envs must be a positive multiple of the number of "
                          f"actor ranks ({n_actors}), got {hp.num_envs}", key="dqn.num_envs")
    shape = list(cfg.atari.obs_shape)
    for name in ("obs", "next_obs"):
        fc = cfg.spec.get(name)
        if fc is None or fc.dtype != "uint8" or list(fc.shape) != shape:
            got = None if fc is None else (fc.dtype, list(fc.shape))
            raise ConfigError(f"spec.{name} must be uint8 of shape {shape} (atari.frame_stack"
                              f", screen_size, screen_size), got {got}", key=f"spec.{name}")
    stacks = frame_stacks(cfg.spec)
    if stacks and (set(stacks) != {"obs"} or stacks["obs"].axis != 0
                   or stacks["obs"].next_field != "next_obs"):
        raise ConfigError("the Atari job's frame stacks are obs (stack = {axis = 0, "
                          "stream = ...}) and next_obs (next_of = 'obs'), or none; got "
                          f"{sorted(stacks)}", key="spec.obs.stack")
    if stacks:  # the actors write each row's env slot into the stream field, in its type
        stream = stacks["obs"].stream
        top = int(np.iinfo(np.dtype(cfg.spec[stream].dtype)).max)
        if hp.num_envs - 1 > top:
            raise ConfigError(f"spec.{stream}.dtype must hold every env slot 0 .. "
                              f"{hp.num_envs - 1} (dqn.num_envs; the stream of the frame "
                              f"stacks), got {cfg.spec[stream].dtype} (at most {top})",
                              key=f"spec.{stream}.dtype")
    one = {"obs": np.zeros((1, *shape), np.uint8), "action": np.zeros(1, np.int64),
           "reward": np.zeros(1, np.float32), "next_obs": np.zeros((1, *shape), np.uint8),
           "discount": np.zeros(1, np.float32)}  # a row as ApexActor.step makes it
    check_actor_rows(cfg.spec, one, stacks["obs"].stream if stacks else "")
    check_actor_batch(hp, hp.num_envs // n_actors, cfg.scheduler)
    return hp.num_envs // n_actors


class EpisodeReferee:
    """On the learner: the actors' episode reports, the mean return of the last
    ``window`` scored episodes and the agent steps spent. Local."""

    def __init__(self, edp: ExperienceDataPlane, hp: DQNSection,
                 env_steps_offset: int = 0) -> None:
        self.edp, self.hp = edp, hp
        self.env_steps_offset = env_steps_offset  # steps of the run this one resumes
        self.recent: deque[float] = deque(maxlen=hp.window)
        self.actor_steps: dict[int, int] = {}
        self.episodes = 0
        self.reached_at: int | None = None

    @property
    def env_steps(self) -> int:
        return self.env_steps_offset + sum(self.actor_steps.values())

    @property
    def mean(self) -> float:
        return float(np.mean(self.recent)) if self.recent else math.nan

    def _drain(self) -> None:
        while (msg := self.edp.channel.poll(tag=EPISODES_TAG)) is not None:
            v = msg.view(np.float64)
            self.actor_steps[msg.source] = int(v[0])
            for ret, scored in v[1:].reshape(-1, 2):
                self.episodes += 1
                if scored:
                    self.recent.append(float(ret))
                if (self.reached_at is None and len(self.recent) == self.hp.window
                        and self.mean >= self.hp.target_return):
                    self.reached_at = self.env_steps

    def poll(self) -> None:
        """Read every report that has arrived (on the data-plane thread)."""
        assert self.edp.learner is not None
        self.edp.learner.run_on_thread(self._drain, "episode reports")


def actor_loop(edp: ExperienceDataPlane, cfg: ApexAtariConfig, net: torch.nn.Module, k: int,
               stop: StopCoordinator, run_dir: Path | None, t0: float) -> dict[str, Any]:
    hp, job, atari = cfg.dqn, cfg.job, cfg.atari
    a = edp.roles.role_rank
    stacks = frame_stacks(cfg.spec)
    path = run_dir / "metrics" / f"episodes-{edp.world_rank}.csv" if run_dir else None
    actor = ApexActor(hp, net, actor_index=a, envs_per_actor=k,
                      seed=cfg.run.seed * 1000 + a * k, episodes_path=path,
                      actor_id=edp.world_rank, t0=t0,
                      make_env=lambda n, seed: make_atari_vector_env(hp.env_id, n, seed, atari),
                      obs_dtype="uint8", reward_clip=atari.reward_clip,
                      stream_field=stacks["obs"].stream if "obs" in stacks else "",
                      stream_dtype=(cfg.spec[stacks["obs"].stream].dtype if "obs" in stacks
                                    else "int64"))
    actor.weights_loaded(edp.policy_version)
    lead = edp.roles.learner_ranks[0]
    pending: list[float] = []
    last_report = started = time.perf_counter()
    rows = 0
    try:
        while not edp.should_stop and not stop.requested():  # a step is ms of frames
            out = actor.step()
            if len(out.priorities):
                edp.ingest(out.rows, priorities=out.priorities)
                rows += len(out.priorities)
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
    wall = time.perf_counter() - started
    return {"env_steps": actor.env_steps, "episodes": actor.episodes.count,
            "rows": rows, "wall_s": wall,
            "frames_per_s": actor.env_steps * atari.frame_skip / wall if wall > 0 else 0.0}


def budget_spent(cfg: ApexAtariConfig, referee: EpisodeReferee, updates: int,
                 elapsed_s: float) -> str:
    """Why the learner stops on its own (``""``: go on). Local."""
    hp, job = cfg.dqn, cfg.job
    if referee.reached_at is not None:
        return "target"
    if referee.env_steps >= hp.max_env_steps:
        return "env-step budget"
    if job.max_supersteps and updates >= job.max_supersteps:
        return "superstep budget"
    if cfg.run.duration_s and elapsed_s >= cfg.run.duration_s:
        return "time budget"
    return ""


def learner_loop(edp: ExperienceDataPlane, cfg: ApexAtariConfig, updater: DQNUpdater,
                 stop: StopCoordinator, agent: CheckpointAgent,
                 env_steps_offset: int) -> dict[str, Any]:
    hp, job = cfg.dqn, cfg.job
    referee = EpisodeReferee(edp, hp, env_steps_offset)

    def state() -> dict[str, Any]:  # at checkpoint boundaries: the model and counters
        return {"counters": {"updates": updater.updates, "env_steps": referee.env_steps},
                "extra_state": updater.state_arrays(), "extra_attrs": updater.state_attrs()}

    agent.every_supersteps(cfg.checkpoint.every_supersteps, state)
    t0 = last_poll = last_print = time.perf_counter()
    printed = (updater.updates, referee.env_steps)  # at the last progress line
    at_start = updater.updates  # (a resumed run's, from its checkpoint)
    why, losses = "", []
    while not why:
        now = time.perf_counter()
        if now - last_poll >= job.poll_every_s:
            last_poll = now
            referee.poll()
            if stop.requested():
                why = "stop requested"
        why = why or budget_spent(cfg, referee, updater.updates, now - t0)
        if why:
            break
        try:
            batch = edp.next_batch()
        except DataPlaneClosed:
            # the actors stopped before the buffer was filled: the end of a stop request
            why = "stop requested" if stop.requested() else "stream closed"
            break
        loss, td = updater.update(batch.data, batch.weights)
        losses.append(loss)
        prio = td.abs().double().cpu().numpy() + 1e-6
        edp.update_priorities(batch.indices, prio)
        edp.log(loss=loss, td_abs_mean=float(prio.mean()), mean_return=referee.mean)
        if job.progress_every_s and now - last_print >= job.progress_every_s:
            dt = max(now - last_print, 1e-9)
            frames_s = (referee.env_steps - printed[1]) * cfg.atari.frame_skip / dt
            frames = referee.env_steps * cfg.atari.frame_skip
            print(f"[apex_atari] {now - t0:6.1f} s  frames {frames:>9,} ({frames_s:6.0f}/s)"
                  f"  mean-{hp.window} return {referee.mean:6.1f}  "
                  f"supersteps {updater.updates:>6,} ({(updater.updates - printed[0]) / dt:5.1f}/s)"
                  f"  loss {loss:.4f}", flush=True)
            last_print, printed = now, (updater.updates, referee.env_steps)
    referee.poll()
    return {"updates": updater.updates, "updates_at_start": at_start, "why": why,
            "wall_s": time.perf_counter() - t0,
            "reached_at": referee.reached_at, "mean": referee.mean,
            "episodes_seen": referee.episodes, "env_steps_seen": referee.env_steps,
            "env_steps_offset": env_steps_offset,
            "loss_last": losses[-1] if losses else math.nan,
            "loss_finite": bool(losses) and all(math.isfinite(v) for v in losses)}


def build_net(cfg: ApexAtariConfig) -> torch.nn.Module:
    """The Nature CNN, the same initial weights on every rank."""
    env, _ = make_atari_vector_env(cfg.dqn.env_id, 1, cfg.run.seed, cfg.atari)
    n_actions = int(env.single_action_space.n)
    env.close()
    torch.manual_seed(cfg.run.seed)
    return NatureQNetwork(cfg.atari.obs_shape, n_actions, cfg.dqn.hidden, cfg.dqn.dueling)


def run(cfg: ApexAtariConfig, run_dir: Path | None, resume: str) -> dict[str, Any]:
    torch.set_num_threads(1)
    # what reward and discount mean (n, gamma): attributes of the checkpoint's datasets
    cfg = replace(cfg, spec=describe_transitions(cfg.spec, n_step=cfg.dqn.n_step,
                                                 gamma=cfg.dqn.gamma))
    ccfg = cfg.checkpoint
    out: dict[str, Any] = {}
    with ExperienceDataPlane(cfg, run_dir=run_dir) as edp:  # collective
        k = check_config(cfg, len(edp.roles.actor_ranks), len(edp.roles.learner_ranks))
        stop = StopCoordinator(edp)  # SIGTERM / SIGUSR1 anywhere: every rank stops
        rank = edp.world_rank
        # the actors' episode files hold the earlier attempts (a resume in the same
        # run directory; looked at before the restore, a collective, so before any
        # actor of this attempt writes), else the merge adds the checkpoint's steps
        carried = rank == 0 and run_dir is not None and has_episodes(run_dir / "metrics")
        # collective: the replay (each frame once, as saved), the sampler, stored state
        restored = (restore_data_plane(edp, resume, roots=resume_roots(cfg, run_dir))
                    if resume else None)
        if rank == 0:
            for line in restore_lines(restored, resume):
                print(line, flush=True)
        root = checkpoint_root(cfg, run_dir)
        agent = CheckpointAgent(edp, root, every_seconds=ccfg.every_seconds, keep=ccfg.keep,
                                first_seq=restored.seq + 1 if restored else 1)
        net = build_net(cfg) if not edp.serves else None
        updater = None
        if net is not None and edp.role is Role.LEARNER:
            net = net.to(edp.device)
            updater = DQNUpdater(cfg.dqn, net)
            updater.warm_up()
            if restored is not None and restored.extra_state:
                updater.load_state_arrays(restored.extra_state)
                print(f"resume: model, target network and optimizer from checkpoint "
                      f"{restored.seq} (after {updater.updates:,} updates)", flush=True)
            elif restored is not None:
                print(f"resume: checkpoint {restored.seq} holds no learner state (a "
                      f"buffer-side periodic one); the model starts fresh", flush=True)
        edp.share_weights(net)  # collective; actors start from the learner's weights
        if rank == 0:
            print(f"apex_atari: {cfg.dqn.env_id}, {len(edp.roles.actor_ranks)} actor ranks x "
                  f"{k} envs, {len(edp.roles.buffer_ranks)} buffer, 1 learner; rows of "
                  f"{sum(f.row_bytes for f in cfg.spec.values()):,} bytes, mode "
                  f"{cfg.scheduler.mode}, target mean-{cfg.dqn.window} return "
                  f"{cfg.dqn.target_return:g}; checkpoints under {root}", flush=True)
        t0 = time.perf_counter()
        if edp.role is Role.ACTOR:
            assert net is not None
            out = actor_loop(edp, cfg, net, k, stop, run_dir, t0)
        elif edp.serves:
            edp.serve()
        else:
            assert updater is not None
            offset = resumed_counter(restored, edp.roles.learner_ranks[0], "env_steps")
            out = learner_loop(edp, cfg, updater, stop, agent, offset)
        edp.done()
        agent.finish()
        stopped = stop.agree()
        final = None
        if stopped and ccfg.on_stop:  # collective: the replay, the model, the counters
            final = save_checkpoint(edp, root, agent=agent, keep=ccfg.keep,
                counters={"updates": out.get("updates", 0),
                          "env_steps": out.get("env_steps_seen", 0)},
                extra_state=updater.state_arrays() if updater else None,
                extra_attrs=updater.state_attrs() if updater else None)
        outcome = checkpoint_outcome(edp, agent, final)  # collective
        summary = edp.summary()
        # JSON, not pickle (collective on the world; every rank gets every rank's stats)
        stats = [(str(role), int(r), dict(s)) for role, r, s in allgather_json(
            edp.roles.world, [edp.role.value, rank, out])]
        placement = edp.placement
        stop.close()
        wall = time.perf_counter() - t0
    if rank == 0:
        if final is not None:
            print(f"final checkpoint written: {final.path}", flush=True)
        for line in outcome.lines():
            print(line, flush=True)
        flat = flat_summary(cfg, summary, stats, wall, placement, stopped)
        if run_dir is not None:
            merge_episode_files(run_dir / "metrics", env_steps_offset=0 if carried
                                else flat["env_steps_total"] - flat["env_steps"])
            write_summary(run_dir / "metrics" / "summary.json", flat)
        report(flat)
    outcome.raise_if_none_written()  # every rank: the run cannot be resumed
    return summary


def replay_footprint(cfg: ApexAtariConfig, placement: Placement,
                     shards: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    """What the replay holds and what a row takes, stored (frames once when the spec
    declares stacks) against the full layout (whole stacks), by the same arithmetic
    as ``conduit-hpc plan`` (:class:`~conduit_hpc.placement.workload.Workload`: stored
    payload, stamp and priority, priority index). Local."""
    wl, _ = Workload.from_job(cfg)
    full = replace(wl, stored_row_bytes=0)
    tiers = {t: n for t, n in placement.tier_rows().items() if n}
    capacity = sum(tiers.values())
    budget = capacity * wl.bytes_per_row
    return {
        "replay_capacity_rows": capacity,
        "replay_rows_held": int(sum(s.get("held", 0) for s in shards.values())),
        "replay_tier_rows": tiers,
        "stored_row_bytes": wl.stored_bytes,
        "stored_over_full": wl.stored_bytes / wl.row_bytes,
        # memory a row takes in a tier (as the plan counts it), and in the full layout
        "memory_row_bytes": wl.bytes_per_row,
        "memory_row_bytes_full": full.bytes_per_row,
        "replay_memory_bytes": budget,
        # the same bytes in the full layout hold this many rows: ratio >= 6 is the goal
        "full_layout_rows_in_budget": budget // full.bytes_per_row,
        "rows_per_budget_over_full": full.bytes_per_row / wl.bytes_per_row,
    }


def flat_summary(cfg: ApexAtariConfig, summary: dict[str, Any],
                 stats: list[tuple[str, int, dict[str, Any]]], wall: float,
                 placement: Placement, stopped: bool) -> dict[str, Any]:
    """The run's headline numbers (``summary.json``). ``env_steps`` and ``frames`` are
    this run's; ``env_steps_total`` adds those of the run it resumed. ``updates`` counts
    the resumed run's too (``updates_at_start`` of them); ``updates_per_s`` and the rows
    delivered (``rows_delivered``, ``delivered_*_per_s``) are this run's, over its time."""
    learner = next(s for role, _, s in stats if role == "learner")
    lead = next(r for role, r, _ in stats if role == "learner")
    actors = [s for role, _, s in stats if role == "actor"]
    lat = summary["learners"].get(lead, {})
    learner_wall = float(learner.get("wall_s", wall)) or wall
    env_steps = sum(a.get("env_steps", 0) for a in actors)
    frames = env_steps * cfg.atari.frame_skip
    updates = int(learner.get("updates", 0))
    # this run's updates (the resumed run's total over this run's time was its rate)
    done = updates - int(learner.get("updates_at_start", 0))
    row_bytes = sum(f.row_bytes for f in cfg.spec.values())
    span = max((a.get("span_s", 0.0) for a in summary["actors"].values()), default=0.0)
    return {
        "job": "apex_atari", "env_id": cfg.dqn.env_id, "mode": cfg.scheduler.mode,
        "seed": cfg.run.seed, "reached": learner.get("reached_at") is not None,
        "env_steps_to_target": learner.get("reached_at"),
        "target_return": cfg.dqn.target_return,
        "stopped_by": "stop requested" if stopped else learner.get("why", ""),
        "wall_s": learner_wall, "env_steps": env_steps, "frames": frames,
        "env_steps_total": int(learner.get("env_steps_offset", 0)) + env_steps,
        "frames_per_s": frames / learner_wall if learner_wall > 0 else 0.0,
        "frames_per_s_per_actor": [a.get("frames_per_s", 0.0) for a in actors],
        "episodes": sum(a.get("episodes", 0) for a in actors),
        "final_mean_return": learner.get("mean", math.nan),
        "updates": updates, "supersteps": int(lat.get("supersteps", updates)),
        "updates_at_start": updates - done,
        "updates_per_s": done / learner_wall if learner_wall > 0 else 0.0,
        "loss_last": learner.get("loss_last", math.nan),
        "loss_finite": bool(learner.get("loss_finite", False)),
        "row_bytes": row_bytes,
        # bytes a slot of the shards takes (frames once: a frame, references, lag), the
        # rows the replay holds, and what the same memory holds in the full layout
        **replay_footprint(cfg, placement, summary["shards"]),
        # declared in [spec]: the shards store each frame once
        "frame_stacks": {k: {"stream": v.stream, "axis": v.axis, "depth": v.depth,
                             "next_field": v.next_field}
                         for k, v in frame_stacks(cfg.spec).items()},
        "rows_ingested": summary["rows_ingested"],
        # over the actors' span (start to latest row), as headline_figures and `report`
        # take it; bytes as the shards took them (each frame once), not whole stacks
        "ingest_span_s": span,
        "ingest_rows_per_s": summary["rows_ingested"] / span if span > 0 else 0.0,
        "ingest_mb_per_s": summary["bytes_ingested"] / span / 1e6 if span > 0 else 0.0,
        "limiter_wait_s": sum(a["limiter_wait_s"] for a in summary["actors"].values()),
        # delivery: rows the learner took, and what its batches cost it per superstep
        "rows_delivered": done * cfg.scheduler.batch_rows,
        "delivered_rows_per_s": (done * cfg.scheduler.batch_rows / learner_wall
                                 if learner_wall > 0 else 0.0),
        "delivered_mb_per_s": (done * cfg.scheduler.batch_rows * row_bytes / learner_wall
                               / 1e6 if learner_wall > 0 else 0.0),
        "exposed_mean_s": lat.get("exposed_mean_s", math.nan),
        "exposed_median_s": lat.get("exposed_median_s", math.nan),
        "iteration_mean_s": lat.get("iteration_mean_s", math.nan),
    }


def report(flat: dict[str, Any]) -> None:
    """The final summary, in words, then as one JSON line."""
    print(f"apex_atari ({flat['env_id']}, {flat['mode']}): stopped by {flat['stopped_by']}; "
          f"final mean return {flat['final_mean_return']:.1f}\n"
          f"  {flat['frames']:,} frames ({flat['frames_per_s']:,.0f} frames/s), "
          f"{flat['episodes']:,} episodes, {flat['supersteps']:,} supersteps "
          f"({flat['updates_per_s']:.1f}/s) in {flat['wall_s']:.1f} s\n"
          f"  ingest {flat['ingest_rows_per_s']:,.0f} rows/s ({flat['ingest_mb_per_s']:.1f} "
          f"MB/s, {flat['rows_ingested']:,} rows); delivered {flat['delivered_rows_per_s']:,.0f}"
          f" rows/s ({flat['delivered_mb_per_s']:.1f} MB/s), exposed latency mean "
          f"{flat['exposed_mean_s'] * 1e3:.3f} ms", flush=True)
    tiers = ", ".join(f"{n:,} in {t}" for t, n in flat["replay_tier_rows"].items())
    print(f"  replay holds {flat['replay_rows_held']:,} of {flat['replay_capacity_rows']:,} "
          f"rows ({tiers}): {flat['stored_row_bytes']:,} B stored a row against "
          f"{flat['row_bytes']:,} B in the full layout ({flat['stored_over_full']:.3f}); "
          f"its {flat['replay_memory_bytes'] / 1e6:,.1f} MB would hold "
          f"{flat['full_layout_rows_in_budget']:,} full rows "
          f"({flat['rows_per_budget_over_full']:.1f}x fewer)", flush=True)
    print(jsontext.dumps(flat, sort_keys=True, default=str), flush=True)


JOB_CONFIG = ApexAtariConfig  # [job], [dqn] and [atari]

if __name__ == "__main__":
    job_main(ApexAtariConfig, run)
