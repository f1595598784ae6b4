"""Environment steps and wall time to reach mean return 475 on CartPole-v1.

    conduit-hpc bench convergence [--smoke] [--seeds 0,1,2] [--modes single,edp,sync,service]
                                  [--learners 1,2]

Modes, with the same job config (``jobs/dqn_cartpole.toml``: the algorithm in ``[dqn]``,
the replay's semantics in ``[scheduler]`` and ``[storage]``; ``--set key=value``
overrides any key, a key without a section meaning ``dqn.key``):

* ``single``: the single-process baseline (:func:`conduit_hpc.rl.train_single_process`,
  a plain in-process prioritized replay), run here;
* ``edp``, ``sync``, ``service``: the distributed job through the data plane, run as
  ``conduit-hpc run jobs/dqn_cartpole.toml --mode MODE --set run.seed=S``; each run's
  ``metrics/summary.json`` holds ``reached``, ``env_steps_to_target``,
  ``wall_s_to_target`` and ``wall_s`` (and ``env_steps``, ``updates``). The same
  ``--set`` overrides go to the job. ``wall_s`` is the training loop's time from the
  moment every rank is set up
  (as for ``single``), not counting the launch.

``--learners 1,2`` runs each data-plane mode once per learner count
(``layout.learners``; several learners train data-parallel, their gradients averaged
through the ``torch.distributed`` group every superstep, each learner drawing
``scheduler.batch_rows`` rows); a mode with ``n > 1`` learners is labelled
``MODE/nL``. Each run also reports its learner updates per second.

Goal: the same env steps to 475 in every mode (convergence preserved), less wall time
in ``edp``. One JSON line per run (with the git sha), a table per mode with ratios to
``single``, and ``report.md`` + ``returns.png`` over all runs in ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conduit_hpc import jsontext
from conduit_hpc.bench._args import names, out_dir, real, wholes
from conduit_hpc.bench.common import git_sha, repo_path

JOB = repo_path("jobs/dqn_cartpole.toml")
MODES = ("single", "edp", "sync", "service")
def qualified(sets: list[str]) -> list[str]:
    """``--set`` overrides with a section: ``lr=5e-4`` means ``dqn.lr=5e-4``."""
    return [s if "." in s.partition("=")[0] else f"dqn.{s}" for s in sets]


def job_overrides(sets: list[str]) -> list[str]:
    """``--set`` arguments for the job (``conduit-hpc run``)."""
    return [arg for s in qualified(sets) for arg in ("--set", s)]


def job_config(config: Path, overrides: list[str]) -> Any:
    """The job's config (its ``[dqn]``, ``[scheduler]``, ``[storage]``, ...), with the
    ``--set`` overrides, through the library's one loader."""
    from conduit_hpc.config import Config

    return Config.from_toml(config, qualified(overrides))


# ---------------------------------------------------------------------------------
# the modes


def run_single(cfg: Any, seed: int, out: Path, time_limit_s: float) -> dict[str, Any]:
    import torch

    from conduit_hpc.rl import train_single_process

    torch.set_num_threads(1)
    run_dir = out / f"single-seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(f'[run]\nname = "dqn"\nseed = {seed}\n')
    result = train_single_process(cfg.dqn, cfg.scheduler, cfg.storage, seed=seed,
                                  run_dir=run_dir, time_limit_s=time_limit_s)
    return {**result, "run_dir": str(run_dir)}


def run_data_plane(mode: str, hp_sets: list[str], seed: int, out: Path,
                   time_limit_s: float, learners: int = 1) -> dict[str, Any]:
    """One run of the distributed job in ``mode`` with ``learners`` learner ranks."""
    if not JOB.exists():
        return {"skipped": f"{JOB} does not exist yet (the distributed "
                           "DQN job comes with the scheduler's next_batch/update_priorities)"}
    runs = out / (f"{mode}-seed{seed}" if learners == 1 else f"{mode}-{learners}L-seed{seed}")
    cmd = [sys.executable, "-m", "conduit_hpc.tools.cli", "run", str(JOB), "--mode", mode,
           "--runs", str(runs), "--set", f"run.seed={seed}", "--set",
           "job.progress_every_s=0", *job_overrides(hp_sets)]
    if learners != 1:
        cmd += ["--set", f"layout.learners={learners}"]
    if time_limit_s:  # the job stops itself at the limit and reports; the launcher later
        cmd += ["--set", f"run.duration_s={time_limit_s}", "--timeout",
                str(time_limit_s + 300)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                          timeout=(time_limit_s or 3600) + 300)
    wall = time.perf_counter() - t0
    run_dirs = sorted(runs.glob("*/")) if runs.exists() else []
    if proc.returncode != 0 or not run_dirs:
        return {"failed": f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}",
                "wall_s": wall}
    summary_path = run_dirs[-1] / "metrics" / "summary.json"
    if not summary_path.exists():
        return {"failed": f"{summary_path} missing", "wall_s": wall}
    summary = json.loads(summary_path.read_text())
    reached = bool(summary.get("reached"))
    to_target = summary.get("wall_s_to_target") if reached else None
    return {"reached": reached,
            "env_steps": summary.get("env_steps"),
            "env_steps_to_target": summary.get("env_steps_to_target"),
            "wall_s": float(to_target if to_target is not None
                            else summary.get("wall_s", wall)),
            "updates": summary.get("updates"),
            "updates_per_s": summary.get("updates_per_s"),
            "learners": summary.get("learners", 1),
            "params_identical": summary.get("params_identical", True),
            "exposed_mean_s": summary.get("exposed_mean_s"),
            "ingest_rows_per_s": summary.get("ingest_rows_per_s"),
            "launch_wall_s": wall, "run_dir": str(run_dirs[-1])}


