"""Restoring a data plane from a checkpoint, and where checkpoints are looked for.

:func:`restore_data_plane` (``FeatureHost.restore``) is collective at start-up:
the newest complete checkpoint (``"latest"``, falling back past refused ones with a
warning) or a given one; shard by shard when the shard capacities are unchanged (bit for
bit: rows, slots, stamps, cursors, priority trees), else resharded (every row exactly
once, with its priority). Every decision is taken on the first buffer rank and broadcast
as JSON, and every rank's success is agreed before anything is written into a ring.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from conduit_hpc import checkpoint as ck
from conduit_hpc.checkpoint.files import checkpoint_root
from conduit_hpc.config import Config, tomllib
from conduit_hpc.errors import CheckpointError, CheckpointMismatch
from conduit_hpc.features.checkpointing.fit import (
    forward_problem,
    stacks_problem,
    window_problem,
)
from conduit_hpc.features.checkpointing.parts import io_timeout, restore_limiter
from conduit_hpc.storage.frames import LAG_COLUMN, LAG_NONE, FrameCodec, stored_spec
from conduit_hpc.storage.frames_reshard import reshard_frames
from conduit_hpc.storage.snapshot import (
    ShardSnapshot,
    build_resharded,
    plan_reshard,
    restore_snapshot,
)
from conduit_hpc.transport.objects import (
    bounded_barrier,
    bounded_bcast_json,
    bounded_gather_json,
)

if TYPE_CHECKING:
    from conduit_hpc.plane.host import FeatureHost

__all__ = ["RestoreResult", "checkpoint_root", "forward_problem", "restore_data_plane",
           "restore_lines", "resume_roots", "resumed_counter", "stacks_problem",
           "window_problem"]

log = logging.getLogger("conduit_hpc.checkpoint")


def resume_roots(config: Config, run_dir: Path | None) -> list[Path]:
    """Where ``resume="latest"`` looks: this run's checkpoint root, then those of earlier
    runs of the same job beside it (``<runs>/<run.name>-*/<directory>``)."""
    own = checkpoint_root(config, run_dir)
    d = Path(config.checkpoint.directory)
    if d.is_absolute() or run_dir is None:
        return [own]
    here = Path(run_dir).resolve()
    siblings = [p / d for p in sorted(Path(run_dir).parent.glob(f"{config.run.name}-*"))
                if p.is_dir() and p.resolve() != here]
    return [own, *siblings]



@dataclass(frozen=True)
class RestoreResult:
    """What :func:`restore_data_plane` restored.

    Attributes:
        path (Path): the checkpoint used.
        seq (int): its number.
        rows (int): rows restored over all shards.
        resharded (bool): rows were dealt over a different set of shards.
        dropped (int): oldest rows left out because the new capacity is smaller.
        counters (dict[int, dict]): every rank's stored counters, by world rank.
        rng_state (str | None): this rank's stored RNG state (JSON) when the world size
            and ``run.seed`` are unchanged, else None. Rank-dependent.
        extra_state (dict[str, np.ndarray]): the stored named arrays (model, optimizer),
            on learner ranks (on the first buffer rank when there is no learner); empty
            elsewhere. Rank-dependent.
        config_toml (str): the config the checkpoint was written with.
        skipped (list[str]): newer checkpoints refused on the way (file and reason).
        transitions (int | None): with frames stored once, the slots of the checkpoint
            that are transitions (``rows`` and ``dropped`` count slots, some of which hold
            frames only); None otherwise.
    """

    path: Path
    seq: int
    rows: int
    resharded: bool
    dropped: int
    counters: dict[int, dict[str, Any]]
    rng_state: str | None
    extra_state: dict[str, np.ndarray]
    config_toml: str
    skipped: list[str]
    transitions: int | None = None



def restore_lines(restored: RestoreResult | None, resume: str) -> list[str]:
    """What a job says of its ``--resume`` (rank 0 prints them): each newer checkpoint
    skipped on the way and the one restored, or that none was found. Local."""
    if restored is None:
        return ["resume: no checkpoint found; starting fresh"] if resume else []
    unit = "rows" if restored.transitions is None else "slots"
    return ([f"resume: skipped a checkpoint: {reason}" for reason in restored.skipped]
            + [f"resumed from {restored.path} (checkpoint {restored.seq}): "
               f"{restored.rows:,} {unit}{', resharded' if restored.resharded else ''}"
               + (f"; {restored.dropped:,} oldest {unit} left out: the replay's capacity "
                  f"now holds fewer" if restored.dropped else "")
               + ("" if restored.transitions is None else
                  f" (frames stored once: {restored.transitions:,} of the checkpoint's "
                  f"slots are transitions, the others hold frames only)")])


def resumed_counter(restored: RestoreResult | None, rank: int, key: str) -> int:
    """Counter ``key`` that world rank ``rank`` stored in the checkpoint restored (0
    for a fresh run, or one that did not store it). Local."""
    if restored is None:
        return 0
    return int(restored.counters.get(rank, {}).get(key, 0))


def _transitions(ckpt: ck.Checkpoint) -> int | None:
    """With frames stored once, the checkpoint's slots that are transitions, else None."""
    if LAG_COLUMN not in ckpt.spec.names:
        return None
    return sum(int((ckpt.shard_dataset(s.shard_id, f"columns/{LAG_COLUMN}") < LAG_NONE).sum())
               for s in ckpt.shards)


