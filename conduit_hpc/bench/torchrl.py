"""TorchRL's DQN on CartPole-v1: TorchRL's own prioritized buffer vs the data plane.

    conduit-hpc bench torchrl [--smoke] [--seeds 0] [--modes torchrl,sync,service,edp]
                              [--set KEY=VALUE] [--time-limit S] [--out DIR]

One job, ``jobs/torchrl_dqn_cartpole.toml`` (TorchRL's ``DQNLoss``, ``QValueActor``,
``EGreedyModule``, ``Collector``, ``HardUpdate``), run in each mode with the same config:

* ``torchrl``: the plain TorchRL loop in one process (``torchrl.single_process = true``)
  on TorchRL's own prioritized buffer - ``TensorDictPrioritizedReplayBuffer``, or, where
  TorchRL's C++ extension does not load with the installed torch, TorchRL's
  ``PrioritizedSampler`` on numpy trees (the result's ``trees`` says which); collection
  and updates interleave, ``samples_per_insert`` rows sampled per row collected;
* ``sync``, ``service``, ``edp``: the job under ``conduit-hpc run --mode MODE`` with
  :class:`~conduit_hpc.integrations.torchrl.DataPlaneReplayBuffer` (1 learner, 1 buffer,
  2 actor ranks running collectors).

Per run, from its ``metrics/summary.json``: env steps and wall time to a mean return of
475 (if reached within the budget), updates per second, the mean iteration (one loss
update: sample, loss, backward, step, priority update, target update) and the mean time
spent in ``sample()`` + ``update_tensordict_priority()`` (the exposed experience path,
measured the same way in every mode; the data-plane modes also report the plane's own
``next_batch`` wait). A table with ratios to ``torchrl``; one JSON line per run.

``--smoke``: one seed, a 2,000-env-step budget - it checks the machinery, not convergence.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conduit_hpc import jsontext
from conduit_hpc.bench._args import names, out_dir, real, wholes
from conduit_hpc.bench.common import git_sha, repo_path

JOB = repo_path("jobs/torchrl_dqn_cartpole.toml")
MODES = ("torchrl", "sync", "service", "edp")
SMOKE_SETS = ["torchrl.max_env_steps=2000", "torchrl.annealing_frames=500",
              "scheduler.min_fill_rows=200"]
KEYS = ("reached", "env_steps_to_target", "wall_s_to_target", "env_steps", "updates",
        "wall_s", "updates_per_s", "iteration_mean_s", "exposed_mean_s", "exposed_median_s",
        "plane_exposed_mean_s", "plane_iteration_mean_s", "final_mean_return", "trees",
        "stopped_by")


def _sets(sets: list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def run_mode(mode: str, config: Path, sets: list[str], seed: int, out: Path,
             time_limit_s: float) -> dict[str, Any]:
    """One run of the job in ``mode``; its summary's headline numbers."""
    run_dir = out / f"{mode}-seed{seed}"
    common = [*_sets([f"run.seed={seed}", "torchrl.progress_every_s=0", *sets])]
    if time_limit_s:
        common += _sets([f"run.duration_s={time_limit_s}"])
    if mode == "torchrl":
        run_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(config.with_suffix(".py")), "--config", str(config),
               "--run-dir", str(run_dir), *common, "--set", "torchrl.single_process=true"]
    else:
        cmd = [sys.executable, "-m", "conduit_hpc.tools.cli", "run", str(config), "--mode",
               mode, "--runs", str(run_dir), *common]
        if time_limit_s:  # start-up and teardown of 4 torch ranks: minutes when loaded
            cmd += ["--timeout", str(time_limit_s + 600)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                              timeout=(time_limit_s or 3600) + 900)
    except subprocess.TimeoutExpired:
        return {"failed": "timed out", "launch_wall_s": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    found = sorted(run_dir.rglob("summary.json")) if run_dir.exists() else []
    if proc.returncode != 0 or not found:
        return {"failed": f"exit {proc.returncode}: {proc.stderr.strip()[-600:]}",
                "launch_wall_s": wall}
    summary = json.loads(found[-1].read_text())
    return {**{k: summary.get(k) for k in KEYS}, "launch_wall_s": wall,
            "run_dir": str(found[-1].parent.parent)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="conduit-hpc bench torchrl")
    p.add_argument("--smoke", action="store_true",
                   help="one seed, a 2,000-env-step budget (the machinery, not convergence)")
    p.add_argument("--seeds", type=wholes(0, 2**32 - 1), default="0")
    p.add_argument("--modes", type=names(MODES), default=",".join(MODES))
    p.add_argument("--config", default=str(JOB), help="the TorchRL DQN job's TOML")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (section.key=value), in every mode")
    p.add_argument("--time-limit", type=real(0, 1e7), default=0.0,
                   help="training seconds per run (run.duration_s; 0: the config's)")
    p.add_argument("--out", type=out_dir, default="", help="folder for the runs (default "
                   "runs/bench-torchrl-<time>)")
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    sets = list(args.set)
    if args.smoke:
        seeds, sets = seeds[:1], [*SMOKE_SETS, *sets]
    from conduit_hpc.config import Config

    Config.from_toml(args.config, sets)  # a bad --set: one error now, not one per run
    out = Path(args.out) if args.out else repo_path("runs") / (
        "bench-torchrl-" + _dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    sha = git_sha()
    results = []
    for seed in seeds:
        for mode in modes:
            r = run_mode(mode, Path(args.config), sets, seed, out, args.time_limit)
            r.update(bench="torchrl", mode=mode, seed=seed, git_sha=sha, sets=sets)
            results.append(r)
            print(jsontext.dumps(r, default=str), flush=True)
    print_table(results)
    return {"results": results, "git_sha": sha, "sets": sets}


def _ms(v: Any) -> str:
    return f"{v * 1e3:.2f}" if isinstance(v, int | float) else "-"


def print_table(results: list[dict[str, Any]]) -> None:
    base = {r["seed"]: r for r in results if r["mode"] == "torchrl" and "failed" not in r}
    print(f"\n{'mode':>8} {'seed':>4} {'to 475: steps':>14} {'wall s':>8} {'updates/s':>10} "
          f"{'iter ms':>8} {'exposed ms':>11} {'plane ms':>9} {'iter/torchrl':>13} "
          f"{'exposed/torchrl':>16}")
    for r in results:
        if "failed" in r:
            print(f"{r['mode']:>8} {r['seed']:>4}  failed: {r['failed'][:200]}")
            continue
        b = base.get(r["seed"], {})
        ratio = [(r.get(k) / b[k]) if r.get(k) and b.get(k) else float("nan")
                 for k in ("iteration_mean_s", "exposed_mean_s")]
        steps = r.get("env_steps_to_target")
        wall = r.get("wall_s_to_target")
        print(f"{r['mode']:>8} {r['seed']:>4} {(f'{steps:,}' if steps else '-'):>14} "
              f"{(f'{wall:.1f}' if wall else '-'):>8} {r.get('updates_per_s') or 0:>10.0f} "
              f"{_ms(r.get('iteration_mean_s')):>8} {_ms(r.get('exposed_mean_s')):>11} "
              f"{_ms(r.get('plane_exposed_mean_s')):>9} {ratio[0]:>13.2f} {ratio[1]:>16.2f}")
    trees = {str(r["trees"]) for r in results if r["mode"] == "torchrl" and r.get("trees")}
    if trees:
        print(f"torchrl: TorchRL's prioritized sampler on {'/'.join(sorted(trees))} trees")


if __name__ == "__main__":
    main(sys.argv[1:])
