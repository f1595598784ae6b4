"""Adaptive placement on vs off on a skewed prioritized workload (the cost model's view).

    conduit-hpc bench adaptive [--smoke] [--supersteps 6000] [--taus 800,8000]

One node of ``jobs/cluster-128x8.toml`` (8 learners, 4 GB of experience per GPU, PCIe
Gen4): 2 M Atari-sized rows of prioritized replay (56 GB: 57 % fit the GPU tier),
partitioned sampling, 2 % of the rows holding 70 % of the priority mass, batch 1,024,
0.5 ms of compute. Three scenarios, each run with the policy off and on:

1. the static plan was made without knowing the skew (a uniform guess) and the skew, once
   there, persists;
2. and 3. the plan knew the skew (the hottest rows promoted into each learner's GPU
   shard), and the hot set then drifts fast or slowly: the share of the
mass in the promoted rows decays as ``exp(-supersteps since promotion / tau)`` (new rows
enter hot, TD errors of replayed rows fall), while the concentration of the mass stays.
Without adaptation the GPU shards' share of the samples decays to their share of the
rows; with it, the policy looks every ``--interval`` supersteps at the telemetry
(measured sample shares, heat) and re-places - the hottest rows back into the GPU tier -
when the gain pays for the move, whose predicted time is charged to that superstep as
exposed latency. Both are evaluated with the same cost model, side by side, for a fast and
a slow drift.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from scale import cluster_of, git_sha  # noqa: E402


def run(tau: float, supersteps: int, interval: int, cluster: object, workload: object,
        *, skew_known: bool) -> dict:
    from dataclasses import replace

    from conduit_hpc.placement.adaptive import (
        AdaptiveKnobs,
        AdaptivePolicy,
        Telemetry,
        predict_placement,
    )
    from conduit_hpc.placement.static import plan_static

    # the plan at start: made knowing the skew (hot rows promoted), or not (uniform guess)
    start = plan_static(cluster, workload if skew_known else  # type: ignore[arg-type]
                        replace(workload, heat=()))
    part_rows: dict[int, int] = {}
    for s in start.shards:
        part_rows[s.partition] = part_rows.get(s.partition, 0) + s.capacity_rows

    def true_shares(plan: object, since: int) -> dict[int, float]:
        """Sample shares ``since`` supersteps after the last promotion."""
        keep = math.exp(-since / tau) if math.isfinite(tau) else 1.0
        out = {}
        for s in plan.shards:  # type: ignore[attr-defined]
            uniform = s.capacity_rows / part_rows[s.partition]
            out[s.shard_id] = uniform + (s.share - uniform) * keep
        return out

    policy = AdaptivePolicy(cluster, workload, start, knobs=AdaptiveKnobs(  # type: ignore[arg-type]
        min_gain=0.1, payback_supersteps=5000, patience=2, cooldown_supersteps=500))
    heat = workload.heat  # type: ignore[attr-defined]
    off_total = on_total = moved_s = 0.0
    last_move = 0
    trace = []
    for t in range(0, supersteps, interval):
        off = predict_placement(cluster, workload, start,  # type: ignore[arg-type]
                                shares=true_shares(start, t))
        shares_on = true_shares(policy.placement, t - last_move)
        on = predict_placement(cluster, workload, policy.placement,  # type: ignore[arg-type]
                               shares=shares_on)
        off_total += off.max_exposed_s * interval
        on_total += on.max_exposed_s * interval
        d = policy.observe(Telemetry(t, shard_sample_share=shares_on, heat=heat))
        if d.action == "move":
            moved_s += d.move_s
            on_total += d.move_s  # the boundary waits for the rows to move
            last_move = t
        trace.append((t, off.max_exposed_s, on.max_exposed_s, d.action))
    return {"tau": tau, "skew_known_at_start": skew_known,
            "off_mean_exposed_s": off_total / supersteps,
            "on_mean_exposed_s": on_total / supersteps, "moves": policy.moves_made,
            "migration_s": moved_s,
            "on_over_off": on_total / off_total if off_total else float("nan"),
            "trace": trace}


def main(argv: list[str] | None = None) -> dict:
    from conduit_hpc.placement.cluster import ClusterModel
    from conduit_hpc.placement.model import Workload

    p = argparse.ArgumentParser(prog="conduit-hpc bench adaptive")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--supersteps", type=int, default=6000)
    p.add_argument("--interval", type=int, default=100)
    p.add_argument("--taus", default="800,8000", help="drift time constants to compare")
    p.add_argument("--compute-s", type=float, default=0.0005)
    p.add_argument("--cluster", default=str(HERE.parent / "jobs" / "cluster-128x8.toml"),
                   help="its first node type is used, one node")
    args = p.parse_args(argv)
    if args.smoke:
        args.supersteps, args.taus = 1200, "300"
    cluster = cluster_of(ClusterModel.from_toml(args.cluster), 1, 4)
    w = Workload(capacity_rows=2_000_000, row_bytes=28_224 - 16 - 80, batch_rows=1024,
                 update_rate_hz=250, actor_rows_per_s=100, compute_s=args.compute_s,
                 sampling="prioritized", scope="partitioned",
                 heat=((0.02, 0.7), (0.98, 0.3)))
    sha = git_sha()
    results = []
    scenarios = [(math.inf, False)] + [(float(x), True) for x in args.taus.split(",")]
    if args.smoke:
        scenarios = scenarios[:2]
    for tau, known in scenarios:
        r = run(tau, args.supersteps, args.interval, cluster, w, skew_known=known)
        trace = r.pop("trace")
        r.update(bench="adaptive", git_sha=sha, supersteps=args.supersteps,
                 compute_s=args.compute_s)
        print(json.dumps(r))
        what = ("skew unknown when planned, then persistent" if not known else
                f"skew known when planned, hot set drifts (tau = {tau:g} supersteps)")
        print(f"\n{what}")
        print(f"{'superstep':>9} {'off exposed ms':>15} {'on exposed ms':>14}  action")
        step = max(1, len(trace) // 8)
        for t, off, on, action in trace[::step]:
            print(f"{t:>9} {off * 1e3:>15.3f} {on * 1e3:>14.3f}  {action}")
        print(f"mean exposed per superstep: off {r['off_mean_exposed_s'] * 1e3:.3f} ms, on "
              f"{r['on_mean_exposed_s'] * 1e3:.3f} ms (on/off {r['on_over_off']:.2f}); "
              f"{r['moves']} moves, {r['migration_s']:.3f} s of moving in all")
        results.append(r)
    return {"results": results}


if __name__ == "__main__":
    main(sys.argv[1:])
