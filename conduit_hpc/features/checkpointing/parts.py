"""A buffer rank's part of a checkpoint and the leader's last step, shared by the periodic
:class:`~conduit_hpc.features.checkpointing.agent.CheckpointAgent` and the collective
:func:`~conduit_hpc.features.checkpointing.save.save_checkpoint`: the consistent cut of
this rank's shards, the shard file and its record, the layout and placement written
into the manifest, and the leader's manifest / rename / ``DONE`` / prune. No MPI call.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conduit_hpc import checkpoint as ck
from conduit_hpc.config import to_toml
from conduit_hpc.plane.buffer import OwnedShard
from conduit_hpc.storage.frames import stored_owner, stored_spec
from conduit_hpc.storage.snapshot import ShardSnapshot, SnapshotStaging, take_snapshot

if TYPE_CHECKING:
    from conduit_hpc.plane.host import FeatureHost

__all__ = ["STALL_ENV", "buffer_file", "compression_for", "cut_shards", "described_for",
           "finish_checkpoint", "finish_from_parts", "io_timeout", "layout_json",
           "placement_json", "shard_part", "write_buffer_part"]

#: fault injection for tests: seconds a buffer rank sleeps after writing its shard file
#: and before reporting it (widens the window in which a kill leaves a partial one; and
#: stands in for a large replay on a slow file system)
STALL_ENV = "CONDUIT_CHECKPOINT_STALL_S"


#: the job's rate-limiter counts (the control block's rows inserted and sampled), kept in
#: the counters of the rank that holds the block in each checkpoint, written back on resume
LIMITER_COUNTERS = ("limiter_inserts", "limiter_samples")


def limiter_counters(edp: FeatureHost) -> dict[str, int]:
    """On the rank that holds the control block, the job's rate-limiter counts now
    (:data:`LIMITER_COUNTERS`); ``{}`` elsewhere. Local (two atomic reads)."""
    from conduit_hpc.plane.control import C_INSERTS, C_SAMPLES

    if edp.world_rank != edp.control.owner:
        return {}
    return dict(zip(LIMITER_COUNTERS, (edp.control.read(C_INSERTS),
                                        edp.control.read(C_SAMPLES)), strict=True))


def restore_limiter(edp: FeatureHost, stored: Mapping[int, Mapping[str, Any]]) -> None:
    """On the rank that holds the control block, the rate-limiter counts of a
    checkpoint's ``stored`` counters (world rank -> counters) come back, so that a
    resumed job keeps its samples-per-insert pacing: restarted at 0 with a full replay, a
    limited learner waited for the actors to insert its whole error buffer again (and an
    integration's ``len()``, the rows inserted, said 0). Counts of another form (an older
    checkpoint, an edited one) are left out. Local; before any rank ingests or samples."""
    from conduit_hpc.plane.control import C_INSERTS, C_RESERVED, C_SAMPLES

    if edp.world_rank != edp.control.owner:
        return
    for counters in stored.values():
        vals = [counters.get(k) for k in LIMITER_COUNTERS]
        counts = [v for v in vals if isinstance(v, int) and not isinstance(v, bool)
                  and 0 <= v < 2**62]
        if len(counts) == len(vals):
            inserts, samples = counts
            for slot, v in ((C_INSERTS, inserts), (C_RESERVED, inserts), (C_SAMPLES, samples)):
                edp.control.write(slot, v)
            return


def io_timeout(edp: FeatureHost) -> tuple[float, str]:
    """How long a wait that covers a checkpoint's reads or writes lasts (the slowest
    rank's shard file, the manifest, a restore's read): ``max(run.timeout_s,
    checkpoint.timeout_s)``; and the words its error adds (which key to raise)."""
    run, ckpt = edp.config.run.timeout_s, edp.config.checkpoint.timeout_s
    t = max(run, ckpt)
    return t, (f" (a checkpoint's reads and writes are waited for up to max(run.timeout_s, "
               f"checkpoint.timeout_s) = {t:g} s; raise checkpoint.timeout_s for a replay "
               f"that takes longer to write or read)")


def layout_json(edp: FeatureHost) -> dict[str, Any]:
    r = edp.roles
    return {"world_size": r.world_size, "actor_ranks": list(r.actor_ranks),
            "buffer_ranks": list(r.buffer_ranks), "learner_ranks": list(r.learner_ranks),
            "node_of": list(r.node_of)}


def placement_json(edp: FeatureHost) -> dict[str, Any]:
    p = edp.placement
    return {"shards": [{"shard_id": s.shard_id, "owner_rank": s.owner_rank, "tier": s.tier,
                        "capacity_rows": s.capacity_rows} for s in p.shards],
            "actor_shards": {str(k): v for k, v in p.actor_shards.items()},
            "learner_shards": {str(k): list(v) for k, v in p.learner_shards.items()}}


def described_for(edp: FeatureHost) -> dict[str, dict[str, Any]]:
    """The attributes of this job's experience datasets (the spec's descriptions, alpha)."""
    return ck.dataset_attrs(stored_spec(edp.spec), edp.config.storage.priority_exponent)


def compression_for(edp: FeatureHost) -> dict[str, str]:
    """The codec of each stored column of this job's shards (``checkpoint.compression``
    by spec field; a stacked field's codec covers its frames and references). Local;
    the same on every rank."""
    by_field = edp.config.checkpoint.compression
    return {col: by_field[owner] for col, owner in stored_owner(edp.spec).items()
            if owner in by_field}


def buffer_file(edp: FeatureHost) -> str:
    return f"buffer-{edp.roles.role_rank:04d}.h5"


def cut_shards(shards: Sequence[OwnedShard], staging: Mapping[int, SnapshotStaging] | None,
               *, writers_done: bool = False) -> tuple[list[ShardSnapshot], float]:
    """The consistent cut of this rank's shards: a commit pass and a copy each.
    ``writers_done``: no writer will write again (the buffer's serve loop finished), so
    the guard band's rows are given back and go into the cut (a final checkpoint cut
    within ``idle_s`` of the last write left them out: rows held, yet not restored)."""
    t0 = time.perf_counter()
    snaps = []
    for s in shards:
        s.poll(writers_done=writers_done)
        with s.locked():  # no node-local learner's update half in the copy
            snaps.append(take_snapshot(s.shard_id, s.ring, s.index,
                                       None if staging is None else staging[s.shard_id]))
    return snaps, time.perf_counter() - t0


def shard_part(path: Path, snaps: Sequence[ShardSnapshot], cut_s: float,
               world_rank: int, described: Mapping[str, Mapping[str, Any]] | None = None,
               compression: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Write this rank's shard file; its part record. Blocks for the disk (and
    :data:`STALL_ENV` seconds after writing, if set)."""
    t0 = time.perf_counter()
    rec = ck.write_shard_file(path, snaps, attrs={"world_rank": world_rank},
                              described=described, compression=compression)
    write_s = time.perf_counter() - t0
    stall = float(os.environ.get(STALL_ENV, "0") or 0)
    if stall > 0:
        time.sleep(stall)
    for s in rec["shards"]:
        s["cut_s"] = cut_s
        s["write_s"] = write_s
    return {"files": [rec["file"]], "shards": rec["shards"],
            "counters": {"checkpoint_cut_s": cut_s, "checkpoint_write_s": write_s,
                         "checkpoint_bytes": rec["file"]["bytes"]}}


