"""The job summary: every rank's counters, gathered (as JSON, no pickle) and merged."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from conduit_hpc.plane.extensions import Feature
from conduit_hpc.plane.shard import OwnedShard

__all__ = ["merge_summaries", "rank_summary", "shard_counters"]


def shard_counters(shards: Sequence[OwnedShard]) -> dict[str, dict[str, float]]:
    """Per owned shard (after a commit pass): committed, held, priority updates applied
    and dropped, rows overwritten before any learner drew them, block-policy releases,
    the measured insert rate and the guard band (rows hidden ahead of writers now and
    at most, their row-seconds hidden, rows given back to sampling when writers went
    idle) and, with frame stacks, rows hidden because their oldest frame's slot was
    due. Local."""
    out: dict[str, dict[str, float]] = {}
    for s in shards:
        s.poll()
        out[str(s.shard_id)] = {"committed": s.committed, "held": s.index.count,
                                "dropped_updates": s.index.dropped_updates,
                                "applied_updates": s.index.applied_updates,
                                "overwritten_unsampled": s.overwritten_unsampled,
                                "block_releases": s.block_releases,
                                "insert_rate_rows_s": s.rate_rows_s,
                                "guard_rows": s.guard_rows,
                                "guard_rows_max": s.guard_rows_max,
                                "guard_row_s": s.guard_row_s,
                                "unhidden_rows": s.unhidden_rows,
                                "guard_revocations": s.revocations,
                                "frame_hidden_rows": s.frame_hidden_rows}
    return out


def rank_summary(rank: int, role: str, actor: Any, server: Any,
                 learner: dict[str, float] | None, features: Sequence[Feature]
                 ) -> dict[str, Any]:
    """This rank's part of ``ExperienceDataPlane.summary``: its ingest counters (an
    ``actor`` endpoint), its shards' (a buffer ``server``), its learner's summary, and
    every feature's. Local."""
    mine: dict[str, Any] = {"rank": rank, "role": role}
    if actor is not None:
        mine["ingest"] = actor.stats.as_dict()
    if server is not None:
        mine["shards"] = shard_counters(server.shards)
    if learner is not None:
        mine["learner"] = learner
    mine["features"] = {f.name: f.summary() for f in features}
    return mine


def merge_summaries(everyone: Sequence[Mapping[str, Any]], features: Sequence[Feature],
                    known: Mapping[str, Any]) -> dict[str, Any]:
    """The job's summary from every rank's part (see ``ExperienceDataPlane.summary``):
    ``actors``, ``shards``, ``learners``, ``rows_ingested``, ``bytes_ingested``, and one
    entry per known feature (``{}`` where it is off). Local; the same on every rank."""
    actors = {d["rank"]: d["ingest"] for d in everyone if "ingest" in d}
    shards: dict[int, Any] = {}
    for d in everyone:
        shards.update({int(k): v for k, v in d.get("shards", {}).items()})
    out: dict[str, Any] = {
        "actors": actors, "shards": dict(sorted(shards.items())),
        "learners": {d["rank"]: d["learner"] for d in everyone if "learner" in d},
        "rows_ingested": sum(a["rows"] for a in actors.values()),
        "bytes_ingested": sum(a["bytes"] for a in actors.values())}
    for name in known:
        out[name] = {}
    for f in features:
        out[f.name] = f.merge([d["features"].get(f.name) for d in everyone])
    return out
