"""``conduit-hpc plan``: a plan (or why there is none) as tables and as JSON.

Plain Python (rich for the tables); no MPI. :func:`plan_command` is what the CLI calls.
"""

from __future__ import annotations

import io
import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rich.console import Console
from rich.table import Table

from conduit_hpc import jsontext
from conduit_hpc.errors import ConfigError, PlacementInfeasible
from conduit_hpc.placement.cluster import TIERS, ClusterModel, Roster
from conduit_hpc.placement.model import Topology, Workload
from conduit_hpc.placement.placement import Placement, PlanPrediction, _fmt_bytes

__all__ = ["plan_command", "plan_json", "render_infeasible", "render_plan"]


SHARE_MEANS = ("share of draws: the fraction of its partition's sampled rows expected to "
               "come from the shard (global scope: of all learners' draws; the shards of a "
               "partition sum to 100%)")


def _share(share: float) -> str:
    """A share as a percentage with three significant digits (``0.000763%``)."""
    return f"{100 * share:.3g}%" if share > 0 else "0%"


def _ms(s: float) -> str:
    return f"{s * 1e3:.4g}"


def render_plan(cluster: ClusterModel, workload: Workload, plan: Placement, *,
                notes: Sequence[str] = (), top: int = 24) -> str:
    """The plan as text tables: tiers, shards, learners, busiest links, bottleneck."""
    pred = plan.prediction
    assert pred is not None
    buf = io.StringIO()
    con = Console(file=buf, width=120, force_terminal=False, color_system=None, markup=False,
                  highlight=False)
    con.print(f"cluster  : {cluster.name} ({len(cluster.nodes)} nodes, {cluster.gpus} GPUs, "
              f"{cluster.learners} learners, {cluster.buffers} buffer ranks, "
              f"{cluster.actors} actors)  [{cluster.source or 'in memory'}]")
    stored = (f", {workload.stored_bytes:,} B stored (frames once)"
              if workload.stored_bytes != workload.row_bytes else "")
    con.print(f"workload : {workload.capacity_rows:,} rows x {workload.row_bytes:,} B{stored} "
              f"(+{workload.bytes_per_row - workload.stored_bytes} B/row in memory at most), batch "
              f"{workload.batch_rows} rows, {workload.update_rate_hz:g} updates/s, "
              f"{workload.actor_rows_per_s:g} rows/s per actor, {workload.sampling} "
              f"sampling, {workload.scope} scope")
    for n in notes:
        con.print(f"           note: {n}")
    con.print(f"planner  : {pred.method}; planned in {pred.planning_s * 1e3:.1f} ms")
    # tiers
    t = Table(title="memory tiers", title_justify="left")
    for c in ("tier", "shards", "rows", "bytes used", "capacity", "used"):
        t.add_column(c, justify="left" if c == "tier" else "right")
    rows = plan.tier_rows()
    counts = dict.fromkeys(TIERS, 0)
    for s in plan.shards:
        counts[s.tier] += 1
    for tier in TIERS:
        used, cap = pred.tier_bytes[tier]
        t.add_row(tier, f"{counts[tier]:,}", f"{rows[tier]:,}", _fmt_bytes(used),
                  _fmt_bytes(cap), f"{100 * used / cap:.1f}%" if cap else "-")
    con.print(t)
    # shards
    t = Table(title=f"shards ({len(plan.shards):,})", title_justify="left")
    for c in ("shard", "owner rank", "tier", "location", "capacity rows", "share of draws",
              "partition"):
        t.add_column(c, justify="right" if c not in ("tier", "location") else "left")
    for s in plan.shards[:top]:
        t.add_row(str(s.shard_id), str(s.owner_rank), s.tier, s.location,
                  f"{s.capacity_rows:,}", _share(s.share),
                  "all" if s.partition < 0 else f"learner {s.partition}")
    con.print(t)
    if len(plan.shards) > top:
        con.print(f"... {len(plan.shards) - top:,} more shards (--top N or --json for all)")
    con.print(SHARE_MEANS)
    # learners, slowest first
    t = Table(title=f"learners ({len(pred.learners):,}), per superstep, slowest first",
              title_justify="left")
    for c in ("rank", "node", "read", "bytes per link", "path ms", "exposed ms",
              "slowest link"):
        t.add_column(c, justify="left" if c in ("node", "bytes per link", "slowest link")
                     else "right")
    order = sorted(pred.learners, key=lambda lp: (-lp.path_s, lp.rank))
    for lp in order[:top]:
        links = sorted(lp.bytes_per_link.items(), key=lambda kv: -kv[1])
        shown = ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in links[:3])
        if len(links) > 3:
            shown += f", +{len(links) - 3} more"
        t.add_row(str(lp.rank), lp.node, _fmt_bytes(lp.read_bytes), shown or "(own GPU)",
                  _ms(lp.path_s), _ms(lp.exposed_s), lp.slowest_link or "-")
    con.print(t)
    if pred.learners:
        paths = [lp.path_s for lp in pred.learners]
        con.print(f"path time over learners: min {_ms(min(paths))} ms, median "
                  f"{_ms(statistics.median(paths))} ms, max {_ms(max(paths))} ms; exposed at "
                  f"compute {_ms(pred.compute_s)} ms: max {_ms(pred.max_exposed_s)} ms "
                  f"(superstep period {_ms(pred.superstep_s)} ms)")
    # links
    t = Table(title="busiest links", title_justify="left")
    for c in ("link", "ms per superstep", "of the period"):
        t.add_column(c, justify="left" if c == "link" else "right")
    busiest = sorted(pred.link_time_s.items(), key=lambda kv: (-kv[1], kv[0]))[:8]
    for name, sec in busiest:
        t.add_row(name, _ms(sec), f"{100 * sec / pred.superstep_s:.1f}%")
    con.print(t)
    con.print(f"bottleneck: {pred.bottleneck.describe()}")
    if pred.bottleneck.utilisation > 1:
        con.print("warning: the bottleneck link cannot carry one superstep's traffic within "
                  "a superstep; the job will run slower than the update rate")
    return buf.getvalue()


