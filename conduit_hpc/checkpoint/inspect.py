"""``conduit-hpc inspect``: describe a checkpoint (no h5py import of its own; reads go
through :mod:`conduit_hpc.checkpoint.read`). See :mod:`conduit_hpc.checkpoint`. Local;
blocks for the reads."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from conduit_hpc.checkpoint.files import (
    DONE,
    LEARNER_FILE,
    MANIFEST,
    damage_of,
    is_complete,
    list_checkpoints,
    spec_to_json,
)
from conduit_hpc.checkpoint.read import open_checkpoint
from conduit_hpc.errors import CheckpointError
from conduit_hpc.storage.frames import LAG_COLUMN, LAG_NONE


def inspect_checkpoint(path: str | Path, *, verify: bool = False) -> dict[str, Any]:
    """Describe a checkpoint (or the newest one under a root) as a plain dict.

    Local; blocks (``verify`` reads every byte). Never raises for a damaged checkpoint:
    the problem is in ``error`` and ``ok`` is False.

    Returns:
        dict: ``path``, ``ok``, ``error``, ``verified``, and when readable ``seq``,
        ``created_unix``, ``schema_version``, ``spec``, ``shards`` (per shard: rows,
        capacity, commit, owner, priority min/mean/max/sum), ``rows``, ``config_toml``,
        ``counters``, ``rng_ranks``, ``extra_arrays``, ``attributes`` (dataset path in
        the manifest -> its attributes: description, units, alpha, ...), ``columns``
        (stored column -> codec, stored and raw bytes over every shard); for a frame-once
        checkpoint, ``deliverable`` (in all and per shard): the slots that are transitions
        a restore can deliver (not frames only, nor rows whose frames the cut lacks); for
        a root, ``checkpoints`` lists every checkpoint, whether it is complete and why it is
        marked damaged (``damaged``: None when it is not), and the newest complete one
        not marked damaged is described; when it is refused, ``fallback`` names the
        checkpoint a resume would take instead (the newest older one that opens, and
        verifies with ``verify``; None: none is left) and ``fallback_verified`` says
        whether it was verified.
    """
    p = Path(path)
    out: dict[str, Any] = {"path": str(p), "ok": False, "error": None, "verified": False}
    if p.is_dir() and not (p / MANIFEST).exists() and not (p / DONE).exists() and \
            list_checkpoints(p):
        out["checkpoints"] = [{"path": str(c), "complete": is_complete(c),
                               "damaged": damage_of(c)} for c in list_checkpoints(p)]
        complete = [c for c in reversed(list_checkpoints(p)) if is_complete(c)]
        # the newest not marked damaged (the newest complete if every one is)
        complete.sort(key=lambda c: damage_of(c) is not None)
        if not complete:
            out["error"] = f"no complete checkpoint under {p}"
            return out
        p = complete[0]
        out["path"] = str(p)
    _describe(out, p, verify)
    if "checkpoints" in out and not out["ok"]:  # what a resume takes instead
        older = [c for c in complete[1:] if damage_of(c) is None]
        out["fallback"] = next((str(c) for c in older if _usable(c, verify)), None)
        out["fallback_verified"] = verify
    return out


def _usable(p: Path, verify: bool) -> bool:
    try:
        ckpt = open_checkpoint(p)
        if verify:
            ckpt.verify()
        return True
    except CheckpointError:
        return False


def _describe(out: dict[str, Any], p: Path, verify: bool) -> None:
    """Fill ``out`` with what checkpoint ``p`` holds, or why it is refused."""
    try:
        ckpt = open_checkpoint(p)
        out.update(seq=ckpt.seq, created_unix=ckpt.created_unix,
                   schema_version=ckpt.schema_version,
                   spec=spec_to_json(ckpt.spec), rows=ckpt.rows,
                   config_toml=ckpt.config_toml, counters=ckpt.counters,
                   rng_ranks=sorted(ckpt.rng), layout=ckpt.layout,
                   sampler={r: {k: v for k, v in s.items() if k != "rng"}
                            for r, s in sorted(ckpt.sampler.items())},
                   extra_arrays=sorted(d[len("/arrays/"):] for d in
                                       ckpt.files.get(LEARNER_FILE, {}).get("datasets", {})),
                   attributes=ckpt.dataset_attrs(), columns=ckpt.column_storage())
        owners = [s["owner_rank"] for s in ckpt.placement["shards"]]
        shards = []
        for s in ckpt.shards:
            prio = ckpt.priorities(s.shard_id)
            shards.append({"shard_id": s.shard_id, "owner_rank": owners[s.shard_id],
                           "rows": s.rows, "capacity": s.capacity, "commit": s.commit,
                           "file": s.file,
                           "priority_min": float(prio.min()) if len(prio) else None,
                           "priority_mean": float(prio.mean()) if len(prio) else None,
                           "priority_max": float(prio.max()) if len(prio) else None,
                           "priority_sum": float(prio.sum())})
            if LAG_COLUMN in ckpt.spec.names:  # frames once: slots that are transitions
                lag = ckpt.shard_dataset(s.shard_id, f"columns/{LAG_COLUMN}")
                shards[-1]["deliverable"] = int((lag < LAG_NONE).sum())
        out["shards"] = shards
        if LAG_COLUMN in ckpt.spec.names:
            out["deliverable"] = sum(s["deliverable"] for s in shards)
        if verify:
            ckpt.verify()
            out["verified"] = True
        out["ok"] = True
    except CheckpointError as err:
        out["error"] = str(err)


def format_report(report: Mapping[str, Any]) -> str:
    """:func:`inspect_checkpoint`'s dict as text for a terminal."""
    lines = []
    for c in report.get("checkpoints", ()):
        state = ("DAMAGED   " if c.get("damaged") else
                 "complete  " if c["complete"] else "INCOMPLETE")
        lines.append(f"  {state}  {c['path']}"
                     + (f"  ({c['damaged']})" if c.get("damaged") else ""))
    if lines:
        lines.insert(0, "checkpoints under the root (oldest first):")
        lines.append("")
    status = ("verified: every dataset matches its checksum" if report.get("verified")
              else "not verified (--verify reads every checksum)")
    if not report.get("ok"):
        status = "REFUSED"
    lines.append(f"checkpoint   {report['path']}  [{status}]")
    if "seq" not in report:
        if report.get("error"):
            lines.append(f"error        {report['error']}")
        return "\n".join(lines + _fallback_lines(report))
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report["created_unix"]))
    lines.append(f"number       {report['seq']}, written {when}, schema version "
                 f"{report['schema_version']}")
    spec = ", ".join(f"{f['name']}: {np.dtype(f['dtype']).name}{f['shape']}"
                     for f in report["spec"])
    lines.append(f"spec         {spec}")
    shards = report.get("shards", [])
    lines.append(f"rows         {report['rows']:,} in {len(shards)} shards" + (
        f" ({report['deliverable']:,} deliverable transitions; the other slots hold frames "
        f"only, or rows whose frames the cut lacks)" if "deliverable" in report else ""))
    if shards:
        lines.append("")
        lines.append(f"{'shard':>6} {'owner':>6} {'rows':>10} {'capacity':>10} {'commit':>12} "
                     f"{'prio min':>10} {'mean':>10} {'max':>10} {'sum':>12}  file")

        def num(v: float | None) -> str:
            return "-" if v is None else f"{v:.4g}"

        for s in shards:
            lines.append(f"{s['shard_id']:>6} {s['owner_rank']:>6} {s['rows']:>10,} "
                         f"{s['capacity']:>10,} {s['commit']:>12,} "
                         f"{num(s['priority_min']):>10} {num(s['priority_mean']):>10} "
                         f"{num(s['priority_max']):>10} {num(s['priority_sum']):>12}  "
                         f"{s['file']}")
    cols = report.get("columns") or {}
    if cols:
        lines.append("")
        lines.append("columns      " + ", ".join(
            f"{name}: {c['codec']}" + (f" {c['stored_bytes']:,} of {c['raw_bytes']:,} B"
                                       if c["codec"] != "none" else "")
            for name, c in cols.items()))
    lines.append("")
    position = [f"{k}={v}" for c in report["counters"].values() for k, v in c.items()
                if k in ("superstep", "step", "samples", "inserts")]
    lines.append("position     " + (", ".join(position) if position else
                                    "no scheduler position stored"))
    lines.append("counters")
    for r, c in sorted(report["counters"].items()):
        body = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in c.items() if k != "role")
        lines.append(f"  rank {r} ({c.get('role', '?')}): {body or '-'}")
    lines.append(f"rng states   world ranks {report['rng_ranks'] or 'none'}")
    samplers = report.get("sampler") or {}
    lines.append("samplers     " + (", ".join(
        f"rank {r}: {s.get('sampler', '?')} from superstep {s.get('superstep_offset', '?')}"
        for r, s in samplers.items()) if samplers else "none stored" + (
            " (schema 1 stores none)" if report["schema_version"] == 1 else "")))
    extra = report.get("extra_arrays") or []
    lines.append(f"extra state  {', '.join(extra) if extra else 'none'}")
    attrs = {k: a for k, a in (report.get("attributes") or {}).items() if a}
    lines.append("datasets     (paths in manifest.h5; /weights links to learner.h5)"
                 if attrs else "datasets     no attributes (written before they existed)")
    for path, a in attrs.items():
        if path.startswith("/shards/"):
            continue  # the per-shard table is above
        more = ", ".join(f"{k} = {v}" for k, v in a.items() if k not in
                         ("description", "units", "field"))
        units = f" [{a['units']}]" if a.get("units") else ""
        lines.append(f"  {path}: {a.get('description', '-')}{units}"
                     + (f" ({more})" if more else ""))
    lines.append("config")
    lines += ["  " + ln for ln in report["config_toml"].rstrip().splitlines()]
    if report.get("error"):
        lines.append(f"error        {report['error']}")
    return "\n".join(lines + _fallback_lines(report))


def _fallback_lines(report: Mapping[str, Any]) -> list[str]:
    """What a resume takes instead of a refused newest checkpoint (roots only)."""
    if "fallback" not in report:
        return []
    if report["fallback"] is None:
        return ["resume       no older checkpoint is usable: --resume refuses them all"]
    return [f"resume       --resume falls back to {report['fallback']}" + (
        "" if report.get("fallback_verified") else
        " (it opens; --verify reads every checksum, as a resume does)")]
