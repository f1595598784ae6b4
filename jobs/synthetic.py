"""Synthetic experience workload: the data plane without RL.

Actor ranks generate random rows that match the spec and ingest them in batches
(optionally at a fixed rate); buffer ranks serve; learner ranks take batches through
``next_batch()``, "compute" on each with a torch matmul sized to take
``synthetic.compute_s`` seconds, and send back random priorities. The job ends after
``synthetic.supersteps`` learner supersteps (or ``run.duration_s`` when that is 0 or
there is no learner). Rank 0 prints what was ingested and delivered, and how long
learners waited.

Checkpoints (``[checkpoint]``): the buffer side writes one every ``every_seconds`` while
actors ingest; ``--resume`` (latest, or a path) restores the replay state first; SIGTERM
or SIGUSR1 on any rank stops every rank, which then write a final checkpoint together
and exit 0.

    conduit-hpc run jobs/synthetic.toml [--mode edp|sync|service] [--set key=value]
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from conduit_hpc import Config, DataPlaneClosed, ExperienceDataPlane, Role, Spec, jsontext
from conduit_hpc.checkpoint import rng_from_json, rng_to_json
from conduit_hpc.config import LaunchWorld, require, require_bytes
from conduit_hpc.config.checks import itemsize
from conduit_hpc.features.checkpointing import (
    CheckpointOutcome,
    SaveResult,
    checkpoint_outcome,
    restore_data_plane,
    save_checkpoint,
)
from conduit_hpc.features.checkpointing.agent import CheckpointAgent
from conduit_hpc.features.checkpointing.resume import checkpoint_root, restore_lines, resume_roots
from conduit_hpc.features.checkpointing.stopping import StopCoordinator
from conduit_hpc.job import job_main
from conduit_hpc.plane.headline import headline_figures
from conduit_hpc.plane.metrics import write_summary

MAX_SUPERSTEP_FLOPS = 3_600 * 10**12  # matmul_reps' bound: an hour's work at 1 TFLOP/s


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticSection:
    """``[synthetic]``: the workload.

    Attributes:
        batch_rows (int): rows per ingest call.
        actor_rate_rows_s (float): rows per second per actor; 0 for as fast as possible.
        supersteps (int): learner supersteps before the job ends (0: run for
            ``run.duration_s``).
        compute_s (float): emulated learner compute per superstep (torch matmuls).
        matmul_size (int): side of the square matrices multiplied.
        matmul_reps (int): matmuls per superstep; 0 calibrates it from ``compute_s`` at
            start-up (benchmarks fix it, so that every mode does the same work).
        priorities (bool): learners send random priorities back each superstep.
    """

    batch_rows: int = 64
    actor_rate_rows_s: float = 0.0
    supersteps: int = 0
    compute_s: float = 0.002
    matmul_size: int = 128
    matmul_reps: int = 0
    priorities: bool = True

    def __post_init__(self) -> None:
        require(self.batch_rows > 0, "batch_rows", self.batch_rows, "> 0")
        require(self.actor_rate_rows_s >= 0, "actor_rate_rows_s", self.actor_rate_rows_s,
                ">= 0")
        require(self.supersteps >= 0, "supersteps", self.supersteps, ">= 0")
        require(0 <= self.compute_s <= 3600, "compute_s", self.compute_s,
                ">= 0 and <= 3600 (seconds per superstep)")
        require(self.matmul_size > 0, "matmul_size", self.matmul_size, "> 0")
        require(self.matmul_reps >= 0, "matmul_reps", self.matmul_reps, ">= 0")
        flops = 2 * self.matmul_reps * self.matmul_size ** 3  # a superstep's work, bounded
        require(flops <= MAX_SUPERSTEP_FLOPS, "matmul_reps", self.matmul_reps,  # as compute_s
                f"at most {MAX_SUPERSTEP_FLOPS // (2 * self.matmul_size ** 3):,} with "
                f"matmul_size = {self.matmul_size} (2 x reps x size^3 = {flops:.3g} "
                f"floating-point operations a superstep; at most {MAX_SUPERSTEP_FLOPS:.2g}, "
                f"an hour at 1 TFLOP/s, as compute_s is at most 3600 s)")


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticConfig(Config):
    synthetic: SyntheticSection = field(default_factory=SyntheticSection)

    def check_launch(self, world: LaunchWorld) -> None:
        """Before any rank starts: an actor's ingest batch fits the shard it writes and
        the rate limiter's bound, and its pool of batches and the learner's matrices fit
        in a node's memory (else an actor's ingest or allocation fails mid-run)."""
        Config.check_launch(self, world)
        syn, st, sch = self.synthetic, self.storage, self.scheduler
        rows, why = st.capacity_rows, "storage.capacity_rows, the whole replay"
        if (world.buffers is not None and world.actors and self.placement.planner ==
                "round_robin" and self.longhaul.mode == "off"):
            # plan_round_robin: capacity split evenly, actor i writes shard i mod shards
            shards = world.buffers * st.shards_per_buffer
            base, extra = divmod(st.capacity_rows, shards)
            rows = base + (1 if min(world.actors, shards) <= extra else 0)
            why = (f"the rows of the shards the actors write (storage.capacity_rows = "
                   f"{st.capacity_rows} over {shards} shards)")
        require(syn.batch_rows <= rows, "synthetic.batch_rows", syn.batch_rows,
                f"<= {rows}, {why}: an actor ingests each batch into one shard")
        if sch.samples_per_insert > 0:
            require(syn.batch_rows <= sch.max_insert_batch, "synthetic.batch_rows",
                    syn.batch_rows, f"<= scheduler.max_insert_batch = "
                    f"{sch.max_insert_batch}: with scheduler.samples_per_insert > 0 the rate "
                    f"limiter refuses a larger ingest")
        # random_batch draws float64 (or int64) values and casts them: per element at
        # least its own bytes in the pool of 4 batches, plus 8 while drawn
        row = sum(f.row_bytes for f in self.spec.values())
        elems = max((f.row_bytes // itemsize(f.dtype) for f in self.spec.values()),
                    default=0)
        require_bytes(world, "synthetic.batch_rows", syn.batch_rows,
                      syn.batch_rows * (4 * row + 8 * elems),
                      f"on each actor (a pool of 4 batches of {row}-byte rows)")
        require_bytes(world, "synthetic.matmul_size", syn.matmul_size,
                      3 * 4 * syn.matmul_size ** 2,
                      "on the learner (three float32 matrices of matmul_size x matmul_size)")


def random_batch(spec: Spec, rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random rows of every field of ``spec``."""
    out = {}
    for f in spec:
        if f.dtype.kind == "f":
            out[f.name] = rng.standard_normal((rows, *f.shape)).astype(f.dtype)
        elif f.dtype.kind == "b":
            out[f.name] = rng.integers(0, 2, (rows, *f.shape)).astype(bool)
        else:
            info = np.iinfo(f.dtype)
            out[f.name] = rng.integers(max(info.min, -1000), min(info.max, 1000),
                                       (rows, *f.shape)).astype(f.dtype)
    return out


