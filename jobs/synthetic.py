"""Synthetic experience workload: the data plane without RL.

Actor ranks generate random rows that match the spec and ingest them in batches for
``run.duration_s`` seconds (optionally at a fixed rate); buffer ranks serve; learner
ranks wait. Rank 0 prints what was ingested and at what rate.

Checkpoints (``[checkpoint]``): the buffer side writes one every ``every_seconds`` while
actors ingest; ``--resume`` (latest, or a path) restores the replay state first; SIGTERM
or SIGUSR1 on any rank stops every rank, which then write a final checkpoint together
and exit 0.

    mpirun -n 6 python -m mpi4py jobs/synthetic.py --config jobs/synthetic.toml
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from conduit_hpc import Config, ExperienceDataPlane, Role, Spec
from conduit_hpc.checkpoint import rng_from_json, rng_to_json
from conduit_hpc.checkpointing import CheckpointAgent, gather_json
from conduit_hpc.config import require
from conduit_hpc.resume import checkpoint_root, resume_roots
from conduit_hpc.runner import job_main
from conduit_hpc.stopping import StopCoordinator


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticSection:
    """``[synthetic]``: the workload.

    Attributes:
        batch_rows (int): rows per ingest call.
        actor_rate_rows_s (float): rows per second per actor; 0 for as fast as possible.
    """

    batch_rows: int = 64
    actor_rate_rows_s: float = 0.0

    def __post_init__(self) -> None:
        require(self.batch_rows > 0, "batch_rows", self.batch_rows, "> 0")
        require(self.actor_rate_rows_s >= 0, "actor_rate_rows_s", self.actor_rate_rows_s,
                ">= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticConfig(Config):
    synthetic: SyntheticSection = field(default_factory=SyntheticSection)


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


def run(cfg: SyntheticConfig, run_dir: Path | None = None, resume: str = "") -> dict:
    ccfg = cfg.checkpoint
    with ExperienceDataPlane(cfg) as edp:
        stop = StopCoordinator(edp)  # SIGTERM / SIGUSR1 anywhere: every rank stops
        rank = edp.world_rank
        restored = edp.restore(resume, roots=resume_roots(cfg, run_dir)) if resume else None
        root = checkpoint_root(cfg, run_dir)
        agent = CheckpointAgent(edp, root, every_seconds=ccfg.every_seconds, keep=ccfg.keep,
                                first_seq=restored.seq + 1 if restored else 1)
        rng = (rng_from_json(restored.rng_state) if restored and restored.rng_state
               else np.random.default_rng(cfg.run.seed + rank))
        if rank == 0:
            for reason in restored.skipped if restored else ():
                print(f"resume: skipped a checkpoint: {reason}", flush=True)
            if restored:
                print(f"resumed from {restored.path} (checkpoint {restored.seq}): "
                      f"{restored.rows:,} rows{', resharded' if restored.resharded else ''}",
                      flush=True)
            elif resume:
                print("resume: no checkpoint found; starting fresh", flush=True)
            print(f"running: checkpoints under {root}", flush=True)
        end = time.perf_counter() + (cfg.run.duration_s or 3.0)
        if edp.role is Role.ACTOR:
            b = cfg.synthetic.batch_rows
            pool = [random_batch(edp.spec, b, rng) for _ in range(4)]
            rate = cfg.synthetic.actor_rate_rows_s
            t0 = time.perf_counter()
            i = 0
            while (now := time.perf_counter()) < end and not stop.requested():
                if rate > 0 and edp.ingest_stats.rows >= rate * (now - t0):
                    time.sleep(min(0.001, end - now))
                    continue
                edp.ingest(pool[i % len(pool)])
                i += 1
            edp.done()
        elif edp.role is Role.BUFFER:
            edp.serve()
        else:
            while time.perf_counter() < end and not stop.requested():
                time.sleep(0.01)
            edp.done()
        agent.finish()
        final = None
        if stop.agree() and ccfg.on_stop:
            final = edp.checkpoint(root, rng=rng_to_json(rng), agent=agent, keep=ccfg.keep,
                                   counters={"rows_ingested": edp.ingest_stats.rows})
        summary = edp.summary()
        summary["checkpoints"] = gather_json(edp.roles.world, {
            "completed": agent.completed, "failed": agent.failed, "cuts_s": agent.cuts_s},
            root=0)
        stop.close()
    if rank == 0:
        report(summary, cfg)
        report_checkpoints(summary["checkpoints"], final)
    return summary


def report_checkpoints(per_rank: list[dict], final) -> None:
    completed = [c for r in per_rank for c in r["completed"]]
    cuts = [c for r in per_rank for c in r["cuts_s"]]
    failed = [f for r in per_rank for f in r["failed"]]
    if completed or cuts:
        print(f"periodic checkpoints: {len(completed)} written, longest cut (pause) "
              f"{max(cuts, default=0) * 1e3:.2f} ms, "
              f"last {completed[-1]['path'] if completed else '-'}")
    for f in failed:
        print(f"checkpoint failed: {f}")
    if final is not None:
        print(f"final checkpoint written: {final.path} (cut {final.cut_s * 1e3:.2f} ms, "
              f"{final.bytes / 1e6:.1f} MB in {final.seconds:.2f} s)", flush=True)


def report(summary: dict, cfg: SyntheticConfig) -> None:
    from rich.console import Console
    from rich.table import Table

    dur = cfg.run.duration_s or 3.0
    t = Table(title=f"synthetic ingest ({len(summary['actors'])} actors, "
                    f"{len(summary['shards'])} shards, {dur:g} s)")
    for col in ("actor rank", "rows", "batches", "MB", "rows/s", "MB/s (in ingest)"):
        t.add_column(col, justify="right")
    for r, a in sorted(summary["actors"].items()):
        t.add_row(str(r), f"{a['rows']:,}", f"{a['batches']:,}", f"{a['bytes'] / 1e6:.1f}",
                  f"{a['rows'] / dur:,.0f}",
                  f"{a['bytes'] / 1e6 / max(a['seconds'], 1e-9):,.0f}")
    console = Console(width=110, color_system=None, highlight=False)
    console.print(t)
    held = sum(s["held"] for s in summary["shards"].values())
    committed = sum(s["committed"] for s in summary["shards"].values())
    console.print(f"ingested {summary['rows_ingested']:,} rows "
                  f"({summary['bytes_ingested'] / 1e6:.1f} MB) at "
                  f"{summary['rows_ingested'] / dur:,.0f} rows/s overall; "
                  f"committed {committed:,}, held {held:,} "
                  f"(capacity {cfg.storage.capacity_rows:,})")


if __name__ == "__main__":
    job_main(SyntheticConfig, run)
