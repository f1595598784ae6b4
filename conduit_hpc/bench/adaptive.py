"""Adaptive placement on vs off on a skewed prioritized workload (the cost model's view).

    conduit-hpc bench adaptive [--smoke] [--supersteps 6000] [--taus 800,8000] [--no-live]

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

**Live** (``--live``, on by default; ``--no-live`` skips it): the real data plane on this
machine, adaptive off and on, one after the other in the same invocation. Four ranks as two
emulated nodes (``[layout] emulate_nodes = 2``): the learner and a buffer rank on node 0, a
buffer rank and the actor on node 1. Rows of ``--row-kb`` KB; the actor writes every row
to the shard on node 1 (the start plan: buffers beside the actors), one row in
``--hot-every`` enters 100x hotter, and the learner keeps that skew in its priority
updates; it samples ``--batch`` rows per superstep through ``edp`` mode and "computes"
``--live-compute-s`` (a sleep). The *off* run measures what a batch from node 1 costs; the
cluster model of the *on* run takes its link from that measurement (node 1's effective
bandwidth as the learner sees it; this machine's shared memory, 8 GB/s, within a node), so
the policy judges with numbers this job measured (looks every 20 supersteps, ``min_gain``
0.1, patience 2, ``--live-cooldown`` 200). ``--live-repeats`` pairs (off, then on) run back
to back. Reported per run: mean and median exposed latency (first 10 % of supersteps
dropped), the share of rows read on the learner's node, a trace per look window, and for
the *on* run its moves (supersteps, rows, seconds) and the policy's time per look.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from conduit_hpc import jsontext
from conduit_hpc.bench._args import real, reals, whole
from conduit_hpc.bench.common import git_sha, repo_path, worker_command
from conduit_hpc.bench.scale import cluster_of

if TYPE_CHECKING:
    from conduit_hpc.placement.cluster import ClusterModel
    from conduit_hpc.placement.model import Workload


def run(tau: float, supersteps: int, interval: int, cluster: ClusterModel, workload: Workload,
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
    start = plan_static(cluster, workload if skew_known else
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

    policy = AdaptivePolicy(cluster, workload, start, knobs=AdaptiveKnobs(
        min_gain=0.1, payback_supersteps=5000, patience=2, cooldown_supersteps=500))
    heat = tuple((float(b[0]), float(b[1])) for b in workload.heat)
    off_total = on_total = moved_s = 0.0
    last_move = 0
    trace = []
    for t in range(0, supersteps, interval):
        off = predict_placement(cluster, workload, start,
                                shares=true_shares(start, t))
        shares_on = true_shares(policy.placement, t - last_move)
        on = predict_placement(cluster, workload, policy.placement,
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


# ---------------------------------------------------------------------------------
# live: the real data plane, adaptive off vs on


def live_config(args: argparse.Namespace, *, adaptive: bool, cluster: str) -> dict:
    """The job (a plain mapping, as TOML gives) for one live run."""
    batch = args.batch
    return {
        "run": {"name": "adaptive-live", "seed": 0, "timeout_s": 120.0},
        "layout": {"learners": 1, "buffers": 2, "emulate_nodes": 2},
        "spec": {"obs": {"dtype": "uint8", "shape": [args.row_kb * 1024]},
                 "actor": {"dtype": "int32"}, "seq": {"dtype": "int64"}},
        "storage": {"capacity_rows": 2 * args.shard_rows, "priority_exponent": 1.0},
        "scheduler": {"mode": "edp", "batch_rows": batch, "prefetch_depth": 2,
                      "sampler": "prioritized", "min_fill_rows": 4 * batch, "device": "cpu"},
        "placement": {"adaptive": adaptive, "cluster": cluster, "interval_supersteps": 20,
                      "min_gain": 0.1, "patience": 2,
                      "cooldown_supersteps": args.live_cooldown,
                      "payback_supersteps": 100_000},
        "checkpoint": {"on_stop": False},
    }


def _hot(actor: Any, seq: Any, every: int) -> np.ndarray:
    h = (np.asarray(actor, np.int64) * 7919 + np.asarray(seq, np.int64)) % every == 0
    return np.where(h, 100.0, 1.0)


def live_worker(cfg_path: str, out_path: str) -> None:
    """One live run on the ranks mpirun started (``python -m mpi4py``)."""
    import numpy as np
    from mpi4py import MPI

    from conduit_hpc import Config, ExperienceDataPlane, Role
    from conduit_hpc.placement.placement import Placement, plan_round_robin

    job = json.loads(Path(cfg_path).read_text())
    knobs = job.pop("bench")
    cfg = Config.from_dict(job)
    size = MPI.COMM_WORLD.Get_size()
    rr = plan_round_robin(actor_ranks=tuple(range(3, size)), buffer_ranks=(1, 2),
                          learner_ranks=(0,), capacity_rows=cfg.storage.capacity_rows)
    # the start plan: buffers beside the actors (node 1 holds every row)
    start = Placement(shards=rr.shards, actor_shards=dict.fromkeys(range(3, size), 1),
                      learner_shards=rr.learner_shards)
    out: dict = {}
    with ExperienceDataPlane(cfg, placement=start) as edp:
        me = edp.world_rank
        if edp.role is Role.ACTOR:
            rng = np.random.default_rng(me)
            n, seq = 16, 0
            obs = rng.integers(0, 255, (n, cfg.spec["obs"].shape[0]), dtype=np.uint8)
            t0, rate = time.perf_counter(), knobs["actor_rows_s"]
            while not edp.should_stop:
                a, q = np.full(n, me, np.int32), np.arange(seq, seq + n)
                edp.ingest({"obs": obs, "actor": a, "seq": q}, priorities=_hot(
                    a, q, knobs["hot_every"]))
                seq += n
                ahead = seq / rate - (time.perf_counter() - t0)
                if ahead > 0:
                    time.sleep(ahead)
        elif edp.role is Role.LEARNER:
            rng = np.random.default_rng(1)
            local: list[float] = []
            exposed: list[float] = []
            path: list[float] = []
            for _ in range(knobs["supersteps"]):
                t0 = time.perf_counter()
                b = edp.next_batch()
                exposed.append(time.perf_counter() - t0)  # every superstep, in order
                path.append(b.timings["sample_s"] + b.timings["gather_s"])
                local.append(float(np.mean(b.indices[:, 0] == 0)))
                time.sleep(knobs["compute_s"])
                p = _hot(b.data["actor"].numpy(), b.data["seq"].numpy(), knobs["hot_every"])
                edp.update_priorities(b.indices, p * rng.uniform(0.8, 1.25, len(b)))
            edp.done()
            out = {"exposed_s": exposed, "path_s": path, "local_share": local}
        else:
            edp.serve()
        edp.done()
        summary = edp.summary()
    if me == 0:
        rep = summary["replacement"].get(1, {})
        out["history"] = rep.get("history", [])  # the latest looks
        out["looks"] = rep.get("looks", 0)
        out["counters"] = {r: v.get("counters", {}) for r, v in summary["replacement"].items()}
        Path(out_path).write_text(jsontext.dumps(out, default=str))


def _stats(r: dict, lo: int, hi: int | None = None) -> dict:
    import numpy as np

    ex = np.asarray(r["exposed_s"][lo:hi])
    return {"mean_exposed_s": float(ex.mean()), "median_exposed_s": float(np.median(ex)),
            "local_share": float(np.mean(r["local_share"][lo:hi]))}


def _cluster_toml(gbps: float) -> str:
    """Two emulated nodes: this machine's shared memory within a node, the link between
    them as the off run measured it."""
    link = f"{{ bandwidth_gbps = {gbps:.6g}, latency_s = 1e-5 }}"
    shm = "{ bandwidth_gbps = 8.0, latency_s = 1e-6 }"
    return 'name = "emulated-2-nodes"\n' + "".join(
        f'[[nodes]]\nname = "n{i}"\nlearners = {1 - i}\nbuffers = 1\nactors = {i}\n'
        f'buffer_host_bytes = "1 GB"\nshm = {shm}\nnic = {link}\n' for i in (0, 1))


def _launch(args: argparse.Namespace, job: dict, work: Path, name: str) -> dict:
    from conduit_hpc.testing import mpirun

    (work / f"{name}.json").write_text(jsontext.dumps(job))
    t0 = time.perf_counter()
    out = mpirun(4, worker_command("conduit_hpc.bench.adaptive", "--live-worker",
                                   str(work / f"{name}.json"), str(work / f"{name}-out.json")),
                 timeout_s=args.live_timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"live run {name} failed with {out.returncode}:\n"
                           f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    r = json.loads((work / f"{name}-out.json").read_text())
    r["wall_s"] = time.perf_counter() - t0
    return r


def run_live(args: argparse.Namespace) -> dict:
    """``--live-repeats`` pairs of runs, adaptive off then on (the on run's cluster model
    calibrated by the off run just before it); 4 ranks each. Pairs run back to back so
    that both see the same machine (this one is shared)."""
    import numpy as np

    knobs = {"supersteps": args.live_supersteps, "compute_s": args.live_compute_s,
             "actor_rows_s": args.actor_rows_s, "hot_every": args.hot_every}
    n = args.live_supersteps
    warm = n // 10
    pairs = []
    with tempfile.TemporaryDirectory(prefix="conduit-adaptive-") as tmp:
        work = Path(tmp)
        for rep in range(args.live_repeats):
            off = _launch(args, {**live_config(args, adaptive=False, cluster=""),
                                 "bench": knobs}, work, f"off{rep}")
            path = np.asarray(off["path_s"][warm:])
            gbps = args.batch * (args.row_kb * 1024 + 12) / float(np.median(path)) / 1e9
            (work / f"cluster{rep}.toml").write_text(_cluster_toml(gbps))
            on = _launch(args, {**live_config(args, adaptive=True,
                                              cluster=str(work / f"cluster{rep}.toml")),
                                "bench": knobs}, work, f"on{rep}")
            moves = [h for h in on["history"] if h.get("action") == "move"]
            pair: dict = {"remote_gbps_measured": gbps, "off": _stats(off, warm),
                          "on": _stats(on, warm), "moves": len(moves),
                          "moved_rows": sum(int(m["moved_rows"]) for m in moves),
                          "move_supersteps": [int(m["superstep"]) for m in moves],
                          "move_seconds": sum(float(m["seconds"]) for m in moves),
                          "looks": on["looks"], "off_looks": off["looks"],
                          "policy_s_max": max((float(h.get("policy_s", 0.0))
                                               for h in on["history"]), default=0.0)}
            pair["on_over_off"] = pair["on"]["mean_exposed_s"] / pair["off"]["mean_exposed_s"]
            if moves:
                first = int(moves[0]["superstep"])
                pair["reason"] = moves[0]["reason"]
                pair["on_after_first_move"] = _stats(on, min(first + 20, n - 1))
                pair["off_same_supersteps"] = _stats(off, min(first + 20, n - 1))
            w = 20  # one window per look
            pair["trace_ms"] = {m: [round(float(np.mean(r["exposed_s"][i:i + w])) * 1e3, 3)
                                    for i in range(0, n, w)]
                                for m, r in (("off", off), ("on", on))}
            pairs.append(pair)
    mean = {m: float(np.mean([p[m]["mean_exposed_s"] for p in pairs])) for m in ("off", "on")}
    return {"bench": "adaptive-live", "git_sha": git_sha(), "ranks": 4, "supersteps": n,
            "row_bytes": args.row_kb * 1024, "batch_rows": args.batch,
            "compute_s": args.live_compute_s, "actor_rows_s": args.actor_rows_s,
            "hot_every": args.hot_every, "cooldown_supersteps": args.live_cooldown,
            "repeats": len(pairs), "off_mean_exposed_s": mean["off"],
            "on_mean_exposed_s": mean["on"], "on_over_off": mean["on"] / mean["off"],
            "moves": sum(p["moves"] for p in pairs), "pairs": pairs}


def print_live(r: dict) -> None:
    print("\nlive: the real data plane, 4 ranks as 2 emulated nodes, adaptive off vs on")
    for k, p in enumerate(r["pairs"]):
        print(f"  pair {k}: link measured off {p['remote_gbps_measured']:.3g} GB/s; "
              f"{p['moves']} moves ({p['moved_rows']} rows, {p['move_seconds'] * 1e3:.0f} ms, "
              f"at supersteps {p['move_supersteps']})")
        for name in ("off", "on"):
            x = p[name]
            print(f"    {name:>3}: mean exposed {x['mean_exposed_s'] * 1e3:7.3f} ms, median "
                  f"{x['median_exposed_s'] * 1e3:7.3f} ms, rows read on the learner's node "
                  f"{x['local_share']:.0%}")
        print(f"    on/off {p['on_over_off']:.2f}")
    print(f"  mean exposed over {r['repeats']} pairs: off {r['off_mean_exposed_s'] * 1e3:.3f} "
          f"ms, on {r['on_mean_exposed_s'] * 1e3:.3f} ms (on/off {r['on_over_off']:.2f})")


def main(argv: list[str] | None = None) -> dict:
    from conduit_hpc.placement.cluster import ClusterModel
    from conduit_hpc.placement.model import Workload

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--live-worker":
        live_worker(argv[1], argv[2])
        return {}
    p = argparse.ArgumentParser(prog="conduit-hpc bench adaptive")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--supersteps", type=whole(1, 10**7), default=6000)
    p.add_argument("--interval", type=whole(1, 10**6), default=100)
    p.add_argument("--taus", type=reals(0, 1e12, open_lo=True), default="800,8000",
                   help="drift time constants to compare")
    p.add_argument("--compute-s", type=real(0, 3600), default=0.0005)
    p.add_argument("--cluster", default=str(repo_path("jobs/cluster-128x8.toml")),
                   help="its first node type is used, one node")
    p.add_argument("--live", action=argparse.BooleanOptionalAction, default=True,
                   help="also compare off and on on the real data plane (4 ranks)")
    p.add_argument("--live-supersteps", type=whole(1, 10**7), default=1500)
    p.add_argument("--live-compute-s", type=real(0, 3600), default=0.002)
    p.add_argument("--row-kb", type=whole(1, 1 << 20), default=16)
    p.add_argument("--batch", type=whole(1, 1 << 20), default=64)
    p.add_argument("--shard-rows", type=whole(1, 1 << 30), default=2048)
    p.add_argument("--actor-rows-s", type=real(0, 1e9, open_lo=True), default=1000.0)
    p.add_argument("--hot-every", type=whole(1, 10**6), default=20)
    p.add_argument("--live-cooldown", type=whole(0, 10**7), default=200,
                   help="supersteps after a move before the policy looks again")
    p.add_argument("--live-repeats", type=whole(1, 100), default=2,
                   help="pairs of runs (off, then on), back to back")
    p.add_argument("--live-timeout-s", type=real(0, 1e6, open_lo=True), default=600.0)
    args = p.parse_args(argv)
    if args.smoke:
        args.supersteps, args.taus = 1200, "300"
        args.live_supersteps, args.row_kb, args.shard_rows = 300, 4, 1024
        args.live_repeats = 1
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
        print(jsontext.dumps(r))
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
    out: dict = {"results": results}
    if args.live:
        live = run_live(args)
        print(jsontext.dumps(live))
        print_live(live)
        out["live"] = live
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
