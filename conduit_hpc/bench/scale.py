"""Scale model: predicted per-superstep iteration and exposed latency, 8 to 1,024 GPUs.

    conduit-hpc bench scale [--smoke] [--cluster jobs/cluster-128x8.toml] [--png FILE]
                            [--measured RUN_DIR ...]

Weak scaling: learners = GPUs (8 per node, from the cluster file's first node type), a
fixed number of actors per learner, one buffer rank per node, a fixed replay share per
learner. For each size the static planner places the replay on the cluster model and the
cost model gives each learner's link time per superstep (link contention included, ingest
counted on the links it shares); per-operation CPU costs (sample, gather, priority update,
hand-off, request) are **measured on this machine** by micro-benchmarks of ShardRing,
PriorityIndex and SumTree, and added per mode:

* ``sync``    - the learner samples, gathers and copies inline: iteration = path + compute,
                exposed = path;
* ``edp``     - the path runs ahead on a data-plane thread: exposed = max(0, path - compute)
                + hand-off, iteration = compute + exposed;
* ``service`` - the learner asks a buffer rank and waits: the buffer serves the learners
                mapped to it one request at a time (they all ask at the superstep start), so
                the last waits for all of them; plus a request round trip.

Assumptions are listed in bench/README.md. ``--measured RUN_DIR ...`` prints predicted
against measured per mode for runs made on this machine, ``--measured-learners RUN_DIR
...`` per learner count for the DQN job's runs with 1, 2, ... learners, the gradient
all-reduce on a link probed here (:mod:`conduit_hpc.bench._scale_measured`).
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from conduit_hpc import jsontext
from conduit_hpc.bench._args import finished_run, link, out_file, real, run_dir, whole, wholes
from conduit_hpc.bench._scale_model import (
    MODES,
    allreduce_link,
    cluster_of,
    predict_modes,
    read_split,
)
from conduit_hpc.bench.common import git_sha, repo_path

__all__ = ["MODES", "allreduce_link", "cluster_of", "measure_costs", "predict_modes",
           "read_split", "run_scale"]


# ---------------------------------------------------------------------------------
# per-operation costs on this machine


def _best(fn: Any, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_costs(*, batch: int = 256, repeats: int = 20) -> dict[str, float]:
    """Seconds per row / per byte of the experience path's operations, measured here on
    one core (ShardRing on a COMM_SELF shared-memory window, PriorityIndex, SumTree)."""
    from mpi4py import MPI

    from conduit_hpc.spec import Spec
    from conduit_hpc.storage import PriorityIndex, ShardLayout, ShardRing, SumTree
    from conduit_hpc.transport.rma import RmaWindow

    rng = np.random.default_rng(0)
    out: dict[str, float] = {}
    per_kind: dict[str, tuple[float, float, int]] = {}
    for kind, spec, cap in (("small", Spec.from_dict({"obs": ("float32", (4,))}), 1 << 16),
                            ("large", Spec.from_dict({"obs": ("uint8", (4, 84, 84))}), 2048)):
        lay = ShardLayout(spec, cap)
        win = RmaWindow(MPI.COMM_SELF, lay.nbytes, node_comm=MPI.COMM_SELF, shared=True)
        try:
            ring = ShardRing(win, 0, 0, lay, timeout_s=10.0)
            owner = ShardRing(win, 0, 0, lay, timeout_s=10.0)
            data = {f.name: rng.integers(0, 255, (batch, *f.shape)).astype(f.dtype)
                    for f in spec}

            def write(ring: ShardRing = ring, owner: ShardRing = owner,
                      data: dict = data) -> None:
                ring.write(data)
                owner.advance_commits()

            t_write = _best(write, repeats)
            slots = rng.integers(0, cap, batch)
            t_gather = _best(lambda ring=ring, slots=slots: ring.gather(slots), repeats)
            per_kind[kind] = (t_write, t_gather, spec.row_bytes)
        finally:
            win.close()
    (ws, gs, rs), (wl, gl, rl) = per_kind["small"], per_kind["large"]
    out["ingest_s_per_byte"] = max(wl - ws, 0.0) / batch / (rl - rs)
    out["ingest_s_per_row"] = max(ws / batch - out["ingest_s_per_byte"] * rs, 0.0)
    out["gather_s_per_byte"] = max(gl - gs, 0.0) / batch / (rl - rs)
    out["gather_s_per_row"] = max(gs / batch - out["gather_s_per_byte"] * rs, 0.0)
    # sampling: stratified prefix search in a sum-tree of 1 Mi leaves
    tree = SumTree(1 << 20)
    tree.update(np.arange(1 << 20), rng.random(1 << 20))
    targets = np.sort(rng.random(batch)) * tree.total
    out["sample_s_per_row"] = _best(lambda: tree.prefix_search(targets), repeats) / batch
    idx = PriorityIndex(1 << 16, alpha=0.6)
    sl = np.arange(1 << 16)
    idx.insert(sl, sl + 1, rng.random(1 << 16))
    up = rng.integers(0, 1 << 16, batch)
    out["update_s_per_row"] = _best(lambda: idx.update(up, up + 1, rng.random(batch)),
                                    repeats) / batch
    # one RMA read of a remote shard: an indexed get of one 64-byte block and a flush
    win = RmaWindow(MPI.COMM_SELF, 1 << 16, node_comm=None, shared=False)
    try:
        buf = np.zeros(64, np.uint8)
        offs = np.zeros(1, np.int64)

        def rma_get() -> None:
            win.get_blocks(0, 0, 64, offs, buf)
            win.flush(0)

        out["rma_message_s"] = _best(rma_get, repeats * 5)
    finally:
        win.close()
    # hand-off of a ready batch from a data-plane thread to the learner thread
    q_in: queue.Queue[int] = queue.Queue()
    q_out: queue.Queue[int] = queue.Queue()

    def echo() -> None:
        while (v := q_in.get()) >= 0:
            q_out.put(v)

    th = threading.Thread(target=echo, daemon=True)
    th.start()

    def ping() -> None:
        q_in.put(1)
        q_out.get(timeout=5)

    out["handoff_s"] = _best(ping, repeats * 5) / 2
    q_in.put(-1)
    th.join(timeout=5)
    # one request message handled by a buffer (MPI point-to-point to self, 64 bytes)
    comm = MPI.COMM_SELF
    sbuf, rbuf = np.zeros(64, np.uint8), np.zeros(64, np.uint8)

    def request() -> None:
        r = comm.Irecv(rbuf, source=0, tag=7)
        comm.Send(sbuf, dest=0, tag=7)
        r.Wait()

    out["request_s"] = _best(request, repeats * 5)
    return out


# ---------------------------------------------------------------------------------
# the model at each size (the model itself: conduit_hpc.bench._scale_model)


def run_scale(cluster_path: Path, sizes: list[int], costs: dict[str, float], *,
              row_bytes: int, batch_rows: int, rows_per_learner: int, compute_s: float,
              update_rate_hz: float, actor_rows_per_s: float, actors_per_learner: int,
              scope: str, gradient_bytes: float = 0.0) -> list[dict]:
    from conduit_hpc.placement.cluster import ClusterModel
    from conduit_hpc.placement.model import Workload

    template = ClusterModel.from_toml(cluster_path)
    gpn = template.nodes[0].learners
    results = []
    for gpus in sizes:
        nodes = max(1, gpus // gpn)
        cluster = cluster_of(template, nodes, actors_per_learner)
        learners = sum(n.learners for n in cluster.nodes)
        w = Workload(capacity_rows=rows_per_learner * learners, row_bytes=row_bytes,
                     batch_rows=batch_rows, update_rate_hz=update_rate_hz,
                     actor_rows_per_s=actor_rows_per_s, compute_s=compute_s,
                     scope=scope)  # type: ignore[arg-type]
        for mode, r in predict_modes(cluster, w, costs, gradient_bytes).items():
            results.append({"gpus": learners, "nodes": nodes, "mode": mode, **r})
    return results


# ---------------------------------------------------------------------------------
# output


def draw(results: list[dict], png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode, style in zip(MODES, ("-o", "--s", ":^"), strict=True):
        rs = [r for r in results if r["mode"] == mode]
        x = [r["gpus"] for r in rs]
        axes[0].plot(x, [r["iteration_s"] * 1e3 for r in rs], style, label=mode)
        axes[1].plot(x, [r["exposed_s"] * 1e3 for r in rs], style, label=mode)
    for ax, what in zip(axes, ("iteration", "exposed experience-path"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"predicted {what} latency")
        ax.set_xlabel("GPUs (= learners, weak scaling)")
        ax.set_ylabel("ms per superstep")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def print_table(results: list[dict]) -> None:
    print(f"\n{'GPUs':>5} {'nodes':>5} {'mode':>8} {'path ms':>9} {'exposed ms':>11} "
          f"{'iteration ms':>13}  bottleneck link")
    for r in results:
        print(f"{r['gpus']:>5} {r['nodes']:>5} {r['mode']:>8} {r['path_s'] * 1e3:>9.3f} "
              f"{r['exposed_s'] * 1e3:>11.3f} {r['iteration_s'] * 1e3:>13.3f}  "
              f"{r['bottleneck']}")


# ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="conduit-hpc bench scale")
    p.add_argument("--smoke", action="store_true", help="two sizes, few repeats")
    p.add_argument("--cluster", default=str(repo_path("jobs/cluster-128x8.toml")),
                   help="cluster whose first node type is replicated")
    p.add_argument("--sizes", type=wholes(1, 1 << 20), default="8,16,32,64,128,256,512,1024")
    p.add_argument("--row-bytes", type=whole(1, 1 << 30), default=28_224, help="Atari frame stack")
    p.add_argument("--batch-rows", type=whole(1, 1 << 24), default=256)
    p.add_argument("--rows-per-learner", type=whole(1, 1 << 40), default=100_000)
    p.add_argument("--compute-s", type=real(0, 3600), default=0.004)
    p.add_argument("--update-rate", type=real(0, 1e9, open_lo=True), default=200.0)
    p.add_argument("--actor-rate", type=real(0, 1e9, open_lo=True), default=250.0,
                   help="rows/s per actor")
    p.add_argument("--actors-per-learner", type=whole(0, 1 << 16), default=4)
    p.add_argument("--scope", choices=("global", "partitioned"), default="global")
    p.add_argument("--gradient-bytes", type=real(0, 1e15), default=0.0,
                   help="bytes of gradient all-reduced per superstep over the learners "
                   "(0: none; e.g. 6.7e6 for the Nature DQN's 1.7M float32 parameters)")
    p.add_argument("--png", type=out_file, default="",
                   help="where the curves go (default bench/scale.png; with --smoke, "
                   "bench/out/scale-smoke.png: a smoke run does not replace the recorded figure)")
    p.add_argument("--measured", type=run_dir, nargs="*", default=[],
                   help="run directories of this machine to compare against")
    p.add_argument("--measured-learners", type=finished_run, nargs="*", default=[],
                   metavar="RUN_DIR",
                   help="DQN runs with 1, 2, ... learners (bench convergence --learners)")
    p.add_argument("--link", type=link, default="probe", help="the learners' all-reduce link for "
                   "--measured-learners: probe (gloo, measured here) or LATENCY_US,GBPS")
    p.add_argument("--job", default=str(repo_path("jobs/synthetic.toml")),
                   help="job config of the --measured runs")
    p.add_argument("--cost", action="append", default=[], metavar="NAME=SECONDS",
                   help="replace a measured cost (what-if), e.g. gather_s_per_byte=4e-11")
    p.add_argument("--out", type=out_file, default="",
                   help="also append the JSON lines to this file")
    args = p.parse_args(argv)
    if args.smoke:
        args.sizes = "8,16"
    if not args.png:
        args.png = str(repo_path("bench/out/scale-smoke.png" if args.smoke else "bench/scale.png"))
        Path(args.png).parent.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    sha = git_sha()
    costs = measure_costs(repeats=5 if args.smoke else 20)
    for item in args.cost:
        name, _, value = item.partition("=")
        if name not in costs:
            raise SystemExit(f"--cost {item!r}: unknown cost; known: {', '.join(costs)}")
        costs[name] = float(value)
    print(jsontext.dumps({"bench": "scale", "what": "costs", "git_sha": sha, **costs}))
    results = run_scale(Path(args.cluster), sizes, costs, row_bytes=args.row_bytes,
                        batch_rows=args.batch_rows, rows_per_learner=args.rows_per_learner,
                        compute_s=args.compute_s, update_rate_hz=args.update_rate,
                        actor_rows_per_s=args.actor_rate,
                        actors_per_learner=args.actors_per_learner, scope=args.scope,
                        gradient_bytes=args.gradient_bytes)
    lines = [jsontext.dumps({"bench": "scale", "git_sha": sha, "scope": args.scope,
                         "row_bytes": args.row_bytes, "batch_rows": args.batch_rows,
                         "compute_s": args.compute_s, **r}) for r in results]
    for ln in lines:
        print(ln)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(lines) + "\n")
    print_table(results)
    draw(results, Path(args.png), f"weak scaling on {Path(args.cluster).stem} nodes, "
         f"{args.row_bytes:,} B rows, batch {args.batch_rows}, compute "
         f"{args.compute_s * 1e3:g} ms ({args.scope} sampling)")
    print(f"\ncurves: {args.png}")
    from conduit_hpc.bench import _scale_measured as sm

    comparison, learners = [], []
    local_cluster = repo_path("jobs/cluster-local.toml")
    if args.measured:
        measured = sm.load_measured(args.measured)
        local = sm.predict_local(Path(args.job), measured, costs, local_cluster)
        comparison = sm.compare_with_measured(local, measured)
    if args.measured_learners:
        learners = sm.measured_learners(args.measured_learners, costs, local_cluster,
                                        args.link, args.gradient_bytes)
    top = {m: max((r for r in results if r["mode"] == m), key=lambda r: r["gpus"])
           for m in MODES}
    return {"costs": costs, "results": results, "png": args.png, "comparison": comparison,
            "learners": learners,
            "largest": {m: {"gpus": r["gpus"], "iteration_s": r["iteration_s"],
                            "exposed_s": r["exposed_s"]} for m, r in top.items()}}


if __name__ == "__main__":
    main(sys.argv[1:])