class MatmulCompute:
    """Emulated learner compute: repeated square matmuls, calibrated to a duration."""

    def __init__(self, seconds: float, size: int, device: object, reps: int = 0) -> None:
        import torch  # only learners pay for importing torch

        self.a = torch.randn(size, size, device=device)
        self.b = torch.randn(size, size, device=device)
        for _ in range(3):
            self.a @ self.b
        t0 = time.perf_counter()
        for _ in range(10):
            self.a @ self.b
        one = (time.perf_counter() - t0) / 10
        self.reps = reps or (max(1, round(seconds / one)) if seconds > 0 else 0)

    def __call__(self) -> float:
        out = 0.0
        for _ in range(self.reps):
            out += float((self.a @ self.b)[0, 0])
        return out


def actor_loop(edp: ExperienceDataPlane, cfg: SyntheticConfig, rng: np.random.Generator,
               stop: StopCoordinator) -> None:
    b = cfg.synthetic.batch_rows
    pool = [random_batch(edp.spec, b, rng) for _ in range(4)]
    rate = cfg.synthetic.actor_rate_rows_s
    t0 = time.perf_counter()
    timed = not edp.roles.learner_ranks or not cfg.synthetic.supersteps
    end = t0 + (cfg.run.duration_s or 3.0) if timed else float("inf")
    i = 0
    while (now := time.perf_counter()) < end and not edp.should_stop:
        if i % 16 == 0 and stop.requested():
            break
        if rate > 0 and edp.ingest_stats.rows >= rate * (now - t0):
            time.sleep(0.0005)
            continue
        edp.ingest(pool[i % len(pool)])
        i += 1


