"""The plan a run executed (``RUN_DIR/plan.json``, written by the data plane at start)
against what its learners measured: ``conduit-hpc report``'s "Plan" section.

Per learner: the plan's predicted experience-path time (its slowest read of a batch,
per superstep) and exposed time, against the measured means of ``sample_s + gather_s``
(finding and reading the batch's rows: what the path time predicts) and ``exposed_s``
from ``metrics/learner-<rank>.csv`` (each row weighted by the supersteps it stands for).
Plain Python; no MPI.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from conduit_hpc.errors import ConduitError
from conduit_hpc.plane.headline import read_metrics_text
from conduit_hpc.plane.sampled_rows import WEIGHT, weighted_mean, weights

__all__ = ["learner_reads", "load_plan", "plan_markdown", "plan_vs_measured"]

#: the measured columns that the predicted path time covers
MEASURED_PATH = ("sample_s", "gather_s")


def load_plan(run_dir: Path) -> tuple[dict[str, Any], str]:
    """``plan.json`` of a run (``RUN_DIR`` or ``RUN_DIR/..`` of a metrics directory), and
    a problem ("" when it loaded or there is none)."""
    for p in (run_dir / "plan.json", run_dir.parent / "plan.json"):
        if p.exists():
            try:  # bounded: a FIFO or device named plan.json is refused, never waited on
                doc = json.loads(read_metrics_text(p))
            except (OSError, ValueError, ConduitError) as err:
                return {}, f"plan.json: unreadable ({err})"
            if not isinstance(doc, dict):
                return {}, "plan.json: not a JSON object"
            return doc, ""
    return {}, ""


def _mean(table: dict[str, np.ndarray] | None, *cols: str) -> float:
    if table is None or any(c not in table or table[c].dtype == object for c in cols):
        return math.nan
    v = np.asarray(sum(np.nan_to_num(table[c].astype(np.float64)) for c in cols))
    # a row past run.metrics_full_rows stands for its weight's supersteps
    return weighted_mean(v, weights(table.get(WEIGHT), v.size)) if v.size else math.nan


def learner_reads(plan: dict[str, Any]) -> dict[str, list[int]]:
    """``str(learner rank) -> shards it reads`` from ``plan.json``'s sparse groups
    (``[{"learners": [...], "shards": [...]}]``; a plain mapping is read too)."""
    table = (plan.get("placement") or {}).get("learner_shards") or {}
    if isinstance(table, dict):
        return {str(k): list(v) for k, v in table.items()}
    out: dict[str, list[int]] = {}
    for group in table:
        if isinstance(group, dict):
            for r in group.get("learners") or ():
                out[str(r)] = list(group.get("shards") or ())
    return out


def plan_vs_measured(plan: dict[str, Any], learners: dict[int, dict[str, np.ndarray]]
                     ) -> list[dict[str, Any]]:
    """One row per learner (those the plan predicts, and those that wrote metrics):
    ``rank``, ``node``, ``shards`` it reads, ``predicted_path_ms``,
    ``measured_path_ms``, ``predicted_exposed_ms``, ``measured_exposed_ms`` (NaN when
    unknown)."""
    pred = (plan.get("prediction") or {}).get("learners") or {}
    reads = learner_reads(plan)
    ranks = sorted({int(r) for r in pred} | set(learners) | {int(r) for r in reads})
    rows = []
    for r in ranks:
        p = pred.get(str(r)) or {}
        t = learners.get(r)

        def ms(x: Any) -> float:
            return 1e3 * float(x) if isinstance(x, int | float) else math.nan

        rows.append({"rank": r, "node": p.get("node", "-"),
                     "shards": len(reads.get(str(r), [])),
                     "predicted_path_ms": ms(p.get("path_s")),
                     "measured_path_ms": 1e3 * _mean(t, *MEASURED_PATH),
                     "predicted_exposed_ms": ms(p.get("exposed_s")),
                     "measured_exposed_ms": 1e3 * _mean(t, "exposed_s")})
    return rows


def _f(v: Any) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def _ranks(ranks: list[int]) -> str:
    if ranks and ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(str(r) for r in ranks)


def plan_markdown(label: str, plan: dict[str, Any],
                  learners: dict[int, dict[str, np.ndarray]]) -> list[str]:
    """The "Plan" section of one run: planner, tiers, and per learner predicted against
    measured (empty when the run has no ``plan.json``)."""
    if not plan:
        return []
    lines = [f"### Plan of {label}", "",
             f"planner: {plan.get('planner', '?')}"
             + (f"; cluster: {plan['cluster']}" if plan.get("cluster") else ""), ""]
    nodes = [n for n in plan.get("nodes") or () if isinstance(n, dict)]
    if nodes:
        lines += [f"nodes: {len(nodes)} - " + "; ".join(
            f"node {n.get('node', '?')} {n.get('host', '?')}: world ranks "
            f"{_ranks(n.get('ranks') or [])}" for n in nodes), ""]
    tiers = plan.get("tiers") or {}
    if tiers:
        lines += ["| tier | shards | rows | bytes used | bytes available |",
                  "|---|---|---|---|---|"]
        lines += [f"| {t} | {v.get('shards', 0)} | {v.get('rows', 0)} | "
                  f"{v.get('bytes_used', '-')} | {v.get('bytes_available', '-')} |"
                  for t, v in sorted(tiers.items())]
        lines.append("")
    lines += ["| learner | node | shards read | path ms, predicted | path ms, measured "
              "(sample + gather) | exposed ms, predicted | exposed ms, measured |",
              "|---|---|---|---|---|---|---|"]
    for row in plan_vs_measured(plan, learners):
        lines.append("| " + " | ".join(_f(row[k]) for k in (
            "rank", "node", "shards", "predicted_path_ms", "measured_path_ms",
            "predicted_exposed_ms", "measured_exposed_ms")) + " |")
    if not plan.get("prediction"):
        lines += ["", "(no prediction: the plan was not made against a cluster model)"]
    return [*lines, ""]
