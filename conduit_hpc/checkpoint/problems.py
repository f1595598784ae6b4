"""What is wrong with a manifest's JSON records, checked when a checkpoint opens, before
anything indexes them or sizes an array by them. No h5py. Local; pure.
"""

from __future__ import annotations

from typing import Any

__all__ = ["manifest_problem"]

#: bytes a shard's row takes in its file whatever the codecs: seq, priority and
#: init_priority (int64, float64, float64) are never compressed
_ROW_INDEX_BYTES = 24


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def manifest_problem(shards: Any, placement: Any, files: Any, layout: Any) -> str:
    """What is wrong with a manifest's JSON records ("" if nothing): readers index the
    shard records and the placement's shards by shard id, and each shard's file and
    dataset checksums by name; a shard's counts go into int64 cursors (< 2**62) and
    size what a resume allocates before it reads (rows no more than its file holds)."""
    if not isinstance(files, dict) or not all(
            isinstance(r, dict) and isinstance(r.get("datasets"), dict) for r in files.values()):
        return f"files must be a table of file records with datasets, got {files!r:.80}"
    if not isinstance(layout, dict):
        return f"layout must be a table, got {layout!r:.80}"
    if not isinstance(shards, list) or not all(isinstance(s, dict) for s in shards):
        return f"shards must be a list of shard records, got {shards!r:.80}"
    for name, r in files.items():
        if not (_is_int(r.get("bytes")) and 0 <= r["bytes"] < 1 << 62):
            return f"file record {name!r} gives bytes {r.get('bytes')!r}, expected bytes >= 0"
    held: dict[str, int] = {}
    for i, s in enumerate(shards):
        v = {k: s.get(k) for k in ("shard_id", "capacity", "rows", "commit", "reserve",
                                   "applied_updates", "dropped_updates")}
        # < 2**62: each goes into an int64 (a ring's cursors and counters, np.arange)
        if not (all(_is_int(x) and 0 <= x < 1 << 62 for x in v.values())
                and v["shard_id"] == i
                and v["capacity"] >= 1 and v["rows"] <= min(v["capacity"], v["commit"])
                and isinstance(s.get("max_priority"), int | float)
                and isinstance(s.get("file"), str)):
            return (f"shard record {i} has {', '.join(f'{k} {x!r}' for k, x in v.items())}, "
                    f"file {s.get('file')!r}; expected shard_id {i}, integers >= 0 and < "
                    f"2**62, capacity >= 1, rows <= capacity and commit, a file name")
        held[s["file"]] = held.get(s["file"], 0) + v["rows"]
    for name, rows in held.items():  # seq, priority, init_priority: 24 plain bytes a row
        have = files[name]["bytes"] if name in files else 0
        if rows * _ROW_INDEX_BYTES > have:
            return (f"the shard records put {rows} rows in {name!r}, which has {have} bytes: "
                    f"expected at most {have // _ROW_INDEX_BYTES} ({_ROW_INDEX_BYTES} bytes "
                    f"a row for seq, priority and init_priority alone)")
    places = placement.get("shards") if isinstance(placement, dict) else None
    if not isinstance(places, list):
        return f"placement must be a table with a list of shards, got {placement!r:.80}"
    if len(places) != len(shards) or not all(
            isinstance(s, dict) and _is_int(s.get("owner_rank")) for s in places):
        return (f"placement lists {len(places)} shards, the manifest {len(shards)}; "
                f"expected one table with an integer owner_rank per shard")
    return ""
