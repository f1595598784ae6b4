"""Delivery per superstep in a running job with the replay in each tier (synthetic job).

    conduit-hpc bench tiers-job [--duration 8] [--mode sync] [--out DIR] [--smoke]

Runs ``jobs/synthetic.toml`` (6 ranks: 1 learner, 1 buffer, 4 actors at 20k rows/s each)
once per placement, in ``sync`` mode by default so that each superstep's experience path
(sample + gather + transform + copy) is all exposed and measured by the learner itself:

* ``buffer_host``: ``planner = "round_robin"``, the replay in the buffer rank's window;
* ``learner_gpu (all)``: ``planner = "static"`` on a one-node cluster file whose learner
  "GPU" holds the whole replay, ``tiers = ["learner_gpu"]``: every row mirrored on the
  learner's device (:mod:`conduit_hpc.plane.device_tier`);
* ``split``: the same cluster with GPU memory for about a quarter of the replay and
  ``tiers = ["learner_gpu", "buffer_host"]``: the planner's share on the device, the
  rest in the buffer's window; batches drawn across both.

Reports per placement the median (ms) of the learner's ``sample_s``, ``gather_s``,
``copy_s``, their sum (the path) and ``iteration_s``, and the share of rows drawn from
the device, one JSON line each. On this machine the device is the CPU (torch tensors in
host memory), so the figures compare code paths (device-side search and gather against
the shared-memory sum-tree and numpy copies), not PCIe against HBM; the same command on a
GPU node (``--set scheduler.device=cuda``) measures the real tiers.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from conduit_hpc import jsontext
from conduit_hpc.bench._args import out_dir, real
from conduit_hpc.bench.common import git_sha
from conduit_hpc.plane.sampled_rows import row_weight, rows_after, weighted_median

JOB = Path(__file__).resolve().parents[2] / "jobs" / "synthetic.toml"

CLUSTER = """name = "bench-tiers-job"
[[nodes]]
name = "local"
gpus = 1
learners = 1
buffers = 1
actors = 4
learner_gpu_bytes = {gpu}
learner_host_bytes = 0
buffer_host_bytes = "4 GB"
gpu_host = {{ bandwidth_gbps = 25.0, latency_s = 1e-5 }}
shm = {{ bandwidth_gbps = 8.0, latency_s = 1.5e-6 }}
"""


def _replay_bytes(job: Path) -> int:
    """What the planner needs for the job's whole replay (rows, stamps, index)."""
    from conduit_hpc.config import Config
    from conduit_hpc.placement.model import INDEX_BYTES_PER_ROW, STAMP_BYTES_PER_ROW
    from conduit_hpc.spec import Spec

    cfg = Config.from_toml(job)
    row = Spec.from_config(cfg.spec).row_bytes + STAMP_BYTES_PER_ROW + INDEX_BYTES_PER_ROW
    return row * cfg.storage.capacity_rows


def placements(tmp: Path, job: Path) -> list[tuple[str, list[str]]]:
    """(name, extra ``--set`` arguments) per placement; writes the cluster files."""
    total = _replay_bytes(job)
    out: list[tuple[str, list[str]]] = [("buffer_host", [])]
    for name, gpu, tiers in (("learner_gpu (all)", 2 * total, '["learner_gpu"]'),
                             ("split", total // 4, '["learner_gpu", "buffer_host"]')):
        path = tmp / f"cluster-{len(out)}.toml"
        path.write_text(CLUSTER.format(gpu=int(gpu)))
        out.append((name, ["placement.planner=static", f"placement.cluster={path}",
                           f"placement.tiers={tiers}"]))
    return out


def _median_ms(rows: list[dict[str, str]], key: str) -> float:
    """Median over the supersteps (each row weighted by those it stands for), in ms."""
    return 1e3 * weighted_median([float(r[key]) for r in rows],
                                 [row_weight(r) for r in rows])


def run_one(name: str, sets: list[str], args: argparse.Namespace, out: Path) -> dict[str, Any]:
    runs = out / name.split(" ")[0]
    cmd = [sys.executable, "-m", "conduit_hpc.tools.cli", "run", str(args.job), "--mode",
           args.mode, "--runs", str(runs), "--set", f"run.duration_s={args.duration}",
           "--set", "checkpoint.every_seconds=0", "--set", "checkpoint.on_stop=false"]
    for s in [*sets, *args.set]:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + 240,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench tiers-job: {name} failed (exit {proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    run_dir = max(runs.iterdir(), key=lambda p: p.name)
    with open(run_dir / "metrics" / "learner-0.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    rows = rows_after(rows, int(sum(map(row_weight, rows))) // 5)  # past fill and warm-up
    steps = int(sum(map(row_weight, rows)))
    summary = json.loads((run_dir / "metrics" / "summary.json").read_text())
    plan = json.loads((run_dir / "plan.json").read_text())
    path = [sum(float(r[k]) for k in ("sample_s", "gather_s", "transform_s", "copy_s"))
            for r in rows]
    drawn = float(summary.get("learner0_device_rows_drawn", 0.0))
    batch_rows = sum(int(r["rows"]) * row_weight(r) for r in rows) / max(steps, 1)
    supersteps = int(summary.get("learner0_supersteps", 0) or steps)
    return {"placement": name, "mode": args.mode, "supersteps": steps,
            "tiers": {t: v["rows"] for t, v in plan["tiers"].items()},
            "sample_ms": _median_ms(rows, "sample_s"), "gather_ms": _median_ms(rows, "gather_s"),
            "copy_ms": _median_ms(rows, "copy_s"),
            "path_ms": 1e3 * weighted_median(path, [row_weight(r) for r in rows]),
            "iteration_ms": _median_ms(rows, "iteration_s"),
            "device_share": drawn / (batch_rows * supersteps) if supersteps else 0.0,
            "git": git_sha()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="conduit-hpc bench tiers-job", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", default=str(JOB), help="job TOML (the synthetic job)")
    p.add_argument("--mode", default="sync", choices=["sync", "edp", "service"])
    p.add_argument("--duration", type=real(0, 1e6, open_lo=True), default=8.0,
                   help="seconds per run")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="passed to every run, e.g. scheduler.device=cuda")
    p.add_argument("--out", type=out_dir, default="",
                   help="folder for the runs (default: a temp dir)")
    p.add_argument("--smoke", action="store_true", help="2 s per run")
    args = p.parse_args(argv)
    if args.smoke:
        args.duration = 2.0
    if not args.duration > 0:
        p.error(f"--duration must be > 0 seconds, got {args.duration}")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench-tiers-job-"))
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name, sets in placements(out, Path(args.job)):
        r = run_one(name, sets, args, out)
        print(jsontext.dumps(r), flush=True)
        results.append(r)
    return {"results": results, "out": str(out)}