def _load_shards(edp: FeatureHost, ckpt: ck.Checkpoint
                 ) -> tuple[dict[int, ShardSnapshot], bool, int]:
    """This rank's new shards, read (and verified) from the checkpoint."""
    mine = [s for s in edp.placement.shards_of(edp.world_rank)] if edp.server else []
    new_caps = [s.capacity_rows for s in edp.placement.shards]
    if ckpt.capacities == new_caps:
        return {s.shard_id: ckpt.read_shard(s.shard_id) for s in mine}, False, 0
    if edp.spec.stacks:  # references are seqs of one shard: rows are written anew
        snaps, dropped = reshard_frames(
            FrameCodec(edp.spec), len(ckpt.shards), ckpt.read_shard, new_caps,
            [s.shard_id for s in mine],
            max((s.max_priority for s in ckpt.shards), default=1.0))
        return snaps, True, dropped
    plan = plan_reshard([s.rows for s in ckpt.shards], new_caps)
    max_p = max((s.max_priority for s in ckpt.shards), default=1.0)
    ids = [s.shard_id for s in mine]
    out_cols = {k: edp.spec.empty(plan.rows_of(k)) for k in ids}
    out_p = {k: np.empty(plan.rows_of(k)) for k in ids}
    out_i = {k: np.empty(plan.rows_of(k)) for k in ids}
    for old in range(len(ckpt.shards)):
        if not len(plan.needed_from(ids, old)):
            continue
        snap = ckpt.read_shard(old)  # whole shard: every checksum is checked
        for k in ids:
            src, idx = plan.sources[k]
            m = src == old
            if m.any():
                for name, col in out_cols[k].items():
                    col[m] = snap.columns[name][idx[m]]
                out_p[k][m] = snap.priority[idx[m]]
                out_i[k][m] = snap.init_priority[idx[m]]
        del snap
    snaps = {k: build_resharded(k, new_caps[k], out_cols[k], out_p[k], out_i[k], max_p)
             for k in ids}
    return snaps, True, plan.dropped