def render_infeasible(cluster: ClusterModel, workload: Workload,
                      err: PlacementInfeasible) -> str:
    """Why there is no plan: what each tier holds against what the replay needs."""
    topo = Topology(cluster, None, TIERS)
    buf = io.StringIO()
    con = Console(file=buf, width=120, force_terminal=False, color_system=None, markup=False,
                  highlight=False)
    con.print(f"no placement: {err}")
    t = Table(title="what the tiers hold", title_justify="left")
    for c in ("tier", "allowed", "locations", "each", "total"):
        t.add_column(c, justify="left" if c == "tier" else "right")
    for tier in TIERS:
        sel = [i for i, x in enumerate(topo.o_tier) if x == tier]
        caps = [topo.o_cap[i] for i in sel]
        t.add_row(tier, "yes" if tier in workload.tiers else "no", str(len(sel)),
                  _fmt_bytes(max(caps)) if caps else "-", _fmt_bytes(sum(caps)))
    con.print(t)
    need = workload.capacity_rows * workload.bytes_per_row
    con.print(f"the replay needs {_fmt_bytes(need)} ({workload.capacity_rows:,} rows x "
              f"{workload.bytes_per_row} B: {workload.stored_bytes} B of payload"
              f"{' stored' if workload.stored_bytes != workload.row_bytes else ''}, "
              f"{workload.bytes_per_row - workload.stored_bytes} B at most of stamp, "
              f"priority and priority index)")
    return buf.getvalue()


def plan_json(cluster: ClusterModel, workload: Workload, plan: Placement) -> dict[str, Any]:
    """A JSON-compatible dict: cluster, workload, plan (sparse, see
    :meth:`~conduit_hpc.placement.Placement.to_dict`) and prediction."""
    pred: PlanPrediction | None = plan.prediction
    out: dict[str, Any] = {"cluster": cluster.name, "source": cluster.source,
                           "legend": {"share": SHARE_MEANS.split(": ", 1)[1]},
                           "workload": {k: getattr(workload, k) for k in workload.__slots__},
                           "plan": plan.to_dict()}
    if pred is not None:
        b = pred.bottleneck
        out["prediction"] = {
            "method": pred.method, "planning_s": pred.planning_s,
            "superstep_s": pred.superstep_s, "compute_s": pred.compute_s,
            "objective_s": pred.objective_s, "max_path_s": pred.max_path_s,
            "max_exposed_s": pred.max_exposed_s,
            "bottleneck": {"link": b.link, "kind": b.kind, "time_s": b.time_s,
                           "utilisation": b.utilisation, "read_bytes": b.read_bytes,
                           "ingest_bytes": b.ingest_bytes, "text": b.describe()},
            "tier_bytes": {k: {"used": u, "capacity": c} for k, (u, c) in
                           pred.tier_bytes.items()},
            "link_time_s": pred.link_time_s,
            "learners": [{"rank": lp.rank, "node": lp.node, "path_s": lp.path_s,
                          "exposed_s": lp.exposed_s, "read_bytes": lp.read_bytes,
                          "bytes_per_link": lp.bytes_per_link,
                          "slowest_link": lp.slowest_link} for lp in pred.learners],
        }
    return out


def plan_command(cluster_path: str, workload_path: str | None, *, as_json: bool,
                 method: str = "auto", scope: str | None = None, top: int = 24,
                 min_shard_rows: int | None = None, out: Any = None) -> int:
    """Load, plan and print. ``min_shard_rows`` overrides the workload's floor (None:
    keep it). Raises :class:`PlacementInfeasible` after explaining it, ConfigError on a
    bad value."""
    import sys

    from conduit_hpc.placement.static import plan_static

    out = out or sys.stdout
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        # a negative N sliced the tables from the end and counted more shards than exist
        raise ConfigError(f"--top must be a number of rows >= 1, got {top!r}", key="--top")
    cluster = ClusterModel.from_toml(cluster_path)
    notes: list[str] = []
    if workload_path:
        workload, notes = Workload.from_toml(workload_path)
    else:
        total = sum(cluster.tier_capacity().values())
        workload = Workload(capacity_rows=max(int(total * 0.5 // (1000 + 16)), 1),
                            row_bytes=1000, min_shard_rows=256)
        notes.append("no --workload: rows of 1,000 B filling half of all tiers, batch 256, "
                     "100 updates/s, 1,000 rows/s per actor, shards of >= 256 rows")
    if scope:
        workload = replace(workload, scope=scope)  # type: ignore[arg-type]
    if min_shard_rows is not None:
        workload = replace(workload, min_shard_rows=min_shard_rows)  # validated there
    try:
        plan = plan_static(cluster, workload, roster=Roster.block(cluster),
                           method=method)  # type: ignore[arg-type]
    except PlacementInfeasible as err:
        if as_json:
            print(jsontext.dumps({"cluster": cluster.name, "infeasible": str(err),
                              "tier": err.tier, "shortfall_bytes": err.shortfall_bytes}),
                  file=out)
        else:
            print(render_infeasible(cluster, workload, err), file=out)
        raise
    if as_json:
        print(jsontext.dumps(plan_json(cluster, workload, plan)), file=out)
    else:
        print(render_plan(cluster, workload, plan, notes=notes, top=top), file=out)
    return 0