def finish_checkpoint(tmp: Path, root: Path, seq: int, edp: FeatureHost,
                      parts: Sequence[Mapping[str, Any]], keep: int) -> Path:
    """Leader: manifest, rename into place, DONE, prune. Blocks for the disk."""
    rec = ck.write_manifest(tmp, seq=seq, spec=stored_spec(edp.spec),
                            config_toml=to_toml(edp.config.to_dict()),
                            layout=layout_json(edp), placement=placement_json(edp),
                            parts=parts, alpha=edp.config.storage.priority_exponent)
    final = root / ck.checkpoint_name(seq)
    ck.finalize(tmp, final, rec)
    if keep > 0:
        ck.prune(root, keep)
    return final


def write_buffer_part(path: Path, snaps: Sequence[ShardSnapshot], cut_s: float,
                      world_rank: int, counters: Mapping[str, Any],
                      described: Mapping[str, Mapping[str, Any]] | None = None,
                      compression: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A buffer rank's writer thread: its shard file and part record (``counters``
    added), or ``{"error": ...}`` - reported to the leader, which drops the checkpoint.
    Blocks for the disk (and :data:`STALL_ENV` seconds after writing, if set)."""
    try:
        part = shard_part(path, snaps, cut_s, world_rank, described, compression)
    except Exception as err:  # reported to the leader, which drops the checkpoint
        part = {"error": f"{type(err).__name__}: {err}"}
    part["counters"] = {**counters, **part.get("counters", {})}
    return part


def finish_from_parts(tmp: Path, root: Path, seq: int, edp: FeatureHost,
                      parts: Sequence[Mapping[str, Any]], keep: int, *,
                      started: float) -> dict[str, Any]:
    """The leader's manifest thread: :func:`finish_checkpoint` unless a part failed.
    Returns the checkpoint's record (``seq``, ``path``, ``cut_s_max``, ``seconds`` since
    ``started`` on ``time.perf_counter()``, ``bytes``) or ``{"error": ...}``. Blocks for
    the disk."""
    errors = [p["error"] for p in parts if p.get("error")]
    if errors:
        return {"error": errors[0]}
    try:
        path = finish_checkpoint(tmp, root, seq, edp, parts, keep)
    except Exception as err:
        return {"error": f"{type(err).__name__}: {err}"}
    cuts = [float(p["counters"].get("checkpoint_cut_s", 0.0)) for p in parts]
    return {"seq": seq, "path": str(path), "cut_s_max": max(cuts),
            "seconds": time.perf_counter() - started,
            "bytes": sum(int(f["bytes"]) for p in parts for f in p["files"])}