def restore_data_plane(edp: FeatureHost, source: str | Path = "latest", *,
                       roots: Sequence[Path] = ()) -> RestoreResult | None:
    """Restore replay state (and hand back stored state) from a checkpoint.

    **Collective** over the job's ranks; call right after constructing the data plane,
    before any ingest. Blocks for the reads. Every decision is made on the first buffer
    rank and broadcast, and every rank's success is agreed, so all ranks return or raise
    together.

    Same shard capacities as the checkpoint: every shard comes back bit for bit (rows,
    slots, stamps, cursors, priority trees, counters). Otherwise the rows are resharded
    (:func:`~conduit_hpc.storage.snapshot.plan_reshard`), each exactly once with its
    priority.

    Args:
        edp (FeatureHost): this rank's data plane.
        source (str | Path): ``"latest"``: the newest complete checkpoint under
            ``roots``, falling back past refused ones (each logged as a warning and
            listed in :attr:`RestoreResult.skipped`; a complete one refused as damaged
            is marked so, see :func:`_skip`); or a checkpoint directory (refused
            without fallback), or a root holding several (newest first, with fallback).
        roots (Sequence[Path]): where ``"latest"`` looks (see :func:`resume_roots`).

    Returns:
        RestoreResult | None: None when ``"latest"`` finds no checkpoint at all.

    Raises:
        CheckpointError: on every rank: rows were written into a shard before the call
            (naming the shards; nothing is restored, the rows stay), a given checkpoint
            is refused (file and reason),
            or every candidate was; or reading failed on some rank for a reason that is
            not the checkpoint's (naming the rank and the error; no fallback).
    """
    world = edp.roles.world
    me = edp.world_rank
    leader = edp.roles.buffer_ranks[0]
    strict = False
    candidates: list[Path] = []
    timeout_s = edp.config.run.timeout_s
    # the waits that cover reading (the leader's choice, every rank's read) are longer
    io_s, io_note = io_timeout(edp)

    def check() -> None:
        edp.control.raise_if_failed(me)

    if me == leader:
        if str(source) in ("", "latest"):
            candidates = ck.newest_first(roots)
        else:
            p = Path(source)
            if p.name == ck.MANIFEST:
                p = p.parent
            if p.is_dir() and not (p / ck.DONE).exists() and not (p / ck.MANIFEST).exists() \
                    and ck.list_checkpoints(p):
                candidates = ck.newest_first([p])
            else:
                candidates, strict = [p], True
    skipped: list[str] = []
    # a learner's sampler state is taken inside the agreed read (a stored state the
    # sampler refuses fails there, on every rank together); each try starts from this
    initial = edp.learner.sampler_state(0) if edp.learner is not None else None
    # before any ingest, as documented: a restore rewrites every slot and cursor (rows
    # written before it were lost), and a frame writer's remembered frames pointed at
    # slots the restore refilled (stacks of later rows resolved to other frames); slots
    # a previous restore filled are no ingest
    written = {s.shard_id: s.ring.reserve_cursor() - s.restored_commit
               for s in edp.owned_shards()}
    everyone = bounded_gather_json(world, {k: v for k, v in written.items() if v}, leader,
                                   timeout_s, "the restore: shards written before it", check)
    while True:
        decision: dict[str, Any] = {}
        used = {k: v for part in everyone or [] for k, v in part.items()}
        if me == leader and used:
            decision = {"error": f"restore_data_plane must run before any ingest (right "
                                 f"after the data plane is made): shard(s) "
                                 f"{', '.join(f'{k} ({v} slots)' for k, v in used.items())} "
                                 f"were written already; the restore would overwrite them "
                                 f"and the writers' frame references"}
        elif me == leader:
            decision = {"path": None, "skipped": skipped, "strict": strict}
            while candidates:
                c = candidates.pop(0)
                try:
                    opened = ck.open_checkpoint(c, spec=stored_spec(edp.spec))
                    caps = [s.capacity_rows for s in edp.placement.shards]
                    why = (stacks_problem(opened, edp.spec)
                           or forward_problem(opened, edp.config.longhaul.mode, caps)
                           or window_problem(opened, edp.config, caps, bool(edp.spec.stacks)))
                    if why:
                        raise CheckpointMismatch(why)
                    decision["path"] = str(c)
                    decision["sha256"] = opened.manifest_sha256
                    break
                except CheckpointError as err:
                    if strict:
                        decision["error"] = str(err)
                        break
                    damaged = not isinstance(err, CheckpointMismatch) and ck.is_complete(c)
                    _skip(skipped, str(err), candidates, c if damaged else None)
        # bounded, as every step below: a rank that hangs (or dies without an abort)
        # while it reads ends the others after max(run.timeout_s, checkpoint.timeout_s)
        decision = bounded_bcast_json(world, decision, leader, io_s,
                                      f"the restore: the checkpoint to read{io_note}", check)
        if "error" in decision:
            raise CheckpointError(decision["error"])
        skipped = list(decision["skipped"])
        strict = bool(decision["strict"])  # decided on the leader; every rank follows
        if decision["path"] is None:
            if skipped:
                raise CheckpointError("no usable checkpoint: every candidate was refused: "
                                      + "; ".join(skipped))
            if me == leader:
                log.info("resume: no checkpoint found under %s; starting fresh",
                         ", ".join(map(str, roots)) or "(no directory)")
            return None
        error = fatal = None
        failure: Exception | None = None
        try:
            ckpt = ck.open_checkpoint(decision["path"], spec=stored_spec(edp.spec))
            if ckpt.manifest_sha256 != decision["sha256"]:
                raise _Changed(f"the checkpoint changed while the ranks read it: its "
                               f"manifest here has SHA-256 {ckpt.manifest_sha256[:16]}..., "
                               f"the one world rank {leader} chose "
                               f"{decision['sha256'][:16]}... (is another job writing, "
                               f"pruning or replacing checkpoints in this directory, or do "
                               f"the ranks' file systems show it differently?)")
            snaps, resharded, dropped = _load_shards(edp, ckpt)
            learners = edp.roles.learner_ranks or (leader,)
            extra = ckpt.extra_state() if me in learners else {}
            if edp.learner is not None and initial is not None:
                edp.learner.load_sampler_state(initial)  # (a candidate refused before)
                _resume_learner(edp, ckpt, _same_draws(edp, ckpt))
        except _Changed as err:  # no rank restores from what another did not read
            failure, fatal = err, f"world rank {me}: {err}"
        except CheckpointError as err:
            error = str(err)
        except Exception as err:  # not the checkpoint's fault: every rank stops with it
            failure, fatal = err, f"world rank {me}: {type(err).__name__}: {err}"
        errors = bounded_gather_json(world, [error, fatal], leader, io_s,
                                     f"the restore: every rank's read of {decision['path']}"
                                     f"{io_note}", check)
        verdict: dict[str, Any] = {}
        if me == leader:
            assert errors is not None
            bad = [e for e, _ in errors if e]
            worst = [f for _, f in errors if f]
            verdict = {"error": bad[0] if bad else None, "fatal": worst[0] if worst else None}
        verdict = bounded_bcast_json(world, verdict, leader, timeout_s,
                                     "the restore: the verdict on the read", check)
        if verdict["fatal"] is not None:
            raise CheckpointError(f"restoring {decision['path']} failed on "
                                  f"{verdict['fatal']}") from failure
        if verdict["error"] is None:
            break
        if strict:
            raise CheckpointError(verdict["error"])
        if me == leader:  # every error reading a checkpoint that opened is damage
            _skip(skipped, verdict["error"], candidates, Path(decision["path"]))
    for s in edp.owned_shards():
        with s.writing():  # the tree lives in shared memory: change it under the seqlock
            restore_snapshot(s.ring, s.index, snaps[s.shard_id])
        s.hidden_upto = s.restored_commit = snaps[s.shard_id].commit
        s.track_held_frames()
    restore_limiter(edp, ckpt.counters)
    # no rank ingests before every shard is back; a rank whose restore failed leaves
    # (marked): the others raise RemoteFailure, or CollectiveFailed after the timeout
    bounded_barrier(world, io_s, f"the restore of every shard{io_note}",
                    lambda: edp.control.raise_if_failed(me))
    same_draws = _same_draws(edp, ckpt)
    return RestoreResult(path=ckpt.path, seq=ckpt.seq, rows=ckpt.rows - dropped,
                         resharded=resharded, dropped=dropped, counters=ckpt.counters,
                         rng_state=ckpt.rng.get(me) if same_draws else None,
                         extra_state=extra, config_toml=ckpt.config_toml, skipped=skipped,
                         transitions=_transitions(ckpt))


