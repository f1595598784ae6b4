"""One blocking collective checkpoint (:func:`save_checkpoint`): the final checkpoint on
stop, or a checkpoint between phases of a job. Every rank contributes its RNG state and
counters; buffer ranks cut and write their shards; one rank may contribute named arrays
(the learner's model and optimizer). Composition layer.

Small collectives move JSON bytes in ``uint8`` buffers (``Bcast``/``Gatherv``): no
pickle on this path.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conduit_hpc import checkpoint as ck
from conduit_hpc.errors import CheckpointError
from conduit_hpc.features.checkpointing.agent import CheckpointAgent
from conduit_hpc.features.checkpointing.parts import (
    buffer_file,
    compression_for,
    cut_shards,
    described_for,
    finish_checkpoint,
    io_timeout,
    limiter_counters,
    shard_part,
)
from conduit_hpc.transport.objects import (
    allgather_json,
    bounded_bcast_json,
    bounded_gather_json,
)

if TYPE_CHECKING:
    from conduit_hpc.plane.host import FeatureHost

__all__ = ["SaveResult", "save_checkpoint"]


@dataclass(frozen=True)
class SaveResult:
    """A checkpoint written by :func:`save_checkpoint` (the same on every rank).

    Attributes:
        path (Path): the complete checkpoint directory.
        seq (int): its number.
        cut_s (float): longest cut (pause) over the buffer ranks.
        seconds (float): wall time of the whole save.
        bytes (int): bytes written (manifest excluded).
    """

    path: Path
    seq: int
    cut_s: float
    seconds: float
    bytes: int


def save_checkpoint(edp: FeatureHost, root: Path, *,
                    counters: Mapping[str, Any] | None = None, rng: str | None = None,
                    extra_state: Mapping[str, Any] | None = None,
                    extra_attrs: Mapping[str, Mapping[str, Any]] | None = None,
                    agent: CheckpointAgent | None = None, keep: int = 0) -> SaveResult:
    """Write a complete checkpoint now. **Collective** over the job's ranks; blocks until
    it is on disk (``DONE`` written). Buffer ranks must not be inside ``serve``.

    Args:
        edp (FeatureHost): this rank's data plane.
        root (Path): checkpoint root.
        counters (Mapping[str, number] | None): this rank's counters (scheduler
            position, rate-limiter counts, ...).
        rng (str | None): this rank's RNG state (:func:`~conduit_hpc.checkpoint.rng_to_json`).
        extra_state (Mapping[str, array] | None): named numeric arrays (model and
            optimizer state); give them on one rank only.
        extra_attrs (Mapping[str, Mapping] | None): HDF5 attributes of those arrays by
            name (``{"online/fc.weight": {"description": ...}}``).
        agent (CheckpointAgent | None): reuse its staging memory and numbering (call
            its :meth:`~CheckpointAgent.finish` first).
        keep (int): prune to this many complete checkpoints (0: keep all).

    Returns:
        SaveResult: the same on every rank.

    Raises:
        CheckpointError: on every rank, naming the first failure (nothing half-written
            is left under a checkpoint name).
    """
    t0 = time.perf_counter()
    world = edp.roles.world
    me = edp.world_rank
    leader = edp.roles.buffer_ranks[0]
    # every rank is here before the collectives below (a rank that left, or never came,
    # ends the others: RemoteFailure at once, CollectiveFailed after run.timeout_s)
    timeout_s = edp.config.run.timeout_s

    def check() -> None:
        edp.control.raise_if_failed(me)

    root = Path(root)
    # what the leader alone uses (root, keep) and what one rank may give (extra_state)
    # is agreed first: before, rank 0's root/0 went silently to the leader's root/1
    calls = allgather_json(world, [str(root), repr(keep), extra_state is not None],
                           timeout_s, "save_checkpoint()", check)
    check_calls(calls)
    plan: dict[str, Any] = {}
    if me == leader:
        try:
            root.mkdir(parents=True, exist_ok=True)
            seq = ck.next_seq(root, agent.first_seq if agent else 1)
            tmp = root / f"{ck.TMP_PREFIX}{ck.checkpoint_name(seq)}-{os.getpid()}"
            tmp.mkdir()
            plan = {"seq": seq, "tmp": str(tmp)}
        except OSError as err:
            plan = {"error": f"cannot create a checkpoint under {root}: {err}"}
    # each step below is bounded too: a rank that hangs or dies while it writes its part
    # (or the leader, the manifest) ends the others after max(run.timeout_s,
    # checkpoint.timeout_s) in the steps that cover the writing, run.timeout_s in the rest
    try:
        plan = bounded_bcast_json(world, plan, leader, timeout_s,
                                  "save_checkpoint(): the checkpoint's name", check)
    except BaseException:
        if plan.get("tmp"):
            shutil.rmtree(plan["tmp"], ignore_errors=True)
        raise
    if "error" in plan:
        raise CheckpointError(plan["error"])
    seq, tmp = int(plan["seq"]), Path(plan["tmp"])
    part: dict[str, Any] = {"seq": seq, "world_rank": me, "role": edp.role.value, "rng": rng,
                            "counters": dict(counters or {}), "files": [], "shards": [],
                            # a learner's sampler resumes after its last batch
                            "sampler": (edp.learner.sampler_state()
                                        if edp.learner is not None else None)}
    try:
        if agent is not None and agent.busy:
            raise CheckpointError(f"world rank {me} still has checkpoint work in flight; "
                                  f"call CheckpointAgent.finish() before save_checkpoint()")
        if edp.server is not None:
            snaps, cut_s = cut_shards(edp.server.shards, agent.staging if agent else None,
                                      writers_done=edp.server.finished)
            sp = shard_part(tmp / buffer_file(edp), snaps, cut_s, me, described_for(edp),
                            compression_for(edp))
            part["files"] += sp["files"]
            part["shards"] += sp["shards"]
            part["counters"].update(sp["counters"])
            part["counters"].update(limiter_counters(edp))
        if extra_state is not None:
            part["files"].append(ck.write_arrays_file(tmp / ck.LEARNER_FILE, extra_state,
                                                      extra_attrs))
    except CheckpointError as err:
        part["error"] = str(err)
    # the waits for the parts and for the manifest cover the slowest rank's writes
    io_s, io_note = io_timeout(edp)
    try:
        parts = bounded_gather_json(world, part, leader, io_s,
                                    f"save_checkpoint(): every rank's part of checkpoint "
                                    f"{seq}{io_note}", check)
    except BaseException:
        if me == leader:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    verdict: dict[str, Any] = {}
    if me == leader:
        assert parts is not None
        errors = [p["error"] for p in parts if p.get("error")]
        if not errors:
            try:
                final = finish_checkpoint(tmp, root, seq, edp, parts, keep)
                verdict = {"path": str(final),
                           "cut_s": max((float(p["counters"].get("checkpoint_cut_s", 0))
                                         for p in parts), default=0.0),
                           "bytes": sum(int(f["bytes"]) for p in parts for f in p["files"])}
            except CheckpointError as err:
                errors.append(str(err))
        if errors:
            shutil.rmtree(tmp, ignore_errors=True)
            verdict = {"error": errors[0]}
        if agent is not None:
            agent.first_seq = seq + 1
    verdict = bounded_bcast_json(world, verdict, leader, io_s,
                                 f"save_checkpoint(): checkpoint {seq} finished{io_note}", check)
    if "error" in verdict:
        raise CheckpointError(verdict["error"])
    if agent is not None:
        agent.first_seq = seq + 1
    return SaveResult(path=Path(verdict["path"]), seq=seq, cut_s=float(verdict["cut_s"]),
                      seconds=time.perf_counter() - t0, bytes=int(verdict["bytes"]))


def check_calls(calls: list[list[Any]]) -> None:
    """Every rank's ``[root, keep, gave extra_state]`` (world rank order): the same root
    and keep everywhere, extra state on one rank at most.

    Raises:
        CheckpointError: naming the ranks and their values (on every rank).
    """
    for k, name in ((0, "root"), (1, "keep")):
        if len({c[k] for c in calls}) > 1:
            by_rank = ", ".join(f"rank {r}: {c[k]!r}" for r, c in enumerate(calls))
            raise CheckpointError(f"save_checkpoint(): every rank must give the same "
                                  f"{name}, got {by_rank}")
    if len(extra := [r for r, c in enumerate(calls) if c[2]]) > 1:
        raise CheckpointError(f"save_checkpoint(): extra_state given on world ranks "
                              f"{extra}; give it on one rank only (the learner's model)")
