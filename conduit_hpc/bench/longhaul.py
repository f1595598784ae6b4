"""Long-haul placements side by side: ``edge_replay`` against ``forward`` at two link budgets.

    conduit-hpc bench longhaul [--smoke] [--workload auto|dqn|regression] [--seeds 0,1,2]
                               [--budgets 0.5,4] [--supersteps N] [--out DIR]

The job is ``jobs/longhaul_dqn.toml`` (2 actors and a buffer at the edge, a buffer and
the learner in the data centre, one emulated link). Actors are paced at
``--actor-rows-s`` rows per second each; the link budget is a multiple of what they
produce as ``forward`` would ship it (rows + their priorities): ``0.5`` is *tight* (the
link carries half of it), ``4`` is *loose*. The learner is the same in both placements
(``--batch`` rows per update, at least ``--learner-step-s`` per update, ``--supersteps``
updates), sized so that ``edge_replay``'s sampled batches fit the tight budget.

For each budget, seed and placement one run; reported per run (one JSON line each, with
the git sha) and per budget, over seeds: the ratio ``edge_replay / forward`` of the
average priority of transferred experiences (during training) and of the learner's TD
loss after it settles (mean of the second half of the supersteps), and the return
reached (``dqn``). The marks are the study's: priority x3.92 and loss at 26 %.
``--out`` gets ``longhaul.png`` and ``longhaul.md`` (see ``conduit_hpc.tools.report.longhaul``).

``--hosts`` (root, a checkout): the same runs across 2 hosts of ``scripts/hosts/cluster.sh``
(network namespaces on this machine, ``docs/hosts.md``): the data centre (learner, its
buffer) on host0, the edge (edge buffer, actors) on host1, every host link shaped by
``tc tbf`` at the link budget. The link model still paces each message at the budget and
adds the latency (this kernel has no netem), so the kernel's shaper now also carries what
the model does not pace (weights, RMA words, MPI and TCP headers).

``--workload auto`` runs DQN on CartPole when ``conduit_hpc.rl`` (issue 6) is importable
and the ``regression`` workload otherwise (said in the output).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conduit_hpc import jsontext
from conduit_hpc.bench._args import out_dir, real, reals, whole, wholes
from conduit_hpc.bench.common import git_sha, repo_path

JOB = repo_path("jobs/longhaul_dqn.toml")
MODES = ("forward", "edge_replay")
MARK_PRIORITY = 3.92
MARK_LOSS = 0.26
ROW_BYTES = 48  # obs[4] f32, action i64, reward f32, next_obs[4] f32, discount f32


def have_rl() -> bool:
    try:
        import conduit_hpc.rl  # noqa: F401
    except ImportError:
        return False
    return True


def forward_demand_bytes_s(actors: int, rows_s: float) -> float:
    """What ``forward`` must ship: every row with its priority (message headers aside)."""
    return actors * rows_s * (ROW_BYTES + 8)


def run_one(args: argparse.Namespace, workload: str, mode: str, seed: int,
            bandwidth_bytes_s: float, work: Path) -> dict[str, Any]:
    from conduit_hpc.tools.launcher import launch
    from conduit_hpc.tools.report.longhaul import load_longhaul_run

    sets = [f"longhaul.mode={mode}", f"longhaul.bandwidth_gbps={bandwidth_bytes_s / 1e9!r}",
            f"longhaul.latency_s={args.latency_s!r}", f"run.seed={seed}",
            f"job.workload={workload}", f"job.supersteps={args.supersteps}",
            f"job.learner_step_s={args.learner_step_s!r}",
            f"job.actor_rows_s={args.actor_rows_s!r}", f"scheduler.batch_rows={args.batch}",
            f"scheduler.min_fill_rows={args.min_fill}", f"longhaul.queue_rows={args.queue_rows}",
            f"scheduler.beta_anneal_supersteps={args.supersteps}"]
    rc, run_dir = launch(JOB, overrides=sets, runs_root=work, quiet=True,
                         timeout_s=args.timeout)
    if rc != 0:
        raise RuntimeError(f"{mode} seed {seed} at {bandwidth_bytes_s:g} B/s failed with "
                           f"status {rc}; logs in {run_dir / 'logs'}")
    run = load_longhaul_run(run_dir)
    s = run.summary
    return {"bench": "longhaul", "workload": workload, "mode": mode, "seed": seed,
            "hosts": bool(args.hosts),
            "bandwidth_bytes_s": bandwidth_bytes_s, "run_dir": str(run_dir),
            "updates": s.get("updates"), "wall_s": s.get("wall_s"),
            "priority_mean_training": run.priority_mean,
            "priority_mean_run": s.get("link_priority_mean_crossed"),
            "loss_settled": run.loss_settled, "final_mean_return": run.final_return,
            "env_steps": s.get("env_steps"), "rows_ingested": s.get("rows_ingested"),
            "rows_crossed": s.get("link_rows_crossed"),
            "rows_dropped": s.get("link_rows_dropped"),
            "e2c_util": s.get("link_e2c_util"), "c2e_util": s.get("link_c2e_util"),
            "exposed_median_s": s.get("exposed_median_s"),
            "iteration_median_s": s.get("iteration_median_s"),
            "late_s_max": s.get("link_late_s_max")}


@contextlib.contextmanager
def across_hosts(bandwidth_bytes_s: float, work: Path) -> Iterator[None]:
    """A 2-host test cluster whose links ``tc tbf`` holds to ``bandwidth_bytes_s``, and
    ``launch`` pointed at it (ranks 0-1 on host0, 2.. on host1); down again after."""
    name = f"longhaul-{os.getpid()}"
    state = f"/run/conduit-hosts/{name}"
    script = str(repo_path("scripts/hosts/cluster.sh"))
    env = {**os.environ, "CONDUIT_HOSTS_NAME": name, "CONDUIT_HOSTS_DIR": state}
    rate = f"{max(8, round(bandwidth_bytes_s * 8 / 1e3))}kbit"
    up = subprocess.run([script, "up", "2", "--rate", rate], env=env, capture_output=True,
                        text=True, timeout=120, check=False)
    if up.returncode != 0:
        raise SystemExit(f"bench longhaul --hosts: cluster.sh up failed: {up.stderr.strip()}")
    hostfile = work / f"hostfile-{name}"
    hostfile.parent.mkdir(parents=True, exist_ok=True)
    hostfile.write_text("host0 slots=2\nhost1 slots=3\n")  # data centre | edge
    saved = {k: os.environ.get(k) for k in ("CONDUIT_MPIRUN", "CONDUIT_HOSTS_NAME",
                                            "CONDUIT_HOSTS_DIR", "CONDUIT_HOSTS_MAP_BY",
                                            "CONDUIT_HOSTS_HOSTFILE")}
    os.environ.update(CONDUIT_MPIRUN=str(repo_path("scripts/hosts/mpirun.sh")),
                      CONDUIT_HOSTS_NAME=name, CONDUIT_HOSTS_DIR=state,
                      CONDUIT_HOSTS_MAP_BY="slot", CONDUIT_HOSTS_HOSTFILE=str(hostfile))
    print(f"longhaul bench: across 2 hosts, links shaped to {rate} (tbf)", flush=True)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        subprocess.run([script, "down"], env=env, capture_output=True, timeout=120,
                       check=False)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="conduit-hpc bench longhaul")
    p.add_argument("--smoke", action="store_true", help="tiny run for the test suite")
    p.add_argument("--workload", choices=("auto", "dqn", "regression"), default="auto")
    p.add_argument("--seeds", type=wholes(0, 2**32 - 1), default="0,1,2")
    p.add_argument("--budgets", type=reals(0, 1e6, open_lo=True), default="0.5,4",
                   help="link bandwidth as multiples of what forward must ship")
    p.add_argument("--supersteps", type=whole(1, 10**8), default=3000)
    p.add_argument("--batch", type=whole(1, 1 << 20), default=32)
    p.add_argument("--learner-step-s", type=real(0, 3600), default=0.05)
    p.add_argument("--actor-rows-s", type=real(0, 1e9, open_lo=True), default=1000.0)
    p.add_argument("--latency-s", type=real(0, 3600), default=0.02)
    p.add_argument("--min-fill", type=whole(1, 1 << 30), default=1000)
    p.add_argument("--queue-rows", type=whole(1, 1 << 30), default=4096,
                   help="forward: rows the edge holds for the link before dropping")
    p.add_argument("--timeout", type=real(0, 1e7, open_lo=True), default=1800.0, help="per run (s)")
    p.add_argument("--out", type=out_dir, default="",
                   help="runs, plots and table go here (default: "
                   "bench/out/longhaul; with --smoke and no --out, a temporary folder)")
    p.add_argument("--hosts", action="store_true",
                   help="across 2 hosts of scripts/hosts/cluster.sh, links shaped by tc tbf "
                        "at the budget (root; docs/hosts.md)")
    args = p.parse_args(argv)
    if args.smoke:  # a short queue and a tighter link, so that forward drops in seconds
        args.workload, args.seeds, args.budgets = "regression", "0", "0.25"
        args.supersteps, args.min_fill, args.timeout = 60, 256, 300.0
        args.queue_rows = 256
    workload = args.workload
    if workload == "auto":
        workload = "dqn" if have_rl() else "regression"
    if workload == "dqn" and not have_rl():
        raise SystemExit("--workload dqn needs conduit_hpc.rl (issue 6)")
    print(f"longhaul bench: workload {workload}"
          + ("" if workload == "dqn" or args.workload != "auto" else
             " (conduit_hpc.rl not importable: the DQN pieces of issue 6 are not here)"),
          flush=True)
    demand = forward_demand_bytes_s(2, args.actor_rows_s)
    # the link's own floor (longhaul.bandwidth_gbps >= 1e-12): told as the flag given,
    # not as the config value it was turned into
    if low := [f for f in map(float, args.budgets.split(",")) if f * demand / 1e9 < 1e-12]:
        p.error(f"argument --budgets: {args.budgets!r}: {low[0]:g} gives a link of "
                f"{low[0] * demand:.3g} bytes/s, below the 1e-12 GB/s (0.001 bytes/s) a "
                f"link may have; forward ships {demand:.4g} bytes/s here, so use budgets "
                f">= {1e-3 / demand:.3g}")
    sha = git_sha()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="conduit-longhaul-") as tmp:
        keep = bool(args.out) or not args.smoke
        out = Path(args.out) if args.out else repo_path("bench/out/longhaul")
        work = out / "runs" if keep else Path(tmp)
        for factor in [float(x) for x in args.budgets.split(",")]:
            hosts = across_hosts(factor * demand, work) if args.hosts else \
                contextlib.nullcontext()
            with hosts:
                for seed in [int(x) for x in args.seeds.split(",")]:
                    for mode in MODES:
                        r = run_one(args, workload, mode, seed, factor * demand, work)
                        r.update(budget_factor=factor, git_sha=sha)
                        results.append(r)
                        print(jsontext.dumps(r), flush=True)
        table = summarize(results)
        if keep:
            from conduit_hpc.tools.report.longhaul import write_longhaul_report

            md = write_longhaul_report([r["run_dir"] for r in results], out)
            print(f"plots and table: {md}")
    print_table(table)
    for t in table:
        print(jsontext.dumps({"bench": "longhaul", "summary": t, "git_sha": sha}), flush=True)
    return {"workload": workload, "results": results, "ratios": table}


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per budget, means over seeds and the ``edge_replay / forward`` ratios."""
    out = []
    for factor in sorted({r["budget_factor"] for r in results}):
        by = {m: [r for r in results if r["budget_factor"] == factor and r["mode"] == m]
              for m in MODES}
        if not all(by.values()):
            continue
        row: dict[str, Any] = {"budget_factor": factor,
                               "bandwidth_bytes_s": by["forward"][0]["bandwidth_bytes_s"],
                               "seeds": len(by["edge_replay"])}
        for m in MODES:
            for key in ("priority_mean_training", "loss_settled", "final_mean_return",
                        "e2c_util", "exposed_median_s", "wall_s"):
                vals = [float(r[key]) for r in by[m] if r.get(key) is not None
                        and math.isfinite(float(r[key]))]
                row[f"{m}_{key}"] = sum(vals) / len(vals) if vals else math.nan
        f_p, e_p = row["forward_priority_mean_training"], row["edge_replay_priority_mean_training"]
        f_l, e_l = row["forward_loss_settled"], row["edge_replay_loss_settled"]
        row["priority_ratio"] = e_p / f_p if f_p else math.nan
        row["loss_ratio"] = e_l / f_l if f_l else math.nan
        row["meets_priority_mark"] = bool(row["priority_ratio"] >= MARK_PRIORITY)
        row["meets_loss_mark"] = bool(row["loss_ratio"] <= MARK_LOSS)
        out.append(row)
    return out


def print_table(table: list[dict[str, Any]]) -> None:
    print(f"\n{'budget':>7} {'kB/s':>8} {'seeds':>5} {'priority x':>11} {'loss ratio':>11} "
          f"{'return fwd':>11} {'return edge':>12} {'util fwd':>9} {'util edge':>10}")
    for t in table:
        print(f"{t['budget_factor']:>7g} {t['bandwidth_bytes_s'] / 1e3:>8.1f} {t['seeds']:>5} "
              f"{t['priority_ratio']:>11.3f} {t['loss_ratio']:>11.3f} "
              f"{t['forward_final_mean_return']:>11.1f} "
              f"{t['edge_replay_final_mean_return']:>12.1f} "
              f"{t['forward_e2c_util']:>9.2f} {t['edge_replay_e2c_util']:>10.2f}")
    print(f"(marks: priority x{MARK_PRIORITY}, loss ratio <= {MARK_LOSS})")


if __name__ == "__main__":
    main(sys.argv[1:])