def _same_draws(edp: FeatureHost, ckpt: ck.Checkpoint) -> bool:
    """Whether stored random states come back: in a world of the same size with the same
    ``run.seed`` (a run forked from a checkpoint with another seed draws anew: before,
    every fork drew the same). Local."""
    return (int(ckpt.layout.get("world_size", -1)) == edp.roles.world_size
            and _stored_seed(ckpt) in (None, edp.config.run.seed))


def _stored_seed(ckpt: ck.Checkpoint) -> int | None:
    """The ``run.seed`` the checkpoint was written with (None: its config does not say,
    e.g. written by hand). Local."""
    try:
        seed = tomllib.loads(ckpt.config_toml).get("run", {}).get("seed")
    except (tomllib.TOMLDecodeError, AttributeError):
        return None
    return seed if type(seed) is int else None


def _stored_learner(ckpt: ck.Checkpoint, learners: Sequence[int], me: int
                    ) -> tuple[int | None, bool]:
    """The world rank whose stored learner state learner ``me`` (of this job's
    ``learners``) takes, and whether it is that learner's own (else a learner this job
    adds: it takes the lead's position only). By learner order, not world rank: the
    checkpoint's learners may sit at other world ranks (a ``per_node`` layout with more
    actors per node moves every node's learner; those ranks held an actor's or a
    buffer's state, or none: the learner restarted its schedule, alone). None where the
    checkpoint has no learner. Local."""
    old = ckpt.layout.get("learner_ranks")
    if not isinstance(old, list) or not all(type(r) is int for r in old):
        old = sorted(ckpt.sampler)  # (a layout that does not say: the samplers stored)
    if not old:
        return None, False
    i = list(learners).index(me)
    return (old[i], True) if i < len(old) else (old[0], False)