def learner_loop(edp: ExperienceDataPlane, cfg: SyntheticConfig, rng: np.random.Generator,
                 stop: StopCoordinator) -> None:
    syn = cfg.synthetic
    compute = MatmulCompute(syn.compute_s, syn.matmul_size, edp.device, syn.matmul_reps)
    t_end = time.perf_counter() + (cfg.run.duration_s or 3.0)
    step = 0
    while (syn.supersteps and step < syn.supersteps) or (
            not syn.supersteps and time.perf_counter() < t_end):
        if step % 16 == 0 and stop.requested():
            break
        try:
            batch = edp.next_batch()
        except DataPlaneClosed:
            if stop.requested():  # the actors stopped before the buffer was filled
                break
            raise
        compute()
        if syn.priorities and cfg.scheduler.sampler == "prioritized":
            edp.update_priorities(batch.indices, rng.random(len(batch)) + 0.01)
        step += 1


def run(cfg: SyntheticConfig, run_dir: Path | None, resume: str) -> dict:
    ccfg = cfg.checkpoint
    with ExperienceDataPlane(cfg, run_dir=run_dir) as edp:
        stop = StopCoordinator(edp)  # SIGTERM / SIGUSR1 anywhere: every rank stops
        rank = edp.world_rank
        restored = (restore_data_plane(edp, resume, roots=resume_roots(cfg, run_dir))
                    if resume else None)
        root = checkpoint_root(cfg, run_dir)
        agent = CheckpointAgent(edp, root, every_seconds=ccfg.every_seconds, keep=ccfg.keep,
                                first_seq=restored.seq + 1 if restored else 1)
        rng = (rng_from_json(restored.rng_state) if restored and restored.rng_state
               else np.random.default_rng(cfg.run.seed + rank))
        if rank == 0:
            for line in restore_lines(restored, resume):
                print(line, flush=True)
            print(f"running: checkpoints under {root}", flush=True)
        # learners: checkpoints also cut at every `every_supersteps`-th superstep boundary
        agent.every_supersteps(ccfg.every_supersteps,
                             lambda: {"counters": {"rows_sampled": edp.learner.priority_rows}})
        if edp.role is Role.ACTOR:
            actor_loop(edp, cfg, rng, stop)
        elif edp.serves:
            edp.serve()
        else:
            learner_loop(edp, cfg, rng, stop)
        edp.done()
        agent.finish()
        final = None
        stopped = stop.agree()
        if stopped and rank == 0:
            print("stopped early: stop requested", flush=True)
        if stopped and ccfg.on_stop:
            final = save_checkpoint(edp, root, rng=rng_to_json(rng), agent=agent, keep=ccfg.keep,
                                   counters={"rows_ingested": edp.ingest_stats.rows})
        outcome = checkpoint_outcome(edp, agent, final)  # collective
        summary = edp.summary()
        summary["checkpoints"] = {"written": outcome.n_written, "failed": outcome.n_failed,
                                  "last": outcome.written[-1] if outcome.written else None,
                                  "latest_failures": outcome.failed,
                                  "longest_cut_s": outcome.longest_cut_s}
        stop.close()
        wall = time.perf_counter() - edp.started_at
    if rank == 0:
        report(summary, cfg, wall)
        report_checkpoints(outcome, final)
        if run_dir is not None:  # headline figures as `conduit-hpc report` computes them
            write_summary(run_dir / "metrics" / "summary.json",
                          {**flat_summary(summary, cfg, wall),
                           **headline_figures(run_dir / "metrics")})
    outcome.raise_if_none_written()  # every rank: the run cannot be resumed
    return summary


