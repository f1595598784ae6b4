"""Synthetic experience workload: the data plane without RL.

Actor ranks generate random rows that match the spec and ingest them in batches for
``run.duration_s`` seconds (optionally at a fixed rate); buffer ranks serve; learner
ranks wait. Rank 0 prints what was ingested and at what rate.

    mpirun -n 6 python -m mpi4py jobs/synthetic.py --config jobs/synthetic.toml
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from conduit_hpc import Config, ExperienceDataPlane, Role, Spec
from conduit_hpc.config import require
from conduit_hpc.runner import job_main, stop_requested


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


def run(cfg: SyntheticConfig, resume: str = "") -> dict:
    with ExperienceDataPlane(cfg) as edp:
        if resume and edp.world_rank == 0:
            print(f"resume requested ({resume}): the synthetic job keeps no checkpoint; "
                  "starting over", flush=True)
        rank = edp.world_rank
        if rank == 0:
            print(f"synthetic: {len(edp.roles.actor_ranks)} actors ingesting for "
                  f"{cfg.run.duration_s or 3.0:g} s", flush=True)
        if edp.role is Role.ACTOR:
            rng = np.random.default_rng(cfg.run.seed + rank)
            b = cfg.synthetic.batch_rows
            pool = [random_batch(edp.spec, b, rng) for _ in range(4)]
            rate = cfg.synthetic.actor_rate_rows_s
            t0 = time.perf_counter()
            end = t0 + (cfg.run.duration_s or 3.0)
            i = 0
            while (now := time.perf_counter()) < end and not stop_requested():
                if rate > 0 and edp.ingest_stats.rows >= rate * (now - t0):
                    time.sleep(min(0.001, end - now))
                    continue
                edp.ingest(pool[i % len(pool)])
                i += 1
            edp.done()
        elif edp.role is Role.BUFFER:
            edp.serve()
        else:
            edp.done()
        summary = edp.summary()
    if rank == 0:
        report(summary, cfg)
        if stop_requested():
            print("stopped early: stop requested (SIGUSR1, e.g. a SLURM preemption warning)",
                  flush=True)
    return summary


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