def _resume_learner(edp: FeatureHost, ckpt: ck.Checkpoint, same_draws: bool) -> None:
    """The scheduler's position and the sampler's state come back to this learner: the
    sampler's own state (schema 2; its random state only in the same world with the
    same ``run.seed``, and only its own), else (schema 1) the superstep counter and the
    RNG. Local.

    Raises:
        CheckpointError: a stored state the sampler cannot take.
    """
    assert edp.learner is not None
    src, own = _stored_learner(ckpt, edp.roles.learner_ranks, edp.world_rank)
    if src is None:
        return
    keep_rng = same_draws and own
    state = ckpt.sampler.get(src)
    if state:
        edp.learner.load_sampler_state(state if keep_rng else
                                       {k: v for k, v in state.items() if k != "rng"})
        return
    rng = ckpt.rng.get(src) if keep_rng else None
    edp.learner.resume_at(int(ckpt.counters.get(src, {}).get("superstep", 0)),
                          ck.rng_from_json(rng) if rng else None)


class _Changed(CheckpointError):
    """A rank opened another checkpoint than the one chosen (not damage: no fallback)."""


def _skip(skipped: list[str], reason: str, remaining: Sequence[Path],
          damaged: Path | None = None) -> None:
    """Note a refused candidate; mark a complete one refused as damaged (not one of
    another spec or schema, nor one without ``DONE``) so that retention neither counts
    nor deletes it and listings show it (:func:`~conduit_hpc.checkpoint.mark_damaged`).
    Leader only; blocks for the marker's write."""
    if damaged is not None and ck.mark_damaged(damaged, reason):
        reason += f" (marked damaged: {damaged / ck.DAMAGED})"
    skipped.append(reason)
    nxt = f"falling back to {remaining[0]}" if remaining else "no older checkpoint left"
    log.warning("resume: refused %s; %s", reason, nxt)
