"""Placement across two hosts over a shaped link: the static plan against a link-blind one.

    conduit-hpc bench hosts-placement [--rates 1gbit,100mbit] [--duration 6] [--smoke]

Needs root and a checkout (``scripts/hosts/cluster.sh``): brings up a test cluster of 2
hosts (network namespaces, see ``docs/hosts.md``) whose links a ``tc tbf`` qdisc holds to
each rate in turn, and runs ``jobs/synthetic.toml`` across them, 6 ranks dealt
round-robin (learner 0 and buffer 2 on host0, buffer 1 on host1, actors on both), with
1 KiB rows and 2,000 rows/s per actor, once per plan:

* ``aware``: ``planner = "static"`` on the model the start-up probe measured - the link
  between the hosts at what the shaper lets through;
* ``blind``: ``planner = "static"`` on the same measurements with the link between the
  hosts as fast as memory (:func:`blind_cluster`): a plan that ignores the link;
* ``round_robin``: the default planner (capacity split evenly over the buffer ranks).

Per plan and rate: the share of the learner's samples its plan puts on the learner's own
host, the probe's put/get bandwidth between the hosts, the plan's predicted path and
exposed time per superstep, and the learner's measured medians (``sync`` mode by default,
so the path is all exposed and measured by the learner itself); then the ratios of the
blind and round-robin plans to the aware one. ``--smoke``: 100 Mbit/s only, 2 s runs,
``aware`` and ``blind``.

The machine is shared and oversubscribed (6 ranks and the shaper on the same cores): read
ratios, not absolute times; a figure is printed with the load average when it was taken.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from conduit_hpc import jsontext
from conduit_hpc.bench._args import names, out_dir, real
from conduit_hpc.bench.common import git_sha, repo_path
from conduit_hpc.plane.sampled_rows import row_weight, rows_after, weighted_median

__all__ = ["JOB_SETS", "blind_cluster", "learner_host_share", "main", "roles_per_node"]

#: the job across the two hosts: 1 learner, a buffer on each host, 3 actors; 1 KiB rows at
#: 2,000 rows/s per actor, so that the learner's reads (a 256-row batch per superstep)
#: outweigh the ingest that crosses the link, whichever host holds the rows
JOB_SETS = ("layout.learners=1", "layout.buffers=2", "layout.actors=3",
            "spec.obs.shape=[256]", "synthetic.actor_rate_rows_s=2000",
            "storage.capacity_rows=50000", "checkpoint.every_seconds=0",
            "checkpoint.on_stop=false")
RATE_BYTES_S = {"1gbit": 125e6, "100mbit": 12.5e6, "10mbit": 1.25e6}


def roles_per_node(plan: Mapping[str, Any], learners: int, buffers: int, actors: int
                   ) -> list[tuple[int, int, int]]:
    """(learners, buffers, actors) on each node of a run, from ``plan.json``'s ``nodes``
    and the whole-world layout counts. Pure."""
    from conduit_hpc.config import LayoutConfig
    from conduit_hpc.config.layout_rule import assign_roles

    node_of = [0] * sum(len(n["ranks"]) for n in plan["nodes"])
    for n in plan["nodes"]:
        for r in n["ranks"]:
            node_of[r] = n["node"]
    got, err = assign_roles(LayoutConfig(learners=learners, buffers=buffers, actors=actors),
                            node_of)
    if err is not None or got is None:
        raise ValueError(f"layout {learners}/{buffers}/{actors} on {node_of}: {err}")
    out = []
    for i in range(max(node_of) + 1):
        roles = [got.roles[r] for r in range(len(node_of)) if node_of[r] == i]
        out.append((roles.count("learner"), roles.count("buffer"), roles.count("actor")))
    return out


def blind_cluster(probe: Mapping[str, float], per_node: Sequence[tuple[int, int, int]],
                  host_bytes: int, *, blind: bool = True) -> Any:
    """The cluster model of the start-up probe's measurements (``plan.json``'s
    ``probe``), with the link between nodes as fast as memory when ``blind`` (a plan
    on it ignores the link). Pure; returns a
    :class:`~conduit_hpc.placement.cluster.ClusterModel`."""
    from conduit_hpc.placement.cluster import ClusterModel

    shm = max(probe["memcpy_gbps"], probe["shm_get_gbps"])
    shm_lat = probe["shm_latency_s"] / 2
    nic = shm if blind else min(probe["net_put_gbps"], probe["net_get_gbps"])
    nic_lat = shm_lat if blind else probe["net_latency_s"] / 2
    return ClusterModel.from_measurements(
        name="link-blind" if blind else "probed", nodes=len(per_node), gpus_per_node=0,
        learners_per_node=per_node[0][0], buffers_per_node=per_node[0][1],
        actors_per_node=per_node[0][2], shm_gbps=shm, shm_latency_s=shm_lat,
        nic_gbps=nic, nic_latency_s=nic_lat, host_bytes=host_bytes,
        per_node=None if len(set(per_node)) == 1 else list(per_node))


def learner_host_share(plan: Mapping[str, Any], learner: int = 0) -> float:
    """The share of ``learner``'s samples that its plan draws from shards owned on its
    own host (``plan.json``; by rows where the plan gives no shares, as round-robin's
    uniform split). Pure."""
    node_of = {r: n["node"] for n in plan["nodes"] for r in n["ranks"]}
    shards = plan["placement"]["shards"]
    weights = [float(s.get("share") or 0.0) for s in shards]
    if not any(weights):
        weights = [float(s["capacity_rows"]) for s in shards]
    total = sum(weights)
    local = sum(w for s, w in zip(shards, weights, strict=True)
                if node_of.get(int(s["owner_rank"])) == node_of[learner])
    return local / total if total else 0.0


def _host_bytes() -> int:
    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _cluster(name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONDUIT_HOSTS_NAME": name,
           "CONDUIT_HOSTS_DIR": f"/run/conduit-hosts/{name}"}
    return subprocess.run([str(repo_path("scripts/hosts/cluster.sh")), *args], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def run_job(name: str, sets: Sequence[str], *, runs: Path, duration: float, mode: str,
            hostfile: Path, extra: Sequence[str] = ()) -> Path:
    """The synthetic job across the cluster ``name``'s hosts of ``hostfile``; its run
    directory. Blocks (bounded)."""
    env = {**os.environ, "CONDUIT_HOSTS_NAME": name,
           "CONDUIT_HOSTS_DIR": f"/run/conduit-hosts/{name}",
           "CONDUIT_HOSTS_HOSTFILE": str(hostfile),
           "CONDUIT_MPIRUN": str(repo_path("scripts/hosts/mpirun.sh"))}
    cmd = [sys.executable, "-m", "conduit_hpc.tools.cli", "run",
           str(repo_path("jobs/synthetic.toml")), "--mode", mode, "--runs", str(runs),
           "--timeout", str(int(duration + 180)), "--set", f"run.duration_s={duration}"]
    for s in [*JOB_SETS, *sets, *extra]:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, env=env, cwd=repo_path("."), capture_output=True, text=True,
                          timeout=duration + 300, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench hosts-placement: the job failed (exit {proc.returncode}):"
                         f"\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}")
    return max((p for p in runs.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)


def measure(run_dir: Path, plan_name: str, rate: str) -> dict[str, Any]:
    """One result line from a run directory: plan, prediction and measured medians."""
    plan = json.loads((run_dir / "plan.json").read_text())
    with open(run_dir / "metrics" / "learner-0.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    # past the fill and warm-up, by supersteps (a row past run.metrics_full_rows stands
    # for its weight's)
    rows = rows_after(rows, int(sum(map(row_weight, rows))) // 5)
    if not rows:
        raise SystemExit(f"bench hosts-placement: no supersteps measured in {run_dir}")

    def med_ms(*keys: str) -> float:
        return 1e3 * weighted_median([sum(float(r[k]) for k in keys) for r in rows],
                                     [row_weight(r) for r in rows])

    pred = ((plan.get("prediction") or {}).get("learners") or {}).get("0") or {}
    probe = plan.get("probe") or {}
    return {"rate": rate, "plan": plan_name, "planner": plan["planner"],
            "learner_host_share": round(learner_host_share(plan), 4),
            "shards": [(s["owner_rank"], s["tier"], s["capacity_rows"])
                       for s in plan["placement"]["shards"]],
            "probe_put_gbps": probe.get("net_put_gbps"),
            "probe_get_gbps": probe.get("net_get_gbps"),
            "predicted_path_ms": 1e3 * pred["path_s"] if pred.get("path_s") is not None
            else None,
            "predicted_exposed_ms": 1e3 * pred["exposed_s"]
            if pred.get("exposed_s") is not None else None,
            "supersteps": int(sum(map(row_weight, rows))),
            "path_ms": med_ms("sample_s", "gather_s"),
            "exposed_ms": med_ms("exposed_s"), "iteration_ms": med_ms("iteration_s"),
            "run_dir": str(run_dir), "loadavg": os.getloadavg()[0], "git": git_sha()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="conduit-hpc bench hosts-placement", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", type=names(RATE_BYTES_S), default="1gbit,100mbit",
                   help=f"link rates, comma-separated (of {', '.join(RATE_BYTES_S)})")
    p.add_argument("--plans", type=names(("aware", "blind", "round_robin")),
                   default="aware,blind,round_robin",
                   help="plans to compare: aware, blind, round_robin (aware first)")
    p.add_argument("--duration", type=real(0, 1e6, open_lo=True), default=6.0,
                   help="seconds per run")
    p.add_argument("--mode", default="sync", choices=["sync", "edp", "service"])
    p.add_argument("--out", type=out_dir, default="",
                   help="folder for the runs (default: a temp dir)")
    p.add_argument("--smoke", action="store_true",
                   help="100mbit only, 2 s runs, aware and blind")
    args = p.parse_args(argv)
    if args.smoke:
        args.rates, args.plans, args.duration = "100mbit", "aware,blind", 2.0
    rates, plans = args.rates.split(","), args.plans.split(",")
    if plans[0] != "aware":  # the others are compared with it
        p.error(f"argument --plans: must start with aware, got {args.plans!r}")
    if not repo_path("scripts/hosts/cluster.sh").is_file():
        raise SystemExit("bench hosts-placement: needs a checkout (scripts/hosts/cluster.sh)")
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-hosts-placement-"))
    out.mkdir(parents=True, exist_ok=True)
    name = f"bench-{os.getpid()}"
    results: list[dict[str, Any]] = []
    try:
        for i, rate in enumerate(rates):
            got = _cluster(name, "up", "2", "--rate", rate) if i == 0 else \
                _cluster(name, "shape", "--rate", rate)
            if got.returncode != 0:
                raise SystemExit(f"bench hosts-placement: cluster.sh failed (exit "
                                 f"{got.returncode}): {got.stderr.strip()}")
            hostfile = out / "hostfile"
            hostfile.write_text("host0 slots=3\nhost1 slots=3\n")
            aware_plan: dict[str, Any] = {}
            for plan_name in plans:
                runs = out / rate / plan_name
                runs.mkdir(parents=True, exist_ok=True)
                if plan_name == "aware":
                    sets = ["placement.planner=static"]
                elif plan_name == "blind":
                    model = blind_cluster(aware_plan["probe"],
                                          roles_per_node(aware_plan, 1, 2, 3), _host_bytes())
                    path = out / rate / "link-blind.toml"
                    path.write_text(model.to_toml())
                    sets = ["placement.planner=static", f"placement.cluster={path}"]
                else:
                    sets = ["placement.planner=round_robin"]
                run_dir = run_job(name, sets, runs=runs, duration=args.duration,
                                  mode=args.mode, hostfile=hostfile)
                if plan_name == "aware":
                    aware_plan = json.loads((run_dir / "plan.json").read_text())
                row = measure(run_dir, plan_name, rate)
                print(jsontext.dumps(row), flush=True)
                results.append(row)
    finally:
        _cluster(name, "down")
    ratios = []
    for rate in rates:
        by = {r["plan"]: r for r in results if r["rate"] == rate}
        base = by.get("aware")
        for other in ("blind", "round_robin"):
            if base and other in by:
                ratios.append({
                    "rate": rate, "vs": other,
                    "path_ratio": by[other]["path_ms"] / max(base["path_ms"], 1e-9),
                    "exposed_ratio": by[other]["exposed_ms"] / max(base["exposed_ms"], 1e-9),
                    "iteration_ratio": by[other]["iteration_ms"] / max(base["iteration_ms"],
                                                                        1e-9)})
    return {"bench": "hosts-placement", "mode": args.mode, "duration_s": args.duration,
            "results": results, "ratios": ratios, "out": str(out), "git": git_sha()}


if __name__ == "__main__":
    print(jsontext.dumps(main()))
