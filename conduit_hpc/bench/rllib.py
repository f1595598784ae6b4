"""RLlib's DQN: its own prioritized buffer vs its replay on the data plane (sync, service, edp).

    conduit-hpc bench rllib [--smoke] [--seeds 0,1,2] [--variants rllib,sync,service,edp]
                            [--set KEY=VALUE ...] [--out DIR]

Every run is ``conduit-hpc run jobs/rllib_dqn_cartpole.toml`` (RLlib's unchanged
``algo.train()`` loop on rank 0, a buffer rank beside it) with ``--set run.seed=S`` and:

* ``rllib``: ``rllib.replay = "rllib"`` - RLlib's own ``PrioritizedEpisodeReplayBuffer``
  in the algorithm's process (timed by a thin subclass, otherwise unchanged);
* ``sync``, ``service``, ``edp``: the replay on the data plane in that delivery mode.

Per run (the learner's ``rllib-result.json``): median per-iteration latency (one DQN
training step: collect, add, sample, learn, update priorities), exposed experience-path
latency (median of add + sample + update per step; of sample alone; of its fetch alone,
without building RLlib's episodes from the rows), env steps and
wall seconds (from the built algorithm) to RLlib's smoothed mean return of
``rllib.target_return`` (475; ``--smoke``: a small budget and target 50). One JSON line
per run, then a table per variant with the ratios to ``rllib``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from conduit_hpc import jsontext
from conduit_hpc.bench._args import out_dir, real, wholes
from conduit_hpc.bench.common import git_sha, repo_path

JOB = repo_path("jobs/rllib_dqn_cartpole.toml")
VARIANTS = ("rllib", "sync", "service", "edp")
SMOKE = ["rllib.max_env_steps=3000", "rllib.target_return=50.0", "rllib.learning_starts=500",
         "scheduler.min_fill_rows=250", "rllib.epsilon_steps=2000", "rllib.lr=0.001",
         "rllib.target_update_steps=250", "rllib.smoothing_episodes=10",
         "storage.capacity_rows=10000"]
COLUMNS = ("iteration_ms", "exposed_path_ms", "exposed_sample_ms", "exposed_fetch_ms",
           "env_steps_to_target", "seconds_to_target")


def run_one(variant: str, seed: int, sets: list[str], out: Path,
            timeout_s: float) -> dict[str, Any]:
    run_dir = out / f"{variant}-seed{seed}"
    mode = "edp" if variant == "rllib" else variant
    replay = "rllib" if variant == "rllib" else "data_plane"
    args = [sys.executable, "-m", "conduit_hpc.tools.cli", "run", str(JOB), "--run-dir",
            str(run_dir), "--mode", mode, "--timeout", str(int(timeout_s)),
            "--set", f"run.seed={seed}", "--set", f'rllib.replay="{replay}"']
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s + 60,
                          check=False)
    result_file = run_dir / "rllib-result.json"
    if proc.returncode != 0 or not result_file.exists():
        return {"variant": variant, "seed": seed, "failed": proc.returncode,
                "tail": (proc.stdout + proc.stderr)[-1500:]}
    result = json.loads(result_file.read_text())
    result.pop("curve", None)
    return {"variant": variant, **result, "run_dir": str(run_dir)}


def table(rows: list[dict[str, Any]], variants: list[str]) -> str:
    def med(v: str, col: str) -> float | None:
        xs = [r[col] for r in rows if r.get("variant") == v and r.get(col) is not None]
        return statistics.median(xs) if xs else None

    base = {c: med("rllib", c) for c in COLUMNS}
    lines = ["| variant | " + " | ".join(COLUMNS) + " |",
             "| --- |" + " --- |" * len(COLUMNS)]
    for v in variants:
        cells = []
        for c in COLUMNS:
            x, b = med(v, c), base[c]
            if x is None:
                cells.append("-")
            elif v != "rllib" and b:
                cells.append(f"{x:.4g} ({100 * (x - b) / b:+.0f}%)")
            else:
                cells.append(f"{x:.4g}")
        n = sum(1 for r in rows if r.get("variant") == v and r.get("reached"))
        m = sum(1 for r in rows if r.get("variant") == v)
        lines.append(f"| {v} ({n}/{m} reached) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="conduit-hpc bench rllib",
                                description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--smoke", action="store_true", help="one seed, a small budget")
    p.add_argument("--seeds", type=wholes(0, 2**32 - 1), default="0,1,2")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a job override for every run (section.key=value)")
    p.add_argument("--out", type=out_dir, default="runs/bench-rllib")
    p.add_argument("--timeout", type=real(0, 1e7, open_lo=True), default=3600.0, help="per run (s)")
    a = p.parse_args(argv)
    try:
        import ray  # noqa: F401 - the [rllib] extra
    except ImportError:
        print("bench rllib: the [rllib] extra is not installed (pip install -e '.[rllib]')")
        return {"skipped": "no ray"}
    seeds = [0] if a.smoke else [int(s) for s in a.seeds.split(",")]
    variants = [v for v in a.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"--variants: unknown {bad}; expected some of {VARIANTS}")
    sets = [*(SMOKE if a.smoke else []), *a.set]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in seeds:
        for v in variants:  # interleaved, so that load drifts hit every variant alike
            row = {"bench": "rllib", "git": git_sha(), "smoke": a.smoke, "sets": sets,
                   **run_one(v, seed, sets, out, a.timeout)}
            print(jsontext.dumps(row), flush=True)
            rows.append(row)
    text = table(rows, variants)
    print(text)
    (out / "table.md").write_text(text + "\n")
    return {"rows": rows, "table": text}
