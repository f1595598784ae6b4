"""Planning time of the static planner, 8 to 1,024 GPUs (1 buffer rank per 8-GPU node).

    conduit-hpc bench plan [--smoke] [--repeats 3]

For each size, scope (global, partitioned) and sampling kind (uniform; prioritized with
three heat bins) it plans ``cluster-128x8``-like nodes and reports the best and median
wall time (and the best process CPU time, which a busy machine inflates less) of
``plan_static`` over ``--repeats`` runs (cluster model already loaded;
everything else - topology, LP, rounding, the Placement and its prediction - timed).
The goal is well under 1 s for 128 nodes x 8 GPUs and 128 buffer ranks. One JSON line
per result.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from conduit_hpc import jsontext
from conduit_hpc.bench._args import whole, wholes
from conduit_hpc.bench.common import git_sha, repo_path
from conduit_hpc.bench.scale import cluster_of


def main(argv: list[str] | None = None) -> dict:
    from conduit_hpc.placement.cluster import ClusterModel
    from conduit_hpc.placement.model import Workload
    from conduit_hpc.placement.static import plan_static

    p = argparse.ArgumentParser(prog="conduit-hpc bench plan")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--repeats", type=whole(1, 1000), default=3)
    p.add_argument("--cluster", default=str(repo_path("jobs/cluster-128x8.toml")))
    p.add_argument("--nodes", type=wholes(1, 1 << 20), default="1,16,128")
    args = p.parse_args(argv)
    if args.smoke:
        args.nodes, args.repeats = "1,4", 1
    template = ClusterModel.from_toml(args.cluster)
    sha = git_sha()
    results = []
    heat = ((0.02, 0.5), (0.18, 0.3), (0.8, 0.2))
    for nodes in [int(n) for n in args.nodes.split(",")]:
        cluster = cluster_of(template, nodes, 4)
        learners = cluster.learners
        for scope in ("global", "partitioned"):
            for sampling in ("uniform", "prioritized"):
                w = Workload(capacity_rows=50_000 * learners, row_bytes=28_224,
                             batch_rows=256, update_rate_hz=200, actor_rows_per_s=250,
                             scope=scope, sampling=sampling,
                             heat=heat if sampling == "prioritized" else ())
                times, cpu = [], []
                plan = None
                for _ in range(args.repeats):
                    t0, c0 = time.perf_counter(), time.process_time()
                    plan = plan_static(cluster, w)
                    times.append(time.perf_counter() - t0)
                    cpu.append(time.process_time() - c0)
                assert plan is not None and plan.prediction is not None
                r = {"bench": "plan", "git_sha": sha, "nodes": nodes, "gpus": learners,
                     "buffers": cluster.buffers, "scope": scope, "sampling": sampling,
                     "shards": len(plan.shards), "method": plan.prediction.method,
                     "best_s": min(times), "median_s": statistics.median(times),
                     "cpu_best_s": min(cpu),
                     "objective_s": plan.prediction.objective_s}
                print(jsontext.dumps(r))
                results.append(r)
    print(f"\n{'GPUs':>5} {'buffers':>7} {'scope':>11} {'sampling':>11} {'shards':>7} "
          f"{'best s':>8} {'median s':>9} {'CPU s':>7}  method")
    for r in results:
        print(f"{r['gpus']:>5} {r['buffers']:>7} {r['scope']:>11} {r['sampling']:>11} "
              f"{r['shards']:>7} {r['best_s']:>8.3f} {r['median_s']:>9.3f} "
              f"{r['cpu_best_s']:>7.3f}  {r['method']}")
    worst = max(r["median_s"] for r in results if r["gpus"] == max(x["gpus"] for x in results))
    return {"results": results, "largest_median_s": worst}


if __name__ == "__main__":
    main(sys.argv[1:])