def report_checkpoints(outcome: CheckpointOutcome, final: SaveResult | None) -> None:
    for line in outcome.lines():
        print(line, flush=True)
    if final is not None:
        print(f"final checkpoint written: {final.path} (cut {final.cut_s * 1e3:.2f} ms, "
              f"{final.bytes / 1e6:.1f} MB in {final.seconds:.2f} s)", flush=True)


def ingest_span(summary: dict) -> float:
    """The longest actor's time from its start to its latest row (0 without rows): the
    span ingest rates are taken over, as ``headline_figures``' (not the job's wall time,
    which adds start-up, the learners' tail and teardown)."""
    return max((a.get("span_s", 0.0) for a in summary["actors"].values()), default=0.0)


def rate(rows: float, seconds: float) -> float:
    return rows / seconds if seconds > 0 else 0.0


def flat_summary(summary: dict, cfg: SyntheticConfig, wall: float) -> dict:
    span = ingest_span(summary)
    shards = summary["shards"].values()
    ckpt = summary.get("checkpoints", {})
    out: dict = {"job": "synthetic", "mode": cfg.scheduler.mode, "wall_s": wall,
                 "rows_ingested": summary["rows_ingested"], "ingest_span_s": span,
                 "ingest_rows_per_s": rate(summary["rows_ingested"], span),
                 # what the job prints: the shards' rows and the checkpoints' tally
                 "rows_committed": sum(s["committed"] for s in shards),
                 "rows_held": sum(s["held"] for s in shards),
                 "capacity_rows": cfg.storage.capacity_rows,
                 "dropped_updates": sum(s["dropped_updates"] for s in shards),
                 "checkpoints_written": ckpt.get("written", 0),
                 "checkpoints_failed": ckpt.get("failed", 0),
                 "checkpoint_last": ckpt.get("last")}
    for rank, lat in summary["learners"].items():
        for k, v in lat.items():
            out[f"learner{rank}_{k}"] = v
    return out


def report(summary: dict, cfg: SyntheticConfig, wall: float) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=110, color_system=None, highlight=False)
    t = Table(title=f"synthetic ingest ({len(summary['actors'])} actors, "
                    f"{len(summary['shards'])} shards, job wall time {wall:.1f} s)")
    for col in ("actor rank", "rows", "batches", "MB", "rows/s", "limiter wait s"):
        t.add_column(col, justify="right")
    for r, a in sorted(summary["actors"].items()):  # rows/s over the actor's own span
        t.add_row(str(r), f"{a['rows']:,}", f"{a['batches']:,}", f"{a['bytes'] / 1e6:.1f}",
                  f"{rate(a['rows'], a.get('span_s', 0.0)):,.0f}",
                  f"{a['limiter_wait_s']:.2f}")
    console.print(t)
    held = sum(s["held"] for s in summary["shards"].values())
    committed = sum(s["committed"] for s in summary["shards"].values())
    span = ingest_span(summary)
    console.print(f"ingested {summary['rows_ingested']:,} rows "
                  f"({summary['bytes_ingested'] / 1e6:.1f} MB) at "
                  f"{rate(summary['rows_ingested'], span):,.0f} rows/s overall (over the "
                  f"actors' {span:.1f} s); "
                  f"committed {committed:,}, held {held:,} "
                  f"(capacity {cfg.storage.capacity_rows:,})")
    for rank, lat in summary["learners"].items():
        if not lat:
            continue
        console.print(
            f"learner {rank} ({cfg.scheduler.mode}): {int(lat['supersteps'])} supersteps, "
            f"exposed median {lat.get('exposed_median_s', float('nan')) * 1e3:.3f} ms "
            f"(p99 {lat.get('exposed_p99_s', float('nan')) * 1e3:.3f}), iteration median "
            f"{lat.get('iteration_median_s', float('nan')) * 1e3:.3f} ms")
    print(jsontext.dumps({"dropped_updates": sum(s["dropped_updates"]
                                             for s in summary["shards"].values())}))


JOB_CONFIG = SyntheticConfig  # the loader finds [synthetic] here (conduit_hpc.config.jobs)

if __name__ == "__main__":
    job_main(SyntheticConfig, run)
