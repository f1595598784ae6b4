"""Exposed experience-path latency and iteration latency in edp, sync and service modes.

    conduit-hpc bench exposed-latency [--smoke] [--supersteps N] [--modes M,..] [--out DIR]

A synthetic job (jobs/synthetic.py: 1 learner, 1 buffer, 1 actor ingesting at a steady
rate) is run in every mode in one invocation - ``edp`` (the data-plane thread),
``edp-process`` (``scheduler.delivery = "process"``: a delivery rank, one more rank),
``sync`` and ``service`` - for rows of 4 float32 (batch 256) and
Atari-sized rows (2 x 4x84x84 uint8, batch 32). The experience-path time is measured
first (median exposed latency in ``sync`` mode, where the learner does the whole path
inline); learner compute, a torch matmul loop, is then set to 0.5x, 1x and 2x of it.
Reported per mode: median and p99 exposed latency and iteration latency, and the
reductions of ``edp`` against ``sync`` (exposed) and ``service`` (iteration). One JSON
line per result; a PNG of exposed vs iteration latency per mode.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from conduit_hpc import jsontext
from conduit_hpc.bench._args import names, reals, whole
from conduit_hpc.bench._args import out_dir as a_folder
from conduit_hpc.bench.common import git_sha, repo_path
from conduit_hpc.plane.sampled_rows import (
    row_weight,
    rows_after,
    weighted_median,
    weighted_percentile,
)

MODES = ("sync", "service", "edp", "edp-process")
#: the edp variants, each compared with sync and service
EDP = ("edp", "edp-process")
CASES: dict[str, dict[str, Any]] = {
    "float4": {"spec": {"obs": ("float32", [4]), "action": ("int64", []),
                        "reward": ("float32", [])},
               "batch": 256, "actor_rate": 4000.0, "ingest_batch": 64, "capacity": 100_000},
    "atari": {"spec": {"obs": ("uint8", [4, 84, 84]), "next_obs": ("uint8", [4, 84, 84])},
              "batch": 32, "actor_rate": 400.0, "ingest_batch": 16, "capacity": 4_000},
}


MATMUL = 96


def matmul_seconds(size: int = MATMUL, repeats: int = 200) -> float:
    """Best-of time of one ``size`` x ``size`` float32 torch matmul, measured here."""
    import time

    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeats):
            a @ b
        best = min(best, (time.perf_counter() - t0) / repeats)
    return best


def job_toml(case: str, mode: str, compute_s: float, supersteps: int, reps: int,
             fetch: str = "direct") -> str:
    c = CASES[case]
    lines = ['[run]', 'name = "bench"', "timeout_s = 120.0", "", "[layout]", "learners = 1",
             "buffers = 1", "actors = 1", ""]
    for name, (dtype, shape) in c["spec"].items():
        lines += [f"[spec.{name}]", f'dtype = "{dtype}"', f"shape = {shape}", ""]
    process = mode == "edp-process"
    mode = "edp" if process else mode
    lines += ["[storage]", f"capacity_rows = {c['capacity']}", "",
              "[checkpoint]", "on_stop = false", "",  # (delivery = 'process' needs it)
              "[scheduler]", f'mode = "{mode}"', f"batch_rows = {c['batch']}",
              f'delivery = "{"process" if process else "thread"}"',
              "prefetch_depth = 2", 'sampler = "prioritized"',
              f'fetch = "{fetch if mode != "service" else "direct"}"',
              f"min_fill_rows = {4 * c['batch']}", "",
              "[synthetic]", f"batch_rows = {c['ingest_batch']}",
              f"actor_rate_rows_s = {c['actor_rate']}", f"supersteps = {supersteps}",
              f"compute_s = {compute_s}", f"matmul_size = {MATMUL}",
              f"matmul_reps = {reps}"]
    return "\n".join(lines) + "\n"


def run_once(case: str, mode: str, compute_s: float, supersteps: int, work: Path,
             matmul_s: float, fetch: str = "direct") -> dict:
    """One job; returns the learner's per-superstep rows (after warm-up). Compute is a
    fixed number of matmuls (``compute_s / matmul_s``), the same work in every mode."""
    reps = max(1, round(compute_s / matmul_s)) if compute_s > 0 else 0
    cfg = work / f"{case}-{mode}-{compute_s:.6f}.toml"
    cfg.write_text(job_toml(case, mode, compute_s, supersteps, reps, fetch))
    from conduit_hpc.tools.launcher import launch

    rc, run_dir = launch(cfg, runs_root=work / "runs", quiet=True, timeout_s=600,
                         entry=repo_path("jobs/synthetic.py"))
    if rc != 0:
        raise RuntimeError(f"{case}/{mode} failed with {rc}; logs in {run_dir}")
    (csv_path,) = (run_dir / "metrics").glob("learner-*.csv")
    return {"case": case, "mode": mode, "compute_target_s": compute_s, "matmul_reps": reps,
            **latency_stats(csv_path)}


def latency_stats(csv_path: Path) -> dict[str, float]:
    """Supersteps measured and the medians and p99s of one learner file, after the
    warm-up (the first tenth of the supersteps, at least 5) and without the last one."""
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    # warm-up and counts by supersteps, statistics weighted: past run.metrics_full_rows
    # a row stands for its weight's supersteps
    warm = max(5, int(sum(row_weight(r) for r in rows)) // 10)
    use = rows_after(rows, warm)[:-1]  # the last superstep is closed by done()
    w = np.array([row_weight(r) for r in use])
    ex = np.array([float(r["exposed_s"]) for r in use])
    it = np.array([float(r["iteration_s"]) for r in use])
    path = np.array([sum(float(r[k]) for k in ("sample_s", "gather_s", "transform_s",
                                                 "copy_s")) for r in use])
    comp = np.array([float(r["compute_s"]) for r in use])
    return {"supersteps": int(w.sum()),
            "exposed_median_s": weighted_median(ex, w),
            "exposed_p99_s": weighted_percentile(ex, w, 99),
            "iteration_median_s": weighted_median(it, w),
            "iteration_p99_s": weighted_percentile(it, w, 99),
            "path_median_s": weighted_median(path, w),
            "compute_median_s": weighted_median(comp, w)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="conduit-hpc bench exposed-latency")
    p.add_argument("--smoke", action="store_true", help="tiny run for the test suite")
    p.add_argument("--supersteps", type=whole(1, 10**7), default=300)
    p.add_argument("--cases", type=names(CASES), default="float4,atari")
    p.add_argument("--factors", type=reals(0, 1e6), default="0.5,1,2",
                   help="compute as multiples of the path")
    p.add_argument("--out", type=a_folder, default=str(repo_path("bench/out")),
                   help="PNG/JSON folder")
    p.add_argument("--modes", type=names(MODES), default=",".join(MODES),
                   help=f"modes to run, of {','.join(MODES)} (sync always: it calibrates)")
    p.add_argument("--fetch", choices=("direct", "owner"), default="direct",
                   help="scheduler.fetch of edp and sync (service always asks the owner)")
    args = p.parse_args(argv)
    modes = [m for m in MODES if m in args.modes.split(",")]
    if args.smoke:
        args.supersteps, args.cases, args.factors = 40, "float4", "1"
        modes = ["sync", "service", "edp"]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    sha = git_sha()
    matmul_s = matmul_seconds()
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="conduit-bench-") as tmp:
        work = Path(tmp)
        for case in args.cases.split(","):
            calib = run_once(case, "sync", 0.0, args.supersteps, work, matmul_s, args.fetch)
            path_s = calib["exposed_median_s"]
            for factor in [float(f) for f in args.factors.split(",")]:
                for mode in modes:
                    r = run_once(case, mode, factor * path_s, args.supersteps, work, matmul_s,
                                 args.fetch)
                    r.update(factor=factor, calibrated_path_s=path_s, git_sha=sha,
                             bench="exposed_latency")
                    results.append(r)
                    print(jsontext.dumps(r), flush=True)
    table = reductions(results)
    print_table(results, table)
    if not args.smoke:
        plot(results, out_dir / "exposed_latency.png")
        (out_dir / "exposed_latency.json").write_text(jsontext.dumps(
            {"results": results, "reductions": table}, indent=1))
    return {"results": results, "reductions": table}


def reductions(results: list[dict]) -> list[dict]:
    out = []
    keys = sorted({(r["case"], r["factor"]) for r in results})
    for case, factor in keys:
        by = {r["mode"]: r for r in results if r["case"] == case and r["factor"] == factor}
        for variant in EDP:
            if all(m in by for m in (variant, "sync", "service")):
                out.append(_cut(case, factor, variant, by[variant], by["sync"], by["service"]))
    return out


def _cut(case: str, factor: float, variant: str, e: dict, s: dict, v: dict) -> dict:
    return {"case": case, "factor": factor, "variant": variant,
            "compute_vs_sync": e["compute_median_s"] / s["compute_median_s"],
            "exposed_reduction_vs_sync": 1 - e["exposed_median_s"] / s["exposed_median_s"],
            "exposed_reduction_vs_service":
                1 - e["exposed_median_s"] / v["exposed_median_s"],
            "iteration_reduction_vs_sync":
                1 - e["iteration_median_s"] / s["iteration_median_s"],
            "iteration_reduction_vs_service":
                1 - e["iteration_median_s"] / v["iteration_median_s"]}


def print_table(results: list[dict], table: list[dict]) -> None:
    print(f"\n{'case':>7} {'x':>4} {'mode':>11} {'exposed med':>12} {'p99':>9} "
          f"{'iter med':>9} {'p99':>9} {'path':>8} {'compute':>8}   (ms)")
    for r in results:
        print(f"{r['case']:>7} {r['factor']:>4g} {r['mode']:>11} "
              f"{r['exposed_median_s'] * 1e3:>12.3f} {r['exposed_p99_s'] * 1e3:>9.3f} "
              f"{r['iteration_median_s'] * 1e3:>9.3f} {r['iteration_p99_s'] * 1e3:>9.3f} "
              f"{r['path_median_s'] * 1e3:>8.3f} {r['compute_median_s'] * 1e3:>8.3f}")
    print(f"\n{'case':>7} {'x':>4} {'variant':>11} {'compute/sync':>12} "
          f"{'exposed vs sync':>16} {'exposed vs service':>19} "
          f"{'iteration vs sync':>18} {'iteration vs service':>21}   (edp reduction)")
    for t in table:
        print(f"{t['case']:>7} {t['factor']:>4g} {t['variant']:>11} "
              f"{t['compute_vs_sync']:>12.2f} {t['exposed_reduction_vs_sync']:>16.1%} "
              f"{t['exposed_reduction_vs_service']:>19.1%} "
              f"{t['iteration_reduction_vs_sync']:>18.1%} "
              f"{t['iteration_reduction_vs_service']:>21.1%}")


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = sorted({r["case"] for r in results})
    fig, axes = plt.subplots(1, len(cases), figsize=(6 * len(cases), 4.5), squeeze=False)
    colors = {"edp": "tab:green", "edp-process": "tab:olive", "sync": "tab:red",
              "service": "tab:blue"}
    for ax, case in zip(axes[0], cases, strict=True):
        for r in (r for r in results if r["case"] == case):
            ax.scatter(r["iteration_median_s"] * 1e3, r["exposed_median_s"] * 1e3,
                       color=colors[r["mode"]], s=40)
            ax.annotate(f"{r['mode']} {r['factor']:g}x", (r["iteration_median_s"] * 1e3,
                                                           r["exposed_median_s"] * 1e3),
                        fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("iteration latency, median (ms)")
        ax.set_ylabel("exposed experience-path latency, median (ms)")
        ax.set_title(f"{case}: compute = 0.5x/1x/2x of the path")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main(sys.argv[1:])