# ---------------------------------------------------------------------------------
# driver


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="conduit-hpc bench convergence")
    p.add_argument("--smoke", action="store_true",
                   help="one seed, a 3,000-step budget: checks the machinery, not convergence")
    p.add_argument("--seeds", type=wholes(0, 2**32 - 1), default="0,1,2")
    p.add_argument("--modes", type=names(MODES), default=",".join(MODES))
    p.add_argument("--learners", type=wholes(1, 64), default="1",
                   help="learner counts for the data-plane modes, e.g. 1,2 (layout.learners)")
    p.add_argument("--config", default=str(JOB), help="the DQN job's TOML")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set lr=5e-4 (= dqn.lr) or "
                   "--set scheduler.batch_rows=32")
    p.add_argument("--time-limit", type=real(0, 1e7), default=0.0, help="seconds per run (0: none)")
    p.add_argument("--out", type=out_dir, default="", help="folder for runs and the report "
                   "(default runs/convergence-<time>)")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    modes = args.modes.split(",")
    try:
        counts = [int(n) for n in args.learners.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise SystemExit(f"--learners: a comma-separated list of counts >= 1, got "
                         f"{args.learners!r}")
    sets = list(args.set)
    if args.smoke:
        seeds = seeds[:1]
        sets += ["dqn.max_env_steps=3000", "scheduler.min_fill_rows=500"]
    cfg = job_config(Path(args.config), sets)
    hp = cfg.dqn
    out = Path(args.out) if args.out else repo_path("runs") / (
        "convergence-" + _dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    sha = git_sha()
    results: list[dict[str, Any]] = []
    runs = [(m, 1) for m in modes if m == "single"] + [
        (m, n) for m in modes if m != "single" for n in counts]
    for mode, n in runs:
        for seed in seeds:
            if mode == "single":
                r = run_single(cfg, seed, out, args.time_limit)
            else:
                r = run_data_plane(mode, sets, seed, out, args.time_limit, n)
            r.update(bench="convergence", mode=mode, seed=seed, git_sha=sha,
                     label=mode if n == 1 else f"{mode}/{n}L",
                     target_return=hp.target_return, max_env_steps=hp.max_env_steps)
            results.append(r)
            print(jsontext.dumps(r, default=str), flush=True)
    by_mode = summarise(results)
    print_table(by_mode, hp)
    from conduit_hpc.tools.report.run import write_report

    run_dirs = [r["run_dir"] for r in results if r.get("run_dir")]
    report = str(write_report(run_dirs, out / "report")) if run_dirs else ""
    if report:
        print(f"report: {report}")
    return {"results": results, "by_mode": by_mode, "report": report, "git_sha": sha,
            "config": {k: v for k, v in cfg.to_dict().items()
                       if k in ("dqn", "scheduler", "storage")}}


def summarise(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per mode: runs, how many reached 475, median env steps and wall time to it, and
    the ratios to ``single``."""
    by: dict[str, dict[str, Any]] = {}
    for mode in dict.fromkeys(r.get("label", r["mode"]) for r in results):
        rs = [r for r in results if r.get("label", r["mode"]) == mode]
        skipped = [r["skipped"] for r in rs if "skipped" in r]
        if skipped:
            by[mode] = {"runs": len(rs), "skipped": skipped[0]}
            continue
        hit = [r for r in rs if r.get("reached")]
        by[mode] = {"runs": len(rs), "reached": len(hit),
                    "failed": [r["failed"] for r in rs if "failed" in r],
                    "median_env_steps_to_475": statistics.median(
                        r["env_steps_to_target"] for r in hit) if hit else None,
                    "median_wall_s_to_475": statistics.median(r["wall_s"] for r in hit)
                    if hit else None,
                    "median_updates_per_s": statistics.median(ups) if (ups := [
                        r["updates_per_s"] for r in rs if r.get("updates_per_s")]) else None}
    base = by.get("single", {})
    for s in by.values():
        if s.get("median_wall_s_to_475") and base.get("median_wall_s_to_475"):
            s["wall_ratio_to_single"] = s["median_wall_s_to_475"] / base["median_wall_s_to_475"]
            s["steps_ratio_to_single"] = (s["median_env_steps_to_475"]
                                          / base["median_env_steps_to_475"])
    return by


def print_table(by_mode: dict[str, dict[str, Any]], hp: Any) -> None:
    print(f"\nCartPole-v1: env steps and wall time to mean return {hp.target_return:g} over "
          f"the last {hp.window} scored episodes (explorers with epsilon <= "
          f"{hp.score_max_epsilon:g}; budget {hp.max_env_steps:,} steps)")
    print(f"{'mode':>8} {'reached':>8} {'steps (median)':>15} {'wall s (median)':>16} "
          f"{'steps/single':>13} {'wall/single':>12} {'updates/s':>10}")
    for mode, s in by_mode.items():
        if "skipped" in s:
            print(f"{mode:>8}  skipped: {s['skipped']}")
            continue
        steps = s["median_env_steps_to_475"]
        wall = s["median_wall_s_to_475"]
        print(f"{mode:>8} {s['reached']:>4}/{s['runs']:<3} "
              f"{(f'{steps:,.0f}' if steps else '-'):>15} "
              f"{(f'{wall:,.1f}' if wall else '-'):>16} "
              f"{s.get('steps_ratio_to_single', float('nan')):>13.2f} "
              f"{s.get('wall_ratio_to_single', float('nan')):>12.2f} "
              f"{(f'{u:,.0f}' if (u := s.get('median_updates_per_s')) else '-'):>10}")
        for f in s["failed"]:
            print(f"{'':>10}failed: {f}")


if __name__ == "__main__":
    main(sys.argv[1:])
